"""The code interpreter of live sandboxes: code run in contexts whose state persists between
calls (the table's sandbox_run_code and sandbox_code_context_* rows; E2B's `run_code` is one
adapter of them, http/e2b/interpreter.py).

A context is one kernel: kernel.py.in's source run by the image's python3 as a process of the
sandbox (sandboxes.popen: pipes to it, nothing written into its filesystem). An execution sends
the code on the kernel's stdin and reads its messages (kernel.py.in's doc) until "done": stdout and
stderr as the code writes them (on_output gets each as it comes), results (the last expression's
value with its _repr_*_ formats, display() calls, matplotlib figures as PNG), an error with its
name, value and traceback. One execution at a time per context (another waits, as Jupyter
queues them). A timeout or a cancel interrupts the code (SIGINT: KeyboardInterrupt, the
context's state kept); code that ignores the interrupt for defaults.INTERPRETER_INTERRUPT_GRACE has its kernel
killed: the context starts afresh (a new kernel under its ID), which its error says.

Each sandbox has a default context per language, made on first use; others are made by
create_context (their own cwd). Contexts belong to this engine process (their kernels' pipes are
its own): they end with the sandbox, or with the server. Languages: python only (the kernel);
another is refused with InvalidInput naming what is available.
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
_SOURCE: str | None = None


def kernel_source() -> str:
    """kernel.py.in's text: the program a context runs (python3 -c)."""
    global _SOURCE
    if _SOURCE is None:
        with open(os.path.join(os.path.dirname(__file__), "kernel.py.in"), encoding="utf-8") as f:
            _SOURCE = f.read()
    return _SOURCE


class Kernel:
    """One context: its process in the sandbox and the reader of its messages."""

    def __init__(self, sid: str, cid: str, language: str, cwd: str, proc, default: bool):
        self.sid, self.id, self.language, self.cwd, self.proc, self.default = sid, cid, language, cwd, proc, default
        self.lock = threading.Lock()            # one execution at a time
        self.cond = threading.Condition()
        self.inbox: list[dict] = []             # messages not yet taken by the execution
        self.eof = False
        self.spent = False                      # killed or exited: a new one takes its place
        self.stderr = bytearray()               # what the kernel itself wrote before its pipes
        threading.Thread(target=self._read, daemon=True, name=f"sandtree-kernel-{cid[:8]}").start()
        threading.Thread(target=self._read_stderr, daemon=True, name=f"sandtree-kernel-{cid[:8]}-err").start()

    def view(self) -> dict:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

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
        """The kernel's next message; None at its end or when `deadline` (monotonic) passes."""
        with self.cond:
            while not self.inbox and not self.eof:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.cond.wait(left if left is None else min(left, 0.5))
            return self.inbox.pop(0) if self.inbox else None

    def interrupt(self) -> None:
        try:
            self.proc.send_signal(signal.SIGINT)
        except (OSError, ProcessLookupError):
            pass

    def kill(self) -> None:
        self.spent = True
        try:
            self.proc.kill()
        except (OSError, ProcessLookupError):
            pass
        for f in (self.proc.stdin,):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(5.0)
        except Exception:                       # noqa: BLE001 - it dies with its sandbox in any case
            pass


