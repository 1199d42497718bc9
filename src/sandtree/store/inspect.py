"""Reading an image without running anything: resolve a path, ls, stat, read, grep, export tar.

Everything walks trees from the root, one tree object per directory on the path, and opens only
the blobs it reads: cost follows what is read, never the image's size. Paths are resolved like a
chroot: absolute symlinks are image-rooted; anything that would climb above the root (`..` or a
symlink) is refused with PathEscape rather than clamped, so a caller never reads what it did not
mean to.
"""

from __future__ import annotations

import base64
import collections
import fnmatch
import os
import tarfile

import re2

from ..errors import InvalidInput, NotRegularFile, PathEscape, PathNotFound
from .objects import BLK, CHR, DIR, FIFO, FILE, KIND_NAMES, SYMLINK, Entry
from .store import Store

MAX_SYMLINKS = 40
MAX_LINE = 1 << 20


def split_path(path: str) -> list[str]:
    if not isinstance(path, str) or "\0" in path:
        raise InvalidInput("a path must be a string without NUL bytes")
    parts = []
    for p in path.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not parts:
                raise PathEscape(f"path {path!r} escapes the image root", path=path)
            parts.pop()
        else:
            parts.append(p)
    return parts


def resolve(store: Store, root: str, path: str, *, follow: bool = True) -> tuple[str, Entry]:
    """(normalised path, entry) for `path` in the tree `root`; the root itself is the '.' entry."""
    todo = split_path(path)
    done: list[str] = []
    stack: list[str] = [root]               # tree hashes of done's prefixes
    hops = 0
    entry = _root_entry(store, root)
    while todo:
        name = todo.pop(0)
        if name == "..":                     # only produced by symlink targets
            if not done:
                raise PathEscape(f"path {path!r} escapes the image root through a symlink", path=path)
            done.pop()
            stack.pop()
            entry = _dir_entry(store, stack, done)
            continue
        if entry.kind != DIR:
            raise PathNotFound(f"{'/' + '/'.join(done)} is not a directory", path=path)
        e = store.tree(stack[-1]).get(name)
        if e is None:
            raise PathNotFound(f"no such file or directory: {'/' + '/'.join(done + [name])}", path=path)
        if e.kind == SYMLINK and (todo or follow):
            hops += 1
            if hops > MAX_SYMLINKS:
                raise InvalidInput(f"too many levels of symbolic links in {path!r}")
            target = e.ref
            if target.startswith("/"):
                done, stack = [], [root]
                entry = _root_entry(store, root)
            rest = [p for p in target.split("/") if p not in ("", ".")]
            todo = rest + todo
            continue
        done.append(name)
        entry = e
        if e.kind == DIR:
            stack.append(e.ref)
        elif todo:
            raise PathNotFound(f"{'/' + '/'.join(done)} is not a directory", path=path)
    return "/" + "/".join(done), entry


def _root_entry(store: Store, root: str) -> Entry:
    return store.tree(root)["."]._replace(name="/", ref=root)


def _dir_entry(store: Store, stack: list[str], done: list[str]) -> Entry:
    if not done:
        return _root_entry(store, stack[0])
    return store.tree(stack[-2])[done[-1]]


def listdir(store: Store, root: str, path: str = "/") -> list[Entry]:
    p, e = resolve(store, root, path)
    if e.kind != DIR:
        raise InvalidInput(f"{p} is not a directory")
    return [x for n, x in sorted(store.tree(e.ref).items()) if n != "."]


def read(store: Store, root: str, path: str, *, offset: int = 0, limit: int | None = None) -> bytes:
    p, e = resolve(store, root, path)
    if e.kind != FILE:
        # devices, FIFOs and sockets are metadata here: nothing on the host is ever opened for them
        raise NotRegularFile(f"{p} is not a regular file (a {KIND_NAMES[e.kind]})", path=p)
    with store.blobs.open(e.ref) as f:
        f.seek(offset)
        return f.read() if limit is None else f.read(limit)


def text_lines(store: Store, e: Entry | None, max_bytes: int | None = None) -> list[str] | None:
    """A file's lines (keepends) if it is UTF-8 text; None for binary, non-files or too large;
    [] for no entry (an absent side of a diff or merge)."""
    if e is None:
        return []
    if e.kind != FILE or (max_bytes is not None and e.size > max_bytes):
        return None
    with store.blobs.open(e.ref) as f:
        data = f.read()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8").splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def walk(store: Store, tree: str, prefix: str):
    """(path, entry) for everything under the tree, sorted, depth first. A stack of iterators,
    not nested generators: an image's depth is untrusted (1,100 levels overflowed `yield from`)."""
    stack = [(prefix.rstrip("/"), iter(sorted(store.tree(tree).items())))]
    while stack:
        base, it = stack[-1]
        item = next(it, None)
        if item is None:
            stack.pop()
            continue
        name, e = item
        if name == ".":
            continue
        p = base + "/" + name
        yield p, e
        if e.kind == DIR:
            stack.append((p, iter(sorted(store.tree(e.ref).items()))))


