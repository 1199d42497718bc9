"""Helpers entered ahead: the slow part of a live exec (joining a sandbox's cgroups and
namespaces) done before the command comes, for the sandboxes this process used last.
Used by sandboxes.py's exec; the helpers themselves are runtime/live.py's."""

from __future__ import annotations

from ...runtime.base import LiveTier
from ...runtime.liveproc import LiveHandle
from .kept import KeptAhead


class Ahead(KeptAhead):
    """For each of the last KEEP live sandboxes this process exec'd in, one helper already inside it (cgroups joined,
    namespaces entered: the slow part of an exec), prepared after each exec by one long-lived
    thread (the helpers die with the thread that forked them)."""

    KEEP = 32                 # a helper (and 5 fds) per sandbox: only the recent
    NAME = "sandtree-enter"

    def __init__(self, live: LiveTier):
        super().__init__()
        self.live = live

    def take(self, sid: str, handle: LiveHandle):
        """The helper entered ahead into sandbox `sid` (None: none ready, the exec enters by itself);
        the next one is prepared after this exec."""
        with self.cv:
            got = self.ready.pop(sid, None)
            self._want(sid, handle)
        if got is None:
            return None
        if got[0] != handle or not self.live.alive(handle):
            got[1].discard()
            return None
        return got[1]

    def _make(self, sid: str, h: LiveHandle):
        entered = self.live.enter_ahead(h) if self.live.alive(h) else None
        return (h, entered) if entered is not None else None      # (a tier without: gvisor_live.py)

    def _discard(self, made) -> None:
        made[1].discard()

    def close(self) -> None:
        super().close(join=10)
