"""Durability: what the store tells a caller survives kill -9 and a power cut, and after any
crash the store is consistent (no row names bytes that are not on the disk).

The page cache holds a file's bytes for up to half a minute before they reach the disk, while
ext4 commits its journal (names, sizes) every 5 s: without a sync, a power cut soon after a
commit left the image's row and its layer's names on the disk and the files' bytes zeros. So
every write the database will name is made durable *before* the transaction that names it:

- a layer (LayerDirs.publish): renamed into layers/, then its files (and, but on ext4/XFS, its
  directories) synced (sync_tree), then layers/;
- a blob file (BlobStore): the file synced before its rename, its directory after;
- a local checkpoint (hibernate): its files before the row says `hibernated`.

And the transaction itself is durable before the ID is returned: SQLite (WAL mode, NORMAL: the
WAL synced at checkpoints only, so a power cut loses the last commits, never corrupts) has its
WAL flushed after each write transaction's commit, one flush shared by the commits of many
threads (db.GroupSync). PostgreSQL commits are durable already (synchronous_commit).

Two levels (Store(durability=...), SANDTREE_DURABILITY):
- "strict" (the default): both of the above: a told ID survives a power cut.
- "relaxed": the bytes are still synced before any row names them (consistency is never
  relaxed), but a SQLite commit is not synced: a power cut may lose the last seconds of images,
  tags and records, as if they had never been made. A deletion that follows a transaction (gc
  removes files after their rows) still makes that transaction durable first (Database.tx
  durable=True).

Many small files: an fsync each costs a journal commit each; past SYNC_TREE_FILES files one
syncfs() of the store's filesystem writes them all with one (it also writes whatever else is
dirty on that filesystem: sandboxes' uppers are on tmpfs, not there).
"""

from __future__ import annotations

import ctypes
import os
import stat

from ..defaults import DURABILITY, SYNC_TREE_FILES
from ..errors import InvalidInput

STRICT, RELAXED = "strict", "relaxed"
MODES = (STRICT, RELAXED)


def check_mode(mode: str | None) -> str:
    """The durability level `mode` names (None: defaults.DURABILITY), or InvalidInput."""
    if mode is None or mode == "":
        return DURABILITY
    if mode not in MODES:
        raise InvalidInput(f"durability is 'strict' or 'relaxed', not {mode!r}")
    return mode


_libc = ctypes.CDLL(None, use_errno=True)
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int) -> None:
    """Start writing a file's dirty pages to the disk without waiting (sync_file_range), so the
    fsync that follows waits for less: a big file's bytes go out while the rest is still being
    copied and hashed. Best effort: where the call is missing, the fsync does it all."""
    try:
        _libc.sync_file_range(ctypes.c_int(fd), ctypes.c_longlong(0), ctypes.c_longlong(0),
                              ctypes.c_uint(_SYNC_FILE_RANGE_WRITE))
    except (AttributeError, OSError):
        pass


def sync_dir(path: str) -> None:
    """A directory's entries (names made, renamed or removed in it) on the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_fs(path: str) -> None:
    """Everything written on the filesystem holding `path` on the disk (syncfs(2))."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)


# Filesystems whose journal commits in order: an fsync commits every metadata change made before
# the change it waits for. ext4 (EXT4_SUPER_MAGIC) and XFS (XFS_SB_MAGIC).
_ORDERED = {0xEF53, 0x58465342}


class _Statfs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]


_ordered_devs: dict[int, bool] = {}


def ordered_journal(path: str) -> bool:
    """Whether the filesystem holding `path` commits its metadata in order (ext4, XFS): there,
    the fsync of a directory changed last makes every name made before it durable too, so the
    directories of a tree need no fsync each (one flush of the disk's cache each, the dearest
    part of a small commit on a busy disk)."""
    dev = os.stat(path).st_dev
    known = _ordered_devs.get(dev)
    if known is None:
        buf = _Statfs()
        known = _libc.statfs(os.fsencode(path), ctypes.byref(buf)) == 0 and (buf.f_type & 0xFFFFFFFF) in _ORDERED
        _ordered_devs[dev] = known
    return known


def sync_tree(root: str, *, dirs: bool = True) -> None:
    """Every file and directory under `root` (a staged layer, a checkpoint) on the disk: each
    regular file and directory fsynced (files first, directories deepest first), or, past
    SYNC_TREE_FILES files, one syncfs. Never follows a symlink or crosses into another
    filesystem; other kinds (whiteouts, FIFOs, symlinks) are names, made durable by their
    directory's fsync. dirs=False: the files' bytes only; the caller then fsyncs a directory it
    changed after the whole tree was made, on a filesystem where that covers the tree's names
    (ordered_journal)."""
    top = os.lstat(root)
    files: list[str] = []
    subdirs: list[str] = [root]
    todo = [root]
    while todo:
        d = todo.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    if e.stat(follow_symlinks=False).st_dev == top.st_dev:
                        subdirs.append(e.path)
                        todo.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    files.append(e.path)
        if len(files) > SYNC_TREE_FILES:
            sync_fs(root)
            return
    for path in files:
        _fsync_regular(path)
    if dirs:
        for path in reversed(subdirs):
            sync_dir(path)


def _fsync_regular(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fsync(fd)
    finally:
        os.close(fd)
