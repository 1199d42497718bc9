"""openat2(2) with RESOLVE_IN_ROOT: open a path inside a running sandbox's root from the host.

Following /proc/<pid>/root/<path> naively would resolve an absolute symlink planted by the
sandbox (`ln -s / /tmp/x`) against the host's root. openat2 resolves every component, symlinks
and `..` included, as if the sandbox's root were `/`, and refuses magic links (/proc/self/fd/N).
Python has no binding for it (3.11), hence ctypes; the syscall number is the same on every
architecture.
"""

from __future__ import annotations

import ctypes
import errno
import os

from ..errors import InvalidInput, PathNotFound

SYS_openat2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    raw = path.lstrip("/").encode("utf-8", "surrogateescape") or b"."
    for _ in range(16):                  # EAGAIN: a rename raced the lookup; the kernel asks to retry
        fd = _libc.syscall(SYS_openat2, ctypes.c_int(root_fd), ctypes.c_char_p(raw), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    if err in (errno.ENOENT, errno.ENOTDIR):
        raise PathNotFound(f"no such file in the sandbox: {path}", path=path)
    if err == errno.EISDIR:
        raise InvalidInput(f"{path} is a directory", path=path)
    raise OSError(err, f"{os.strerror(err)}: {path}")
