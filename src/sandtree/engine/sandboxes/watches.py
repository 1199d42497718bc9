"""Directory watches of running live sandboxes (a mixin of sandboxes.Sandboxes, which provides live,
_row, _running and _check_path): inotify from the host (runtime/inotify.py), one thread of the
engine reading every watch's events into its queue, a caller taking them (waiting a while for the
first). A watch is the engine's, not the sandbox's: it lives in the process that made it (a server's
watches are its own), ends when its directory or its sandbox goes, and is removed after WATCH_IDLE
seconds nobody took its events."""

from __future__ import annotations

import collections
import os
import secrets
import selectors
import threading
import time

from ... import defaults as D
from ...errors import Ended, InvalidInput, LimitExceeded, NotFound
from ...runtime.inotify import DirWatch


class _Watch:
    def __init__(self, sid: str, dw: DirWatch):
        self.sid, self.dw = sid, dw
        self.events: collections.deque = collections.deque()
        self.dropped = 0
        self.used = time.monotonic()


class WatchHub:
    """Every watch of an engine and the thread that reads them."""

    def __init__(self):
        self.cond = threading.Condition()
        self.watches: dict[str, _Watch] = {}
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.sel.register(self.wake_r, selectors.EVENT_READ, None)
        self.closed = False
        self.thread: threading.Thread | None = None

    def add(self, sid: str, dw: DirWatch) -> str:
        wid = secrets.token_hex(8)
        with self.cond:
            if sum(1 for w in self.watches.values() if w.sid == sid) >= D.SANDBOX_WATCHES:
                dw.close()
                raise LimitExceeded(f"sandbox {sid} has {D.SANDBOX_WATCHES} watches already (remove one first)",
                                    sandbox=sid)
            self.watches[wid] = _Watch(sid, dw)
            self.sel.register(dw.fileno(), selectors.EVENT_READ, wid)
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="sandtree-watches", daemon=True)
                self.thread.start()
        return wid

    def take(self, sid: str, wid: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self.cond:
            w = self._get(sid, wid)
            self._drain(w)           # what the kernel queued already (a write just returned: its events are there)
            while not w.events and not w.dw.ended and (left := deadline - time.monotonic()) > 0:
                self.cond.wait(left)
                w = self._get(sid, wid)
            w.used = time.monotonic()
            out, dropped = list(w.events), w.dropped
            w.events.clear()
            w.dropped = 0
            if not out and w.dw.ended:
                self._drop(wid)
                raise Ended(f"watch {wid}: its directory {w.dw.path} is gone, or its sandbox stopped", watch=wid)
        return {"events": out, "dropped": dropped}

    def remove(self, sid: str, wid: str) -> None:
        with self.cond:
            self._get(sid, wid)
            self._drop(wid)

    def end_sandbox(self, sid: str) -> None:
        """Its sandbox stops: each of its watches ends (a caller waiting gets what was left, then Ended)."""
        with self.cond:
            for w in self.watches.values():
                if w.sid == sid and not w.dw.ended:
                    self._unregister(w)
                    w.dw.ended = True
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            for wid in list(self.watches):
                self._drop(wid)
        os.write(self.wake_w, b"x")

    def _get(self, sid: str, wid: str) -> _Watch:
        w = self.watches.get(wid) if isinstance(wid, str) else None
        if w is None or w.sid != sid:
            raise NotFound(f"no watch {str(wid)[:40]!r} of sandbox {sid}", watch=str(wid)[:40], sandbox=sid)
        return w

    def _unregister(self, w: _Watch) -> None:
        if w.dw.fileno() >= 0:
            try:
                self.sel.unregister(w.dw.fileno())
            except (KeyError, ValueError):
                pass
            w.dw.close()

    def _drop(self, wid: str) -> None:
        w = self.watches.pop(wid, None)
        if w is not None:
            self._unregister(w)
        self.cond.notify_all()

    def _drain(self, w: _Watch) -> None:
        """Read a watch's queued events into its deque (under the lock: one reader at a time)."""
        if w.dw.fileno() < 0:
            return
        try:
            new = w.dw.read()
        except Exception:                     # the sandbox went under it: the watch ends
            new, w.dw.ended = [], True
        w.events.extend(new)
        over = len(w.events) - D.WATCH_EVENTS
        for _ in range(max(0, over)):
            w.events.popleft()
        w.dropped += max(0, over)
        if w.dw.ended:
            self._unregister(w)

    def _run(self) -> None:
        idle_check = time.monotonic()
        while not self.closed:
            for key, _ in self.sel.select(timeout=5.0):
                if key.data is None:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                with self.cond:
                    w = self.watches.get(key.data)
                    if w is not None:
                        self._drain(w)
                    self.cond.notify_all()
            now = time.monotonic()
            if now - idle_check > 5.0:
                idle_check = now
                with self.cond:
                    for wid in [k for k, w in self.watches.items() if now - w.used > D.WATCH_IDLE]:
                        self._drop(wid)


class SandboxWatches:
    _watch_hub: WatchHub | None = None

    def _hub(self) -> WatchHub:
        if self._watch_hub is None:
            self._watch_hub = WatchHub()
        return self._watch_hub

    def watch(self, sid: str, path: str, *, recursive: bool = False) -> dict:
        """Watch a directory of the running sandbox (recursive: and every directory below it): its
        watch id, for watch_events and unwatch."""
        self._check_path(path)
        if not isinstance(recursive, bool):
            raise InvalidInput("recursive must be true or false")
        row = self._running(sid)
        handle = row["handle"]
        dw = DirWatch(lambda: (self.live.root(handle), self.live.own_mounts(handle)), path, recursive,
                      D.WATCH_DIRS)
        wid = self._hub().add(row["id"], dw)
        return {"watch": wid, "sandbox": row["id"], "path": path, "recursive": recursive}

    def watch_events(self, sid: str, watch: str, *, timeout: float = 0.0) -> dict:
        """The events of a watch since the last call ({"events": [{name, type, time}], "dropped": n}),
        waiting up to `timeout` seconds for the first; Ended once its directory or sandbox is gone and
        every event was taken."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 <= timeout <= D.WATCH_WAIT_MAX:
            raise InvalidInput(f"timeout must be 0 to {D.WATCH_WAIT_MAX} seconds", timeout=timeout)
        row = self._row(sid)
        return self._hub().take(row["id"], watch, float(timeout))

    def unwatch(self, sid: str, watch: str) -> None:
        """Stop a watch (its events not taken are dropped)."""
        row = self._row(sid)
        self._hub().remove(row["id"], watch)

    def _end_watches(self, sid: str) -> None:
        if self._watch_hub is not None:
            self._watch_hub.end_sandbox(sid)

    def _close_watches(self) -> None:
        if self._watch_hub is not None:
            self._watch_hub.close()
