"""Helpers entered ahead: the slow part of a live exec (joining a sandbox's cgroups and
namespaces) done before the command comes, for the sandboxes this process used last.
Used by sandboxes.py's exec; the helpers themselves are runtime/live.py's."""

from __future__ import annotations

import threading

from ..runtime.base import LiveTier
from ..runtime.liveproc import LiveHandle


class Ahead:
    """For each of the last KEEP live sandboxes this process exec'd in, one helper already inside it (cgroups joined,
    namespaces entered: the slow part of an exec), prepared after each exec by one long-lived
    thread (the helpers die with the thread that forked them)."""

    KEEP = 32

    def __init__(self, live: LiveTier):
        self.live = live
        self.ready: dict[str, tuple[LiveHandle, object]] = {}
        self.want: dict[str, LiveHandle] = {}
        self.cv = threading.Condition()
        self.closed = False
        self.thread: threading.Thread | None = None

    def take(self, sid: str, handle: LiveHandle):
        with self.cv:
            got = self.ready.pop(sid, None)
            self.want.pop(sid, None)
            self.want[sid] = handle                 # most recent last
            while len(self.want) > self.KEEP:       # a helper (and 5 fds) per sandbox: only the recent
                old = next(iter(self.want))
                self.want.pop(old)
                drop = self.ready.pop(old, None)
                if drop is not None:
                    threading.Thread(target=drop[1].discard, daemon=True).start()
            if self.thread is None and not self.closed:
                self.thread = threading.Thread(target=self._loop, name="sandtree-enter", daemon=True)
                self.thread.start()
            self.cv.notify_all()
        if got is None:
            return None
        if got[0] != handle or not self.live.alive(handle):
            got[1].discard()
            return None
        return got[1]

    def forget(self, sid: str) -> None:
        with self.cv:
            self.want.pop(sid, None)
            got = self.ready.pop(sid, None)
        if got is not None:
            got[1].discard()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.closed and not (set(self.want) - set(self.ready)):
                    self.cv.wait()
                if self.closed:
                    return
                todo = {k: v for k, v in self.want.items() if k not in self.ready}
            for sid, h in todo.items():
                try:
                    e = self.live.enter_ahead(h) if self.live.alive(h) else None
                except Exception:                  # noqa: BLE001 - the exec enters by itself then
                    e = None
                with self.cv:
                    if e is not None and self.want.get(sid) == h and not self.closed:
                        self.ready[sid] = (h, e)
                        e = None
                    elif self.want.get(sid) == h and e is None:
                        self.want.pop(sid, None)    # gone: stop trying
                if e is not None:
                    e.discard()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            got, self.ready = list(self.ready.values()), {}
            self.cv.notify_all()
        for _, e in got:
            e.discard()
        if self.thread is not None:
            self.thread.join(timeout=10)
