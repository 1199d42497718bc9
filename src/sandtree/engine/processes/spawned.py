"""The processes of a live sandbox (or of a live run: Contree's subprocesses): one started without
waiting (its pipes pumped by threads), what it wrote kept to the output cap, how it ended, and its
view as the table's rows answer it (sandbox_spawn / sandbox_stdin / sandbox_signal /
sandbox_process, processes/instances.py). A process of a live run that ended is told from the run's events
(fold_process)."""

from __future__ import annotations

import base64
import json
import os
import signal as signal_mod
import threading
import time

from ...errors import CommandNotFound, InvalidInput, NotFound, SandboxError

__all__ = ["Process", "signal_number", "start_error", "usage_of", "fold_process", "public_view"]


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
        self.dropped = {"stdout": 0, "stderr": 0}        # bytes read past the cap (Contree's `truncated`)
        self.stdin_open = stdin_open
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.timed_out = False
        self.lock = threading.Lock()              # stdin writes, one at a time
        self.done = threading.Event()
        self.master: int | None = None            # its terminal's host side (terminal.py), if it has one
        self.listeners: list = []                 # on_output(stream, chunk) of its followers (instances.follow)
        self.heard = threading.Lock()             # output kept and told to followers, one chunk at a time

    def hear(self, stream: str, chunk: bytes) -> bytes:
        """A chunk it wrote: told to its followers (all of it), kept within the cap; the part kept."""
        with self.heard:
            for listener in self.listeners:
                listener("pty" if self.master is not None else stream, chunk)
            return self.keep(stream, chunk)

    def listen(self, on_output, replay: bool) -> None:
        """Tell on_output what it writes from now on (replay: what it kept so far first)."""
        with self.heard:
            if replay:
                for stream in ("stdout", "stderr"):
                    if self.output[stream]:
                        on_output("pty" if self.master is not None else stream, bytes(self.output[stream]))
            self.listeners.append(on_output)

    def unlisten(self, on_output) -> None:
        with self.heard:
            if on_output in self.listeners:
                self.listeners.remove(on_output)

    def keep(self, stream: str, chunk: bytes) -> bytes:
        """The part of chunk within the cap (the rest is counted as cut)."""
        buf = self.output[stream]
        room = max(0, self.cap - len(buf))
        if len(chunk) > room:
            self.cut[stream] = True
            self.dropped[stream] += len(chunk) - room
            chunk = chunk[:room]
        buf += chunk
        return chunk

    def view(self) -> dict:
        return {"spid": self.spid, "argv": self.argv, "command": self.shown, "running": not self.done.is_set(),
                "exit_code": self.exit_code, "signal": self.signal, "timed_out": self.timed_out,
                "stdout": bytes(self.output["stdout"]), "stderr": bytes(self.output["stderr"]),
                "stdout_truncated": self.cut["stdout"], "stderr_truncated": self.cut["stderr"],
                "stdin_open": self.stdin_open, "started": self.started, "finished": self.finished, **self.spec}


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


def public_view(v: dict) -> dict:
    """A process view as the rows answer it (JSON): output as text (UTF-8, bad bytes replaced) and
    exactly, as base64."""
    out = {("pid" if k == "spid" else k): v[k] for k in v if k not in ("stdout", "stderr")}
    for s in ("stdout", "stderr"):
        out[s] = bytes(v[s]).decode("utf-8", "replace")
        out[s + "_base64"] = base64.b64encode(bytes(v[s])).decode()
    return out
