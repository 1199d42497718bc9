"""Layer directories: the image's files as the kernel's overlayfs sees them (its lower dirs).

A layer is the on-disk delta one commit added: files with host-side ids (shifted by the id map,
so uid 0 in a sandbox is an unprivileged uid on the host), whiteouts for deletions and opaque
markers for replaced directories, in the overlay flavour of the store (see Flavor). Layers are
immutable once published and shared by every image stacked on them, so a fork copies nothing.
Objects (trees and blobs) are the truth; a layer can always be rebuilt from them (squash does).

Device nodes: an image may record char and block devices (tree entries keep kind and rdev, so
the ID and a tar export keep them), but a layer never holds one. A layer is an overlay lower: a
device node there, made by host root, is the host's device to every sandbox on the image (a loop
device, /dev/kmsg, /dev/kvm...). In its place a layer holds an inert placeholder: an empty
regular file, mode 0 (make_placeholder). The only device nodes in layers are overlay's own 0/0
whiteouts. A staged import marks its placeholders with DEVICE_MARKER (a trusted.* xattr: no
sandbox can set or read one) so scan() can record the device it stands for.

Deleting: nothing is mounted inside the store but EROFS images of layers (store/erofs.py, S3
objects), which remove() unmounts first (drop); remove_tree() still refuses any path with a mount beneath it (see PLATFORM.md, DANGER), and
never crosses a mount or recurses on the tree's depth.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import shutil
import stat
from dataclasses import dataclass

from ..procid import dead_owner, owner_prefix
from . import durable
from .objects import BLK, CHR, DIR, FIFO, FILE, SOCK, SYMLINK, Entry

log = logging.getLogger("sandtree.store")


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


# Marks an import's placeholder with the device it stands for: "c|b RDEV MODE(octal)".
DEVICE_MARKER = "trusted.sandtree.device"


def is_overlay_xattr(name: str) -> bool:
    return name.startswith(("trusted.overlay.", "user.overlay."))


def is_recorded_xattr(name: str) -> bool:
    """Whether an xattr is part of an image's state. Not overlay's own markers (of either
    flavour: a user.overlay.* xattr from outside could turn into a marker in a rootless store),
    and not trusted.*: that namespace is the host's (no sandbox can read or set it), so nothing
    from outside may put one into a layer, where overlayfs would act on it."""
    return not name.startswith("trusted.") and not is_overlay_xattr(name)


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
        if not is_recorded_xattr(n):
            continue
        try:
            out.append((n, os.getxattr(path, n, follow_symlinks=False)))
        except OSError:
            pass
    return out


# File capabilities. A v2 security.capability written by host root holds in EVERY user
# namespace, the host's included: a layer file carrying one is a host privilege for whoever can
# execute it. In a layer they are stored as the kernel stores what a sandbox's root sets: v3,
# bound to the sandbox's root (rootid = its host uid), so they work inside and nowhere else.
# Trees hold the namespace-free v2 form, so an image ID does not depend on the store's id map.
CAPS = "security.capability"
_V1, _V2, _V3 = 0x01000000, 0x02000000, 0x03000000


def _caps_parts(value: bytes):
    """(flags, data words) of a v1/v2/v3 value, or None if malformed."""
    if len(value) < 4:
        return None
    magic = int.from_bytes(value[:4], "little")
    rev, flags = magic & 0xFF000000, magic & 0x00FFFFFF
    want = {_V1: 12, _V2: 20, _V3: 24}.get(rev)
    if want is None or len(value) != want:
        return None
    words = value[4:4 + (8 if rev == _V1 else 16)]
    return flags, words + bytes(16 - len(words))


def logical_xattr(name: str, value: bytes, idmap: IdMap) -> bytes:
    """An xattr as a tree records it, from a layer or an upper (host root's raw view)."""
    if name != CAPS:
        return value
    parts = _caps_parts(value)
    if parts is None:
        return value
    rev = int.from_bytes(value[:4], "little") & 0xFF000000
    if rev == _V3 and int.from_bytes(value[20:24], "little") != idmap.host_uid(0):
        return value                             # bound to someone else's root: keep as is
    return (_V2 | parts[0]).to_bytes(4, "little") + parts[1]


def layer_xattr(name: str, value: bytes, idmap: IdMap) -> bytes | None:
    """What a layer holds for an xattr of a tree or from outside; None: never written."""
    if name != CAPS:
        return value
    parts = _caps_parts(value)
    if parts is None:
        return None                              # malformed: the kernel would refuse it anyway
    return (_V3 | parts[0]).to_bytes(4, "little") + parts[1] + idmap.host_uid(0).to_bytes(4, "little")


def logical_xattrs(pairs, idmap: IdMap) -> list[tuple[str, bytes]]:
    return [(k, logical_xattr(k, v, idmap)) for k, v in pairs]


def set_layer_xattrs(path: str, pairs, idmap: IdMap) -> None:
    """Write xattrs into a layer (after any chown: chown drops file capabilities)."""
    for k, v in pairs:
        if not is_recorded_xattr(k):
            continue
        v = layer_xattr(k, v, idmap)
        if v is None:
            continue
        try:
            os.setxattr(path, k, v, follow_symlinks=False)
        except OSError:
            pass        # e.g. security.* we may not set here; the tree still records it


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


def open_regular(path: str):
    """Open a file the walk saw as regular, for reading, as host root: never through a symlink
    and never a FIFO or device swapped in since the lstat (a FIFO would block the commit, a
    symlink would read a host file into the image)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is no longer a regular file")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb", buffering=0)


def make_placeholder(path: str) -> None:
    """What a layer holds where the image has a device node: an empty regular file, mode 0."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0)
    os.close(fd)
    os.chmod(path, 0, follow_symlinks=False)


def device_marker(kind: str, rdev: int, mode: int) -> bytes:
    return f"{kind} {rdev} {stat.S_IMODE(mode):o}".encode()


def read_device_marker(path: str) -> tuple[str, int, int] | None:
    """(kind, rdev, mode) of an import's placeholder, or None."""
    try:
        raw = os.getxattr(path, DEVICE_MARKER, follow_symlinks=False).decode()
        kind, rdev, mode = raw.split()
        if kind not in (CHR, BLK):
            return None
        return kind, int(rdev), int(mode, 8) & 0o7777
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def mount_points_under(path: str) -> list[str]:
    real = os.path.realpath(path)
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].replace("\\040", " ")
            if mp == real or mp.startswith(real.rstrip("/") + "/"):
                found.append(mp)
    return found


