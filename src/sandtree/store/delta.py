"""Tree delta → layer: the overlay layer that turns image A's filesystem into image B's.

Used wherever a new image is made from objects rather than from a sandbox's writes: a merge
(on top of `ours`), a bundle import (on top of the parent), a squash (from nothing). Walks both
trees together and skips every subtree whose hash is equal, so the cost is what differs. The
walk is iterative (depth is untrusted) and every name is checked against the one name rule before
it is joined to a path (trees from outside were already checked when read: store/names.py).
Device entries become inert placeholders (make_node), never device nodes.
"""

from __future__ import annotations

import os

from ..errors import StoreCorrupt
from .layers import apply_meta, make_node, make_whiteout, opaque_xattr
from .names import check_entry_name
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

    def node(e: Entry, path: str, ipath: str) -> None:
        """Write one non-directory entry at path."""
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

    def child(name: str, path: str, ipath: str) -> tuple[str, str]:
        check_entry_name(name, StoreCorrupt, "tree entry")   # trees from outside were checked
        return os.path.join(path, name), ipath.rstrip("/") + "/" + name

    # An explicit stack instead of recursion (a tree's depth is untrusted). Tasks run LIFO, so a
    # directory's "meta" task is pushed before its children: it runs after them (mtimes hold).
    todo: list[tuple] = [("walk", old, new, dest, "/")]
    while todo:
        task = todo.pop()
        op = task[0]
        if op == "meta":
            apply_meta(task[1], task[2], idmap)
        elif op == "opaque":
            os.setxattr(task[1], opaque_xattr(idmap), b"y")
        elif op == "create":                      # a whole subtree the lower does not have
            _, e, path, ipath = task
            if e.kind != DIR:
                node(e, path, ipath)
                continue
            os.mkdir(path, 0o700)
            todo.append(("meta", path, e))
            for name, sub in sorted(tree(e.ref).items(), reverse=True):
                if name != ".":
                    todo.append(("create", sub, *child(name, path, ipath)))
        else:                                     # "walk": both sides, skipping equal subtrees
            _, old_h, new_h, path, ipath = task
            a = tree(old_h) if old_h else {}
            b = tree(new_h)
            for name in sorted(set(a) | set(b), reverse=True):
                if name == ".":
                    continue
                ea, eb = a.get(name), b.get(name)
                p, ip = child(name, path, ipath)
                if eb is None:
                    make_whiteout(p, idmap)
                elif ea is None:
                    todo.append(("create", eb, p, ip))
                elif ea == eb:
                    continue
                elif ea.kind == DIR and eb.kind == DIR:
                    os.mkdir(p, 0o700)
                    todo.append(("meta", p, eb))
                    todo.append(("walk", ea.ref, eb.ref, p, ip))
                else:
                    if eb.kind == DIR:                   # a dir replacing a non-dir
                        todo.append(("opaque", p))
                    todo.append(("create", eb, p, ip))

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
