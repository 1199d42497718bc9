"""A live sandbox's commit lock: a `flock` on `$SANDTREE_HOME/sandboxes/<id>.lock`, held (by any
engine process) while the sandbox is frozen for a commit, hibernated, resumed or stopped; the
kernel releases it when its holder dies (sandboxes.py _commit_lock says why that matters).

A sandbox that has ended needs its lock no more, and a file per sandbox ever started would pile
up: so its file goes when the sandbox has ended. Unlinking a flock'ed file races with a process
that opened it just before and waits for the lock (it would lock an inode no one else can
reach, while a third process locks a new file of the same name). So the unlink is done only by
the holder, and every locker, once it holds the lock, checks that the name still refers to the
inode it locked, else opens again. `sweep` (gc) removes the files of ended sandboxes that a
killed engine, or an end that took no lock (an expiry), left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re

__all__ = ["held", "sweep"]

_NAME = re.compile(r"^([0-9a-f]{32})\.lock$")


def _directory(home: str) -> str:
    d = os.path.join(home, "sandboxes")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o700)                         # checkpoints below hold sandboxes' memory
    return d


def _lock(path: str, blocking: bool = True) -> int | None:
    """An fd holding the lock on the file `path` names now (None: busy, when not blocking)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return None
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return fd
        os.close(fd)                           # its holder removed it meanwhile: the name's file now


@contextlib.contextmanager
def held(home: str, sid: str, ended):
    """The lock of sandbox `sid`; on release, its file is removed if `ended()` (called with the
    lock held) says the sandbox has ended."""
    path = os.path.join(_directory(home), f"{sid}.lock")
    fd = _lock(path)
    try:
        yield
    finally:
        try:
            if ended():
                os.unlink(path)
        except Exception:                      # noqa: BLE001 - a file left for gc, never a lost release
            pass
        os.close(fd)


def sweep(home: str, ended) -> int:
    """Removes the lock files of sandboxes for which `ended(sid)` is true (no row, or stopped,
    expired, gone), each under its lock; a lock someone holds is left. Returns how many."""
    d = os.path.join(home, "sandboxes")
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        m = _NAME.match(name)
        if not m or not ended(m.group(1)):
            continue
        path = os.path.join(d, name)
        fd = _lock(path, blocking=False)
        if fd is None:
            continue
        try:
            if ended(m.group(1)):
                os.unlink(path)
                removed += 1
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)
    return removed