# What a process writes before renaming it into place, named `PREFIX` + its owner_prefix(): left
# behind only when it was killed (blob and S3 temp files, checkpoint packs and fetches).
TRANSFER_PREFIXES = (".tmp-", ".fetch-", ".pack-")


def remove_dead_transfers(directory: str) -> int:
    """Remove the transfer leftovers in `directory` whose owner verifiably died; how many."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        prefix = next((p for p in TRANSFER_PREFIXES if name.startswith(p)), None)
        if prefix is not None and dead_owner(name[len(prefix):]):
            try:
                remove_tree(os.path.join(directory, name))
                removed += 1
            except (OSError, RuntimeError) as exc:        # a mount beneath it, a race: left, said
                log.warning("cannot remove leftover %s: %s", name, exc)
    return removed


def remove_tree(path: str) -> None:
    """rm -rf that refuses to cross a mount (a bind of a lower would delete the image)."""
    if not os.path.lexists(path):
        return
    mounts = mount_points_under(path)
    if mounts:
        raise RuntimeError(f"refusing to delete {path}: mounts beneath it: {mounts}")
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    _remove_dir(path, st.st_dev)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_dir(path: str, dev: int) -> None:
    """Depth-first delete, iterative (shutil.rmtree recurses: a 1,100-deep tree raised
    RecursionError). One directory fd is open at a time, so depth costs no fds; we climb back
    through '..' of the fd, and every descent checks st_dev so it never crosses into another
    filesystem even if a mount appeared after the mountinfo check."""
    fd = os.open(path, _DIR_FLAGS)
    stack: list[list[str]] = []                 # per open level: its subdirs still to delete
    names: list[str] = []                       # the name of each level below path
    try:
        pending = _clear_files(fd)
        while True:
            if pending:
                name = pending.pop()
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                if os.fstat(child).st_dev != dev:
                    os.close(child)
                    raise RuntimeError(f"refusing to delete {path}: {name!r} is on another filesystem")
                stack.append(pending)
                names.append(name)
                os.close(fd)
                fd = child
                pending = _clear_files(fd)
                continue
            if not stack:
                break
            parent = os.open("..", _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
            pending = stack.pop()
    finally:
        os.close(fd)
    os.rmdir(path)


def _clear_files(fd: int) -> list[str]:
    """Unlink every non-directory in the open dir; return its subdirectories' names."""
    dirs = []
    with os.scandir(fd) as it:
        entries = list(it)
    for e in entries:
        if e.is_dir(follow_symlinks=False):
            dirs.append(e.name)
        else:
            try:
                os.unlink(e.name, dir_fd=fd)
            except FileNotFoundError:
                pass
    return dirs


