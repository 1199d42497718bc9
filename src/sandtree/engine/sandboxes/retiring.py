"""Old sandboxes stopped off the path of the call that replaced them.

A gVisor hibernation's checkpoint leaves the sandbox's processes in place (paused: runsc
checkpoint --leave-running, so a hibernator killed mid-dump loses nothing). Once the checkpoint is
whole and the row says `hibernated`, stopping them (the Sentry's 100 MB freed, its cgroup
removed: 40-90 ms on 2 loaded cores) need not hold up the caller: it is done by a thread here.
The row keeps the old handle as `retiring` in its spec until that stop finished, so an engine
killed before it ends leaves a record: the next reap (any engine process), resume or stop of the
sandbox stops it. It stays paused meanwhile (nothing thaws a sandbox whose row is not
`running`), so a sandbox is never both running and hibernated.

Likewise a resumed sandbox's checkpoint (100 MB of memory: deleting it costs 18-27 ms) is renamed
`<id>.ckpt.old` on the resume's path and deleted by a thread; what a killed engine left of those
(they are never read again) goes at the next reap.
"""

from __future__ import annotations

import json
import os
import shutil
import threading

from ...runtime.liveproc import LiveHandle
from ...store.db import dumps

__all__ = ["Retiring"]

_KEY = "retiring"           # the spec's record of an old handle still to stop
_OLD = ".old"               # (suffix of) a resumed sandbox's checkpoint, to delete


class Retiring:
    def __init__(self, store, live):
        self.store, self.live = store, live
        self._threads: dict[str, threading.Thread] = {}
        self._removing: list[threading.Thread] = []     # checkpoints being deleted (discard)
        self._lock = threading.Lock()

    def later(self, sid: str, h: LiveHandle) -> None:
        """Stop h in a thread of this engine, then drop the row's record of it."""
        def stop():
            try:
                # its exit yields to a resume (live.py stop), so on busy cores it may take seconds
                self.live.stop(h, 60.0, idle=True)
                self._forget(sid, h)
            finally:
                with self._lock:
                    if self._threads.get(sid) is threading.current_thread():
                        del self._threads[sid]
        t = threading.Thread(target=stop, name=f"sandtree-retire-{sid[:8]}", daemon=True)
        with self._lock:
            self._threads[sid] = t
        t.start()

    def discard(self, checkpoint: str) -> None:
        """A checkpoint no one will read again (its sandbox was resumed from it): moved aside at
        once, deleted by a thread (files only: a checkpoint dir holds no mounts)."""
        old = checkpoint + _OLD
        try:
            os.rename(checkpoint, old)
        except FileNotFoundError:
            return
        except OSError:                      # (an old one of the same name is still there)
            shutil.rmtree(old, ignore_errors=True)
            os.rename(checkpoint, old)
        t = threading.Thread(target=shutil.rmtree, args=(old, True), name="sandtree-rm-ckpt", daemon=True)
        with self._lock:
            self._removing = [r for r in self._removing if r.is_alive()] + [t]
        t.start()

    def busy(self, sid: str) -> bool:
        with self._lock:
            t = self._threads.get(sid)
        return t is not None and t.is_alive()

    def wait(self, sid: str, timeout: float = 60.0) -> None:
        with self._lock:
            t = self._threads.get(sid)
        if t is not None:
            t.join(timeout)

    def finish(self, row: dict) -> None:
        """The row's recorded old handle, stopped now unless a thread of this engine is at it
        (its stopper died: a killed engine)."""
        stored = row["spec"].get(_KEY)
        if not stored or self.busy(row["id"]):
            return
        h = LiveHandle.from_dict(stored)
        self.live.stop(h)
        self._forget(row["id"], h)

    def leftovers(self) -> None:
        """Every recorded old handle no thread of this engine is stopping: stopped (the reaper's)."""
        for sid, spec in self.store.db.query("SELECT id, spec FROM sandboxes WHERE spec LIKE ?",
                                             (f'%"{_KEY}"%',)):
            spec = json.loads(spec)
            if spec.get(_KEY):
                self.finish({"id": sid, "spec": spec})
        d = os.path.join(self.store.home, "sandboxes")
        for name in os.listdir(d) if os.path.isdir(d) else ():
            if name.endswith(_OLD):
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)

    def close(self, timeout: float = 60.0) -> None:
        with self._lock:
            threads = list(self._threads.values()) + self._removing
        for t in threads:
            t.join(timeout)

    def _forget(self, sid: str, h: LiveHandle) -> None:
        with self.store.db.tx() as con:
            r = con.execute("SELECT spec FROM sandboxes WHERE id=?", (sid,)).fetchone()
            spec = json.loads(r[0]) if r else {}
            if spec.get(_KEY) == json.loads(dumps(h.to_dict())):
                del spec[_KEY]
                con.execute("UPDATE sandboxes SET spec=? WHERE id=?", (dumps(spec), sid))
