"""Runtime files (RunSpec.runtime_files): what the runtime shows a sandbox read-only and never
commits, such as an egress link's resolv.conf and CA bundle. The helper (helper/runfiles.c,
runtime_files()) writes them into a tmpfs of their own at /dev/sandtree, read-only once written,
and binds "/etc/resolv.conf" over the image's when that is a regular file in the sandbox's root.
Nothing of them is in the overlay's upper, so a commit cannot hold them. They reach the helper as
one memfd (--runtime-fd) of records: u32 path length, path, u32 data length, data."""

from __future__ import annotations

import os
import re
import struct

from ..errors import InvalidInput, TooLarge

__all__ = ["RUNTIME_DIR", "RESOLV_CONF", "MAX_TOTAL", "MAX_FILES", "check_runtime_files", "encode", "memfd", "host_name",
           "network_args", "fds_of"]

RUNTIME_DIR = "/dev/sandtree/"
RESOLV_CONF = "/etc/resolv.conf"
MAX_TOTAL = 16 << 20             # bytes of all runtime files of a run (a CA bundle is about 200 KB)
MAX_FILES = 64                   # (the helper's tmpfs for them has 1024 inodes)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def host_name(path: str) -> str:
    """The file's name in the runtime's tmpfs (resolv.conf for /etc/resolv.conf)."""
    return "resolv.conf" if path == RESOLV_CONF else path[len(RUNTIME_DIR):]


def check_runtime_files(files) -> None:
    if not isinstance(files, dict):
        raise InvalidInput("runtime_files must map paths to bytes")
    if len(files) > MAX_FILES:
        raise InvalidInput(f"at most {MAX_FILES} runtime files ({len(files)} given)")
    names, total = set(), 0
    for path, data in files.items():
        if not isinstance(path, str) or not (path == RESOLV_CONF or (
                path.startswith(RUNTIME_DIR) and _NAME.match(path[len(RUNTIME_DIR):]))):
            raise InvalidInput(f"a runtime file is {RESOLV_CONF} or {RUNTIME_DIR}<name>, not {path!r}")
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidInput(f"runtime file {path}: the content must be bytes")
        if host_name(path) in names:
            raise InvalidInput(f"runtime file {path} is given twice")
        names.add(host_name(path))
        total += len(data)
    if total > MAX_TOTAL:
        raise TooLarge(f"runtime files are {total} bytes (at most {MAX_TOTAL})")


def encode(files: dict[str, bytes]) -> bytes:
    out = bytearray()
    for path, data in files.items():
        p = path.encode()
        out += struct.pack("=I", len(p)) + p + struct.pack("=I", len(data)) + bytes(data)
    return bytes(out)


def memfd(files: dict[str, bytes]) -> int:
    """A memfd holding `files` for the helper's --runtime-fd (the caller closes it)."""
    fd = os.memfd_create("sandtree-runtime-files", os.MFD_CLOEXEC)
    try:
        data = encode(files)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return fd
    except BaseException:
        os.close(fd)
        raise


def network_args(spec) -> tuple[list[str], int | None]:
    """The helper's options for a spec's network namespace and runtime files, and the memfd made
    for the latter (None without them; the caller closes it once the helper started)."""
    args = ["--netns-fd", str(spec.netns_fd)] if spec.netns_fd is not None else []
    rt = None
    if spec.runtime_files:
        rt = memfd(spec.runtime_files)
        args += ["--runtime-fd", str(rt)]
    return args, rt


def fds_of(spec, rt: int | None) -> tuple[int, ...]:
    """The fds those options name (for pass_fds)."""
    return tuple(f for f in (spec.netns_fd, rt) if f is not None)
