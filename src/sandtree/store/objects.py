"""Object values: tree entries, trees, and the hashing that gives images their IDs.

Like git: a blob is file content named by its sha256; a tree is one directory's sorted entry list
named by the sha256 of its canonical encoding; an image ID is its root tree's hash. What the hash
covers is the filesystem *state*: name, type, permission bits, uid/gid, size and content, symlink
target, device number, xattrs and hard-link structure. Timestamps are carried in the stored tree
but left out of the hash, so the first recording of a state keeps its times and any later path to
the same state gets the same ID.

Storage of these values lives in store/db.py (trees) and store/blobs.py (contents).
"""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from typing import NamedTuple

# Entry kinds, one letter each (they are part of the hashed encoding: never change them).
FILE, DIR, SYMLINK, CHR, BLK, FIFO, SOCK = "f", "d", "l", "c", "b", "p", "s"

KIND_OF_MODE = {
    stat.S_IFREG: FILE, stat.S_IFDIR: DIR, stat.S_IFLNK: SYMLINK, stat.S_IFCHR: CHR,
    stat.S_IFBLK: BLK, stat.S_IFIFO: FIFO, stat.S_IFSOCK: SOCK,
}
MODE_OF_KIND = {v: k for k, v in KIND_OF_MODE.items()}

# The tree of an empty directory; also the root of the empty image.
FORMAT_VERSION = 1


class Entry(NamedTuple):
    """One name in a directory. `ref` is the blob hash (file), tree hash (dir), link target
    (symlink), or device number (chr/blk); `hl` names the hard-link group (the group's first path
    in sorted order) or is None; `xattrs` is a sorted tuple of (name, base64 value)."""

    name: str
    kind: str
    mode: int          # permission bits incl. setuid/setgid/sticky (S_IMODE)
    uid: int
    gid: int
    size: int
    ref: str | int | None
    xattrs: tuple = ()
    hl: str | None = None
    mtime_ns: int = 0

    def hashed(self) -> list:
        return [self.name, self.kind, self.mode, self.uid, self.gid, self.size, self.ref,
                [list(x) for x in self.xattrs], self.hl]

    def to_dict(self) -> dict:
        d = {"name": self.name, "type": KIND_NAMES[self.kind], "mode": f"{self.mode:04o}",
             "uid": self.uid, "gid": self.gid, "size": self.size, "mtime": self.mtime_ns / 1e9}
        if self.kind == SYMLINK:
            d["target"] = self.ref
        elif self.kind in (CHR, BLK):
            d["rdev"] = self.ref
        elif self.kind == FILE:
            d["sha256"] = self.ref
        if self.hl:
            d["hardlink"] = self.hl
        if self.xattrs:
            d["xattrs"] = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in self.xattrs}
        return d


KIND_NAMES = {FILE: "file", DIR: "dir", SYMLINK: "symlink", CHR: "char", BLK: "block",
              FIFO: "fifo", SOCK: "socket"}


def encode_xattrs(pairs) -> tuple:
    return tuple(sorted((k, base64.b64encode(v).decode()) for k, v in pairs))


def tree_hash_and_data(entries: dict[str, Entry]) -> tuple[str, bytes]:
    """Canonical encoding of one directory: (hash over the state, stored bytes incl. mtimes)."""
    ordered = [entries[k] for k in sorted(entries, key=_sort_key)]
    canon = json.dumps([FORMAT_VERSION, [e.hashed() for e in ordered]], separators=(",", ":"))
    digest = hashlib.sha256(canon.encode()).hexdigest()
    data = json.dumps([FORMAT_VERSION, [e.hashed() + [e.mtime_ns] for e in ordered]],
                      separators=(",", ":"))
    return digest, data.encode()


def decode_tree(data: bytes) -> dict[str, Entry]:
    version, rows = json.loads(data)
    if version != FORMAT_VERSION:
        raise ValueError(f"unknown tree format {version}")
    return {r[0]: Entry(r[0], r[1], r[2], r[3], r[4], r[5], r[6],
                        tuple(tuple(x) for x in r[7]), r[8], r[9]) for r in rows}


def _sort_key(name: str) -> bytes:
    # Sort by the raw bytes of the name, as the filesystem stores it.
    return name.encode("utf-8", "surrogateescape")


EMPTY_TREE_HASH, EMPTY_TREE_DATA = tree_hash_and_data({})
