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

from ...errors import Forbidden, InvalidInput, PathNotFound
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

    def ls(self, sid: str, path: str = "/") -> list[dict]:
        """A directory of the running sandbox: name, kind, size, mode of each entry."""
        self._check_path(path)
        row = self._running(sid)
        vol = self._on_volume(row, path)
        if vol is not None:
            kinds = {"directory": "dir", "file": "file", "symlink": "symlink"}
            return [{"name": e["name"], "kind": kinds.get(e["type"], "other"), "size": e["size"], "mode": e["mode"]}
                    for e in self.volumes.ls(*vol)]
        return self._in(row, lambda root, mounts: openat2.list_dir(root, path, mounts))

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

    def remove(self, sid: str, path: str) -> None:
        """Remove a file, a link or an empty directory of the running sandbox."""
        self._check_path(path)
        row = self._running(sid)
        vol = self._on_volume(row, path, write=True)
        if vol is not None:
            self.volumes.remove(*vol)
        else:
            self._in(row, lambda root, mounts: openat2.remove(root, path, mounts))
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
