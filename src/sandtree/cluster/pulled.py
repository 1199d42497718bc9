"""A node's streamed calls for a caller that cannot take Ray generator methods: Ray Client
(`ray://`) refuses them ("Streaming actor methods are not currently supported when using Ray
Client", ray/util/client/worker.py). Such a caller opens the stream and pulls its items instead
(Node.pull): the node drives the generator (run_streamed, call_streamed, live_run, popen) in a
thread of its own and keeps its items until pulled; each pull returns what came, waiting up to
`wait` s for the first. The items and their order are the generator's, so the API side handles
both ways alike (fabric.py).

A stream whose caller stopped pulling (its API process died) is dropped after ABANDONED_S: its
items are no longer kept; the work itself ends as it would with a generator call whose caller
died (a run finishes and commits; a terminal ends when its keepalive stops, terminals.py).
"""

from __future__ import annotations

import queue
import threading
import time

from ..errors import NotFound

__all__ = ["Pulled", "ABANDONED_S"]

ABANDONED_S = 60.0


class _Stream:
    def __init__(self, items):
        self.items = items
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.pulling = 0
        self.seen = time.monotonic()
        self.abandoned = False
        self.error: BaseException | None = None   # raised by the next pull


class Pulled:
    def __init__(self):
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}

    def open(self, key: str, items) -> None:
        """Stream `key`: the iterator `items`, driven from now on."""
        s = _Stream(items)
        with self._lock:
            self._drop_abandoned()
            self._streams[key] = s
        threading.Thread(target=self._drive, args=(s,), name=f"sandtree-node-pulled-{key[:8]}", daemon=True).start()

    def _drive(self, s: _Stream) -> None:
        try:
            for item in s.items:
                if s.abandoned:
                    s.items.close()
                    return
                s.queue.put((True, item))
            s.queue.put((False, None))
        except BaseException as exc:       # noqa: BLE001 - the caller's next pull raises it
            s.queue.put((False, exc))

    def pull(self, key: str, wait: float) -> tuple[list, bool]:
        """(the items of stream `key` since the last pull, whether it ended); waits up to `wait`
        s for the first. Raises what the stream raised (after its items before that)."""
        with self._lock:
            s = self._streams.get(key)
            if s is None:
                raise NotFound(f"no stream {key} on this node (ended, or dropped after {ABANDONED_S:.0f} s unpulled)")
            s.pulling += 1
        try:
            return self._take(key, s, wait)
        finally:
            with self._lock:
                s.pulling -= 1
                s.seen = time.monotonic()

    def _take(self, key: str, s: _Stream, wait: float) -> tuple[list, bool]:
        if s.error is not None:
            self._end(key)
            raise s.error
        try:
            got = [s.queue.get(timeout=wait)]
        except queue.Empty:
            return [], False
        while True:                     # what came meanwhile: one answer for many items
            try:
                got.append(s.queue.get_nowait())
            except queue.Empty:
                break
        out = []
        for more, value in got:
            if more:
                out.append(value)
            elif value is None:
                self._end(key)
                return out, True
            elif out:                   # its items first, its error at the next pull
                s.error = value
                return out, False
            else:
                self._end(key)
                raise value
        return out, False

    def _end(self, key: str) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def _drop_abandoned(self) -> None:
        """(under the lock) streams nobody pulled for ABANDONED_S."""
        now = time.monotonic()
        for key, s in list(self._streams.items()):
            if s.pulling == 0 and now - s.seen > ABANDONED_S:
                s.abandoned = True
                del self._streams[key]
