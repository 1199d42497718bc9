"""Tree delta → layer: the overlay layer that turns image A's filesystem into image B's.

Used wherever a new image is made from objects rather than from a sandbox's writes: a merge
(on top of `ours`), a bundle import (on top of the parent), a squash (from nothing). Walks both
trees together and skips every subtree whose hash is equal, so the cost is what differs.
"""

from __future__ import annotations

import os

from .layers import apply_meta, make_node, make_whiteout, opaque_xattr
from .objects import DIR, FILE, Entry
from .store import Store


def write_delta(store: Store, old: str | None, new: str, dest: str, tree, blob_path,
                new_links: dict[str, list[str]] | None = None) -> dict[str, str]:
    """Fill the empty dir `dest` so that layers(old) + dest == new. `tree(h)` returns entries
    (so trees not yet in the database can be used); `new_links` is the new image's hard-link
    groups. Returns blob locations inside dest."""
    idmap = store.idmap
    locations: dict[str, str] = {}
    links: dict[str, str] = {}
    written: dict[str, str] = {}          # image path -> layer path, for hard-link members

    def create(e: Entry, path: str, ipath: str) -> None:
        """Write e (and a whole subtree for a dir) at path."""
        if e.kind == DIR:
            os.mkdir(path, 0o700)
            for name, sub in sorted(tree(e.ref).items()):
                if name != ".":
                    create(sub, os.path.join(path, name), ipath.rstrip("/") + "/" + name)
            apply_meta(path, e, idmap)
            return
        if e.hl:
            written[ipath] = path
        if e.hl and e.hl in links:
            os.link(links[e.hl], path)
            return
        make_node(path, e, blob_path)
        apply_meta(path, e, idmap)
        if e.hl:
            links[e.hl] = path
        if e.kind == FILE:
            locations.setdefault(e.ref, ipath.lstrip("/"))

    def walk(old_h: str | None, new_h: str, path: str, ipath: str) -> None:
        a = tree(old_h) if old_h else {}
        b = tree(new_h)
        for name in sorted(set(a) | set(b)):
            if name == ".":
                continue
            ea, eb = a.get(name), b.get(name)
            p, ip = os.path.join(path, name), ipath.rstrip("/") + "/" + name
            if eb is None:
                make_whiteout(p, idmap)
            elif ea is None:
                create(eb, p, ip)
            elif ea == eb:
                continue
            elif ea.kind == DIR and eb.kind == DIR:
                os.mkdir(p, 0o700)
                walk(ea.ref, eb.ref, p, ip)
                apply_meta(p, eb, idmap)
            else:
                create(eb, p, ip)
                if eb.kind == DIR:                       # a dir replacing a non-dir
                    os.setxattr(p, opaque_xattr(idmap), b"y")

    walk(old, new, dest, "/")
    # A hard-link group is one inode: if the delta wrote one member, it writes them all
    # (a lower layer's copy cannot share an inode with this layer's).
    for key, members in (new_links or {}).items():
        if key not in links:
            continue
        for member in members:
            if member in written:
                continue
            parts = member.strip("/").split("/")
            cur_h, cur_path = new, dest
            for part in parts[:-1]:
                e = tree(cur_h)[part]
                cur_path = os.path.join(cur_path, part)
                if not os.path.isdir(cur_path):
                    os.mkdir(cur_path, 0o700)
                    apply_meta(cur_path, e, idmap)
                cur_h = e.ref
            target = os.path.join(cur_path, parts[-1])
            if os.path.lexists(target):
                os.unlink(target)
            os.link(links[key], target)
    apply_meta(dest, tree(new)["."], idmap)
    return locations
