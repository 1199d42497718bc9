"""EROFS images of layers (for a cold node's start): a big layer is also uploaded as one read-only
filesystem image, which a node with an empty cache downloads and mounts (file-backed, no loop
device) at layers/<id> instead of creating every file of it. Everything that reads layer dirs
(overlay lowers, diffs, reads, commits) then works unchanged; the tar (store/layerpack.py) stays
the portable format (bundles, rootless nodes, kernels without file-backed EROFS, another id map).

Only images we built ourselves are ever mounted (a filesystem image is kernel attack surface):
build() runs mkfs.erofs on a layer dir this store checked, and a fetched image is mounted only
after its sha256 and size matched the layer's row (store/layercache.py). build() is
deterministic: a fixed UUID, every inode extended (exact nanosecond mtimes, host ids above 65535)
and the superblock's build time zeroed, so one layer dir gives one image.

On a node (store/erofsdir.py): images live in erofs/<layer>.img, mounted read-only, nosuid,
nodev at layers/<layer> in the host's mount namespace (a node's processes share it; a mount left
by a killed process is reused). Nothing deletes through a mount: umount (detached) first.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import shutil
import subprocess

__all__ = ["MIN_FILES", "worth", "can_build", "can_mount", "build", "mount", "unmount",
           "is_mounted"]

_MKFS = "mkfs.erofs"
# Files, not bytes, make a tar slow to unpack: either way a node writes the layer's bytes once (the
# tar's files, or the image). Measured here (2 CPUs, load 9; 2 KB files, local tar): unpack 15 ms
# for 50 files, 137 ms for 200, 377 ms for 500, 773 ms for 1,000, 2.5 s for 3,000; a mount 0.1 ms
# and mkfs.erofs 6-57 ms at upload. But each mount is one more entry that every new mount
# namespace (each sandbox) copies and every mountinfo scan reads: small layers (most commits)
# stay tars, and from 1,000 entries on a layer gets an image.
MIN_FILES = 1000
_UUID = "73616e64-7472-6565-8000-000000000001"  # fixed: one layer dir, one image
_SB = 1024                                      # the superblock's offset in the image
_MAGIC = 0xE0F5E1E2
_BUILD_TIME = 24                                # u64 seconds + u32 nanoseconds, informational only
_MS_RDONLY, _MS_NOSUID, _MS_NODEV = 1, 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def worth(files: int) -> bool:
    """Whether a layer of `files` entries (files, dirs, links...) gets an image beside its tar."""
    return files >= MIN_FILES


def can_build() -> bool:
    return shutil.which(_MKFS) is not None


@functools.lru_cache(maxsize=1)
def _kernel_mounts() -> bool:
    """Root with a kernel that mounts EROFS from a regular file (Linux >= 6.12)."""
    if os.geteuid() != 0:
        return False                             # EROFS is not mountable in a user namespace
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1:] == ["erofs"] for line in f):
                return False
        major, minor = (int(x) for x in platform.release().split(".")[:2])
    except (OSError, ValueError):
        return False
    return (major, minor) >= (6, 12)


def can_mount(rootless: bool) -> bool:
    """Whether this node can mount a fetched image (else it takes the layer's tar)."""
    return not rootless and _kernel_mounts()


def build(layer_dir: str, out: str) -> None:
    """Write layer_dir as an EROFS image to `out` (a new file), byte for byte the same for the
    same dir. Raises OSError if mkfs.erofs fails (the caller keeps the tar alone)."""
    mkfs = shutil.which(_MKFS)
    if mkfs is None:
        raise OSError(f"{_MKFS} is not installed")
    cmd = [mkfs, "--quiet", "--preserve-mtime", "-Eforce-inode-extended,nosbcrc", f"-U{_UUID}", out, layer_dir]
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env={"LC_ALL": "C"})     # (SOURCE_DATE_EPOCH would flatten every mtime)
    if res.returncode != 0:
        raise OSError(f"mkfs.erofs failed ({res.returncode}): {res.stdout.decode(errors='replace')[-500:]}")
    # Every inode carries its own mtime (force-inode-extended) and the superblock no checksum
    # (nosbcrc: our sha256 of the whole image is the check), so the build time says nothing.
    with open(out, "r+b") as f:
        f.seek(_SB)
        if int.from_bytes(f.read(4), "little") != _MAGIC:
            raise OSError(f"mkfs.erofs wrote no EROFS superblock to {out}")
        f.seek(_SB + _BUILD_TIME)
        f.write(bytes(12))


def mount(image: str, target: str) -> None:
    """Mount a verified image read-only, nosuid, nodev at target (an empty dir)."""
    if _libc.mount(os.fsencode(image), os.fsencode(target), b"erofs",
                   _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount erofs {image} on {target}: {os.strerror(e)}")


def unmount(target: str) -> None:
    """Detach the mount at target (open files keep working; a missing mount is not an error)."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        e = ctypes.get_errno()
        if e not in (errno.EINVAL, errno.ENOENT):
            raise OSError(e, f"umount {target}: {os.strerror(e)}")


def is_mounted(target: str) -> bool:
    """Whether target is a mount point (an EROFS image is another filesystem: st_dev differs)."""
    return os.path.ismount(target)
