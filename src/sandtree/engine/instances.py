"""Instances: a run whose command lives in a live sandbox, so more processes join it while it
runs (Contree's subprocesses), each with stdin that may stay open and signals of its own.

An instance is an operation (operations.py: queued, listed, awaited and cancelled like a run; its
row is a run's). Its work (`run`): start a live sandbox (sandboxes.py) on the image, start the
command in it as process 1; when process 1 ends (exit, its timeout, a signal, a cancel) kill the
processes left, commit the sandbox's filesystem unless disposable, stop the sandbox. While
process 1 runs, `spawn` starts more processes (2, 3, ...) in the same sandbox, `write` feeds a
process's open stdin (and closes it), `signal` signals a process's group and `process` tells its
state and output so far. Process 1's output is the run's own stdout/stderr events; the others'
spawn, output and exit are events of kind "proc" (JSON with their `spid`), so a stream resumes
from any event. What a process wrote is kept up to the output cap per stream, as for a run.
"""

from __future__ import annotations

import json
import os
import signal as signal_mod
import subprocess
import threading
import time

from .. import defaults as D
from ..defaults import RunRecord
from ..errors import CommandNotFound, Conflict, InvalidInput, NotFound, SandboxError
from ..store import ephemeral
from ..secrets_mask import mask_env, mask_text, secret_values
from ..values import parse_size
from .runs import EPHEMERAL, KEPT, NOTHING, keep_mode
from .spec import command_argv

START_WAIT = 30.0             # seconds a call on a submitted live run waits for its sandbox to be up
LIFETIME_MARGIN = 60.0        # the sandbox outlives its command's timeout by this much (the commit)
EXITED_WAIT = 5.0             # seconds a killed process is given to be reaped
PUMP_GRACE = 0.5              # seconds its pipes are read after a process exits (background writers)


def signal_number(value) -> int:
    """A signal from a number (15) or a name with or without SIG (TERM, SIGTERM)."""
    text = str(value).strip().upper()
    if text.isdigit():
        n = int(text)
    else:
        try:
            n = int(signal_mod.Signals[text if text.startswith("SIG") else "SIG" + text])
        except (ValueError, KeyError):
            n = 0
    if not 1 <= n <= 30:
        raise InvalidInput(f"unknown signal {value!r}")
    return n


def start_error(p: "Process", argv: list[str], cwd) -> Exception | None:
    """The error of a process the sandbox could not start (its helper's report), as a run's."""
    rep = getattr(p.proc, "report", {}) or {}
    if "execfail" not in rep:
        return None
    err, step = rep["execfail"]
    if step == "exec":
        return CommandNotFound(f"cannot execute {argv[0]!r}: {os.strerror(err)}", command=argv[0], errno=err)
    if step == "cwd":
        return InvalidInput(f"working directory {cwd!r}: {os.strerror(err)}", cwd=cwd)
    return SandboxError(f"command setup failed at {step}: {os.strerror(err)}", step=step, errno=err)


def usage_of(p: "Process") -> dict:
    """A process's usage as a run's: wall clock, and CPU and max RSS from its helper's report."""
    utime, stime, maxrss = (getattr(p.proc, "report", {}) or {}).get("rusage", (0, 0, 0))
    return {"wall_s": round((p.finished or time.time()) - p.started, 6), "user_cpu_s": utime / 1e6,
            "sys_cpu_s": stime / 1e6, "max_rss_bytes": maxrss * 1024}


class Process:
    """One process of an instance: its pipes, what it wrote (to the cap) and how it ended."""

    def __init__(self, spid: int, proc, argv: list[str], shown: str, cap: int, stdin_open: bool, spec: dict):
        self.spid, self.proc, self.argv, self.shown, self.cap = spid, proc, argv, shown, cap
        self.spec = spec
        self.started, self.finished = time.time(), None
        self.output = {"stdout": bytearray(), "stderr": bytearray()}
        self.cut = {"stdout": False, "stderr": False}
        self.stdin_open = stdin_open
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.timed_out = False
        self.lock = threading.Lock()              # stdin writes, one at a time
        self.done = threading.Event()

    def keep(self, stream: str, chunk: bytes) -> bytes:
        """The part of chunk within the cap (the rest is counted as cut)."""
        buf = self.output[stream]
        room = max(0, self.cap - len(buf))
        if len(chunk) > room:
            self.cut[stream] = True
            chunk = chunk[:room]
        buf += chunk
        return chunk

    def view(self) -> dict:
        return {"spid": self.spid, "argv": self.argv, "command": self.shown, "running": not self.done.is_set(),
                "exit_code": self.exit_code, "signal": self.signal, "timed_out": self.timed_out,
                "stdout": bytes(self.output["stdout"]), "stderr": bytes(self.output["stderr"]),
                "stdout_truncated": self.cut["stdout"], "stderr_truncated": self.cut["stderr"],
                "stdin_open": self.stdin_open, "started": self.started, "finished": self.finished, **self.spec}


