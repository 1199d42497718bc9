"""Diff of two images: which paths were added, removed, modified, changed type or metadata.

Both trees are walked together and every subtree whose hash is equal on both sides is skipped,
so the cost is proportional to what differs, not to the images' size. diff(a, b) is the exact
inverse of diff(b, a). Text files get a unified patch; binary files are named as such.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from ..store.inspect import text_lines
from ..store.objects import DIR, FILE, Entry
from ..store.store import Store

MAX_PATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class Change:
    path: str
    kind: str                     # added | removed | modified | type_changed | metadata_changed
    old: Entry | None
    new: Entry | None

    def to_dict(self) -> dict:
        d = {"path": self.path, "kind": self.kind,
             "type": (self.new or self.old).to_dict()["type"]}
        if self.old is not None:
            d["old"] = _brief(self.old)
        if self.new is not None:
            d["new"] = _brief(self.new)
        return d


def _brief(e: Entry) -> dict:
    d = e.to_dict()
    d.pop("name", None)
    d.pop("mtime", None)
    return d


def _same_meta(a: Entry, b: Entry) -> bool:
    return (a.mode, a.uid, a.gid, a.xattrs, a.hl) == (b.mode, b.uid, b.gid, b.xattrs, b.hl)


def diff(store: Store, a: str, b: str) -> list[Change]:
    out: list[Change] = []
    ra, rb = store.tree(a)["."], store.tree(b)["."]
    if not _same_meta(ra, rb):
        out.append(Change("/", "metadata_changed", ra, rb))
    _walk(store, a, b, "", out)
    return out


def _walk(store: Store, ta: str | None, tb: str | None, prefix: str, out: list[Change]) -> None:
    """Both trees together, depth first in name order; a stack of frames instead of recursion
    (an image's depth is untrusted: a run can nest 1,100 directories)."""
    def frame(ta, tb, prefix):
        ea = store.tree(ta) if ta else {}
        eb = store.tree(tb) if tb else {}
        names = sorted(set(ea) | set(eb), key=lambda n: n.encode("utf-8", "surrogateescape"))
        return ea, eb, prefix, iter(names)

    if ta == tb:
        return
    stack = [frame(ta, tb, prefix)]
    while stack:
        ea, eb, prefix, names = stack[-1]
        name = next(names, None)
        if name is None:
            stack.pop()
            continue
        if name == ".":
            continue
        x, y = ea.get(name), eb.get(name)
        path = f"{prefix}/{name}"
        sub = None
        if x is None:
            out.append(Change(path, "added", None, y))
            if y.kind == DIR:
                sub = (None, y.ref)
        elif y is None:
            out.append(Change(path, "removed", x, None))
            if x.kind == DIR:
                sub = (x.ref, None)
        elif x.kind != y.kind:
            out.append(Change(path, "type_changed", x, y))
            if x.kind == DIR:
                sub = (x.ref, None)
            if y.kind == DIR:
                sub = (None, y.ref)
        elif x.kind == DIR:
            if not _same_meta(x, y):
                out.append(Change(path, "metadata_changed", x, y))
            if x.ref != y.ref:
                sub = (x.ref, y.ref)
        elif (x.ref, x.size) != (y.ref, y.size):
            out.append(Change(path, "modified", x, y))
        elif not _same_meta(x, y):
            out.append(Change(path, "metadata_changed", x, y))
        if sub is not None:
            stack.append(frame(sub[0], sub[1], path))


def patch(store: Store, changes: list[Change]) -> str:
    """A unified diff (git style headers) of the file contents among `changes`."""
    chunks = []
    for c in changes:
        if c.kind not in ("added", "removed", "modified", "type_changed"):
            continue
        old = c.old if c.old is not None and c.old.kind == FILE else None
        new = c.new if c.new is not None and c.new.kind == FILE else None
        if old is None and new is None:
            continue
        a, b = text_lines(store, old, MAX_PATCH_BYTES), text_lines(store, new, MAX_PATCH_BYTES)
        if a is None or b is None:
            chunks.append(f"Binary files a{c.path} and b{c.path} differ\n")
            continue
        lines = difflib.unified_diff(a, b, fromfile=f"a{c.path}" if old else "/dev/null",
                                     tofile=f"b{c.path}" if new else "/dev/null")
        text = "".join(l if l.endswith("\n") else l + "\n\\ No newline at end of file\n" for l in lines)
        if text:
            chunks.append(f"diff --sandtree a{c.path} b{c.path}\n" + text)
    return "".join(chunks)
