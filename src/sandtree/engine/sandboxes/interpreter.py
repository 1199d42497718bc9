"""The code interpreter of live sandboxes: code run in contexts whose state persists between
calls (the table's sandbox_run_code and sandbox_code_context_* rows; E2B's `run_code` is one
adapter of them, http/e2b/interpreter.py).

A context is one kernel: kernel.py.in's program run by the image's python3 as a process of the
sandbox, detached from whoever started it (a process of the sandbox as `cmd &` is one): it
outlives the engine process that started it (a one-shot CLI's, a restarted server's), a
hibernation keeps it with its memory, and it ends with the sandbox. Each execution reaches it
through a relay (kernel.py.in's `relay`, started with sandboxes.popen): the code goes on the
relay's stdin, the kernel's messages come on its stdout until "done": stdout and stderr as the
code writes them (on_output gets each as it comes), results (the last expression's value with its
_repr_*_ formats, display() calls, matplotlib figures as PNG), an error with its name, value and
traceback. One execution at a time per context (another waits, as Jupyter queues them). A
timeout or a cancel interrupts the code (SIGINT: KeyboardInterrupt, the context's state kept);
code that ignores the interrupt for defaults.INTERPRETER_INTERRUPT_GRACE has its kernel killed:
the context starts afresh (a new kernel under its ID), which its error says.

Each sandbox has a default context per language, made on first use; others are made by
create_context (their own cwd). The contexts of a sandbox are found in it (kernel.py.in's
`list`), so any engine process sees the same ones. Languages: python only (the kernel); another
is refused with InvalidInput naming what is available.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid

from ... import defaults as D
from ...errors import Conflict, InvalidInput, NotFound, RuntimeUnavailable

LANGUAGES = ("python",)
SERVE = "sandtree-kernel-serve"
KERNEL_PART = "# ---- the kernel"       # kernel.py.in's small modes are what comes before this line
_SOURCE: str | None = None


def kernel_source() -> str:
    """kernel.py.in's text: the program a context runs (python3 -c)."""
    global _SOURCE
    if _SOURCE is None:
        with open(os.path.join(os.path.dirname(__file__), "kernel.py.in"), encoding="utf-8") as f:
            _SOURCE = f.read()
    return _SOURCE


class Relay:
    """One execution's way to a kernel: the relay process and the reader of its messages."""

    def __init__(self, proc):
        self.proc = proc
        self.cond = threading.Condition()
        self.inbox: list[dict] = []
        self.eof = False
        self.stderr = bytearray()
        threading.Thread(target=self._read, daemon=True, name="sandtree-kernel-relay").start()
        threading.Thread(target=self._read_stderr, daemon=True, name="sandtree-kernel-relay-err").start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self.cond:
                self.inbox.append(msg)
                self.cond.notify_all()
        with self.cond:
            self.eof = True
            self.cond.notify_all()

    def _read_stderr(self) -> None:
        for chunk in iter(lambda: self.proc.stderr.read1(65536), b""):
            if len(self.stderr) < 65536:
                self.stderr += chunk

    def next(self, deadline: float | None) -> dict | None:
        """The next message; None at the end or when `deadline` (monotonic) passes."""
        with self.cond:
            while not self.inbox and not self.eof:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(left)
            return self.inbox.pop(0) if self.inbox else None

    def signal(self, sig: int) -> None:
        try:
            self.proc.send_signal(sig)
        except (OSError, ProcessLookupError):
            pass

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(5.0)
        except Exception:                       # noqa: BLE001 - a relay left over ends with its kernel's reply
            self.proc.kill()


