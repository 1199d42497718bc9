"""Things made ahead of demand, for the few keys this process used last: one thread makes what is
wanted and not ready, a take hands one over, and what is no longer wanted is thrown away. The
base of warm/helpers.py (helpers entered into live sandboxes before an exec) and warm/sandboxes.py (live
sandboxes started before a start). A subclass says how one is made (`_make`, None: it cannot be,
stop wanting it) and thrown away (`_discard`); `_want` is called with the lock held."""

from __future__ import annotations

import threading


class KeptAhead:
    KEEP = 4                  # keys kept wanted, most recent last; older ones are dropped
    NAME = "sandtree-ahead"   # the making thread's name

    def __init__(self):
        self.ready: dict[str, object] = {}
        self.want: dict[str, object] = {}            # key -> what to make, most recent last
        self.cv = threading.Condition()
        self.closed = False
        self.thread: threading.Thread | None = None

    def _make(self, key: str, wanted):
        raise NotImplementedError

    def _discard(self, made) -> None:
        raise NotImplementedError

    def _want(self, key: str, wanted) -> None:
        """(Lock held.) Want `wanted` under `key` from now on (the most recent), dropping the oldest
        keys past KEEP and what was made for them, and start the thread."""
        self.want.pop(key, None)
        self.want[key] = wanted
        while len(self.want) > self.KEEP:
            old = next(iter(self.want))
            self.want.pop(old)
            drop = self.ready.pop(old, None)
            if drop is not None:               # (off the caller's path)
                threading.Thread(target=self._discard, args=(drop,), daemon=True).start()
        if self.thread is None and not self.closed:
            self.thread = threading.Thread(target=self._loop, name=self.NAME, daemon=True)
            self.thread.start()
        self.cv.notify_all()

    def forget(self, key: str) -> None:
        with self.cv:
            self.want.pop(key, None)
            got = self.ready.pop(key, None)
        if got is not None:
            self._discard(got)

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.closed and not (set(self.want) - set(self.ready)):
                    self.cv.wait()
                if self.closed:
                    return
                todo = {k: v for k, v in self.want.items() if k not in self.ready}
            for key, wanted in todo.items():
                try:
                    made = self._make(key, wanted)
                except Exception:                  # noqa: BLE001 - the caller makes its own then
                    made = None
                with self.cv:
                    still = key in self.want and self.want[key] == wanted
                    if made is not None and still and not self.closed:
                        self.ready[key] = made
                        made = None
                    elif made is None and still:
                        self.want.pop(key, None)    # it cannot be made: stop trying
                if made is not None:
                    self._discard(made)

    def close(self, join: float = 30.0) -> None:
        with self.cv:
            self.closed = True
            left, self.ready = list(self.ready.values()), {}
            self.cv.notify_all()
        for made in left:
            self._discard(made)
        if self.thread is not None:
            self.thread.join(timeout=join)
