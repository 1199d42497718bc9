"""A spawned process whose stdio a holder inside the sandbox keeps (runtime/hold.c), so the
sandbox can hibernate while it runs and it goes on after the resume (instances.py spawns a plain
live sandbox's processes so, terminals aside).

The command is the child of the holder H, a process of the sandbox's own; the engine talks to H
through a relay R it starts in the sandbox (popen: `--hold` for the first, which also starts H;
on gVisor `--await` beside the agent's `--start` of H; `--attach` after), in frames (hold.c). release() lets R go before a hibernation (H keeps what the
command writes meanwhile) and attach() starts another after the resume; anything that asks while
it is let go attaches first (a resume by another engine process). Held is the `proc` of a
spawned.Process: Popen's shape (wait, poll, send_signal, kill) plus write and close_stdin.
"""

from __future__ import annotations

import os
import struct
import subprocess
import threading
import uuid

from ...errors import Conflict, NotFound
from ...runtime.popenlike import PopenLike

__all__ = ["Held", "NotAHolder", "spawn_held"]

_HEAD = struct.Struct("=II")
_WATCH = 1.0                 # seconds between looks at the sandbox while let go (did it stop?)
_LET_GO = 5.0                # seconds a released relay is given to end
_MAX_FRAME = 1 << 16         # hold.c's largest frame


class NotAHolder(Exception):
    """The program started as the holder did not answer as one (a sandbox whose agent predates
    hold.c): the caller starts the command the direct way."""


def _frames(f):
    """(type, data) from a relay's stdout until EOF (a cut frame ends it too)."""
    while True:
        head = f.read(_HEAD.size)
        if len(head) < _HEAD.size:
            return
        kind, n = _HEAD.unpack(head)
        if n > _MAX_FRAME:                     # (not the holder's: the sandbox's own garbage)
            return
        data = f.read(n) if n else b""
        if len(data) < n:
            return
        yield chr(kind) if kind < 0x110000 else "?", data


def _hello(relay) -> tuple[int, int] | None:
    head = relay.stdout.read(_HEAD.size)
    if len(head) < _HEAD.size:
        return None
    kind, n = _HEAD.unpack(head)
    if kind != ord("h") or n != 8:
        raise NotAHolder()
    return struct.unpack("=II", relay.stdout.read(8))


