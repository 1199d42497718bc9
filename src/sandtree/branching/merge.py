"""Three-way merge of images, at the level of trees and, for text files, of lines (like git).

Rules per name, comparing the state (not timestamps) of base, ours and theirs:
- equal on both sides, or changed on one side only: take that side (a deletion is a change);
- directories on both sides: merge recursively;
- a text file changed on both sides: merge line by line (merge3, the bzr/breezy algorithm);
- anything else is a conflict: content (both changed, lines overlap or binary), add/add,
  modify/delete, type (file vs dir...), metadata (mode/owner changed differently).
Identical subtrees are skipped by hash, so the cost is what the branches changed. The walk keeps
its own stack (no recursion on the trees' depth).
A strategy resolves conflicts: "ours", "theirs", or "markers" (git-style conflict markers written
into text files; for what has no text form, ours). Without one, conflicts make no image.

Ignored paths (`ignore`: globs, DEFAULT_IGNORE unless given) never conflict: where both sides
changed one differently, ours is taken (a build product such as `__pycache__/` or `*.pyc` is
remade from the sources anyway); a change made on one side only merges as any path's does. A
glob ending in `/` names directories (and all below them); one holding another `/` is matched
against the whole path from the root; any other against the name, at any depth (as .gitignore).
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field

import merge3

from ..errors import InvalidInput, MergeConflict
from ..store.inspect import text_lines
from ..store.objects import DIR, EMPTY_TREE_HASH, FILE, Entry, decode_tree, tree_hash_and_data
from ..store.store import Store
from ..defaults import MERGE_IGNORE

STRATEGIES = (None, "ours", "theirs", "markers")
DEFAULT_IGNORE = MERGE_IGNORE


def check_ignore(ignore) -> tuple[str, ...]:
    """The globs to ignore: DEFAULT_IGNORE for None; [] ignores nothing."""
    if ignore is None:
        return DEFAULT_IGNORE
    if isinstance(ignore, str) or not all(isinstance(g, str) and g.strip("/") for g in ignore):
        raise InvalidInput(f"ignore is a list of non-empty globs, not {ignore!r}")
    if len(ignore) > 1000 or any(len(g) > 1000 for g in ignore):
        raise InvalidInput("ignore: at most 1000 globs of at most 1000 characters")
    return tuple(ignore)


def ignored(globs: tuple[str, ...], path: str, is_dir: bool) -> bool:
    name = path.rsplit("/", 1)[-1]
    for g in globs:
        dir_only = g.endswith("/")
        pat = g.rstrip("/")
        if dir_only and not is_dir:
            continue
        if "/" in pat:
            if fnmatch.fnmatchcase(path.lstrip("/"), pat.lstrip("/")):
                return True
        elif fnmatch.fnmatchcase(name, pat):
            return True
    return False
# Larger files are merged like binary ones (a conflict when both sides changed them): a line
# merge holds each side several times over in memory, and a merge runs in the server.
MAX_TEXT_MERGE = 16 << 20


@dataclass
class Conflict:
    path: str
    kind: str                    # content | add/add | modify/delete | type | metadata
    ours: Entry | None
    theirs: Entry | None

    def to_dict(self) -> dict:
        side = lambda e: None if e is None else {k: v for k, v in e.to_dict().items() if k not in ("name", "mtime")}
        return {"path": self.path, "kind": self.kind, "ours": side(self.ours), "theirs": side(self.theirs)}


@dataclass
class TreeMerge:
    root: str | None
    trees: dict[str, bytes] = field(default_factory=dict)
    conflicts: list[Conflict] = field(default_factory=list)
    blobs: dict[str, bytes] = field(default_factory=dict)     # merged texts, not yet stored
    ignored: list[str] = field(default_factory=list)          # both sides changed, ours taken


def _state(e: Entry | None):
    return None if e is None else e.hashed()


def _meta(e: Entry):
    return (e.mode, e.uid, e.gid, e.xattrs)


class _Merger:
    def __init__(self, store: Store, strategy: str | None, ignore=None):
        if strategy not in STRATEGIES:
            raise InvalidInput(f"unknown merge strategy {strategy!r} (ours, theirs, markers)")
        self.store = store
        self.strategy = strategy
        self.ignore = check_ignore(ignore)
        self.ignored: list[str] = []
        self.trees: dict[str, bytes] = {}
        self.conflicts: list[Conflict] = []
        self.pending: dict[str, bytes] = {}

    def tree(self, h: str | None) -> dict[str, Entry]:
        return self.store_or_new(h)

    @staticmethod
    def _shortcut(b: str | None, o: str | None, t: str | None):
        """The merged tree when one side did not change it; _WALK when it must be walked."""
        if o == t:
            return o
        if b == o:
            return t
        if b == t:
            return o
        return _WALK

    def dir(self, b: str | None, o: str | None, t: str | None, path: str) -> str:
        """The merged tree of three directories. Iterative: a frame per directory being merged,
        so the depth of the trees (untrusted: a run can nest 1,100 directories) costs no stack."""
        short = self._shortcut(b, o, t)
        if short is not _WALK:
            return short
        stack = [_MergeFrame(self, b, o, t, path)]
        result = None
        while stack:
            f = stack[-1]
            name = next(f.names, None)
            if name is None:
                digest, data = tree_hash_and_data(f.out)
                self.trees[digest] = data
                stack.pop()
                if stack:
                    stack[-1].deliver(digest)
                else:
                    result = digest
                continue
            if name == ".":                              # the root dir's own metadata
                x, y, z = f.eb.get(name), f.eo.get(name), f.et.get(name)
                if y is not None and z is not None:
                    f.out["."] = self.meta(x, y, z, "/")
                elif y is not None or z is not None:
                    f.out["."] = y or z
                continue
            p = f"{f.path}/{name}"
            step = self.entry(f.eb.get(name), f.eo.get(name), f.et.get(name), p)
            if isinstance(step, _Descend):
                short = self._shortcut(step.b, step.o, step.t)
                f.waiting = (name, step.finish)
                if short is not _WALK:
                    f.deliver(short)
                else:
                    stack.append(_MergeFrame(self, step.b, step.o, step.t, p))
                continue
            f.put(name, step)
        return result

    def entry(self, b: Entry | None, o: Entry | None, t: Entry | None, path: str):
        """The merged entry, or a _Descend when the answer needs a subdirectory merged first."""
        sb, so, st = _state(b), _state(o), _state(t)
        if so == st:
            return o if (o is None or t is None or o.mtime_ns >= t.mtime_ns) else t
        if sb == so:
            return t
        if sb == st:
            return o
        if self.ignore and ignored(self.ignore, path, any(e is not None and e.kind == DIR for e in (o, t))):
            self.ignored.append(path)
            return o
        if o is not None and t is not None and o.kind == DIR and t.kind == DIR:
            meta = self.meta(b, o, t, path)
            return _Descend(b.ref if b is not None and b.kind == DIR else None, o.ref, t.ref,
                            lambda sub: meta._replace(ref=sub))
        if b is not None and b.kind == DIR and (o is None or t is None) and (o or t).kind == DIR:
            # one side deleted a directory the other changed inside: decide file by file
            kept = o or t

            def finish(sub):
                if not [n for n in self.store_or_new(sub) if n != "."]:
                    return None
                return kept._replace(ref=sub)
            return _Descend(b.ref, o.ref if o is not None else None, t.ref if t is not None else None, finish)
        if o is not None and t is not None and o.kind == FILE and t.kind == FILE:
            return self.file(b if b is not None and b.kind == FILE else None, o, t, path)
        if o is None or t is None:
            kind = "modify/delete"
        elif o.kind != t.kind:
            kind = "type"
        else:
            kind = "add/add" if b is None else "content"
        return self.conflict(path, kind, o, t)

    def store_or_new(self, h: str | None) -> dict[str, Entry]:
        if h is None or h == EMPTY_TREE_HASH:
            return {}
        return decode_tree(self.trees[h]) if h in self.trees else self.store.tree(h)

    def meta(self, b: Entry | None, o: Entry, t: Entry, path: str) -> Entry:
        if _meta(o) == _meta(t) or (b is not None and _meta(b) == _meta(t)):
            return o
        if b is not None and _meta(b) == _meta(o):
            return o._replace(mode=t.mode, uid=t.uid, gid=t.gid, xattrs=t.xattrs)
        resolved = self.conflict(path, "metadata", o, t)
        return resolved if resolved is not None else o

    def file(self, b: Entry | None, o: Entry, t: Entry, path: str) -> Entry | None:
        meta = self.meta(b, o, t, path)
        if (o.ref, o.size) == (t.ref, t.size):
            return meta._replace(hl=o.hl if o.hl == t.hl else None)
        if b is not None and (b.ref, b.size) == (o.ref, o.size):
            return meta._replace(ref=t.ref, size=t.size, hl=None)
        if b is not None and (b.ref, b.size) == (t.ref, t.size):
            return meta._replace(ref=o.ref, size=o.size, hl=None)
        texts = [text_lines(self.store, e, MAX_TEXT_MERGE) for e in (b, o, t)]
        if any(x is None for x in texts):
            return self.conflict(path, "add/add" if b is None else "content", o, t)
        m = merge3.Merge3(texts[0], texts[1], texts[2])
        clean = all(region[0] != "conflict" for region in m.merge_regions())
        if clean:
            data = "".join(m.merge_lines()).encode()
        else:
            resolved = self.conflict(path, "add/add" if b is None else "content", o, t)
            if self.strategy != "markers":
                return resolved
            data = "".join(m.merge_lines(name_a="ours", name_b="theirs")).encode()
        digest = hashlib.sha256(data).hexdigest()
        self.pending[digest] = data                    # written only if an image is made
        return meta._replace(ref=digest, size=len(data), hl=None)

    def conflict(self, path: str, kind: str, o: Entry | None, t: Entry | None) -> Entry | None:
        self.conflicts.append(Conflict(path, kind, o, t))
        if self.strategy == "theirs":
            return t
        if self.strategy == "markers" and kind == "modify/delete":
            return o if o is not None else t           # keep the modified side
        return o                                       # ours, markers without text form, or none


_WALK = object()


@dataclass
class _Descend:
    """entry() needs the merged subdirectory (b, o, t) before it can answer: finish(tree)."""
    b: str | None
    o: str | None
    t: str | None
    finish: object


class _MergeFrame:
    def __init__(self, m: _Merger, b, o, t, path: str):
        self.eb, self.eo, self.et = m.tree(b), m.tree(o), m.tree(t)
        self.path = path
        self.names = iter(sorted(set(self.eb) | set(self.eo) | set(self.et)))
        self.out: dict[str, Entry] = {}
        self.waiting = None                      # (name, finish) while a subdirectory merges

    def put(self, name: str, merged: Entry | None) -> None:
        if merged is not None:
            self.out[name] = merged._replace(name=name)

    def deliver(self, tree: str | None) -> None:
        name, finish = self.waiting
        self.waiting = None
        self.put(name, finish(tree))


def merge_trees(store: Store, base: str | None, ours: str, theirs: str, strategy: str | None = None,
                ignore=None) -> TreeMerge:
    m = _Merger(store, strategy, ignore)
    root = m.dir(base, ours, theirs, "")
    if m.conflicts and strategy is None:
        return TreeMerge(None, {}, m.conflicts, ignored=m.ignored)
    return TreeMerge(root, m.trees, m.conflicts, m.pending, m.ignored)

ON_CONFLICT = ("raise", "return")


def check_on_conflict(on_conflict) -> None:
    if on_conflict not in ON_CONFLICT:
        raise InvalidInput(f"on_conflict is raise or return, not {on_conflict!r}")


def conflict_outcome(res: dict, on_conflict: str) -> dict:
    """A merge that made no image raises MergeConflict unless the caller asked for the conflicts back."""
    if res["image"] is None and on_conflict == "raise":
        n = len(res["conflicts"])
        paths = ", ".join(f"{c['path']} ({c['kind']})" for c in res["conflicts"][:10])
        raise MergeConflict(f"merge left {n} conflict{'s' if n != 1 else ''}, no image made: {paths}"
                            f"{' ...' if n > 10 else ''} (pass a strategy: ours, theirs or markers; or ignore globs)",
                            conflicts=res["conflicts"], base=res["base"])
    return res
