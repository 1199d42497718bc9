"""Commit: a run's upper directory → a new image, in time proportional to what changed.

The upper (overlay form: whiteouts for deletions, opaque markers for replaced directories,
host-shifted ids) is walked once. Each changed file is copied into a staged layer while it is
hashed, and that copy becomes its blob by hard link. New trees are built only along changed
paths; every untouched subtree keeps its hash. The result's ID is its root tree hash, so a run
that changed nothing returns its source's ID and two runs that made the same change converge.

Hard links: overlayfs breaks a lower hard link when one name is copied up, so groups recorded in
the base image are re-derived for every member the upper touches; groups among upper files are
found by inode. Deep layer stacks are squashed (one layer rebuilt from objects) at MAX_LAYERS.

Untrusted input: the upper is what a sandbox wrote. Every walk is iterative (no recursion on its
depth); a device node is recorded in the tree but the layer gets an inert placeholder; opaque
markers are read only in the xattr namespace the run's overlay honoured.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

from ...store.layers import (IdMap, is_whiteout, make_placeholder, make_whiteout, opaque_xattr,
                           logical_xattrs, read_xattrs, remove_tree, set_layer_xattrs)
from ...errors import Conflict, InvalidInput, NotFound, TooLarge
from ...runtime.openat2 import open_in_root
from ...store import durable
from ...store.blobs import BlobStore
from ...store.db import Database
from ...store.names import check_path_length
from ...store.delta import write_delta
from ...store.objects import (BLK, CHR, DIR, FILE, KIND_OF_MODE, SYMLINK, Entry, decode_tree, encode_xattrs,
                            tree_hash_and_data)
from ...store.store import ImageRow, Store

MAX_LAYERS = 64          # well under the kernel's 500 and where lookups stay fast (PLATFORM.md)
MOUNT_POINTS = ("proc", "dev", "sys")   # made by the helper or runsc when an image lacks them


# Mount points runsc's gofer makes in the root for a live gVisor sandbox's binds under /dev (its
# pid 1's binary, the runtime files' dir): empty, and never the sandbox's (its /dev is gVisor's).
RUNTIME_MOUNTS = (".sandtree-agent", "sandtree")


def _drop_runtime_mounts(changes: dict, staged: str) -> None:
    dev = changes.get("dev")
    if dev is None or dev.kind != "dir":
        return
    for name in RUNTIME_MOUNTS:
        ch = dev.children.get(name)
        if ch is None or ch.kind not in ("dir", "node") or ch.children or (ch.st is not None and ch.st.st_size
                                                                            and ch.kind == "node"):
            continue
        del dev.children[name]
        path = os.path.join(staged, "dev", name)
        try:
            os.rmdir(path) if ch.kind == "dir" else os.unlink(path)
        except OSError:
            pass


@dataclass
class Change:
    kind: str                                  # "del", "dir", "node", "patch"
    st: os.stat_result | None = None
    opaque: bool = False
    children: dict[str, "Change"] = field(default_factory=dict)
    entry: Entry | None = None                 # for "node": the finished entry (hash known)
    hl: str | None = None                      # for "patch": the new hard-link key


class _Frame:
    """One upper directory being read: its sorted names, how far the walk got, where its changes
    go, and (st, opaque) to apply once its children are done (None for the upper's root)."""

    def __init__(self, src: str, dst: str, ipath: str, out: dict, post):
        self.src, self.dst, self.ipath, self.out, self.post = src, dst, ipath, out, post
        with os.scandir(src) as it:
            self.names = sorted((e.name for e in it), key=os.fsencode)
        self.i = 0


@dataclass
class CommitResult:
    image: str
    below: list[str] | None                    # layers under the staged one; None: no new layer
    staged: str | None                         # (the image already existed, or nothing changed)
    trees: dict[str, bytes]
    links: dict[str, list[str]]
    size: int
    files: int
    locations: dict[str, str] = field(default_factory=dict)   # blob digest -> path in the layer


def path_key(p: str):
    return [c.encode("utf-8", "surrogateescape") for c in p.split("/")]


_ZEROS = bytes(1 << 20)
_WRITEBACK = 8 << 20


def _copy_hash(root_fd: int, ipath: str, dst: str, walked: os.stat_result) -> tuple[str, int]:
    """Copy the upper's file at ipath (resolved beneath root_fd, the upper: a directory swapped
    for a symlink since the walk resolves inside the upper, never to a host file; the file itself
    is never followed, and a FIFO does not block) into dst, hashing it. The file must be the one
    the walk saw (same inode): a live sandbox the freezer did not hold could swap names between
    the walk's lstat and this open; then nothing is committed."""
    try:
        fd = open_in_root(root_fd, ipath, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, NotFound, InvalidInput) as exc:   # gone, a symlink now (ELOOP), a dir...
        raise Conflict(f"{ipath} changed while it was being committed ({exc}); nothing was "
                       f"committed", path=ipath) from None
    h = hashlib.sha256()
    n = 0
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (walked.st_dev, walked.st_ino):
            raise Conflict(f"{ipath} changed while it was being committed; nothing was committed",
                           path=ipath)
        with open(dst, "wb") as out:           # runs of zeros stay holes (a sparse file costs
            while chunk := f.read(1 << 20):      # the store what it cost the run's tmpfs)
                h.update(chunk)
                if chunk == _ZEROS[:len(chunk)]:
                    out.seek(len(chunk), os.SEEK_CUR)
                else:
                    out.write(chunk)
                n += len(chunk)
                if n % _WRITEBACK == 0:          # to the disk while the rest is read and hashed:
                    out.flush()                  # publish's fsync then waits for less
                    durable.start_writeback(out.fileno())
            out.truncate(n)                      # a trailing hole still has its length
    return h.hexdigest(), n


class Committer:
    def __init__(self, store: Store):
        self.store = store
        self.idmap: IdMap = store.idmap
        self.opaque_name = opaque_xattr(self.idmap)

    # ---- 1. read the upper, mirror it into a staged layer -------------------------------------
    def _read_upper(self, src: str, dst: str, ipath: str, inodes: dict, locations: dict,
                    budget: list[int] | None) -> dict[str, Change]:
        """budget: [bytes the copied files may still add up to] (the run's disk limit).
        Iterative: a run can nest directories as deep as it likes (1,100 nested mkdirs overflowed
        the recursion). A directory's opaque marker and metadata are applied once its children
        are copied (so its mtime holds)."""
        top: dict[str, Change] = {}
        frames = [_Frame(src, dst, ipath, top, None)]
        root_fd = os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)   # files open beneath it
        try:
            self._walk(frames, root_fd, ipath, inodes, locations, budget)
        finally:
            os.close(root_fd)
        return top

    def _walk(self, frames: list, root_fd: int, root_ipath: str, inodes: dict, locations: dict,
              budget: list[int] | None) -> None:
        while frames:
            f = frames[-1]
            if f.i == len(f.names):
                frames.pop()
                if f.post is not None:
                    st, opaque = f.post
                    if opaque:
                        os.setxattr(f.dst, self.opaque_name, b"y")
                    self._copy_meta(f.src, f.dst, st)
                continue
            name = f.names[f.i]
            f.i += 1
            out = f.out
            s, t, ip = os.path.join(f.src, name), os.path.join(f.dst, name), f.ipath.rstrip("/") + "/" + name
            check_path_length(ip, TooLarge, "the run wrote the path")   # nothing committed
            st = os.lstat(s)
            if is_whiteout(st):
                self._whiteout(t)
                out[name] = Change("del")
                continue
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(t, 0o700)
                opaque = self._is_opaque(s)
                xattrs = encode_xattrs(logical_xattrs(read_xattrs(s), self.idmap))
                ch = Change("dir", st, opaque, {}, entry=Entry(name, DIR, 0, 0, 0, 0, None, xattrs))
                out[name] = ch
                frames.append(_Frame(s, t, ip, ch.children, (st, opaque)))
                continue
            kind = KIND_OF_MODE.get(stat.S_IFMT(st.st_mode))
            if kind is None:
                continue
            ref, size = None, 0
            first = None
            if st.st_nlink > 1:
                members = inodes.setdefault(st.st_ino, [])
                if members:
                    first = members[0]
                members.append((ip, t))
            if first is not None:
                os.link(first[1], t)
                e = self._entry(name, kind, st, first[2] if len(first) > 2 else None, 0)
                out[name] = Change("node", st, entry=e)
                continue
            if kind == FILE:
                if budget is not None:
                    budget[0] -= st.st_size
                    if budget[0] < 0:
                        raise InvalidInput(f"{ip} (apparent size {st.st_size} bytes) takes the run's files "
                                           f"over its disk limit: sparse files are stored whole; "
                                           f"nothing was committed", path=ip, size=st.st_size)
                ref, size = _copy_hash(root_fd, ip[len(root_ipath.rstrip("/")):], t, st)
                locations.setdefault(ref, ip.lstrip("/"))
            elif kind == SYMLINK:
                ref = os.readlink(s)
                os.symlink(ref, t)
            elif kind in (CHR, BLK):
                ref = st.st_rdev                   # recorded; the layer gets an inert placeholder
                make_placeholder(t)
            else:
                os.mknod(t, st.st_mode)
            self._copy_meta(s, t, st)
            if kind in (CHR, BLK):
                os.chmod(t, 0)
            out[name] = Change("node", st, entry=self._entry(name, kind, st, ref, size, s))

    def _entry(self, name, kind, st, ref, size, src=None) -> Entry:
        xattrs = encode_xattrs(logical_xattrs(read_xattrs(src), self.idmap)) if src else ()
        return Entry(name, kind, stat.S_IMODE(st.st_mode), self.idmap.uid(st.st_uid),
                     self.idmap.gid(st.st_gid), size, ref, xattrs, None, st.st_mtime_ns)

    def _is_opaque(self, path: str) -> bool:
        """Opaque as the run's overlay saw it: only the xattr namespace that overlay used (a
        host mount: trusted.overlay.*; a rootless userxattr mount: user.overlay.*). A
        user.overlay.opaque a sandbox set on a host-mounted overlay hid nothing from it, so it
        hides nothing here; like every overlay xattr it is then dropped from the image."""
        try:
            return os.getxattr(path, self.opaque_name, follow_symlinks=False) == b"y"
        except OSError:
            return False

    def _whiteout(self, path: str) -> None:
        make_whiteout(path, self.idmap)

    def _copy_meta(self, src: str, dst: str, st) -> None:
        os.lchown(dst, st.st_uid, st.st_gid)
        set_layer_xattrs(dst, read_xattrs(src), self.idmap)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(dst, stat.S_IMODE(st.st_mode))
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)

    # ---- 2. trees along changed paths ---------------------------------------------------------
    def _apply(self, base_tree: str | None, changes: dict[str, Change], root_change: Change | None,
               trees: dict[str, bytes], totals: list[int]) -> tuple[str, dict[str, Entry]]:
        """New trees along the changed paths, children before parents, without recursion (the
        changes are as deep as the run made them)."""
        def frame(base, chs, link):
            return [dict(self.store.tree(base)) if base else {}, list(chs.items()), 0, link]

        stack = [frame(base_tree, changes, None)]
        while True:
            f = stack[-1]
            entries, items, i, link = f
            if i < len(items):
                f[2] += 1
                name, ch = items[i]
                old = entries.get(name)
                if ch.kind == "del":
                    if old is not None:
                        self._count(old, totals, -1)
                        del entries[name]
                elif ch.kind == "patch":
                    if old is not None:
                        entries[name] = old._replace(hl=ch.hl)
                elif ch.kind == "dir":
                    keep = old is not None and old.kind == DIR and not ch.opaque
                    if old is not None and not keep:
                        self._count(old, totals, -1)
                    stack.append(frame(old.ref if keep else None, ch.children, (name, ch, old)))
                else:
                    if old is not None:
                        self._count(old, totals, -1)
                    entries[name] = ch.entry
                    self._count(ch.entry, totals, +1)
                continue
            stack.pop()
            if link is None:
                break
            digest, data = tree_hash_and_data(entries)
            trees[digest] = data
            name, ch, old = link
            parent = stack[-1][0]
            if ch.st is None:                  # a path only carrying patches: keep metadata
                parent[name] = old._replace(ref=digest)
            else:
                parent[name] = Entry(name, DIR, stat.S_IMODE(ch.st.st_mode), self.idmap.uid(ch.st.st_uid),
                                     self.idmap.gid(ch.st.st_gid), 0, digest, ch.entry.xattrs, None,
                                     ch.st.st_mtime_ns)
        if root_change is not None:
            old = entries.get(".")
            st = root_change.st
            entries["."] = Entry(".", DIR, stat.S_IMODE(st.st_mode), self.idmap.uid(st.st_uid),
                                 self.idmap.gid(st.st_gid), 0, None,
                                 root_change.entry.xattrs if root_change.entry else (old.xattrs if old else ()),
                                 None, st.st_mtime_ns)
        digest, data = tree_hash_and_data(entries)
        trees[digest] = data
        return digest, entries

    def _count(self, e: Entry, totals: list[int], sign: int) -> None:
        todo = [e]
        while todo:
            e = todo.pop()
            if e.kind == FILE:
                totals[0] += sign * e.size
                totals[1] += sign
            elif e.kind == DIR and sign < 0:
                todo.extend(sub for sub in self.store.tree(e.ref).values() if sub.name != ".")

    # ---- 3. hard links ------------------------------------------------------------------------
    def _links(self, base: ImageRow, changes: dict[str, Change], inodes: dict) -> dict[str, list[str]]:
        links: dict[str, list[str]] = {}
        # groups among the upper's own files
        for members in inodes.values():
            if len(members) < 2:
                continue
            paths = sorted((p for p, _ in members), key=path_key)
            links[paths[0]] = paths
            for p in paths:
                self._set_hl(changes, p, paths[0], patch=False)
        # groups of the base that the upper touched
        for key, members in base.links.items():
            remaining = [p for p in members if not _touched(changes, p)]
            if len(remaining) == len(members):
                links[key] = members
                continue
            new_key = remaining[0] if len(remaining) >= 2 else None
            if new_key:
                links[new_key] = remaining
            if new_key != key:
                for p in remaining:
                    self._set_hl(changes, p, new_key, patch=True)
        return links

    @staticmethod
    def _set_hl(changes: dict[str, Change], path: str, key: str | None, *, patch: bool) -> None:
        parts = path.strip("/").split("/")
        node = changes
        for part in parts[:-1]:
            ch = node.get(part)
            if ch is None:
                ch = node[part] = Change("dir", None)      # metadata kept from the base
            node = ch.children
        leaf = parts[-1]
        if patch:
            node[leaf] = Change("patch", hl=key)
        else:
            ch = node[leaf]
            ch.entry = ch.entry._replace(hl=key)

    # ---- the whole commit ---------------------------------------------------------------------
    def commit(self, base: ImageRow, upper: str, *, max_file_size: int | None = None,
               mount_points=(), mtime_clamp: int | None = None) -> CommitResult:
        """mtime_clamp: a build step's SOURCE_DATE_EPOCH (clamp_mtimes). max_file_size: the run's disk limit. The upper's tmpfs caps the blocks a run writes,
        not a sparse file's apparent size, and the store keeps files whole: a `truncate -s 1T`
        must not become a terabyte on the host. mount_points: directories the runtime made in the
        upper for a live sandbox's volumes (engine/volumes.py), left out while they are empty."""
        if not mount_points and self._unchanged(base, upper):
            return CommitResult(base.id, None, None, {}, base.links, base.size, base.files)
        if mtime_clamp is not None:
            clamp_mtimes(upper, mtime_clamp)
        staged = self.store.layers.stage("commit")
        try:
            inodes: dict = {}
            locations: dict[str, str] = {}
            changes = self._read_upper(upper, staged, "/", inodes, locations,
                                       None if max_file_size is None else [max_file_size])
            base_root = self.store.tree(base.id)
            _drop_runtime_mounts(changes, staged)
            _drop_mount_points(changes, staged, mount_points)
            for mp in MOUNT_POINTS:
                ch = changes.get(mp)
                if ch and ch.kind == "dir" and not ch.children and (mp not in base_root or mp == "dev"):
                    # (an image's /dev is always covered, on every tier: its upper's dev/ is only ever
                    # the runtime's mount points, whose creation changed its mtime)
                    del changes[mp]
                    os.rmdir(os.path.join(staged, mp))
            # link groups: fill in entries of later members from the first one
            for members in inodes.values():
                first_path = members[0][0]
                first = _find(changes, first_path)
                for p, _ in members[1:]:
                    ch = _find(changes, p)
                    ch.entry = first.entry._replace(name=ch.entry.name, mtime_ns=ch.entry.mtime_ns)
            links = self._links(base, changes, inodes)
            root_st = os.lstat(upper)
            root_xattrs = encode_xattrs(logical_xattrs(read_xattrs(upper), self.idmap))
            root_change = Change("dir", root_st, entry=Entry(".", DIR, 0, 0, 0, 0, None, root_xattrs))
            trees: dict[str, bytes] = {}
            totals = [base.size, base.files]
            image, _ = self._apply(base.id, changes, root_change, trees, totals)
            if image == base.id or self.store.has_image(image):
                remove_tree(staged)
                return CommitResult(image, None, None, {}, links, totals[0], totals[1])
            self._copy_meta(upper, staged, root_st)
            below = base.layers
            if len(base.layers) + 1 > MAX_LAYERS:
                fresh = {h: os.path.join(staged, p) for h, p in locations.items()}
                squashed = self.store.layers.stage("squash")
                try:
                    locations = write_delta(self.store, None, image, squashed, self._tree_with(trees),
                                            lambda h: fresh.get(h) or self.store.blobs.path(h), links)
                finally:
                    remove_tree(staged)
                staged = squashed
                below = []
            return CommitResult(image, below, staged, trees, links, totals[0], totals[1], locations)
        except BaseException:
            remove_tree(staged)
            raise


    def image_writer(self, cr: CommitResult):
        """Publish a commit's staged layer; return the function that writes its rows (None: no
        new layer) inside the transaction that records the operation (records.Records.record).
        Its `layer` is what to remove if no row came to name it."""
        if cr.staged is None:
            return None
        layer = self.store.layers.publish(cr.staged)

        def write(con):
            if Store.insert_image(con, cr.image, [layer] + cr.below, cr.links, cr.size, cr.files):
                Database.put_trees(con, cr.trees)
                BlobStore.record(con, {h: f"layers/{layer}/{p}" for h, p in cr.locations.items()})
                return True
            return False                                 # a concurrent run made the same image
        write.layer = layer
        return write

    def _tree_with(self, extra: dict[str, bytes]):
        """Tree lookup that also sees trees made by this commit (not yet in the database)."""
        def tree(h):
            return decode_tree(extra[h]) if h in extra else self.store.tree(h)
        return tree

    def _unchanged(self, base: ImageRow, upper: str) -> bool:
        """The common case of a read-only run: an upper whose root kept its metadata, empty but
        for what the full commit would drop (commit's MOUNT_POINTS rule): the mount points a
        runtime made, empty (gVisor makes /sys when an image lacks it, and its binds' mount
        points under dev/: _drop_runtime_mounts)."""
        root = self.store.tree(base.id)
        with os.scandir(upper) as it:
            for e in it:
                if e.name not in MOUNT_POINTS or (e.name in root and e.name != "dev") \
                        or not _empty_mount_point(e, RUNTIME_MOUNTS if e.name == "dev" else ()):
                    return False
        st = os.lstat(upper)
        return (stat.S_IMODE(st.st_mode), self.idmap.uid(st.st_uid), self.idmap.gid(st.st_gid)) == \
            (root["."].mode, root["."].uid, root["."].gid)