def _end_relay(relay, patient: bool = False) -> None:
    """Close the engine's ends of a relay and reap it. patient (a reader's, off every caller's
    path): a blocking wait, which, unlike a wait with a timeout (a poll loop), does not wake this
    process while the relay finishes (it ends once its holder let go, or with its sandbox)."""
    for f in (relay.stdin, relay.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
    try:
        relay.wait(None if patient else _LET_GO)
    except subprocess.TimeoutExpired:
        relay.kill()
        relay.wait()


def _relay(sandboxes, sid: str, argv: list[str], **ids):
    """popen of a relay: pipes all three (so a helper entered ahead takes it, the fast way); its
    stderr, which says nothing the frames do not, is closed at once."""
    relay = sandboxes.popen(sid, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **ids)
    relay.stderr.close()
    relay.stderr = None
    return relay


def spawn_held(sandboxes, sid: str, argv: list[str], *, env, cwd, uid, gid) -> "Held":
    """Start argv held (its holder's program: sandboxes.holder(sid)); NotAHolder when that
    program is not one (then nothing runs)."""
    key = uuid.uuid4().hex
    spawners = getattr(sandboxes, "spawners", None)
    direct = spawners.spawn(sid, key, argv, env=env, cwd=cwd, uid=uid, gid=gid) if spawners is not None else None
    if direct is not None:
        # the sandbox's spawner forked its holder (spawner.py): the holder talks to us directly
        held = Held(sandboxes, sid, key, uid, gid, direct)
        held.greeted = False
        return held
    path, by_exec = sandboxes.holder(sid)
    if by_exec:
        # H started by pid 1's agent; its relay (runsc exec: the slow part) started meanwhile, which
        # waits a moment for H to listen
        relay = _relay(sandboxes, sid, [path, "--await", key], uid=uid, gid=gid, cwd="/")
        try:
            rec = sandboxes.exec(sid, [path, "--start", key, "--", *argv], env=env, cwd=cwd, uid=uid, gid=gid)
            if rec.exit_code != 0 or rec.stdout:
                raise NotAHolder()             # (an older agent: "ready", then EOF)
        except BaseException:
            relay.kill()
            _end_relay(relay)
            raise
        held = Held(sandboxes, sid, key, uid, gid, relay)
        held.greeted = False
        return held
    # the engine's own copy of the program: its hello is read with the frames (not waited for here)
    relay = _relay(sandboxes, sid, [path, "--hold", key, "--", *argv], env=env, cwd=cwd, uid=uid, gid=gid)
    held = Held(sandboxes, sid, key, uid, gid, relay)
    held.greeted = False
    return held


class Held(PopenLike):
    def __init__(self, sandboxes, sid: str, key: str, uid, gid, relay):
        self.sandboxes, self.sid, self.key, self.uid, self.gid = sandboxes, sid, key, uid, gid
        self.stdin = self.stdout = self.stderr = None
        self.report: dict = {}
        self.returncode: int | None = None
        self.on_output = None                  # (stream, chunk): set by the owner, then start()
        self.lock = threading.Lock()           # frames out, and the relay's change
        self.ended = threading.Event()
        self.relay = relay
        self.reader: threading.Thread | None = None
        self.greeted = True                    # its relay's hello read (spawn_held's first is read with the frames)

    def start(self, on_output) -> None:
        with self.lock:
            self.on_output = on_output
            relay = self.relay
        if relay is not None:
            self._read_from(relay)

    # ---- frames in -------------------------------------------------------------------------------
    def _read_from(self, relay) -> None:
        self.reader = threading.Thread(target=self._read, args=(relay,), daemon=True, name="sandtree-held")
        self.reader.start()

    def _read(self, relay) -> None:
        if not self.greeted:
            try:
                hello = _hello(relay)
            except (NotAHolder, OSError, ValueError, struct.error):
                hello = None
            self.greeted = True
            if hello is None:                  # it never started: the relay's own failure (its cwd)
                self._never_started(relay)
                return
        try:
            for kind, data in _frames(relay.stdout):
                if self.ended.is_set():
                    break
                if kind == "o" or kind == "e":
                    self.on_output("stdout" if kind == "o" else "stderr", data)
                elif kind == "f" and len(data) >= 4:
                    step = data[4:].decode("ascii", "replace") or "fork"
                    self.report = {"execfail": (struct.unpack("=I", data[:4])[0], step)}
                elif kind == "x" and len(data) == 4:
                    self._finish(os.waitstatus_to_exitcode(struct.unpack("=I", data)[0]))
                    break
        except (OSError, ValueError):
            pass                               # (closed under us: a release that gave up waiting)
        with self.lock:
            mine = self.relay is relay
            if mine:
                self.relay = None
        _end_relay(relay, patient=self.ended.is_set())
        if mine and not self.ended.is_set():
            self._lost()

    def _never_started(self, relay) -> None:
        with self.lock:
            self.relay = None
        _end_relay(relay)
        report = dict(relay.report)
        if report.get("execfail", (0, ""))[1] == "exec":
            # the holder's copy was removed from the sandbox's /dev/shm: the next spawn writes another
            report["execfail"] = (report["execfail"][0], "holder")
            try:
                self.sandboxes.holder(self.sid, again=True)
            except Exception:                  # noqa: BLE001 - (the sandbox stopped meanwhile)
                pass
        self.report = report
        rc = relay.returncode
        self._finish(rc if rc is not None else 127)

    def _finish(self, rc: int) -> None:
        self.returncode = rc
        self.ended.set()

    def _lost(self) -> None:
        """Its relay ended unasked: the sandbox stopped (it ends with it), or hibernated (it waits
        for the resume), or only the relay was killed (another takes its place)."""
        state = self._state()
        if state == "running":
            try:
                self.attach()
                return
            except Exception:                  # noqa: BLE001 - it stopped meanwhile: ended below
                state = self._state()
        if state != "hibernated":
            self._finish(-9)

    def _state(self) -> str:
        try:
            return self.sandboxes.info(self.sid)["state"]
        except NotFound:
            return "gone"

    # ---- its relay -------------------------------------------------------------------------------
    def release(self) -> None:
        """Let its relay go (before a hibernation): the holder keeps the command and what it writes."""
        with self.lock:
            relay, self.relay, reader = self.relay, None, self.reader
        if relay is None:
            return
        try:
            relay.stdin.close()                # R lets go; H closes its end; R ends; its EOF here
        except OSError:
            pass
        if reader is not None and reader is not threading.current_thread():
            reader.join(_LET_GO)
        _end_relay(relay)

    def attach(self) -> None:
        """A relay to its holder again (after a resume); Conflict if the sandbox is not running.
        A holder that is gone (the sandbox was restarted without it) ends it as killed."""
        with self.lock:
            if self.relay is not None or self.ended.is_set():
                return
            path, _ = self.sandboxes.holder(self.sid)
            relay = _relay(self.sandboxes, self.sid, [path, "--attach", self.key], uid=self.uid, gid=self.gid,
                           cwd="/")
            try:
                hello = _hello(relay)
            except NotAHolder:
                hello = None
            if hello is None:
                _end_relay(relay)
                self._finish(-9)
                return
            self.relay = relay
            if self.on_output is None:
                return                         # (the first: start() reads it)
        self._read_from(relay)

    def _send(self, *frames: tuple[str, bytes]) -> None:
        """Frames to the holder, in one write (data and its close come together: a command that
        reads its input and exits cannot end the holder between them)."""
        if self.relay is None and not self.ended.is_set():
            self.attach()                      # (resumed elsewhere: Conflict while hibernated)
        with self.lock:
            if self.ended.is_set():
                raise BrokenPipeError("the process has exited")
            if self.relay is None:
                raise Conflict(f"sandbox {self.sid} is not running")
            out = bytearray()
            for kind, data in frames:
                for off in range(0, max(len(data), 1), _MAX_FRAME):
                    part = data[off:off + _MAX_FRAME]
                    out += _HEAD.pack(ord(kind), len(part)) + part
            self.relay.stdin.write(out)
            self.relay.stdin.flush()

    # ---- Popen's shape -----------------------------------------------------------------------------
    def write(self, data: bytes, *, close: bool = False) -> None:
        """data to the command's stdin, then (close) its end. BrokenPipeError: the command has
        exited (its holder left), so the data did not reach it."""
        frames = [("i", bytes(data))] if data else []
        if not close:
            if frames:
                self._send(*frames)
            return
        try:
            self._send(*frames, ("c", b""))
        except BrokenPipeError:
            if frames:
                raise
            # a close alone: the command exited and its holder left before the engine read the
            # exit; there is nothing left to close (as closing a pipe whose reader has gone)

    def close_stdin(self) -> None:
        self.write(b"", close=True)

    def send_signal(self, sig: int) -> None:
        try:
            self._send(("k", struct.pack("=I", int(sig))))
        except (BrokenPipeError, OSError):
            pass                               # (it exited meanwhile)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        waited, slept = 0.0, False
        while not self.ended.wait(_WATCH):
            waited += _WATCH
            state = self._state() if self.relay is None else "attached"
            if state == "hibernated":
                slept = True
            elif state == "running" and slept:
                slept = False                  # resumed by another engine process: its followers go on
                try:
                    self.attach()
                except Exception:              # noqa: BLE001 - (attached when next asked)
                    pass
            elif state not in ("running", "attached"):
                self._finish(-9)               # let go, and its sandbox stopped meanwhile
            if timeout is not None and waited >= timeout and not self.ended.is_set():
                raise subprocess.TimeoutExpired("held process", timeout)
        return self.returncode
