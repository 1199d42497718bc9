"""Directory → trees: how an imported filesystem becomes objects and a layer.

`scan(src, dest, ...)` walks `src` in sorted order, iteratively (no recursion on its depth). With dest=None the directory is adopted in
place (a staged tar extraction or debootstrap run that already lives in the store's tmp/); with
a dest it is mirrored there. Either way the result is a layer directory with host-shifted ids,
every regular file known as a blob (hard-linked, not copied), and one tree object per directory.
The walk reads each file once: cost is the size of what is imported. Device nodes are recorded
in the trees and left in the layer only as inert placeholders (store/layers.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field

from ..errors import InvalidInput
from .names import check_path_length
from .layers import (CAPS, IdMap, logical_xattrs, make_placeholder, open_regular, read_device_marker,
                     read_xattrs, set_layer_xattrs)
from .objects import (CHR, BLK, DIR, FILE, KIND_OF_MODE, SYMLINK, Entry, encode_xattrs,
                      tree_hash_and_data)


@dataclass
class ScanResult:
    root: str                                  # root tree hash = image id
    trees: dict[str, bytes]
    links: dict[str, list[str]]
    locations: dict[str, str]                  # blob digest -> path inside the layer
    size: int = 0
    files: int = 0


@dataclass
class _Dir:
    path: str                                  # image path, "/" for the root
    entries: dict[str, Entry] = field(default_factory=dict)


class _Frame:
    """One directory of the walk: where it is, its sorted names, how far it got."""

    def __init__(self, spath: str, dpath: str, ipath: str, names: list[str], entry_name: str | None = None,
                 st=None, xattrs: tuple = ()):
        self.spath, self.dpath, self.ipath, self.names = spath, dpath, ipath, names
        self.entry_name, self.st, self.xattrs = entry_name, st, xattrs
        self.i = 0
        self.d = _Dir(ipath)


def _hash_copy(src: str, dst: str | None) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open_regular(src) as f:
        out = open(dst, "wb") if dst else None
        try:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
                if out:
                    out.write(chunk)
        finally:
            if out:
                out.close()
    return h.hexdigest(), size


def scan(src: str, dest: str | None, idmap: IdMap, *, ids_are_host: bool = False,
         progress=None) -> ScanResult:
    """Walk `src`; ids on disk are sandbox ids unless ids_are_host. The layer ends up host-shifted."""
    inodes: dict[tuple[int, int], list[str]] = {}
    first_ids: dict[tuple[int, int], tuple[int, int]] = {}     # hard-linked inode -> its logical ids
    locations: dict[str, str] = {}
    dirs: list[_Dir] = []
    total = [0, 0]

    def logical(st):
        if ids_are_host:
            return idmap.uid(st.st_uid), idmap.gid(st.st_gid)
        return st.st_uid, st.st_gid

    def place(spath: str, dpath: str, st, uid: int, gid: int, is_dir: bool, device: bool = False) -> None:
        # Shift ids to host ids in the layer; chmod after chown (chown clears setuid bits).
        target = dpath
        pairs = read_xattrs(spath)                 # before the chown: it drops file capabilities
        os.lchown(target, idmap.host_uid(uid), idmap.host_gid(gid))
        if device:
            os.chmod(target, 0)                   # a device's placeholder stays inert
        elif not stat.S_ISLNK(st.st_mode):
            os.chmod(target, stat.S_IMODE(st.st_mode))
        if dest is not None:
            set_layer_xattrs(target, pairs, idmap)
        elif not stat.S_ISLNK(st.st_mode):
            # in place: file capabilities return in layer form (store/layers.py, CAPS)
            caps = [(k, v) for k, v in pairs if k == CAPS]
            if caps:
                set_layer_xattrs(target, caps, idmap)
        if not is_dir:
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)

    def listing(spath: str) -> list[str]:
        with os.scandir(spath) as it:
            return sorted((e.name for e in it), key=os.fsencode)

    # Iterative depth-first walk (untrusted depth: a 1,100-deep tar overflowed the recursion).
    # A frame is one directory being read; a directory's entry is made when its frame is done,
    # after its children (its tree hash comes later, children first, from `dirs`).
    root_frame = _Frame(src, dest if dest is not None else src, "/", listing(src))
    frames = [root_frame]
    while frames:
        f = frames[-1]
        if f.i == len(f.names):
            frames.pop()
            dirs.append(f.d)
            if f.entry_name is not None:
                parent = frames[-1]
                st, (uid, gid) = f.st, logical(f.st)
                parent.d.entries[f.entry_name] = Entry(f.entry_name, DIR, stat.S_IMODE(st.st_mode), uid, gid,
                                                       0, f.d.path, f.xattrs, None, st.st_mtime_ns)
                place(f.spath, f.dpath, st, uid, gid, True)
                os.utime(f.dpath, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
            continue
        name = f.names[f.i]
        f.i += 1
        d = f.d
        s = os.path.join(f.spath, name)
        t = os.path.join(f.dpath, name)
        ip = check_path_length(f.ipath.rstrip("/") + "/" + name, InvalidInput, "imported path")
        st = os.lstat(s)
        kind = KIND_OF_MODE.get(stat.S_IFMT(st.st_mode))
        if kind is None:
            continue
        uid, gid = logical(st)
        if st.st_nlink > 1 and (st.st_dev, st.st_ino) in first_ids:
            # a later name of an inode already placed in place: its ids on disk are host ids now
            uid, gid = first_ids[(st.st_dev, st.st_ino)]
        xattrs = encode_xattrs(logical_xattrs(read_xattrs(s), idmap))
        if kind == DIR:
            if dest is not None:
                os.mkdir(t, 0o700)
            frames.append(_Frame(s, t, ip, listing(s), name, st, xattrs))
            continue
        mode = stat.S_IMODE(st.st_mode)
        ref = None
        size = 0
        hl = None
        marker = read_device_marker(s) if dest is None and kind == FILE else None
        if marker is not None:                     # an import's placeholder: the device it records
            kind, ref, mode = marker
        key = (st.st_dev, st.st_ino)
        if st.st_nlink > 1:
            first_ids.setdefault(key, (uid, gid))
            members = inodes.setdefault(key, [])
            members.append(ip)
            hl = f"{st.st_dev}:{st.st_ino}"
            if dest is not None and len(members) > 1:
                first = os.path.join(dest, members[0].lstrip("/"))
                os.link(first, t)
                d.entries[name] = Entry(name, kind, mode, uid, gid, 0, None, xattrs, hl, st.st_mtime_ns)
                continue
        if marker is not None:
            pass
        elif kind == FILE:
            ref, size = _hash_copy(s, t if dest is not None else None)
            locations.setdefault(ref, ip.lstrip("/"))
            total[0] += size
            total[1] += 1
            if progress:
                progress(size)
        elif kind == SYMLINK:
            ref = os.readlink(s)
            if dest is not None:
                os.symlink(ref, t)
        elif kind in (CHR, BLK):
            # recorded, never created: the layer holds an inert placeholder (store/layers.py)
            ref = st.st_rdev
            if dest is None:
                os.unlink(s)
            make_placeholder(t)
        elif dest is not None:
            os.mknod(t, st.st_mode)
        d.entries[name] = Entry(name, kind, mode, uid, gid, size, ref, xattrs, hl, st.st_mtime_ns)
        place(s, t, st, uid, gid, False, device=kind in (CHR, BLK))

    root_st = os.lstat(src)
    uid, gid = logical(root_st)
    target = dest if dest is not None else src
    os.lchown(target, idmap.host_uid(uid), idmap.host_gid(gid))
    os.chmod(target, stat.S_IMODE(root_st.st_mode))
    os.utime(target, ns=(root_st.st_atime_ns, root_st.st_mtime_ns))

    # Hard-link groups: provisional keys (dev:ino) become the group's first path, or vanish when
    # only one path of the inode is inside the image.
    links: dict[str, list[str]] = {}
    rename: dict[str, str | None] = {}
    for key, members in inodes.items():
        prov = f"{key[0]}:{key[1]}"
        if len(members) > 1:
            rename[prov] = members[0]
            links[members[0]] = members
        else:
            rename[prov] = None
    # Member entries that were created as links copy the group's first member's content.
    first_entry: dict[str, Entry] = {}
    for d in dirs:
        for e in d.entries.values():
            if e.hl is not None and e.ref is not None:
                first_entry[e.hl] = e

    trees: dict[str, bytes] = {}
    hashes: dict[str, str] = {}
    for d in dirs:                              # children are appended before their parents
        fixed = {}
        for name, e in d.entries.items():
            if e.kind == DIR:
                e = e._replace(ref=hashes[e.ref])
            elif e.hl is not None:
                src_e = first_entry.get(e.hl, e)
                e = e._replace(ref=src_e.ref, size=src_e.size, hl=rename[e.hl])
            fixed[name] = e
        if d.path == "/":
            fixed["."] = Entry(".", DIR, stat.S_IMODE(root_st.st_mode), uid, gid, 0, None,
                               encode_xattrs(logical_xattrs(read_xattrs(src), idmap)), None, root_st.st_mtime_ns)
        digest, data = tree_hash_and_data(fixed)
        trees[digest] = data
        hashes[d.path] = digest
    return ScanResult(hashes["/"], trees, links, locations, total[0], total[1])