def grep(store: Store, root: str, pattern: str, path: str = "/", *, glob: str | None = None,
         max_matches: int = 1000, ignore_case: bool = False, before: int = 0, after: int = 0) -> list[dict]:
    """Matching lines ({path, line, text}); before/after: that many lines of context around each
    match too, as ripgrep -B/-A (entries with "context": True, not counted as matches; at most 50)."""
    rx = _compile(pattern, ignore_case)
    if max_matches <= 0:
        raise InvalidInput("max_matches must be positive")
    if not (0 <= before <= 50 and 0 <= after <= 50):
        raise InvalidInput("before and after must be 0..50 lines")
    p, e = resolve(store, root, path)
    items = [(p, e)] if e.kind != DIR else walk(store, e.ref, p)
    out = []
    found = 0
    for fp, fe in items:
        if fe.kind != FILE:
            continue
        if glob and not (fnmatch.fnmatch(fp, glob) or fnmatch.fnmatch(fp.rsplit("/", 1)[-1], glob)):
            continue
        with store.blobs.open(fe.ref) as f:
            head = f.read(8192)
            if b"\0" in head:
                continue                      # binary
            f.seek(0)
            recent: collections.deque = collections.deque(maxlen=before or 1)
            trailing = 0                      # context lines still owed after the last match
            # a line is read at most MAX_LINE bytes at a time (a 10 GB file without a newline
            # must not be one string); longer lines are matched in pieces
            for lineno, line in enumerate(iter(lambda: f.readline(MAX_LINE), b""), 1):
                text = line.rstrip(b"\n").decode("utf-8", "replace")
                if rx.search(line[:-1] if line.endswith(b"\n") else line):   # RE2: $ is the end
                    if before:
                        out.extend({"path": fp, "line": n, "text": t, "context": True} for n, t in recent)
                        recent.clear()
                    out.append({"path": fp, "line": lineno, "text": text})
                    found += 1
                    if found >= max_matches:
                        return out
                    trailing = after
                elif trailing:
                    out.append({"path": fp, "line": lineno, "text": text, "context": True})
                    trailing -= 1
                elif before:
                    recent.append((lineno, text))
    return out


def _compile(pattern: str, ignore_case: bool):
    """A user's regex, compiled by RE2: matching is linear in the text, whatever the pattern
    (Python's re backtracks: `(a+)+$` on 31 bytes held the GIL for minutes, freezing the server).
    What RE2 cannot do in linear time (backreferences, lookaround) is refused."""
    if not isinstance(pattern, str) or "\0" in pattern:
        raise InvalidInput("a pattern must be a string without NUL bytes")
    opts = re2.Options()
    opts.log_errors = False
    opts.case_sensitive = not ignore_case
    opts.max_mem = 64 << 20                      # RE2's own cap on a pattern's automaton
    try:
        return re2.compile(pattern.encode("utf-8", "surrogateescape"), opts)
    except re2.error as exc:
        msg = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidInput(f"unsupported regular expression (RE2 syntax, no backreferences or "
                           f"lookaround): {msg}") from None


def export_tar(store: Store, root: str, fileobj, path: str = "/") -> None:
    """Write the subtree at `path` as a POSIX tar with ids, modes, times, xattrs, links, devices."""
    p, e = resolve(store, root, path)
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        if e.kind != DIR:
            _add(store, tar, p.rsplit("/", 1)[-1], e, {})
            return
        seen: dict[str, str] = {}
        base = p.rstrip("/")
        _add(store, tar, ".", e, seen)
        for fp, fe in walk(store, e.ref, p):
            rel = fp[len(base):].lstrip("/")
            _add(store, tar, rel, fe, seen, base)


def _add(store, tar, name, e: Entry, seen, base: str = "") -> None:
    ti = tarfile.TarInfo(name)
    ti.mode = e.mode
    ti.uid, ti.gid = e.uid, e.gid
    ti.mtime = e.mtime_ns / 1e9
    if e.xattrs:
        ti.pax_headers = {"SCHILY.xattr." + k: base64.b64decode(v).decode("utf-8", "surrogateescape")
                          for k, v in e.xattrs}
    if e.hl and e.kind == FILE:
        rel_key = e.hl[len(base):].lstrip("/") if e.hl.startswith(base + "/") else None
        if name != rel_key and rel_key in seen:
            ti.type = tarfile.LNKTYPE
            ti.linkname = rel_key
            tar.addfile(ti)
            return
        seen[name] = name
    if e.kind == FILE:
        ti.size = e.size
        with store.blobs.open(e.ref) as f:
            tar.addfile(ti, f)
        return
    ti.type = {DIR: tarfile.DIRTYPE, SYMLINK: tarfile.SYMTYPE, CHR: tarfile.CHRTYPE,
               BLK: tarfile.BLKTYPE, FIFO: tarfile.FIFOTYPE}.get(e.kind)
    if ti.type is None:
        return                                 # sockets have no tar form
    if e.kind == SYMLINK:
        ti.linkname = e.ref
    elif e.kind in (CHR, BLK):
        ti.devmajor, ti.devminor = os.major(int(e.ref)), os.minor(int(e.ref))
    tar.addfile(ti)