class Interpreter:
    """The contexts of live sandboxes, as this engine process reaches them. sandboxes:
    engine.sandboxes (info, exists, popen, touch)."""

    def __init__(self, sandboxes):
        self.sandboxes = sandboxes
        self.lock = threading.Lock()
        self.locks: dict[tuple[str, str], threading.Lock] = {}     # (sandbox, context) -> one execution at a time
        # sandbox -> its contexts as this process last found them (a miss, or a kernel gone, asks the sandbox)
        self.known: dict[str, dict[str, dict]] = {}

    # ---- the kernel program's modes ----------------------------------------------------------------
    def _program(self, sid: str, *args: str, cwd: str | None = None):
        # -S for the small modes: no site packages to look at (a third of python3's start)
        flags = ["-u"] if args[0] == SERVE else ["-u", "-S"]
        source = kernel_source() if args[0] == SERVE else kernel_source().split(KERNEL_PART)[0]
        try:
            return self.sandboxes.popen(sid, ["python3", *flags, "-c", source, *args], cwd=cwd,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except InvalidInput as e:                 # (python3 missing: CommandNotFound)
            raise InvalidInput(f"the code interpreter needs python3 in the sandbox's image: {e}") from None

    def _ask(self, sid: str, *args: str, cwd: str | None = None):
        """Run one short mode of the program; its JSON answer (a mode that cannot run, python3
        missing: InvalidInput, else RuntimeUnavailable, with what it said)."""
        proc = self._program(sid, *args, cwd=cwd)
        try:
            out, err = proc.communicate(timeout=D.INTERPRETER_START_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise RuntimeUnavailable(f"the code interpreter did not answer in sandbox {sid}") from None
        lines = out.decode("utf-8", "replace").strip().splitlines()
        try:
            got = json.loads(lines[-1]) if lines else None
        except ValueError:
            got = None
        if got is None:
            said = err.decode("utf-8", "replace").strip()
            if proc.returncode == 127 or "not found" in said or "No such file" in said or not said:
                raise InvalidInput("the code interpreter needs python3 in the sandbox's image"
                                   f"{': ' + said[-300:] if said else ''}")
            raise RuntimeUnavailable(f"the code interpreter does not run in sandbox {sid}: {said[-500:]}")
        return got

    def _found(self, sid: str) -> list[dict]:
        got = self._ask(sid, "list")
        with self.lock:
            self.known[sid] = {c["id"]: c for c in got}
            for other in [o for o in self.known if o != sid]:      # the contexts of sandboxes that ended
                try:
                    gone = self.sandboxes.info(other)["state"] != "running"
                except NotFound:
                    gone = True
                if gone:
                    del self.known[other]
                    for key in [k for k in self.locks if k[0] == other]:
                        del self.locks[key]
        return got

    def _forget(self, sid: str, cid: str) -> None:
        with self.lock:
            self.known.get(sid, {}).pop(cid, None)

    def _start(self, sid: str, cid: str, language: str, cwd: str, default: bool) -> dict:
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
        if not self.sandboxes.exists(sid, cwd):
            raise InvalidInput(f"cwd {cwd} does not exist in sandbox {sid}")
        got = self._ask(sid, SERVE, cid, language, "1" if default else "0", cwd, cwd=cwd)
        if not isinstance(got, dict) or got.get("type") != "ready":
            raise RuntimeUnavailable(f"the code interpreter's kernel did not start in sandbox {sid}: "
                                     f"{got.get('message') if isinstance(got, dict) else got}")
        made = {"id": cid, "language": language, "cwd": cwd, "default": default}
        with self.lock:
            self.known.setdefault(sid, {})[cid] = made
        return made

    @staticmethod
    def _view(c: dict) -> dict:
        return {"id": c["id"], "language": c["language"], "cwd": c["cwd"]}

    # ---- contexts ------------------------------------------------------------------------------
    def _sandbox(self, sid: str) -> dict:
        info = self.sandboxes.info(sid)          # NotFound for an unknown sandbox
        if info["state"] != "running":
            raise Conflict(f"sandbox {info['id']} is {info['state']}, not running", state=info["state"])
        return info

    @staticmethod
    def _language(language: str | None) -> str:
        lang = (language or "python").strip().lower()
        if lang not in LANGUAGES:
            raise InvalidInput(f"language {language!r} is not available: the code interpreter runs "
                               f"{', '.join(LANGUAGES)} (the image's python3)")
        return lang

    def _lock(self, sid: str, cid: str) -> threading.Lock:
        with self.lock:
            return self.locks.setdefault((sid, cid), threading.Lock())

    def _context(self, sid: str, context: str | None, language: str | None) -> dict:
        """The context to run code in: `context` (an ID), or the language's default (made now
        when the sandbox has none)."""
        info = self._sandbox(sid)
        sid = info["id"]
        lang = self._language(language) if context is None else None
        with self._lock(sid, ""):                # (one default made at a time)
            with self.lock:
                cached = list(self.known.get(sid, {}).values())
            hit = next((c for c in cached if (c["id"] == context if context is not None
                                              else c["default"] and c["language"] == lang)), None)
            if hit is not None:
                return {**hit, "sid": sid}
            running = self._found(sid)
            if context is not None:
                got = next((c for c in running if c["id"] == context), None)
                if got is None:
                    raise NotFound(f"sandbox {sid} has no code context {context}")
                return {**got, "sid": sid}
            got = next((c for c in running if c["default"] and c["language"] == lang), None)
            if got is None:
                got = self._start(sid, uuid.uuid4().hex, lang, info.get("cwd") or "/", True)
            return {**got, "sid": sid}

    def create_context(self, sid: str, *, language: str | None = None, cwd: str | None = None) -> dict:
        info = self._sandbox(sid)
        return self._view(self._start(info["id"], uuid.uuid4().hex, self._language(language),
                                      cwd or info.get("cwd") or "/", False))

    def contexts(self, sid: str) -> list[dict]:
        return [self._view(c) for c in self._found(self._sandbox(sid)["id"])]

    def restart_context(self, sid: str, context: str) -> dict:
        """The context's state is dropped: a new kernel in its place (same ID, language, cwd)."""
        c = self._context(sid, context, None)
        with self._lock(c["sid"], c["id"]):       # after an execution running in it
            self._ask(c["sid"], "kill", c["id"])
            return self._view(self._restart(c))

    def _restart(self, c: dict) -> dict:
        # the killed kernel's socket goes with it; a new one may find the name still bound an instant
        deadline = time.monotonic() + 5.0
        while True:
            try:
                return self._start(c["sid"], c["id"], c["language"], c["cwd"], c["default"])
            except RuntimeUnavailable:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def remove_context(self, sid: str, context: str) -> None:
        c = self._context(sid, context, None)
        self._forget(c["sid"], c["id"])
        if not self._ask(c["sid"], "kill", c["id"]).get("killed"):
            raise NotFound(f"sandbox {c['sid']} has no code context {context}")

    # ---- executions ----------------------------------------------------------------------------
    def run_code(self, sid: str, code: str, *, context: str | None = None, language: str | None = None,
                 env: dict | None = None, timeout: float | None = None, on_output=None, cancel=None) -> dict:
        """Run `code` in a context (default: the language's default context); the execution:
        {results, logs: {stdout, stderr}, error, execution_count, context, timed_out}.
        on_output(message): each message as it comes (kernel.py.in's shapes, "done" left out), after
        {"type": "start", "context"} once the code is on its way (no error before it)."""
        if not isinstance(code, str):
            raise InvalidInput("code must be text")
        if context is not None and language is not None:
            raise InvalidInput("give a context or a language, not both (a context has its language)")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise InvalidInput(f"timeout must be a positive number of seconds, not {timeout!r}")
        env = {str(k): str(v) for k, v in (env or {}).items()}
        c = self._context(sid, context, language)
        execution = {"results": [], "logs": {"stdout": [], "stderr": []}, "error": None, "execution_count": None,
                     "context": c["id"], "timed_out": False}
        with self._lock(c["sid"], c["id"]):
            self.sandboxes.touch(c["sid"])            # its idle timeout counts from here
            relay = Relay(self._program(c["sid"], "relay", c["id"]))
            try:
                self._run(relay, c, code, env, timeout, on_output, cancel, execution)
            finally:
                relay.close()
        if execution["timed_out"] and execution["error"] is not None and execution["error"]["name"] == "KeyboardInterrupt":
            execution["error"]["value"] = f"the code ran past its timeout ({timeout:g} s) and was interrupted"
        return execution

    def _run(self, relay: Relay, c: dict, code, env, timeout, on_output, cancel, execution) -> None:
        try:
            relay.proc.stdin.write((json.dumps({"code": code, "env": env}) + "\n").encode("utf-8"))
            relay.proc.stdin.flush()
        except (OSError, ValueError):
            pass                                   # (the relay ended: its answer says why)
        if on_output is not None:                  # (a streaming adapter answers its headers now)
            on_output({"type": "start", "context": c["id"]})
        grace = D.INTERPRETER_INTERRUPT_GRACE
        deadline = time.monotonic() + timeout if timeout else None
        interrupted = None                         # when the interrupt was sent
        while True:
            now = time.monotonic()
            if interrupted is None and ((deadline is not None and now >= deadline)
                                        or (cancel is not None and cancel.is_set())):
                execution["timed_out"] = deadline is not None and now >= deadline
                interrupted = now
                relay.signal(signal.SIGINT)
            elif interrupted is not None and now >= interrupted + grace:
                relay.signal(signal.SIGTERM)       # the relay kills the kernel
                self._died(c, execution, killed=True)
                return
            until = [now + 0.2] + ([deadline] if deadline is not None and interrupted is None else []) + \
                ([interrupted + grace] if interrupted is not None else [])
            msg = relay.next(min(until))
            if msg is None:
                if relay.eof:
                    self._died(c, execution)
                    return
                continue
            kind = msg.get("type")
            if kind == "done":
                return
            if kind == "gone":                     # the kernel ended since: it was removed, or died
                self._forget(c["sid"], c["id"])
                if c.get("default") or self._alive(c):
                    self._died(c, execution)
                    return
                raise NotFound(f"sandbox {c['sid']} has no code context {c['id']}")
            self._take(execution, msg)
            if on_output is not None:
                on_output(msg)

    @staticmethod
    def _take(execution: dict, msg: dict) -> None:
        kind = msg.get("type")
        if kind in ("stdout", "stderr"):
            execution["logs"][kind].append(msg.get("text", ""))
        elif kind == "result":
            execution["results"].append({k: v for k, v in msg.items() if k != "type"})
        elif kind == "error":
            execution["error"] = {k: msg.get(k, "") for k in ("name", "value", "traceback")}
        elif kind == "number_of_executions":
            execution["execution_count"] = msg.get("execution_count")

    def _alive(self, c: dict) -> bool:
        return any(o["id"] == c["id"] for o in self._found(c["sid"]))

    def _died(self, c: dict, execution: dict, killed: bool = False) -> None:
        """The kernel ended mid-execution (killed past the interrupt's grace, or it exited): the
        context starts afresh (a new kernel under the same ID)."""
        why = ("the code did not stop when interrupted: its kernel was killed" if killed else
               "the kernel exited")
        execution["error"] = {"name": "KernelRestarted" if killed else "KernelDied",
                              "value": f"{why}; the context's state is lost", "traceback": ""}
        if killed:
            self._ask(c["sid"], "kill", c["id"])
        try:
            self._restart(c)
        except Exception:                          # noqa: BLE001 - the sandbox ended, or python3 cannot start
            pass
