"""Network namespaces by file descriptor, from a thread: a thread enters a namespace, makes a
socket there (a socket stays in the namespace it was made in) and comes back. No bind mounts under
/run/netns: a namespace lives as long as an fd or a process holds it, so nothing is left behind."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_lock = threading.Lock()       # only one thread of the process may be away at a time: simpler to reason about


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"setns: {os.strerror(e)}")


def current() -> int:
    """An fd of the calling thread's network namespace."""
    return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)


@contextlib.contextmanager
def entered(fd: int):
    """The calling thread in namespace `fd` for the block, then back where it was."""
    with _lock:
        home = current()
        try:
            _setns(fd)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(home)


def join(fd: int) -> None:
    """Move the calling thread into namespace `fd` for good (a daemon's main thread, before it
    starts any other: threads inherit their creator's namespace)."""
    with _lock:
        _setns(fd)


def new(parent: int | None = None) -> int:
    """A new, empty network namespace (only `lo`, down), owned by our user namespace: an fd.
    parent: a namespace to make it from (some settings, as tcp_child_ehash_entries, are the
    maker's namespace's), else the calling thread's."""
    with _lock:
        home = current()
        try:
            try:
                if parent is not None:
                    _setns(parent)
                if _libc.unshare(CLONE_NEWNET) != 0:
                    e = ctypes.get_errno()
                    raise OSError(e, f"unshare(CLONE_NEWNET): {os.strerror(e)}")
                return current()
            finally:
                _setns(home)
        finally:
            os.close(home)


def write_sysctl(fd: int, name: str, value: str) -> None:
    """Set net.* sysctl `name` (dotted) of namespace `fd`: /proc/sys/net shows the opener's namespace."""
    path = "/proc/sys/" + name.replace(".", "/")
    with entered(fd):
        f = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(f, value.encode())
    finally:
        os.close(f)
