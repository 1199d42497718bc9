"""Volumes on the host: each tenant's volumes share one ext4 filesystem in a sparse file of the store,
mounted through a loop device, whose size is the tenant's quota; a volume is a directory of it.

Why a loop-mounted ext4 per tenant: the quota must hold inside the sandbox as the kernel's own
ENOSPC at the write that crosses it, losing nothing written before (ext4 reserves blocks at
write(2), delayed allocation included), and the store's filesystem here has no project quotas
(`prjquota` is a mount option of the host's root). One filesystem per tenant makes the quota the
tenant's across all of its volumes, and the sparse file costs only what was written. It is made
with no reserved blocks (-m 0: the sandbox's root is the volume's writer) and mounted nodev,nosuid:
a device node or setuid file a sandbox leaves there opens or elevates nothing, on the host or in
any later sandbox.

`mount -o loop` reuses the loop device already attached to the same file (util-linux): two
mounts of one ext4 through two loop devices would be two superblocks writing one disk. The loop
device is attached with autoclear: it goes with the last mount of it, the host's (umount at the
engine's close) or a live sandbox's bind (that sandbox's mount namespace ends with it).

A live sandbox gets a volume as a bind mount into its own mount namespace, made after its helper
reported ready and before its start returns (no command of its has run): a detached clone of the
volume's directory (open_tree, nodev/nosuid, and read-only when asked) moved onto its path by a
short child process that joined the sandbox's mount namespace (setns needs a single-threaded
process). The sandbox cannot undo or widen it: its seccomp filter denies every mount call.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys

from ..errors import InvalidInput, RuntimeUnavailable, SandboxError

__all__ = ["ensure_filesystem", "unmount", "mounted", "bind_into", "usage"]

_libc = ctypes.CDLL(None, use_errno=True)
_SYS_open_tree, _SYS_mount_setattr = 428, 442
_OPEN_TREE_CLONE, _AT_EMPTY_PATH, _AT_SYMLINK_NOFOLLOW = 1, 0x1000, 0x100
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
_MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def mounted(path: str) -> bool:
    """Whether `path` is a mount point in this process's mount table (os.path.ismount misses a
    mount of the same filesystem)."""
    want = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(_unescape(line.split()[4]) == want for line in f)


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def _run(argv: list[str], what: str) -> None:
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise SandboxError(f"{what} failed: {(p.stderr or p.stdout).strip()[:500]}", step=what)


def ensure_filesystem(image: str, mountpoint: str, size: int) -> None:
    """The ext4 filesystem in `image`, `size` bytes (made sparse if missing; grown, online, if the
    quota grew), mounted at `mountpoint` nodev,nosuid. Its root is the host root's (0755: the volumes in
    it are the sandboxes' own directories; no sandbox ever sees the root itself)."""
    os.makedirs(mountpoint, mode=0o711, exist_ok=True)
    if not os.path.exists(image):
        tmp = image + ".new"
        with open(tmp, "wb") as f:
            f.truncate(size)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "root_owner=0:0", tmp], "mkfs.ext4")
        os.rename(tmp, image)
    if not mounted(mountpoint):
        _run(["mount", "-o", "loop,nodev,nosuid", image, mountpoint], "mount")
    if os.path.getsize(image) < size:
        _grow(image, mountpoint, size)


def _grow(image: str, mountpoint: str, size: int) -> None:
    """A raised quota: the file and its loop device made larger, then ext4 resized online."""
    with open(image, "r+b") as f:
        f.truncate(size)
    dev = _device_of(mountpoint)
    _run(["losetup", "-c", dev], "losetup -c")
    _run(["resize2fs", dev], "resize2fs")


def _device_of(mountpoint: str) -> str:
    want = os.path.realpath(mountpoint)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            if _unescape(left.split()[4]) == want:
                return right.split()[1]
    raise SandboxError(f"{mountpoint} is not mounted")


def unmount(mountpoint: str) -> None:
    """Detach the host's mount (sandboxes that bind a volume keep theirs until they end; the loop
    device is cleared with the last)."""
    while mounted(mountpoint):
        if _libc.umount2(os.fsencode(mountpoint), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err in (errno.EINVAL, errno.ENOENT):
                return
            raise OSError(err, os.strerror(err), mountpoint)


def usage(mountpoint: str) -> tuple[int, int]:
    """(bytes used, bytes the filesystem holds) of a tenant's volumes."""
    st = os.statvfs(mountpoint)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize


def _detached_clone(directory: str, readonly: bool) -> int:
    """An fd of a detached bind mount of `directory` (not its submounts), nodev/nosuid (+ro)."""
    fd = _libc.syscall(_SYS_open_tree, -100, os.fsencode(directory),
                       _OPEN_TREE_CLONE | os.O_CLOEXEC | _AT_SYMLINK_NOFOLLOW)
    if fd < 0:
        err = ctypes.get_errno()
        raise RuntimeUnavailable(f"open_tree of a volume failed: {os.strerror(err)} (volumes need Linux 5.12)")
    attr = _MountAttr(_MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV | (_MOUNT_ATTR_RDONLY if readonly else 0), 0, 0, 0)
    if _libc.syscall(_SYS_mount_setattr, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise RuntimeUnavailable(f"mount_setattr of a volume failed: {os.strerror(err)}")
    return fd


# The child that joins the sandbox's mount namespace (argv: ns fd, uid, gid, then tree fd and path of each
# volume). Its root
# and cwd are then the sandbox's root: every path resolves inside it, as the sandbox's own would.
# Missing directories on the way are made (owned by the sandbox's root) in the sandbox's upper: they
# are the mount points commit leaves out when empty (engine/runs/commit.py mount_points).
_CHILD = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
ns, uid, gid = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def fail(step):
    e = ctypes.get_errno()
    sys.stderr.write(f"{step}: {os.strerror(e)}\n")
    sys.exit(1)
if libc.setns(ns, 0x00020000) != 0:
    fail("setns")
os.chdir("/")
for i in range(4, len(sys.argv), 2):
    tree, path = int(sys.argv[i]), sys.argv[i + 1]
    cur = "/"
    for part in [p for p in path.split("/") if p]:
        cur = os.path.join(cur, part)
        try:
            os.mkdir(cur, 0o755)
            os.chown(cur, uid, gid, follow_symlinks=False)
            print(cur)
        except FileExistsError:
            pass
    target = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    # move_mount(tree, "", target, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH)
    if libc.syscall(429, tree, b"", target, b"", 0x4 | 0x40) != 0:
        fail(f"move_mount {path}")
"""


def bind_into(ns_fd: int, mounts: list[tuple[str, str, bool]], owner: tuple[int, int]) -> list[str]:
    """Bind each volume's (directory, path, read-only) in the mount namespace `ns_fd` (a live sandbox's),
    by one child; the directories made on the way (mount points a commit leaves out while they stay empty)."""
    trees: list[int] = []
    try:
        argv = [sys.executable, "-I", "-S", "-c", _CHILD, str(ns_fd), str(owner[0]), str(owner[1])]
        for directory, path, readonly in mounts:
            trees.append(_detached_clone(directory, readonly))
            argv += [str(trees[-1]), path]
        p = subprocess.run(argv, pass_fds=(ns_fd, *trees), capture_output=True, text=True)
    finally:
        for t in trees:
            os.close(t)
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or ["no output"])[-1]
        if "Not a directory" in why or "File exists" in why:
            raise InvalidInput(f"a volume's path is not a directory in the image: {why}")
        raise SandboxError(f"mounting volumes failed: {why}", step="volume")
    return p.stdout.splitlines()