class Instance:
    def __init__(self, op: str, sid: str):
        self.op, self.sid = op, sid
        self.procs: dict[int, Process] = {}
        self.lock = threading.Lock()
        self.ended = False                        # process 1 ended: no new processes


class Instances:
    """The live instances of one engine process. host: the engine (sandboxes, records, resolve,
    default_limits); emit(op, kind, data): an event of the operation (operations.py)."""

    def __init__(self, host, emit):
        self.host, self.emit = host, emit
        self.live: dict[str, Instance] = {}
        self.expected: set[str] = set()           # submitted, sandbox not up yet
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)

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
            if inst is not None:
                self.live[op] = inst
            else:
                self.live.pop(op, None)
            self.changed.notify_all()

    # ---- the operation's work ------------------------------------------------------------------
    def run(self, op: str, ref: str, command, *, cancel: threading.Event, on_output, stdin=None,
            stdin_open: bool = False, disposable: bool = False, env: dict | None = None, cwd: str | None = None,
            uid: int | None = None, gid: int | None = None, hostname: str = D.HOSTNAME, files=None,
            file_set: str | None = None, network=None, secrets: dict | None = None, labels: dict | None = None,
            **limits) -> RunRecord:
        """Run `command` as process 1 of a new live sandbox on `ref` (module doc)."""
        try:
            return self._run(op, ref, command, cancel=cancel, on_output=on_output, stdin=stdin,
                             stdin_open=stdin_open, disposable=disposable, env=env, cwd=cwd, uid=uid, gid=gid,
                             hostname=hostname, files=files, file_set=file_set, network=network, secrets=secrets,
                             labels=labels, **limits)
        finally:
            self._up(op, None)

    def _run(self, op, ref, command, *, cancel, on_output, stdin, stdin_open, disposable, env, cwd, uid, gid,
             hostname, files, file_set, network, secrets, labels, **limits) -> RunRecord:
        sb = self.host.sandboxes
        keep = keep_mode(disposable)             # kept, ephemeral (Contree's disposable) or nothing
        source = self.host.resolve(ref)
        argv = command_argv(command)
        lim = self.host.specs.limits(limits)
        started = time.time()
        info = sb.start(source, env=env, cwd=cwd, hostname=hostname, files=files, file_set=file_set,
                        idle_timeout=0, lifetime=lim.timeout + LIFETIME_MARGIN, network=network, secrets=secrets,
                        labels=labels, **limits)
        inst = Instance(op, info["id"])
        image, cancelled, p1, done = None, False, None, False
        try:
            p1 = self._start(inst, 1, argv, command if isinstance(command, str) else None, env=None, cwd=None,
                             uid=uid, gid=gid, stdin=stdin, stdin_open=stdin_open, cap=lim.output,
                             on_output=on_output)
            self._up(op, inst)
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
            try:
                sb.stop(inst.sid)
            finally:
                self._up(op, None)
            if done:                             # (a failure is recorded by operations.py)
                self._record(op, source, argv, command, p1, info, env, uid, gid, hostname, disposable, started,
                             image, cancelled, lim, keep)
        v = p1.view()
        return RunRecord(op, source, image, v["exit_code"], v["signal"], v["stdout"], v["stderr"],
                         v["stdout_truncated"], v["stderr_truncated"], v["timed_out"], False,
                         usage_of(p1), cancelled)

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
                "cwd": info.get("cwd", "/"), "env": mask_env({str(k): str(v) for k, v in (env or {}).items()}),
                "uid": uid if uid is not None else 0, "gid": gid if gid is not None else 0, "hostname": hostname,
                "disposable": disposable, "limits": lim.__dict__, "tier": "namespaces", "live": info["id"],
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
    def _start(self, inst: Instance, spid: int, argv: list[str], shell: str | None, *, env, cwd, uid, gid,
               stdin: bytes | None, stdin_open: bool, cap: int, on_output=None) -> Process:
        """Start a process in the instance's sandbox; its pumps write its events (module doc)."""
        proc = self.host.sandboxes.popen(inst.sid, argv, env=env, cwd=cwd, uid=uid, gid=gid,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        shown = shell if shell is not None else " ".join(argv)
        p = Process(spid, proc, argv, shown, cap, stdin_open,
                    {"shell": shell is not None, "cwd": cwd, "uid": uid, "gid": gid})
        inst.procs[spid] = p
        if spid > 1:
            self.emit(inst.op, "proc", json.dumps({"spid": spid, "type": "spawn", "command": shown, "argv": argv,
                                                   "shell": shell is not None, "cwd": cwd, "uid": uid, "gid": gid,
                                                   "truncate_at": cap}))
        pumps = [threading.Thread(target=self._pump, args=(inst, p, name, on_output), daemon=True,
                                  name=f"sandtree-inst-{spid}-{name}") for name in ("stdout", "stderr")]
        for t in pumps:
            t.start()
        threading.Thread(target=self._reap, args=(inst, p, pumps), daemon=True, name=f"sandtree-inst-{spid}").start()
        try:
            if stdin:
                proc.stdin.write(stdin)
                proc.stdin.flush()
            if not stdin_open:
                proc.stdin.close()
        except (BrokenPipeError, ValueError):
            p.stdin_open = False
        return p

    def _pump(self, inst: Instance, p: Process, stream: str, on_output) -> None:
        with getattr(p.proc, stream) as f:
            while True:
                chunk = f.read1(65536)
                if not chunk:
                    return
                self._chunk(inst, p, stream, chunk, on_output)

    def _chunk(self, inst: Instance, p: Process, stream: str, chunk: bytes, on_output) -> None:
        if p.done.is_set():
            return                                # a background process's, after the command's exit
        kept = p.keep(stream, chunk)
        if not kept:
            return
        if on_output is not None:
            on_output(stream, kept)               # process 1: the run's own output events
        else:
            self.emit(inst.op, "proc", json.dumps({"spid": p.spid, "type": stream,
                                                   "data": kept.decode("utf-8", "replace")}))

    def _reap(self, inst: Instance, p: Process, pumps: list[threading.Thread]) -> None:
        rc = p.proc.wait()
        # what it wrote before it exited; then it is done: a process it left in the background may
        # hold the pipes open until the sandbox stops (read to the exit, not to EOF, as exec does)
        for t in pumps:
            t.join(PUMP_GRACE)
        with p.lock:
            p.stdin_open = False
            try:
                p.proc.stdin.close()
            except (OSError, ValueError):
                pass
        p.exit_code, p.signal = (None, -rc) if rc < 0 else (rc, None)
        p.finished = time.time()
        if p.spid > 1:
            self.emit(inst.op, "proc", json.dumps({"spid": p.spid, "type": "exit", "exit_code": p.exit_code,
                                                   "signal": p.signal, "timed_out": p.timed_out,
                                                   "duration_ms": int((p.finished - p.started) * 1000),
                                                   "stdout_truncated": p.cut["stdout"],
                                                   "stderr_truncated": p.cut["stderr"]}))
        p.done.set()

    def _instance(self, op: str) -> Instance:
        with self.changed:
            self.changed.wait_for(lambda: op not in self.expected, START_WAIT)
            inst = self.live.get(op)
        if inst is None:
            raise Conflict(f"operation {op} is not a running instance")
        return inst

    def spawn(self, op: str, command, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
              gid: int | None = None, stdin: bytes | None = None, stdin_open: bool = False, output=None) -> int:
        """Start another process in running instance `op`; its spid (2, 3, ...)."""
        argv = command_argv(command)
        cap = parse_size(output) if output is not None else self.host.default_limits.output
        if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")):
            raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
        inst = self._instance(op)
        with inst.lock:
            if inst.ended:
                raise Conflict(f"operation {op} is not a running instance")
            spid = max(inst.procs, default=1) + 1
            self._start(inst, spid, argv, command if isinstance(command, str) else None, env=env, cwd=cwd,
                        uid=uid, gid=gid, stdin=stdin, stdin_open=stdin_open, cap=cap)
        return spid

    def _process(self, op: str, spid: int) -> Process:
        inst = self._instance(op)
        p = inst.procs.get(int(spid))
        if p is None:
            raise NotFound(f"operation {op} has no process {spid}")
        return p

    def write(self, op: str, spid: int, data: bytes = b"", *, close: bool = True) -> None:
        """Write to a process's open stdin, then close it (close=True) or keep it open."""
        p = self._process(op, spid)
        with p.lock:
            if not p.stdin_open:
                raise Conflict(f"the stdin of process {spid} is closed")
            try:
                if data:
                    p.proc.stdin.write(data)
                    p.proc.stdin.flush()
                if close:
                    p.stdin_open = False
                    p.proc.stdin.close()
            except (BrokenPipeError, ValueError):
                p.stdin_open = False
                raise Conflict(f"process {spid} no longer reads its stdin") from None

    def signal(self, op: str, spid: int, sig=signal_mod.SIGKILL) -> None:
        """Signal a running process's group (a name or number; default SIGKILL)."""
        n = signal_number(sig)
        p = self._process(op, spid)
        if p.done.is_set():
            raise NotFound(f"process {spid} of operation {op} has exited")
        p.proc.send_signal(n)

    def process(self, op: str, spid: int) -> dict | None:
        """A process of a running instance: its state and output so far; None when `op` is not
        a running instance (a finished one's processes are told by its events)."""
        with self.changed:
            self.changed.wait_for(lambda: op not in self.expected, START_WAIT)
            inst = self.live.get(op)
        if inst is None:
            return None
        p = inst.procs.get(int(spid))
        if p is None:
            raise NotFound(f"operation {op} has no process {spid}")
        return p.view()


def fold_process(op: str, spid: int, log: list, rec: dict, result) -> dict:
    """A process's view (Process.view's shape) from the operation's events, `rec` (operations.get)
    and `result` (its RunRecord, or None): for a run not running live any more."""
    spid = int(spid)
    spec = rec.get("spec") or {}
    base = {"spid": spid, "argv": spec.get("argv") or [], "command": spec.get("command", ""), "running": False,
            "exit_code": None, "signal": None, "timed_out": False, "stdout_truncated": False,
            "stderr_truncated": False, "stdin_open": False, "started": rec.get("started"),
            "finished": rec.get("finished"), "shell": None, "cwd": spec.get("cwd"), "uid": spec.get("uid"),
            "gid": spec.get("gid")}
    out = {"stdout": bytearray(), "stderr": bytearray()}
    if spid == 1:
        if rec["status"] == "queued":
            raise NotFound(f"operation {op} has not started its command yet")
        if rec["status"] == "running":
            for _, kind, data in log:
                if kind in out:
                    out[kind] += data.encode()
            return {**base, "running": True, "stdout": bytes(out["stdout"]), "stderr": bytes(out["stderr"])}
        src = result.__dict__ if result is not None else (rec.get("outcome") or {})
        return {**base, "exit_code": src.get("exit_code"), "signal": src.get("signal"),
                "timed_out": bool(src.get("timed_out")), "stdout": bytes(getattr(result, "stdout", b"") or b""),
                "stderr": bytes(getattr(result, "stderr", b"") or b""),
                "stdout_truncated": bool(src.get("stdout_truncated")) if result is not None else True,
                "stderr_truncated": bool(src.get("stderr_truncated")) if result is not None else True}
    seen = False
    for _, kind, data in log:
        if kind != "proc":
            continue
        e = json.loads(data)
        if e.get("spid") != spid:
            continue
        if e["type"] == "spawn":
            seen = True
            base.update(argv=e["argv"], command=e["command"], shell=e["shell"], cwd=e["cwd"], uid=e["uid"],
                        gid=e["gid"], running=True)
        elif e["type"] in out:
            out[e["type"]] += e["data"].encode()
        elif e["type"] == "exit":
            base.update(running=False, exit_code=e["exit_code"], signal=e["signal"], timed_out=e["timed_out"],
                        stdout_truncated=e["stdout_truncated"], stderr_truncated=e["stderr_truncated"])
    if not seen:
        raise NotFound(f"operation {op} has no process {spid} (or its events are no longer kept)")
    return {**base, "stdout": bytes(out["stdout"]), "stderr": bytes(out["stderr"])}
