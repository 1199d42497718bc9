"""Layer directories: the image's files as the kernel's overlayfs sees them (its lower dirs).

A layer is the on-disk delta one commit added: files with host-side ids (shifted by the id map,
so uid 0 in a sandbox is an unprivileged uid on the host), whiteouts for deletions and opaque
markers for replaced directories, in the overlay flavour of the store (see Flavor). Layers are
immutable once published and shared by every image stacked on them, so a fork copies nothing.
Objects (trees and blobs) are the truth; a layer can always be rebuilt from them (squash does).

Deleting: nothing is ever mounted inside the store (sandboxes mount in their own namespaces),
but remove_tree() still refuses any path with a mount beneath it (see PLATFORM.md, DANGER).
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from dataclasses import dataclass

from ..runtime.procid import dead_owner, owner_prefix
from .objects import BLK, CHR, DIR, FIFO, FILE, SOCK, SYMLINK, Entry
import base64


@dataclass(frozen=True)
class IdMap:
    """Sandbox ids 0..count-1 are host ids base..base+count-1 (one line of a uid_map)."""

    uid_base: int
    gid_base: int
    count: int

    def host_uid(self, uid: int) -> int:
        return self.uid_base + uid if 0 <= uid < self.count else self.uid_base + min(65534, self.count - 1)

    def host_gid(self, gid: int) -> int:
        return self.gid_base + gid if 0 <= gid < self.count else self.gid_base + min(65534, self.count - 1)

    def uid(self, host: int) -> int:
        u = host - self.uid_base
        return u if 0 <= u < self.count else 65534

    def gid(self, host: int) -> int:
        g = host - self.gid_base
        return g if 0 <= g < self.count else 65534

    @property
    def rootless(self) -> bool:
        return self.count == 1

    def uid_map_line(self) -> str:
        return f"0 {self.uid_base} {self.count}\n"

    def gid_map_line(self) -> str:
        return f"0 {self.gid_base} {self.count}\n"


# Root runs mount the overlay on the host side (trusted.* xattrs, whiteouts are 0/0 char
# devices); rootless runs mount it inside the user namespace with `userxattr`.
ROOT_OPAQUE = "trusted.overlay.opaque"
USER_OPAQUE = "user.overlay.opaque"


def is_overlay_xattr(name: str) -> bool:
    return name.startswith(("trusted.overlay.", "user.overlay."))


def opaque_xattr(idmap: IdMap) -> str:
    return USER_OPAQUE if idmap.rootless else ROOT_OPAQUE


def is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def read_xattrs(path: str) -> list[tuple[str, bytes]]:
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return []
    out = []
    for n in names:
        if is_overlay_xattr(n):
            continue
        try:
            out.append((n, os.getxattr(path, n, follow_symlinks=False)))
        except OSError:
            pass
    return out


def make_whiteout(path: str, idmap: IdMap) -> None:
    """A deletion marker in a layer: a 0/0 char device, or for rootless stores (no mknod) an
    xattr whiteout: an empty file with overlay.whiteout, its directory marked overlay.opaque="x"
    ("has xattr whiteouts"; "y" would hide the whole lower directory). Kernel >= 6.8."""
    if idmap.rootless:
        with open(path, "wb"):
            pass
        os.setxattr(path, "user.overlay.whiteout", b"y")
        parent = os.path.dirname(path)
        try:
            current = os.getxattr(parent, USER_OPAQUE)
        except OSError:
            current = b""
        if current != b"y":
            os.setxattr(parent, USER_OPAQUE, b"x")
    else:
        os.mknod(path, stat.S_IFCHR | 0o600, 0)


def mount_points_under(path: str) -> list[str]:
    real = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == real or mp.startswith(real.rstrip("/") + "/"):
                found.append(mp)
    return found


def remove_tree(path: str) -> None:
    """rm -rf that refuses to cross a mount (a bind of a lower would delete the image)."""
    if not os.path.lexists(path):
        return
    mounts = mount_points_under(path)
    if mounts:
        raise RuntimeError(f"refusing to delete {path}: mounts beneath it: {mounts}")
    shutil.rmtree(path)


class LayerDirs:
    """The layers/ directory: publish staged layer dirs, list and remove them."""

    def __init__(self, root: str, tmp: str):
        self.root = root
        self.tmp = tmp
        os.makedirs(root, exist_ok=True)
        os.chmod(root, 0o711)     # sandboxes resolve lowers by name; nobody may list them
        os.makedirs(tmp, mode=0o700, exist_ok=True)

    def path(self, layer: str) -> str:
        return os.path.join(self.root, layer)

    def stage(self, prefix: str = "layer") -> str:
        d = os.path.join(self.tmp, f"{prefix}-{owner_prefix()}{secrets.token_hex(6)}")
        os.mkdir(d, 0o755)
        return d

    def publish(self, staged: str) -> str:
        layer = secrets.token_hex(5)
        os.rename(staged, self.path(layer))
        return layer

    def clean_stale(self) -> None:
        """Remove staging dirs whose process died (kill -9 mid-import or mid-commit)."""
        for name in os.listdir(self.tmp):
            # KIND-PID-START-NS-RANDOM (older engines: KIND-PID-RANDOM): see runtime/procid.py
            if "-" in name and dead_owner(name.split("-", 1)[1]):
                remove_tree(os.path.join(self.tmp, name))

    def all(self) -> list[str]:
        return sorted(os.listdir(self.root))

    def remove(self, layer: str) -> None:
        remove_tree(self.path(layer))


def apply_meta(path: str, e: Entry, idmap: IdMap) -> None:
    """Ownership, xattrs, permission bits and mtime of one materialised entry (chmod after chown:
    chown clears setuid bits)."""
    os.lchown(path, idmap.host_uid(e.uid), idmap.host_gid(e.gid))
    for k, v in e.xattrs:
        try:
            os.setxattr(path, k, base64.b64decode(v), follow_symlinks=False)
        except OSError:
            pass        # e.g. security.* we may not set here; the tree still records it
    if e.kind != SYMLINK:
        os.chmod(path, e.mode)
    os.utime(path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)


def make_node(path: str, e: Entry, blob_path) -> None:
    """Create one non-directory entry at `path` (metadata applied separately)."""
    if e.kind == FILE:
        shutil.copyfile(blob_path(e.ref), path)
    elif e.kind == SYMLINK:
        os.symlink(e.ref, path)
    elif e.kind in (CHR, BLK):
        os.mknod(path, (stat.S_IFCHR if e.kind == CHR else stat.S_IFBLK) | 0o600, int(e.ref))
    elif e.kind == FIFO:
        os.mkfifo(path, 0o600)
    elif e.kind == SOCK:
        os.mknod(path, stat.S_IFSOCK | 0o600)
    elif e.kind == DIR:
        os.mkdir(path, 0o700)
