"""Files of a running live sandbox, read and written from the host (a mixin of
sandboxes.Sandboxes, which provides store, live, _running and _touch).

Host-side access as root to a tree the sandbox controls: runtime/openat2.py says what each
step defends against (host device nodes bound into /dev, FIFOs, symlinks, /proc).

A path at or under one of the sandbox's volumes (engine/volumes.py) is that volume's file: read and
written through the volume (the same openat2 rules, inside the volume), as the sandbox sees it on
either tier; a read-only volume is not written. (Resolved from the sandbox's root instead, it would
reach the mount point in its upper: the namespaces tier refuses another filesystem, and on gVisor
the upper's mount point is not what the sandbox sees.)
"""

from __future__ import annotations

import os
import posixpath

from ...errors import Forbidden, InvalidInput, PathNotFound, SandtreeError
from ...runtime import openat2
from ...runtime.openat2 import read_file, write_file


class SandboxFiles:
    def _on_volume(self, row: dict, path: str, write: bool = False):
        """(the volume's engine name, the path within it) when `path` is at or under one of the
        sandbox's volumes; None otherwise. A write to a read-only one is refused."""
        norm = posixpath.normpath(path)
        for m in row["spec"].get("volumes", ()):
            if norm == m["path"] or norm.startswith(m["path"] + "/"):
                if write and m["readonly"]:
                    raise Forbidden(f"{m['path']} is a read-only volume in this sandbox", path=path)
                return m["volume"], norm[len(m["path"]):] or "/"
        return None

    def read(self, sid: str, path: str, *, limit: int = 64 << 20) -> bytes:
        """A regular file as the sandbox sees it now (resolved inside its root, never outside);
        TooLarge over `limit` bytes, NotRegularFile for devices, FIFOs, sockets, directories."""
        row = self._running(sid)
        self._check_path(path)
        if not isinstance(limit, int) or limit < 0:
            raise InvalidInput("limit must be a non-negative number of bytes")
        vol = self._on_volume(row, path)
        if vol is not None:
            return self.volumes.read(*vol, limit)
        mounts = self.live.own_mounts(row["handle"])
        root = self.live.root(row["handle"])
        try:
            return read_file(root, path, limit, mounts)
        finally:
            os.close(root)

    def write(self, sid: str, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        """Write a regular file into the running sandbox, making missing parent directories (as
        mkdir -p, owned by uid/gid): a new file renamed over the name, so nothing that was there is
        written into or re-owned."""
        row = self._running(sid)
        self._check_path(path)
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput("data must be bytes or a string")
        self._check_owner(mode, uid, gid)                 # bad input refused before anything is made
        vol = self._on_volume(row, path, write=True)
        if vol is not None:
            self.volumes.write(*vol, bytes(data), mode=mode, uid=uid, gid=gid)
            self._touch(row)
            return
        parent = path.rsplit("/", 1)[0]
        if parent and not self._in(row, lambda root, mounts: openat2.exists(root, parent)):
            self.mkdir(sid, parent, uid=uid, gid=gid)
        idmap = self.store.idmap
        mounts = self.live.own_mounts(row["handle"])
        root = self.live.root(row["handle"])
        try:
            write_file(root, path, bytes(data), mode, idmap.host_uid(uid), idmap.host_gid(gid), mounts)
        finally:
            os.close(root)
        self._touch(row)

    def ls(self, sid: str, path: str = "/", *, depth: int = 1) -> list[dict]:
        """A directory of the running sandbox (depth > 1: and its subdirectories that deep, never
        through a link): name, path, kind, size, mode, permissions, uid, gid, owner, group, mtime,
        a link's target, of each entry (at most openat2.MAX_LISTED in all)."""
        self._check_path(path)
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= openat2.MAX_DEPTH:
            raise InvalidInput(f"depth must be 1 to {openat2.MAX_DEPTH}", depth=depth)
        row = self._running(sid)
        vol = self._on_volume(row, path)
        if vol is not None:                    # (a volume's directory: its own entries, one level)
            kinds = {"directory": "dir", "file": "file", "symlink": "symlink"}
            return [{"name": e["name"], "path": f"{path.rstrip('/')}/{e['name']}", "kind": kinds.get(e["type"], "other"),
                     "size": e["size"], "mode": e["mode"]} for e in self.volumes.ls(*vol)]
        idmap = self.store.idmap

        def walk(root, mounts):
            out, level, names = [], [(path, 1)], {}
            while level:
                d, n = level.pop(0)
                for e in openat2.list_dir(root, d, mounts):
                    if len(out) >= openat2.MAX_LISTED:
                        return out
                    e["path"] = f"{d.rstrip('/')}/{e['name']}"
                    e["uid"], e["gid"] = idmap.uid(e["uid"]), idmap.gid(e["gid"])
                    for key, table, num in (("owner", "/etc/passwd", e["uid"]), ("group", "/etc/group", e["gid"])):
                        if (table, num) not in names:
                            names[(table, num)] = _account_name(root, table, num, mounts)
                        e[key] = names[(table, num)]
                    out.append(e)
                    if e["kind"] == "dir" and n < depth:
                        level.append((e["path"], n + 1))
            return out
        # a tree in walk order: each directory followed by what is in it, by name (as find and envd list it)
        return sorted(self._in(row, walk), key=lambda e: e["path"].split("/"))

    def exists(self, sid: str, path: str) -> bool:
        self._check_path(path)
        row = self._running(sid)
        vol = self._on_volume(row, path)
        if vol is not None:
            try:
                self.volumes.stat(*vol)
            except PathNotFound:
                return False
            return True
        return self._in(row, lambda root, mounts: openat2.exists(root, path))

    def remove(self, sid: str, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a link or an empty directory of the running sandbox (recursive: a directory
        with everything in it, as rm -r on one filesystem)."""
        self._check_path(path)
        if not isinstance(recursive, bool):
            raise InvalidInput("recursive must be true or false")
        row = self._running(sid)
        vol = self._on_volume(row, path, write=True)
        if vol is not None:
            self.volumes.remove(*vol)
        else:
            self._in(row, lambda root, mounts: openat2.remove(root, path, mounts, recursive=recursive))
        self._touch(row)

    def mkdir(self, sid: str, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        """Make a directory of the running sandbox and any missing parents (mkdir -p)."""
        self._check_path(path)
        row = self._running(sid)
        idmap = self.store.idmap
        self._check_owner(mode, uid, gid)
        vol = self._on_volume(row, path, write=True)
        if vol is not None:
            self.volumes.mkdir(*vol, mode=mode, uid=uid, gid=gid)
            self._touch(row)
            return
        self._in(row, lambda root, mounts: openat2.make_dirs(root, path, mode, idmap.host_uid(uid),
                                                             idmap.host_gid(gid), mounts))
        self._touch(row)

    def stat(self, sid: str, path: str) -> dict:
        """What the kernel says of a path of the running sandbox, the name itself (a link is not
        followed: its target is given): name, kind, path, size, mode, permissions, owner and group
        (the sandbox's ids, and its /etc/passwd and /etc/group names), mtime, target."""
        self._check_path(path)
        row = self._running(sid)
        idmap = self.store.idmap

        def one(root, mounts):
            e = openat2.stat_entry(root, path, mounts)
            e["uid"], e["gid"] = idmap.uid(e["uid"]), idmap.gid(e["gid"])
            e["owner"] = _account_name(root, "/etc/passwd", e["uid"], mounts)
            e["group"] = _account_name(root, "/etc/group", e["gid"], mounts)
            return e
        return self._in(row, one)

    def rename(self, sid: str, source: str, destination: str, *, replace: bool = False) -> dict:
        """Move a file, a link or a directory of the running sandbox to another path of it (one
        rename: a directory moves whole). An existing destination is a Conflict unless `replace`.
        The moved entry as stat shows it."""
        self._check_path(source)
        self._check_path(destination)
        if not isinstance(replace, bool):
            raise InvalidInput("replace must be true or false")
        row = self._running(sid)
        self._in(row, lambda root, mounts: openat2.rename(root, source, destination, mounts, replace))
        self._touch(row)
        return self.stat(sid, destination)

    def _in(self, row: dict, fn):
        """fn(root fd, own mounts) on the sandbox's root, the fd closed after."""
        mounts = self.live.own_mounts(row["handle"])
        root = self.live.root(row["handle"])
        try:
            return fn(root, mounts)
        finally:
            os.close(root)

    def _check_owner(self, mode, uid, gid) -> None:
        top_id = self.store.idmap.count - 1
        for name, v, top in (("mode", mode, 0o7777), ("uid", uid, top_id), ("gid", gid, top_id)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
                raise InvalidInput(f"{name} must be an integer from 0 to {top if name != 'mode' else oct(top)}",
                                   **{name: v})

    @staticmethod
    def _check_path(path) -> None:
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise InvalidInput(f"path must be absolute, not {path!r}"[:300])
        # what the kernel takes (PATH_MAX, NAME_MAX): longer was ENAMETOOLONG, a 500
        if len(os.fsencode(path)) >= 4096 or any(len(os.fsencode(p)) > 255 for p in path.split("/")):
            raise InvalidInput("a path is at most 4095 bytes, each of its names at most 255", path=path[:200])


def _account_name(root: int, table: str, num: int, mounts: set[int]) -> str:
    """The name of uid/gid `num` in the sandbox's own /etc/passwd or /etc/group (its number when it
    has none: as ls shows it)."""
    try:
        text = read_file(root, table, 1 << 20, mounts).decode("utf-8", "replace")
    except (SandtreeError, OSError):
        return str(num)
    for line in text.splitlines():
        f = line.split(":")
        if len(f) > 2 and f[2] == str(num):
            return f[0]
    return str(num)
