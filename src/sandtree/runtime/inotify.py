"""inotify(7) of a directory of a running sandbox, from the host.

A live sandbox's root is an overlay (both tiers: gVisor runs with --overlay2=none on a host overlay, so
its writes land there through the gofer). inotify marks on that overlay's inodes see what the sandbox's
processes do to it, and what the engine does through openat2.py. Every directory is reached the
confined way: opened inside the root (openat2 RESOLVE_IN_ROOT) or by name relative to a directory
already opened, never following a link, only on the sandbox's own filesystems (own_mounts); the mark
is added on the opened fd (/proc/self/fd/N names that very inode), so no host path is looked up.

No fd of the sandbox is kept between calls (an open fd of its root would keep its overlay mounted
after it stops): marks hold no mount, and when the sandbox's overlay goes, the kernel drops them
(IN_IGNORED) and the watch ends.

Events are E2B's (and fsnotify's) five kinds: create (IN_CREATE, IN_MOVED_TO), write (IN_MODIFY),
remove (IN_DELETE), rename (IN_MOVED_FROM), chmod (IN_ATTRIB), each with its path relative to the
watched directory. The engine's own writes (a new file renamed over the name, openat2.write_file)
show as the name's create, chmod and write (as a program that opens, chowns and writes it would: E2B's
envd does), never under their temporary name.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
import time

from ..errors import LimitExceeded
from .openat2 import TEMP_PREFIX, own_filesystem, mount_id, open_in_root

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_UNMOUNT, IN_Q_OVERFLOW, IN_IGNORED = 0x2000, 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK, IN_ISDIR = 0x01000000, 0x02000000, 0x04000000, 0x40000000
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
        | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)
_HEADER = struct.Struct("iIII")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSPC:
            raise LimitExceeded("the host's inotify watches are used up (fs.inotify.max_user_watches)")
        if err == errno.EMFILE:
            raise LimitExceeded("the host's inotify instances are used up (fs.inotify.max_user_instances)")
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


class DirWatch:
    """The marks of one watched directory (and, recursive, of every directory below it, those made
    later included), and the events they gave, translated. `open_root()` -> (an O_PATH fd of the
    sandbox's root (the caller's to close: closed here), its own mount ids)."""

    def __init__(self, open_root, path: str, recursive: bool, max_dirs: int):
        self.open_root, self.path, self.recursive, self.max_dirs = open_root, path, recursive, max_dirs
        self.fd = _check(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        self.dirs: dict[int, str] = {}          # watch descriptor -> directory relative to `path` ("" itself)
        self.moved: dict[int, str] = {}         # cookie -> an engine write's temporary name, moved now
        self.ended = False                      # the watched directory (or the sandbox) is gone
        self.skipped = 0                        # directories not watched: over max_dirs
        try:
            root, mounts = open_root()
            try:
                dfd = open_in_root(root, path, os.O_RDONLY | os.O_DIRECTORY)
            finally:
                os.close(root)
            try:
                own_filesystem(dfd, mounts, path)
                self._add(dfd, "", mounts, [], strict=True)
            finally:
                os.close(dfd)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def fileno(self) -> int:
        return self.fd

    def _add(self, dfd: int, rel: str, mounts: set[int], found: list, strict: bool = False) -> None:
        """Mark the directory open as dfd (rel: its path below the watched one); recursive: its
        subdirectories too, on the sandbox's own filesystems. found: entries seen in a directory
        just made (their create events, which came before its mark)."""
        if len(self.dirs) >= self.max_dirs:
            if strict:
                raise LimitExceeded(f"{self.path} has more than {self.max_dirs} directories to watch")
            self.skipped += 1
            return
        wd = _check(_libc.inotify_add_watch(self.fd, f"/proc/self/fd/{dfd}".encode(), MASK), "inotify_add_watch")
        self.dirs[wd] = rel
        if not self.recursive:
            return
        subdirs = []
        with os.scandir(dfd) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if e.name.startswith(TEMP_PREFIX):
                    continue
                if found is not None and not strict:   # made before the mark: what it would have shown
                    found.append((f"{rel}/{e.name}".lstrip("/"), "create"))
                    if stat.S_ISREG(st.st_mode) and st.st_size:
                        found.append((f"{rel}/{e.name}".lstrip("/"), "write"))
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(e.name)
        for name in subdirs:
            self._add_child(dfd, name, f"{rel}/{name}".lstrip("/"), mounts, found if not strict else None)

    def _add_child(self, dfd: int, name: str, rel: str, mounts: set[int], found) -> None:
        try:
            cfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                          dir_fd=dfd)
        except OSError:
            return                               # gone meanwhile, or a link put there: not followed
        try:
            if mount_id(cfd) in mounts:         # /proc, /sys, /dev under a watched / are not the sandbox's files
                self._add(cfd, rel, mounts, found)
        finally:
            os.close(cfd)

    def _added_dir(self, rel: str) -> list:
        """A directory made (or moved in) below a recursive watch: mark it and what is in it already."""
        found: list = []
        try:
            root, mounts = self.open_root()
        except Exception:
            return found                         # the sandbox is ending
        try:
            parent, _, name = rel.rpartition("/")
            pfd = open_in_root(root, f"{self.path.rstrip('/')}/{parent}" if parent else self.path,
                               os.O_PATH | os.O_DIRECTORY)
        except Exception:
            os.close(root)
            return found
        os.close(root)
        try:
            self._add_child(pfd, name, rel, mounts, found)
        finally:
            os.close(pfd)
        return found

    def read(self) -> list[dict]:
        """The events the kernel has queued now (none: an empty list), translated."""
        out: list[dict] = []
        while self.fd >= 0:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            now = time.time()
            off = 0
            while off + _HEADER.size <= len(buf):
                wd, mask, cookie, n = _HEADER.unpack_from(buf, off)
                name = buf[off + _HEADER.size: off + _HEADER.size + n].rstrip(b"\0").decode("utf-8", "surrogateescape")
                off += _HEADER.size + n
                self._one(wd, mask, cookie, name, now, out)
        return out

    def _one(self, wd: int, mask: int, cookie: int, name: str, now: float, out: list) -> None:
        if mask & IN_Q_OVERFLOW:
            out.append({"name": "", "type": "overflow", "time": now})
            return
        if mask & IN_IGNORED:
            rel = self.dirs.pop(wd, None)
            if rel == "" or not self.dirs:
                self.ended = True                # the watched directory is gone, or the sandbox's overlay
            return
        if wd not in self.dirs:
            return
        base = self.dirs[wd]
        rel = f"{base}/{name}".lstrip("/") if name else base
        if not name:                             # about the directory itself (self events)
            return
        if name.startswith(TEMP_PREFIX):
            if mask & IN_MOVED_FROM:
                self.moved[cookie] = name        # an engine write lands: its MOVED_TO names the file
            return
        def emit(kind, what=rel):
            out.append({"name": what, "type": kind, "time": now})
        if mask & IN_CREATE:
            emit("create")
        if mask & IN_MOVED_TO:
            emit("create")
            if self.moved.pop(cookie, None) is not None:
                emit("chmod")                    # the engine wrote it (a new file owned, then filled, then
                emit("write")                    # renamed over the name): as a writer in place shows
        if mask & IN_MODIFY:
            emit("write")
        if mask & IN_ATTRIB:
            emit("chmod")
        if mask & IN_DELETE:
            emit("remove")
        if mask & IN_MOVED_FROM:
            emit("rename")
        if self.recursive and mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
            for what, kind in self._added_dir(rel):
                emit(kind, what)
        if len(self.moved) > 64:                 # MOVED_FROMs whose MOVED_TO never came (moved out)
            self.moved.clear()

