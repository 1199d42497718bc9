"""The one rule for names and references that come from outside the store.

Every source the store does not control (bundles, tars, OCI layers, registry pulls, directory
imports, uploads) hands over names that end up joined to host paths. They are checked here, and
only here, before use:

- an entry name (one component of a path inside an image): non-empty, no '/', not '.' or '..',
  no NUL, at most NAME_MAX (255) bytes as the filesystem stores it;
- a blob reference: exactly 64 lowercase hex digits (a sha256), so it never joins into a path
  other than objects/blobs/ab/cdef...;
- a tree reference and an image ID: the same 64 hex digits;
- a tag name: the tag rule of the store (letters, digits and ._/:@+-, not a hex ID);
- a whole image path: at most PATH_BYTES_MAX bytes (it is joined to host paths).

A failure raises the caller's error class (BadArchive for archives, InvalidInput otherwise) and
nothing has been written yet.
"""

from __future__ import annotations

import re

from ..errors import InvalidInput
from .objects import BLK, CHR, DIR, FIFO, FILE, KIND_NAMES, SOCK, SYMLINK

NAME_MAX = 255                       # bytes; the kernel's limit for one path component
# Image paths are joined to host paths (staging, layers) of up to ~1 KiB, under the kernel's
# PATH_MAX of 4096: an image path may have at most this many bytes. Depth itself is not capped.
PATH_BYTES_MAX = 3072
DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")
TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,199}$")
HEX_RE = re.compile(r"^[0-9a-f]{6,64}$")


def entry_name_problem(name) -> str | None:
    """Why `name` is not a valid entry name, or None if it is."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if "/" in name:
        return "a name containing '/'"
    if name in (".", ".."):
        return f"the name {name!r}"
    if "\0" in name:
        return "a name containing NUL"
    if len(name.encode("utf-8", "surrogateescape")) > NAME_MAX:
        return f"a name longer than {NAME_MAX} bytes"
    return None


def check_entry_name(name, error=InvalidInput, what: str = "entry") -> str:
    problem = entry_name_problem(name)
    if problem is not None:
        raise error(f"{what} has {problem}: {str(name)[:80]!r}")
    return name


def check_path_length(path: str, error=InvalidInput, what: str = "path") -> str:
    if len(path.encode("utf-8", "surrogateescape")) > PATH_BYTES_MAX:
        raise error(f"{what} {path[:60]!r}... is longer than {PATH_BYTES_MAX} bytes, the longest path "
                    f"an image may hold", limit="path_bytes", max=PATH_BYTES_MAX)
    return path


def check_path(path: str, error=InvalidInput, what: str = "path") -> list[str]:
    """The components of a relative path from outside ('a/./b/' -> ['a', 'b']); '..', absolute
    paths and bad components are refused, never clamped."""
    if not isinstance(path, str) or "\0" in path:
        raise error(f"{what} {str(path)[:80]!r} is not a string without NUL")
    if path.startswith("/"):
        raise error(f"{what} {path[:80]!r} is absolute")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    for p in parts:
        check_entry_name(p, error, what)
    return parts


def is_digest(ref) -> bool:
    return isinstance(ref, str) and DIGEST_RE.match(ref) is not None


def check_digest(ref, error=InvalidInput, what: str = "blob reference") -> str:
    if not is_digest(ref):
        raise error(f"{what} {str(ref)[:80]!r} is not a sha256 (64 lowercase hex digits)")
    return ref


def check_tag(name, error=InvalidInput) -> str:
    if not isinstance(name, str) or not TAG_RE.match(name) or HEX_RE.match(name):
        raise error(f"invalid tag name {str(name)[:80]!r} (letters, digits and ._/:@+-; not a hex id)")
    return name


def check_entries(entries: dict, error=InvalidInput) -> dict:
    """A decoded tree from outside (a bundle): every name, kind and reference well formed, so
    nothing later joins, opens or creates what the tree does not describe."""
    for key, e in entries.items():
        if key != e.name:
            raise error(f"tree entry {str(key)[:80]!r} is stored under another name")
        if key == ".":
            if e.kind != DIR:
                raise error("a tree's '.' entry must be a directory")
        else:
            check_entry_name(key, error, "tree entry")
        if e.kind not in KIND_NAMES:
            raise error(f"tree entry {key!r} has the unknown kind {str(e.kind)[:8]!r}")
        for field in (e.mode, e.uid, e.gid, e.size, e.mtime_ns):
            if not isinstance(field, int) or isinstance(field, bool) or field < 0:
                raise error(f"tree entry {key!r} has a bad number {str(field)[:20]!r}")
        if e.mode > 0o7777:
            raise error(f"tree entry {key!r} has mode bits beyond 07777")
        if e.kind == FILE or (e.kind == DIR and key != "."):
            check_digest(e.ref, error, f"reference of {key!r}")
        elif e.kind == SYMLINK:
            if not isinstance(e.ref, str) or not e.ref or "\0" in e.ref or len(e.ref.encode()) > 4095:
                raise error(f"symlink {key!r} has a bad target")
        elif e.kind in (CHR, BLK):
            if not isinstance(e.ref, int) or isinstance(e.ref, bool) or e.ref < 0:
                raise error(f"device {key!r} has a bad device number")
        elif e.kind in (FIFO, SOCK) and e.ref is not None:
            raise error(f"{key!r} carries a reference it cannot have")
        if e.hl is not None:
            if not isinstance(e.hl, str) or not e.hl.startswith("/"):
                raise error(f"tree entry {key!r} has a bad hard-link key")
            check_path(e.hl[1:], error, "hard-link key")
        for pair in e.xattrs:
            if len(pair) != 2 or not all(isinstance(x, str) for x in pair) or not pair[0] \
                    or "\0" in pair[0] or len(pair[0]) > 255:
                raise error(f"tree entry {key!r} has a bad xattr")
    return entries