def clamp_mtimes(upper: str, epoch: int) -> None:
    """Every entry of `upper` (its root too) modified after `epoch` (seconds) gets `epoch` as its
    mtime: a build step's files then carry the same times in every build (BuildKit's
    rewrite-timestamp), so what a later step reads of them (a tar, a timestamp-based .pyc, a
    make) does not depend on when the build ran. Times are not part of an image's ID; they are
    part of what a later step may write. Iterative and never following a link (the upper is
    what a sandbox wrote; it no longer runs)."""
    limit = epoch * 1_000_000_000
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    todo = [upper]
    while todo:
        path = todo.pop()
        fd = os.open(path, flags)
        try:
            if os.fstat(fd).st_mtime_ns > limit and path == upper:
                os.utime(fd, ns=(limit, limit))
            with os.scandir(fd) as it:
                entries = list(it)
            for e in entries:
                st = e.stat(follow_symlinks=False)
                if st.st_mtime_ns > limit:
                    os.utime(e.name, ns=(min(st.st_atime_ns, limit), limit), dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    todo.append(os.path.join(path, e.name))
        finally:
            os.close(fd)


def _drop_mount_points(changes: dict, staged: str, paths) -> None:
    """Leave out the empty directories made for a live sandbox's volumes (deepest first: a parent
    made only to hold one goes too once it is empty)."""
    for path in sorted(paths, key=lambda p: -p.count("/")):
        parts = path.strip("/").split("/")
        node = changes
        for part in parts[:-1]:
            ch = node.get(part)
            if ch is None or ch.kind != "dir":
                break
            node = ch.children
        else:
            ch = node.get(parts[-1])
            if ch is not None and ch.kind == "dir" and not ch.children and not ch.opaque:
                del node[parts[-1]]
                try:
                    os.rmdir(os.path.join(staged, *parts))
                except OSError:
                    pass


def _empty_mount_point(d: os.DirEntry, allowed: tuple) -> bool:
    """`d` is a directory holding nothing but `allowed` names, each an empty regular file or an
    empty directory (the mount points _drop_runtime_mounts drops)."""
    if not d.is_dir(follow_symlinks=False):
        return False
    with os.scandir(d.path) as it:
        for e in it:
            if e.name not in allowed:
                return False
            st = e.stat(follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                if st.st_size:
                    return False
            elif not stat.S_ISDIR(st.st_mode) or not _empty_mount_point(e, ()):
                return False
    return True


def _touched(changes: dict[str, Change], path: str) -> bool:
    node = changes
    parts = path.strip("/").split("/")
    for i, part in enumerate(parts):
        ch = node.get(part)
        if ch is None:
            return False
        if i == len(parts) - 1 or ch.kind in ("del", "node") or ch.opaque:
            return ch.kind != "patch"
        node = ch.children
    return False


def _find(changes: dict[str, Change], path: str) -> Change:
    node = changes
    parts = path.strip("/").split("/")
    for part in parts[:-1]:
        node = node[part].children
    return node[parts[-1]]
