"""Instances: a run whose command lives in a live sandbox, so more processes join it while it
runs (Contree's subprocesses), each with stdin that may stay open and signals of its own; and the
processes of any live sandbox (the table's sandbox_spawn / sandbox_stdin / sandbox_signal /
sandbox_process: `sid` is a live sandbox's ID or a live run's operation ID).

An instance is an operation (operations.py: queued, listed, awaited and cancelled like a run; its
row is a run's). Its work (`run`): start a live sandbox (sandboxes.py) on the image, start the
command in it as process 1; when process 1 ends (exit, its timeout, a signal, a cancel) kill the
processes left, commit the sandbox's filesystem unless disposable, stop the sandbox. While
process 1 runs, `spawn` starts more processes (2, 3, ...) in the same sandbox, `write` feeds a
process's open stdin (and closes it), `signal` signals a process's group and `process` tells its
state and output so far. Process 1's output is the run's own stdout/stderr events; the others'
spawn, stdin, output, truncation and exit are events of kind "proc" (JSON with their `spid`;
process 1's stdin and truncation too, and the sandbox's network at its start as spid 0), so a
stream resumes from any event. What a process wrote is kept up to the output cap per stream, as
for a run. A plain live sandbox's processes are numbered from 1 and write no events (their state
is asked for); they are forgotten when the sandbox stops.

A call on a live run still queued waits START_WAIT for a worker, then answers NotReady (Contree's
425, its clients retry; one a worker took waits for its sandbox, UP_WAIT); on a live run that
ended: Ended for stdin (410), Conflict for the others (409).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ... import defaults as D
from ...defaults import RunRecord
from ...errors import Conflict, Ended, InvalidInput, NotFound, NotReady, RuntimeUnavailable
from ...store import ephemeral
from ...secrets_mask import mask_env, mask_text, secret_values
from ...values import parse_size
from ..runs.runs import EPHEMERAL, KEPT, NOTHING, keep_mode
from ..images.rundefaults import resolve_user
from .held import Held, NotAHolder, spawn_held
from .spawned import Process, public_view, signal_number, start_error, usage_of
from .terminal import open_terminal, read_terminal, set_size
from ..runs.spec import command_argv

log = logging.getLogger("sandtree.engine")

START_WAIT = 2.0              # seconds a call on a queued live run waits for a worker (then NotReady)
UP_WAIT = 30.0                # seconds it waits for the sandbox of one a worker is starting
RETRY_AFTER = 1               # seconds NotReady tells the caller to wait
LIFETIME_MARGIN = 60.0        # the sandbox outlives its command's timeout by this much (the commit)
EXITED_WAIT = 5.0             # seconds a killed process is given to be reaped
PUMP_GRACE = 0.5              # seconds its pipes are read after a process exits (background writers)


class Instance:
    """A live run's processes (op: its operation), or a plain live sandbox's (op None)."""

    def __init__(self, op: str | None, sid: str, make_cwd: bool = False, events=None):
        """events(kind, data): where the live run's events go (None: a plain sandbox's, none)."""
        self.op, self.sid, self.make_cwd, self.events = op, sid, make_cwd, events
        self.procs: dict[int, Process] = {}
        self.lock = threading.Lock()
        self.ended = False                        # process 1 ended: no new processes


class Instances:
    """The live instances of one engine process. host: the engine (sandboxes, records, resolve,
    default_limits); emit(op, kind, data): an event of the operation (operations.py). elsewhere:
    None, or a cluster engine's (engine/clustered.py), which runs live runs on its nodes."""

    def __init__(self, host, emit):
        self.host, self.emit = host, emit
        self.elsewhere = getattr(host, "live_elsewhere", None)
        self.live: dict[str, Instance] = {}       # op -> its instance
        self.plain: dict[str, Instance] = {}      # sandbox id -> a plain live sandbox's processes
        self.expected: set[str] = set()           # submitted, sandbox not up yet
        self.starting: set[str] = set()           # of those, taken by a worker (its sandbox coming up)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.stopper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sandtree-inst-stop")

    def expect(self, op: str) -> None:
        """A live run was submitted: calls on it wait for its sandbox (START_WAIT), not fail."""
        with self.lock:
            self.expected.add(op)

    def forget(self, op: str) -> None:
        """A submitted live run that never starts (cancelled while queued)."""
        self._up(op, None)

    def _up(self, op: str, inst: Instance | None) -> None:
        with self.changed:
            self.expected.discard(op)
            self.starting.discard(op)
            if inst is not None:
                self.live[op] = inst
            else:
                self.live.pop(op, None)
            self.changed.notify_all()

    # ---- the operation's work ------------------------------------------------------------------
    def run(self, op: str, ref: str, command, *, cancel: threading.Event, on_output, on_up=None, events=None,
            **options) -> RunRecord:
        """Run `command` as process 1 of a new live sandbox on `ref` (module doc); a ready one of
        the image's warm pool (engine.pool_create, `serve --pool`) when its limits fit. options:
        _run's. on_up(sandbox ID): called once its sandbox runs; events(kind, data): where its
        events go (default: emit's). With `elsewhere` set: on a node, which calls back here."""
        with self.changed:
            self.starting.add(op)
            self.changed.notify_all()
        events = events or (lambda kind, data: self.emit(op, kind, data))
        try:
            if self.elsewhere is not None:
                # once its node has its sandbox up, calls on it go there (no longer wait here)
                return self.elsewhere(op, ref, command, options, cancel=cancel, on_output=on_output,
                                      on_up=lambda sid: self._up(op, None), events=events)
            return self._run(op, ref, command, cancel=cancel, on_output=on_output, on_up=on_up, events=events,
                             **options)
        finally:
            self._up(op, None)

    def _run(self, op, ref, command, *, cancel, on_output, on_up, events, stdin=None, stdin_open: bool = False,
             make_cwd: bool = False, disposable: bool = False, env: dict | None = None, cwd: str | None = None,
             uid: int | None = None, gid: int | None = None, hostname: str = D.HOSTNAME, files=None,
             file_set: str | None = None, network=None, secrets: dict | None = None, labels: dict | None = None,
             tier: str | None = None, **limits) -> RunRecord:
        sb = self.host.sandboxes
        keep = keep_mode(disposable)             # kept, ephemeral (Contree's disposable) or nothing
        source = self.host.resolve(ref)
        argv = command_argv(command)
        lim = self.host.specs.limits(limits)
        started = time.time()
        tier = tier or self.host.default_tier
        pool, lent = self.host.pools.get(source), []

        def starter(spec, lifetime):              # a ready sandbox of the image's warm pool, if it fits
            got = pool.lend(spec, tier) if pool is not None else None
            if got is None:
                return sb.live.start(spec, lifetime, tier=tier)
            lent.append((pool, *got))             # (its helper entered ahead: process 1's)
            return got[0]
        try:
            info = sb.start(source, env=env, cwd=None if make_cwd else cwd, hostname=hostname, files=files,
                            file_set=file_set, idle_timeout=0, lifetime=lim.timeout + LIFETIME_MARGIN,
                            network=network, secrets=secrets, labels=labels, run_of=op, starter=starter, tier=tier,
                            **limits)
        except BaseException:
            self._stop(None, lent)                 # (stopped by sb.start)
            raise
        inst = Instance(op, info["id"], make_cwd, events)
        image, cancelled, p1, done = None, False, None, False
        try:
            if info.get("network"):
                events("proc", json.dumps({"spid": 0, "type": "network", "network": info["network"]}))
            p1 = self._start(inst, 1, argv, command if isinstance(command, str) else None, env=None,
                             cwd=cwd if make_cwd else None, uid=uid, gid=gid, stdin=stdin, stdin_open=stdin_open,
                             cap=lim.output, on_output=on_output, ahead=lent[0][2] if lent else None)
            lent[:] = [(p, h, None) for p, h, _ in lent]      # its helper is process 1's now
            self._up(op, inst)
            if on_up is not None:
                on_up(info["id"])
            deadline = time.monotonic() + lim.timeout
            while not p1.done.wait(0.05):
                if cancel.is_set() and not cancelled:
                    cancelled = True
                    p1.proc.kill()
                elif time.monotonic() > deadline and not p1.timed_out:
                    p1.timed_out = True
                    p1.proc.kill()
            self._end(inst)
            failed = start_error(p1, argv, cwd)
            if failed is not None:
                raise failed                     # a failed operation, as a run that cannot start
            if keep != NOTHING and not cancelled:
                image = sb.commit(inst.sid, ephemeral=keep == EPHEMERAL)
            done = True
        finally:
            self._end(inst)
            self._up(op, None)
            # its processes are gone and its image committed: the run is over, and the sandbox's
            # teardown (6 ms: pid 1 reaped, mounts and cgroups gone) is off the run's path
            self.stopper.submit(self._stop, inst.sid, lent)
            if done:                             # (a failure is recorded by operations.py)
                self._record(op, source, argv, command, p1, info, env, uid, gid, hostname, disposable, started,
                             image, cancelled, lim, keep)
        v = p1.view()
        return RunRecord(op, source, image, v["exit_code"], v["signal"], v["stdout"], v["stderr"],
                         v["stdout_truncated"], v["stderr_truncated"], v["timed_out"], False,
                         usage_of(p1), cancelled)

    def _stop(self, sid: str | None, lent: list) -> None:
        try:
            if sid is not None:
                self.host.sandboxes.stop(sid)
        except Exception:                        # noqa: BLE001 - its lifetime ends it in any case
            pass
        for pool, h, ahead in lent:               # a warm pool's sandbox: the pool's child, reaped
            try:                                  # here (its row's handle has no process object)
                if ahead is not None:
                    ahead.discard()               # (not used: process 1 did not start)
                self.host.sandboxes.live.stop(h, wait=2.0)
            finally:
                pool.returned()                   # (the pool may close now)

    def close(self) -> None:
        """Wait for the sandboxes of ended live runs to be stopped."""
        self.stopper.shutdown(wait=True)

    def _end(self, inst: Instance) -> None:
        """No more processes; the ones left are killed and reaped (their exit events written)."""
        with inst.lock:
            inst.ended = True
            procs = list(inst.procs.values())
        for p in procs:
            if not p.done.is_set():
                p.proc.kill()
        for p in procs:
            p.done.wait(EXITED_WAIT)

    def _record(self, op, source, argv, command, p1, info, env, uid, gid, hostname, disposable, started,
                image, cancelled, lim, keep) -> None:
        masked = secret_values({str(k): str(v) for k, v in (env or {}).items()})
        shown = command if isinstance(command, str) else " ".join(argv)
        spec = {"command": mask_text(shown, masked), "argv": [mask_text(a, masked) for a in argv],
                "cwd": (p1 and p1.spec["cwd"]) or info.get("cwd", "/"),
                "env": mask_env({str(k): str(v) for k, v in (env or {}).items()}),
                "uid": uid if uid is not None else 0, "gid": gid if gid is not None else 0, "hostname": hostname,
                "disposable": disposable, "limits": lim.__dict__, "tier": info["tier"], "live": info["id"],
                # the sandbox's network, as a run records its own (netopts.NetworkOption.record)
                **({"network": info["network"], "hermetic": False} if info.get("network") else {}),
                **({"secrets": info["secrets"]} if info.get("secrets") else {})}
        if p1 is None:
            outcome = {"error": "error", "message": "the instance's command did not start"}
        else:
            v = p1.view()
            outcome = {"exit_code": v["exit_code"], "signal": v["signal"], "timed_out": v["timed_out"],
                       "cancelled": cancelled, "stdout_bytes": len(v["stdout"]), "stderr_bytes": len(v["stderr"]),
                       "stdout_truncated": v["stdout_truncated"], "stderr_truncated": v["stderr_truncated"],
                       "usage": usage_of(p1)}
        also = (lambda con: ephemeral.keep(con, image)) if keep == KEPT and image else None
        self.host.records.record(op, source, spec, started, image, outcome, also=also)

    # ---- processes -----------------------------------------------------------------------------
    def _emit(self, inst: Instance, p: Process | None, data: dict) -> None:
        if inst.events is not None:               # a plain live sandbox's processes write no events
            inst.events("proc", json.dumps({"spid": p.spid if p is not None else 0, **data}))

    def _start(self, inst: Instance, spid: int, argv: list[str], shell: str | None, *, env, cwd, uid, gid,
               stdin: bytes | None, stdin_open: bool, cap: int, on_output=None, ahead=None, tag: str | None = None,
               pty: tuple[int, int] | None = None, hold: bool = False) -> Process:
        """Start a process in the instance's sandbox; its pumps write its events (module doc).
        pty: (cols, rows) of a terminal that is its stdin, stdout and stderr (terminal.py).
        hold: its stdio held inside the sandbox (held.py: a hibernation keeps it), where the
        sandbox has a holder (else as without)."""
        if cwd is not None and inst.make_cwd and not self.host.sandboxes.exists(inst.sid, cwd):
            # Contree makes a missing working directory (owned by the process's user)
            self.host.sandboxes.mkdir(inst.sid, cwd, uid=uid or 0, gid=gid or 0)
        master = held = None
        if pty is None and hold:
            try:
                held = spawn_held(self.host.sandboxes, inst.sid, argv, env=env, cwd=cwd, uid=uid, gid=gid)
            except (NotAHolder, RuntimeUnavailable):
                held = None                       # (a gVisor sandbox started without its agent)
        if held is not None:
            proc = held
        elif pty is None:
            proc = self.host.sandboxes.popen(inst.sid, argv, env=env, cwd=cwd, uid=uid, gid=gid, ahead=ahead,
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        else:
            master, slave = open_terminal(*pty)
            try:
                proc = self.host.sandboxes.popen(inst.sid, argv, env=env, cwd=cwd, uid=uid, gid=gid, pty=True,
                                                 stdin=slave, stdout=slave, stderr=slave)
            except BaseException:
                os.close(master)
                raise
            finally:
                os.close(slave)
        shown = shell if shell is not None else " ".join(argv)
        p = Process(spid, proc, argv, shown, cap, stdin_open or master is not None,
                    {"shell": shell is not None, "cwd": cwd, "uid": uid, "gid": gid, "tag": tag,
                     "env": dict(env or {}), "pty": master is not None})
        p.master = master
        inst.procs[spid] = p
        if spid > 1 or inst.op is None:
            self._emit(inst, p, {"type": "spawn", "command": shown, "argv": argv, "shell": shell is not None,
                                 "cwd": cwd, "uid": uid, "gid": gid, "truncate_at": cap})
        pumps = [threading.Thread(target=self._pump, args=(inst, p, name, on_output), daemon=True,
                                  name=f"sandtree-inst-{spid}-{name}")
                 for name in (("stdout", "stderr") if master is None else ("stdout",)) if held is None]
        for t in pumps:
            t.start()
        if held is not None:                      # (its frames come in order: all output, then the exit)
            held.start(lambda stream, chunk: self._chunk(inst, p, stream, chunk, on_output))
        threading.Thread(target=self._reap, args=(inst, p, pumps), daemon=True, name=f"sandtree-inst-{spid}").start()
        with p.lock:
            try:
                self._feed(inst, p, stdin or b"", close=not stdin_open and master is None)
            except (BrokenPipeError, ValueError, OSError):
                p.stdin_open = False
        return p

    def _feed(self, inst: Instance, p: Process, data: bytes, *, close: bool) -> None:
        """Write to a process's stdin (its `stdin` event), then close it or not. Holds p.lock."""
        if p.master is not None:                  # a terminal: its input, never closed (^D ends input)
            if close:
                raise InvalidInput(f"process {p.spid} has a terminal: its input is not closed (send ^D, 0x04)")
            view = memoryview(data)
            while view:
                view = view[os.write(p.master, view):]
            return
        if isinstance(p.proc, Held):
            if close:
                p.stdin_open = False
            p.proc.write(data, close=close)
            if data:
                self._emit(inst, p, {"type": "stdin", "data": data.decode("utf-8", "replace")})
            return
        if data:
            p.proc.stdin.write(data)
            p.proc.stdin.flush()
            self._emit(inst, p, {"type": "stdin", "data": data.decode("utf-8", "replace")})
        if close:
            p.stdin_open = False
            p.proc.stdin.close()

    def _pump(self, inst: Instance, p: Process, stream: str, on_output) -> None:
        if p.master is not None:                  # a terminal: one stream, until nothing holds it open
            try:
                while chunk := read_terminal(p.master):
                    self._chunk(inst, p, stream, chunk, on_output)
            finally:
                with p.lock:                      # (no write or resize on a closed, maybe reused, fd)
                    p.stdin_open = False
                    os.close(p.master)
            return
        with getattr(p.proc, stream) as f:
            while True:
                chunk = f.read1(65536)
                if not chunk:
                    break
                self._chunk(inst, p, stream, chunk, on_output)
        if p.cut[stream]:                         # Contree's `truncated`, on the stream's EOF
            self._emit(inst, p, {"type": "truncated", "stream": stream, "bytes_emitted": len(p.output[stream]),
                                 "bytes_dropped": p.dropped[stream]})

    def _chunk(self, inst: Instance, p: Process, stream: str, chunk: bytes, on_output) -> None:
        if p.done.is_set():
            return                                # a background process's, after the command's exit
        kept = p.hear(stream, chunk)
        if not kept:
            return
        if on_output is not None:
            on_output(stream, kept)               # process 1: the run's own output events
        else:
            self._emit(inst, p, {"type": stream, "data": kept.decode("utf-8", "replace")})

    def _reap(self, inst: Instance, p: Process, pumps: list[threading.Thread]) -> None:
        rc = p.proc.wait()
        # what it wrote before it exited; then it is done: a process it left in the background may
        # hold the pipes open until the sandbox stops (read to the exit, not to EOF, as exec does)
        for t in pumps:
            t.join(PUMP_GRACE)
        with p.lock:
            p.stdin_open = False
            try:
                if p.proc.stdin is not None:      # (a terminal's process has none: its master)
                    p.proc.stdin.close()
            except (OSError, ValueError):
                pass
        p.exit_code, p.signal = (None, -rc) if rc < 0 else (rc, None)
        p.finished = time.time()
        if p.spid > 1 or inst.op is None:
            self._emit(inst, p, {"type": "exit", "exit_code": p.exit_code, "signal": p.signal,
                                 "timed_out": p.timed_out, "duration_ms": int((p.finished - p.started) * 1000),
                                 "stdout_truncated": p.cut["stdout"], "stderr_truncated": p.cut["stderr"]})
        p.done.set()

    def wait_started(self, sid: str) -> None:
        """When `sid` is a live run submitted here whose sandbox is not up: wait START_WAIT for a
        worker to take it (then NotReady), and UP_WAIT for its sandbox once one has."""
        with self.changed:
            self._wait_started(sid)

    def _wait_started(self, sid: str) -> None:
        if sid in self.expected:              # queued: START_WAIT for a worker; taken: its sandbox
            end = time.monotonic() + START_WAIT
            while sid in self.expected and sid not in self.starting and time.monotonic() < end:
                self.changed.wait(end - time.monotonic())
            if sid in self.starting:
                self.changed.wait_for(lambda: sid not in self.expected, UP_WAIT)
        if sid in self.expected:
            raise NotReady(f"operation {sid} is not running yet: retry", retry_after=RETRY_AFTER)

    def _instance(self, sid: str, *, ended=Conflict) -> Instance:
        """The processes of `sid`: a live run's (its operation ID) or a live sandbox's (module doc)."""
        with self.changed:
            self._wait_started(sid)
            inst = self.live.get(sid) or self.plain.get(sid)
        if inst is None and self._is_op(sid):
            raise ended(f"operation {sid} is not a running instance")
        if inst is None:
            inst = self._plain(sid)
        if inst.ended:
            raise ended(f"operation {inst.op} is not a running instance" if inst.op else f"sandbox {sid} stopped")
        return inst

    def _is_op(self, ident: str) -> bool:
        try:
            self.host.records.get(ident)
        except NotFound:
            return False
        return True

    def _plain(self, sid: str) -> Instance:
        """A running plain live sandbox's processes (made at its first), the stopped ones' forgotten."""
        info = self.host.sandboxes.info(sid)              # NotFound for an unknown sandbox
        if info["state"] != "running":
            raise Conflict(f"sandbox {info['id']} is {info['state']}, not running", state=info["state"])
        with self.lock:
            for other, inst in list(self.plain.items()):
                if other != info["id"] and all(p.done.is_set() for p in inst.procs.values()):
                    try:
                        gone = self.host.sandboxes.info(other)["state"] != "running"
                    except NotFound:
                        gone = True
                    if gone:
                        del self.plain[other]
            return self.plain.setdefault(info["id"], Instance(None, info["id"]))

    def spawn(self, sid: str, command, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
              gid: int | None = None, stdin: bytes | str | None = None, stdin_open: bool = False,
              output=None, user: str | None = None, tag: str | None = None, pty: bool = False,
              cols: int = D.TERMINAL_COLS, rows: int = D.TERMINAL_ROWS) -> int:
        """Start a process in live sandbox (or running live run) `sid`; its number (a live run's
        command is 1: its others are 2, 3, ...). user: a name (or NAME:GROUP) of the image's
        /etc/passwd, instead of uid and gid; tag: a name it is found by (unique among the running
        ones); pty: a terminal of cols x rows is its stdin, stdout and stderr."""
        argv = command_argv(command)
        cap = parse_size(output) if output is not None else self.host.default_limits.output
        if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
            raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
        if tag is not None and (not isinstance(tag, str) or not tag or len(tag) > D.PROCESS_TAG_MAX):
            raise InvalidInput(f"a process tag is 1..{D.PROCESS_TAG_MAX} characters, not {tag!r}")
        data = stdin.encode() if isinstance(stdin, str) else bytes(stdin or b"")
        inst = self._instance(sid)
        if user is not None:
            if uid is not None or gid is not None:
                raise InvalidInput("give a user by name or by uid and gid, not both")
            if not isinstance(user, str):
                raise InvalidInput(f"user must be a name, not {user!r}")
            uid, gid = (0, 0) if user == "root" else resolve_user(self.host.store, self.host.sandboxes.info(inst.sid)["image"], user)
        with inst.lock:
            if inst.ended:
                raise Conflict(f"operation {inst.op} is not a running instance")
            if tag is not None and any(q.spec.get("tag") == tag and not q.done.is_set() for q in inst.procs.values()):
                raise Conflict(f"a running process of {sid} is already tagged {tag!r}", tag=tag)
            spid = max(inst.procs, default=1 if inst.op else 0) + 1
            # a plain live sandbox's held, so that it can hibernate with them running (a live
            # run's sandbox is never hibernated; a terminal is the engine's)
            p = self._start(inst, spid, argv, command if isinstance(command, str) else None, env=env, cwd=cwd,
                            uid=uid, gid=gid, stdin=data, stdin_open=stdin_open, cap=cap, tag=tag,
                            pty=(cols, rows) if pty else None, hold=inst.op is None and not pty)
        failed = start_error(p, argv, cwd) if p.done.wait(0) else None
        if failed is not None:
            raise failed
        return spid

    def release(self, sid: str) -> None:
        """Before sandbox `sid` hibernates: its held processes' relays let go (held.py). A process
        of it with the engine's pipes or terminal (not held) cannot be checkpointed: Conflict,
        naming it, and nothing is let go."""
        with self.lock:
            inst = self.plain.get(sid)
        if inst is None:
            return
        with inst.lock:
            procs = [p for p in inst.procs.values() if not p.done.is_set()]
        for p in procs:
            if not isinstance(p.proc, Held):
                why = ("its terminal is the server's, which a checkpoint cannot hold" if p.master is not None
                       else "its pipes lead out of the sandbox")
                raise Conflict(f"process {p.spid} ({p.shown}) of sandbox {sid[:12]} is running and {why}: "
                               "kill it, or hibernate once it has exited", sandbox=sid, pid=p.spid)
        for p in procs:
            p.proc.release()

    def reattach(self, sid: str) -> None:
        """Once sandbox `sid` runs again (resumed, or its hibernation failed): relays to its held
        processes again."""
        with self.lock:
            inst = self.plain.get(sid)
        if inst is None:
            return
        with inst.lock:
            procs = [p for p in inst.procs.values() if not p.done.is_set() and isinstance(p.proc, Held)]
        for p in procs:
            try:
                p.proc.attach()
            except Exception as exc:               # noqa: BLE001 - attached when next asked (held.py)
                log.warning("sandbox %s: process %s not attached again (%s)", sid, p.spid, exc)

    def _process(self, sid: str, pid: int, ended=Conflict) -> tuple[Instance, Process]:
        inst = self._instance(sid, ended=ended)
        p = inst.procs.get(int(pid))
        if p is None:
            raise NotFound(f"{'operation ' + inst.op if inst.op else 'sandbox ' + inst.sid} has no process {pid}")
        return inst, p

    def write(self, sid: str, pid: int, data: bytes | str = b"", *, close: bool = True) -> None:
        """Write to a process's open stdin, then close it (close=True) or keep it open."""
        inst, p = self._process(sid, pid, ended=Ended)
        with p.lock:
            if not p.stdin_open:
                raise Conflict(f"the stdin of process {pid} is closed")
            try:
                self._feed(inst, p, data.encode() if isinstance(data, str) else bytes(data or b""), close=close)
            except (BrokenPipeError, ValueError, OSError):
                p.stdin_open = False
                raise Conflict(f"process {pid} no longer reads its stdin") from None

    def signal(self, sid: str, pid: int, sig="KILL") -> None:
        """Signal a running process's group (a name or number; default SIGKILL)."""
        n = signal_number(sig)
        _, p = self._process(sid, pid)
        if p.done.is_set():
            raise NotFound(f"process {pid} of {sid} has exited")
        p.proc.send_signal(n)

    def process(self, sid: str, pid: int) -> dict | None:
        """A process of a running live run or live sandbox: its state and output so far (JSON, as
        liveprocs.public_view); None when `sid` is an operation not running live (its processes
        are told by its events: operations.py)."""
        try:
            _, p = self._process(sid, pid)
        except NotReady:
            raise
        except Conflict:
            if self._is_op(sid):
                return None
            raise
        return public_view(p.view())

    def processes(self, sid: str) -> list[dict]:
        """The processes started in live sandbox (or running live run) `sid` (spawn), oldest
        first: each one's state (process's view, without its output)."""
        inst = self._instance(sid)
        with inst.lock:
            procs = sorted(inst.procs.values(), key=lambda q: q.spid)
        return [_summary(public_view(q.view())) for q in procs]

    def resize(self, sid: str, pid: int, cols: int, rows: int) -> None:
        """The size of a running process's terminal (spawn(pty=True))."""
        _, p = self._process(sid, pid)
        if p.master is None:
            raise InvalidInput(f"process {pid} of {sid} has no terminal (spawn it with pty)")
        with p.lock:
            if p.done.is_set() or not p.stdin_open:
                raise NotFound(f"process {pid} of {sid} has exited")
            set_size(p.master, cols, rows)

    def follow(self, sid: str, pid: int, on_output, *, replay: bool = False, cancel=None) -> dict:
        """Call on_output(stream, chunk) with what process `pid` writes ("stdout", "stderr", or
        "pty" for a terminal's) until it exits or `cancel` (a threading.Event) is set; its state
        then (processes' shape). replay: what it wrote so far first (kept up to its cap)."""
        _, p = self._process(sid, pid)
        p.listen(on_output, replay)
        try:
            while not p.done.wait(0.25):
                if cancel is not None and cancel.is_set():
                    break
        finally:
            p.unlisten(on_output)
        return _summary(public_view(p.view()))


def _summary(view: dict) -> dict:
    """A process's view without its output (a list or a follower has it otherwise)."""
    return {k: v for k, v in view.items() if k not in ("stdout", "stderr", "stdout_base64", "stderr_base64")}