class Interpreter:
    """The contexts of every live sandbox this engine process serves. sandboxes: engine.sandboxes
    (info, popen)."""

    def __init__(self, sandboxes):
        self.sandboxes = sandboxes
        self.kernels: dict[str, dict[str, Kernel]] = {}     # sandbox id -> context id -> its kernel
        self.lock = threading.Lock()

    # ---- contexts ------------------------------------------------------------------------------
    def _sandbox(self, sid: str) -> dict:
        info = self.sandboxes.info(sid)          # NotFound for an unknown sandbox
        if info["state"] != "running":
            raise Conflict(f"sandbox {info['id']} is {info['state']}, not running", state=info["state"])
        with self.lock:                          # forget the contexts of sandboxes that ended
            for other in [s for s in self.kernels if s != info["id"]]:
                if all(k.eof for k in self.kernels[other].values()):
                    del self.kernels[other]
        return info

    @staticmethod
    def _language(language: str | None) -> str:
        lang = (language or "python").strip().lower()
        if lang not in LANGUAGES:
            raise InvalidInput(f"language {language!r} is not available: the code interpreter runs "
                               f"{', '.join(LANGUAGES)} (the image's python3)")
        return lang

    def _start(self, info: dict, cid: str, language: str, cwd: str, default: bool) -> Kernel:
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
        if not self.sandboxes.exists(info["id"], cwd):
            raise InvalidInput(f"cwd {cwd} does not exist in sandbox {info['id']}")
        try:
            proc = self.sandboxes.popen(info["id"], ["python3", "-u", "-c", kernel_source()], cwd=cwd,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except InvalidInput as e:                 # (python3 missing: CommandNotFound)
            raise InvalidInput(f"the code interpreter needs python3 in the sandbox's image: {e}") from None
        k = Kernel(info["id"], cid, language, cwd, proc, default)
        first = k.next(time.monotonic() + D.INTERPRETER_START_WAIT)
        if first is None or first.get("type") != "ready":
            k.kill()
            said = bytes(k.stderr).decode("utf-8", "replace").strip()
            if proc.poll() == 127 or "not found" in said or "No such file" in said:
                raise InvalidInput("the code interpreter needs python3 in the sandbox's image; "
                                   f"it did not start{': ' + said[-500:] if said else ''}")
            raise RuntimeUnavailable(f"the code interpreter's kernel did not start in sandbox {info['id']}"
                                     f"{': ' + said[-500:] if said else ''}")
        return k

    def _context(self, sid: str, context: str | None, language: str | None) -> Kernel:
        """The kernel that runs code in `context` (an ID), or in the language's default context."""
        info = self._sandbox(sid)
        with self.lock:
            mine = self.kernels.setdefault(info["id"], {})
            if context is not None:
                k = mine.get(context)
                if k is None:
                    raise NotFound(f"sandbox {info['id']} has no code context {context}")
                return k
            lang = self._language(language)
            k = next((k for k in mine.values() if k.default and k.language == lang), None)
            if k is not None:
                return k
        k = self._start(info, uuid.uuid4().hex, lang, info.get("cwd") or "/", True)
        with self.lock:
            had = next((o for o in mine.values() if o.default and o.language == lang), None)
            if had is not None:                  # another call made it meanwhile: keep one
                k.kill()
                return had
            mine[k.id] = k
        return k

    def create_context(self, sid: str, *, language: str | None = None, cwd: str | None = None) -> dict:
        info = self._sandbox(sid)
        k = self._start(info, uuid.uuid4().hex, self._language(language), cwd or info.get("cwd") or "/", False)
        with self.lock:
            self.kernels.setdefault(info["id"], {})[k.id] = k
        return k.view()

    def contexts(self, sid: str) -> list[dict]:
        info = self._sandbox(sid)
        with self.lock:
            return [k.view() for k in self.kernels.get(info["id"], {}).values()]

    def restart_context(self, sid: str, context: str) -> dict:
        """The context's state is dropped: a new kernel in its place (same ID, language, cwd)."""
        k = self._context(sid, context, None)
        with k.lock:                             # after an execution running in it
            k.kill()
            new = self._start(self._sandbox(sid), k.id, k.language, k.cwd, k.default)
            with self.lock:
                self.kernels.setdefault(k.sid, {})[k.id] = new
        return new.view()

    def remove_context(self, sid: str, context: str) -> None:
        k = self._context(sid, context, None)
        with self.lock:
            self.kernels.get(k.sid, {}).pop(k.id, None)
        k.interrupt()
        with k.lock:
            k.kill()

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
        k = self._context(sid, context, language)
        execution = {"results": [], "logs": {"stdout": [], "stderr": []}, "error": None, "execution_count": None,
                     "context": k.id, "timed_out": False}
        with k.lock:
            if k.spent:                          # restarted or removed while this call waited
                raise Conflict(f"code context {k.id} was restarted or removed; run the code again")
            self.sandboxes.touch(k.sid)            # its idle timeout counts from here
            try:
                k.proc.stdin.write((json.dumps({"code": code, "env": env}) + "\n").encode("utf-8"))
                k.proc.stdin.flush()
            except (OSError, ValueError):
                k.eof = True
            if on_output is not None:              # (a streaming adapter answers its headers now)
                on_output({"type": "start", "context": k.id})
            deadline = time.monotonic() + timeout if timeout else None
            interrupted = None                    # when the interrupt was sent
            while True:
                now = time.monotonic()
                if interrupted is None and ((deadline is not None and now >= deadline)
                                            or (cancel is not None and cancel.is_set())):
                    execution["timed_out"] = deadline is not None and now >= deadline
                    interrupted = now
                    k.interrupt()
                elif interrupted is not None and now >= interrupted + D.INTERPRETER_INTERRUPT_GRACE:
                    self._died(k, execution, killed=True)
                    break
                until = [now + 0.2] + ([deadline] if deadline is not None and interrupted is None else []) + \
                    ([interrupted + D.INTERPRETER_INTERRUPT_GRACE] if interrupted is not None else [])
                msg = k.next(min(until))
                if msg is None:
                    if k.eof:
                        self._died(k, execution)
                        break
                    continue
                kind = msg.get("type")
                if kind == "done":
                    break
                self._take(execution, msg)
                if on_output is not None:
                    on_output(msg)
        if execution["timed_out"] and execution["error"] is not None and execution["error"]["name"] == "KeyboardInterrupt":
            execution["error"]["value"] = f"the code ran past its timeout ({timeout:g} s) and was interrupted"
        return execution

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

    def _died(self, k: Kernel, execution: dict, killed: bool = False) -> None:
        """The kernel ended mid-execution (killed past the interrupt's grace, or it exited): the
        context starts afresh (a new kernel under the same ID)."""
        k.kill()
        code = k.proc.poll()
        why = ("the code did not stop when interrupted: its kernel was killed" if killed else
               f"the kernel exited (status {code})")
        execution["error"] = {"name": "KernelRestarted" if killed else "KernelDied",
                              "value": f"{why}; the context's state is lost",
                              "traceback": bytes(k.stderr).decode("utf-8", "replace")[-2000:]}
        try:                                      # the context keeps its ID for the next call
            new = self._start(self._sandbox(k.sid), k.id, k.language, k.cwd, k.default)
        except Exception:                         # noqa: BLE001 - the sandbox ended, or the kernel cannot start
            new = None
        with self.lock:
            mine = self.kernels.get(k.sid, {})
            if mine.get(k.id) is k:
                if new is not None:
                    mine[k.id] = new
                else:
                    del mine[k.id]
            elif new is not None:                 # removed meanwhile
                new.kill()