class LayerDirs:
    """The layers/ directory: publish staged layer dirs, list and remove them."""

    def __init__(self, root: str, tmp: str):
        self.root = root
        self.tmp = tmp
        self.upload = None        # S3 objects: upload(staged, layer) before the rename (layercache.py)
        self.drop = None          # S3 objects: drop(layer) unmounts and deletes its EROFS image first
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
        """Move a staged layer into layers/ under a new id and put it on the disk, its bytes and
        its name: a row written after this names nothing a power cut can lose (store/durable.py).
        Synced after the rename, so one journal commit takes both (until a row names it, a layer
        cut short by a crash is an unreferenced one, which fsck and gc leave alone for GC_GRACE)."""
        layer = secrets.token_hex(5)
        if self.upload is not None:
            self.upload(staged, layer)           # complete in S3 before anything can name it
        path = self.path(layer)
        os.rename(staged, path)
        try:
            # (on ext4/XFS the fsync of layers/, changed last by the rename, covers the names)
            durable.sync_tree(path, dirs=not durable.ordered_journal(self.root))
            durable.sync_dir(self.root)
        except BaseException:
            try:
                remove_tree(path)               # (nothing names it; nothing is mounted in it)
            except (OSError, RuntimeError) as exc:
                log.warning("cannot remove unsynced layer %s: %s", layer, exc)
            raise
        return layer

    def clean_stale(self) -> None:
        """Remove staging dirs whose process died (kill -9 mid-import or mid-commit). Runs at
        every engine start: a leftover it cannot remove is logged and left, never fatal."""
        for name in os.listdir(self.tmp):
            # KIND-PID-START-NS-RANDOM (older engines: KIND-PID-RANDOM): see runtime/procid.py
            if "-" in name and dead_owner(name.split("-", 1)[1]):
                try:
                    remove_tree(os.path.join(self.tmp, name))
                except Exception as exc:           # noqa: BLE001 - start-up must go on
                    log.warning("cannot remove stale staging dir %s: %s", name, exc)

    def all(self) -> list[str]:
        return sorted(os.listdir(self.root))

    def remove(self, layer: str) -> None:
        if self.drop is not None:
            self.drop(layer)
        remove_tree(self.path(layer))


def apply_meta(path: str, e: Entry, idmap: IdMap) -> None:
    """Ownership, xattrs, permission bits and mtime of one materialised entry (chmod after chown:
    chown clears setuid bits)."""
    os.lchown(path, idmap.host_uid(e.uid), idmap.host_gid(e.gid))
    # a tree from outside (a bundle) may carry trusted.*/overlay xattrs: they never reach a layer
    set_layer_xattrs(path, [(k, base64.b64decode(v)) for k, v in e.xattrs], idmap)
    if e.kind in (CHR, BLK):
        os.chmod(path, 0)                        # the placeholder stays inert whatever the mode
    elif e.kind != SYMLINK:
        os.chmod(path, e.mode)
    os.utime(path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)


def make_node(path: str, e: Entry, blob_path) -> None:
    """Create one non-directory entry at `path` (metadata applied separately)."""
    if e.kind == FILE:
        shutil.copyfile(blob_path(e.ref), path)
    elif e.kind == SYMLINK:
        os.symlink(e.ref, path)
    elif e.kind in (CHR, BLK):
        make_placeholder(path)                   # never a device node on the host
    elif e.kind == FIFO:
        os.mkfifo(path, 0o600)
    elif e.kind == SOCK:
        os.mknod(path, stat.S_IFSOCK | 0o600)
    elif e.kind == DIR:
        os.mkdir(path, 0o700)
