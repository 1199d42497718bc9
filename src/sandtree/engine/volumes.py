"""Volumes: named persistent directories of a tenant, mounted into live sandboxes at their start
(read-write or read-only, several sandboxes at once), kept across sandbox lifetimes, outside every
image: a commit of a sandbox leaves its volumes out (and records which), and a volume becomes an
image only by a snapshot of its own.

Storage (runtime/volumes.py): each tenant's volumes are directories of one ext4 filesystem in a
sparse file under the store's home (volumes/<tenant>/disk.img, mounted at MOUNT_BASE/<store>/<tenant>),
sized by the tenant's quota: a write past it fails in the sandbox with ENOSPC. Names are per tenant;
the engine names a tenant's volume "<tenant>~<name>" (the tenancy qualifies the names a tenant
gives, as for stored secrets), a bare name is the operator's. The directory listing is the volumes'
only record: nothing to keep in step with a table. Whether a volume is in use is read from the
live sandboxes' own records (their spec's `volumes`).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import threading
import time
import uuid

from .. import defaults as D
from ..errors import Conflict, InvalidInput, LimitExceeded, NotFound, PathNotFound, TooLarge
from ..runtime import openat2
from ..runtime import volumes as host
from ..store.objects import EMPTY_TREE_HASH
from ..store.store import ImageRow

__all__ = ["MOUNT_BASE", "SEP", "Volumes", "check_name", "check_mounts", "check_path", "qualify", "split",
           "volume_view"]

_NAME = re.compile(D.VOLUME_NAME)
SEP = "~"                                   # tenant~name: a tenant's volume as the engine names it
MOUNT_BASE = "/run/sandtree-volumes"        # where stores mount their tenants' volume filesystems


def check_name(name) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidInput(f"a volume name is 1-63 of A-Z a-z 0-9 . _ - (starting with a letter or digit), "
                           f"not {name!r}", name=name)
    return name


def qualify(tenant: str | None, name) -> str:
    """The engine's name of a tenant's volume (None: the operator's)."""
    check_name(name)
    return name if not tenant else f"{tenant}{SEP}{name}"


def split(qualified: str) -> tuple[str | None, str]:
    tenant, sep, name = check_name(qualified).rpartition(SEP) if not isinstance(qualified, str) else \
        qualified.rpartition(SEP)
    return (tenant if sep else None), check_name(name)


def check_path(path) -> str:
    """A volume's path inside the sandbox: absolute, normalized (no `.`, `..` or `//`), not `/`,
    and not on or under /proc, /dev or /sys (the runtime's own mounts)."""
    if not isinstance(path, str) or not path.startswith("/") or path == "/" or "\0" in path or "\n" in path \
            or len(path) > 1024:
        raise InvalidInput(f"a volume's path is an absolute directory path other than /, not {path!r}", path=path)
    parts = path.split("/")[1:]
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(f"a volume's path has no empty, `.` or `..` component: {path!r}", path=path)
    for bad in D.VOLUME_FORBIDDEN:
        if path == bad or path.startswith(bad + "/"):
            raise InvalidInput(f"a volume cannot be mounted on or under {bad}: {path!r}", path=path)
    return path


def check_mounts(value) -> list[dict]:
    """sandbox_start's `volumes`: {name: path} or [{name, path, readonly}], as a list of
    {"volume", "path", "readonly"} (names as given: the tenancy qualifies a tenant's)."""
    if value is None:
        return []
    if isinstance(value, dict):                    # {name: path}, path:ro read-only (the CLI's NAME=PATH[:ro])
        value = [{"name": k, "path": v[:-3], "readonly": v.endswith(":ro")}
                 if isinstance(v, str) and v.endswith((":ro", ":rw")) else {"name": k, "path": v}
                 for k, v in value.items()]
    if not isinstance(value, (list, tuple)):
        raise InvalidInput("volumes is {name: path} or a list of {name, path, readonly}")
    out, paths = [], set()
    for v in value:
        if not isinstance(v, dict) or set(v) - {"name", "path", "readonly"} or "name" not in v or "path" not in v:
            raise InvalidInput(f"a volume mount is {{name, path, readonly}}, not {v!r}")
        ro = v.get("readonly", False)
        if not isinstance(ro, bool):
            raise InvalidInput(f"a volume's readonly is true or false, not {ro!r}")
        name = v["name"]
        split(name) if isinstance(name, str) else check_name(name)
        path = check_path(v["path"])
        for p in paths:
            if path == p or path.startswith(p + "/") or p.startswith(path + "/"):
                raise InvalidInput(f"volume paths {p} and {path} overlap", path=path)
        paths.add(path)
        out.append({"volume": name, "path": path, "readonly": ro})
    return out


def volume_view(mounts) -> list[dict]:
    """A sandbox's mounts as its caller named them: {name, path, readonly} each."""
    return [{"name": split(m["volume"])[1], "path": m["path"], "readonly": m["readonly"]} for m in mounts]


class Volumes:
    def __init__(self, store, committer, records, users):
        """users(qualified name) -> ids of the live sandboxes that mount it (engine's Sandboxes)."""
        self.store, self.committer, self.records, self.users = store, committer, records, users
        self.root = os.path.join(store.home, "volumes")              # each tenant's disk image
        # ... mounted outside the store: a live gVisor sandbox's helper covers /tmp (where a store may be) in the
        # mount namespace its runsc opens the volumes' directories in; traversable by the sandbox's root (gofer)
        self.mount_root = os.path.join(MOUNT_BASE, hashlib.sha256(os.path.realpath(store.home).encode())
                                       .hexdigest()[:16])
        self._lock = threading.RLock()
        self.lock = self._lock          # held by a start that mounts volumes until its row is written
        self._owner = (store.idmap.host_uid(0), store.idmap.host_gid(0))   # the sandbox's root
        self._exit_hook = False

    # ---- a tenant's filesystem -------------------------------------------------------------------
    def _space(self, tenant: str | None) -> str:
        key = "operator" if not tenant else "t-" + hashlib.sha256(tenant.encode()).hexdigest()[:24]
        return os.path.join(self.root, key)

    def filesystem(self, tenant: str | None, quota: int | None = None) -> str:
        """The mounted filesystem of a tenant's volumes (made, or grown to `quota`; None: as it is,
        NotFound when it was never made)."""
        space = self._space(tenant)
        fs, image = os.path.join(self.mount_root, os.path.basename(space)), os.path.join(space, "disk.img")
        with self._lock:
            if quota is None and not os.path.exists(image):
                raise NotFound("no volumes yet", tenant=tenant)
            if quota is None:
                quota = os.path.getsize(image)
            os.makedirs(space, mode=0o700, exist_ok=True)
            os.makedirs(self.mount_root, mode=0o711, exist_ok=True)
            host.ensure_filesystem(image, fs, int(quota))
            if not self._exit_hook:                  # a one-shot process (the CLI) never closes its engine
                atexit.register(self.close)
                self._exit_hook = True
        return fs

    def directory(self, qualified: str, quota: int | None = None, *, exists: bool = True) -> str:
        """Where a volume's files are on the host (its filesystem mounted); NotFound when it does not exist."""
        tenant, name = split(qualified)
        try:
            d = os.path.join(self.filesystem(tenant, quota), name)
        except NotFound:
            d = None
        if exists and (d is None or not os.path.isdir(d) or os.path.islink(d)):
            raise NotFound(f"no volume {name!r}", volume=name)
        return d

    # ---- the rows -----------------------------------------------------------------------------------
    def create(self, qualified: str, quota: int) -> dict:
        tenant, name = split(qualified)
        fs = self.filesystem(tenant, quota)
        try:
            os.mkdir(os.path.join(fs, name), 0o755)
        except FileExistsError:
            raise Conflict(f"volume {name!r} exists", volume=name) from None
        os.chown(os.path.join(fs, name), *self._owner)
        return self.info(qualified)

    def info(self, qualified: str) -> dict:
        tenant, name = split(qualified)
        d = self.directory(qualified)
        st = os.lstat(d)
        used, size = host.usage(os.path.dirname(d))
        return {"name": name, "created": st.st_ctime, "bytes": _bytes_under(d), "used_by": self.users(qualified),
                "quota": {"used": used, "size": size}}

    def list(self, tenant: str | None) -> list[dict]:
        try:
            fs = self.filesystem(tenant)
        except NotFound:
            return []
        names = sorted(n for n in os.listdir(fs) if _NAME.fullmatch(n))
        return [self.info(qualify(tenant, n)) for n in names]

    def delete(self, qualified: str) -> None:
        """Remove a volume and its files; Conflict (naming them) while live sandboxes mount it."""
        tenant, name = split(qualified)
        with self._lock:
            d = self.directory(qualified)
            users = self.users(qualified)
            if users:
                raise Conflict(f"volume {name!r} is mounted by live sandbox(es) {', '.join(u[:12] for u in users)}: "
                               "stop them first", volume=name, sandboxes=users)
            # Renamed away first (the name is free at once, a start cannot mount it meanwhile), then removed
            # through fds (shutil.rmtree never follows a link); nothing is mounted under it on this host.
            gone = os.path.join(os.path.dirname(d), f".deleting-{uuid.uuid4().hex}")
            os.rename(d, gone)
        if any(p == gone or p.startswith(gone + "/") for p in _mount_points()):
            raise Conflict(f"volume {name!r} has a mount under it on the host; left in place as {gone}")
        shutil.rmtree(gone)

    def snapshot(self, qualified: str) -> str:
        """An image whose root holds the volume's files, made by a `volume snapshot` operation whose
        record names the volume (lineage: produced_by). The volume's files are read as a sandbox's
        upper is for a commit (ids shifted back, links kept as links, never followed). Consistent
        when no sandbox writes to the volume meanwhile."""
        tenant, name = split(qualified)
        started = time.time()
        with self.store.using():
            d = self.directory(qualified)
            if not any(True for _ in os.scandir(d)):
                raise InvalidInput(f"volume {name!r} is empty: there is nothing to make an image of", volume=name)
            cr = self.committer.commit(ImageRow(EMPTY_TREE_HASH, [], {}, 0.0, 0, 0), d)
            self.records.record(uuid.uuid4().hex, cr.image, {"volume": name, "command": f"snapshot of volume {name}"},
                                started, cr.image, {"exit_code": 0}, self.committer.image_writer(cr),
                                kind="volume snapshot", edge=False)
        return cr.image

    # ---- files, from the host (E2B's volume content API; CLI and SDK alike) ----------------------------
    # Every path resolves inside the volume (openat2 RESOLVE_IN_ROOT: a link a sandbox left there is
    # followed as the sandbox would, never to the host), only regular files are read or written, and only
    # on the volume's own filesystem (runtime/openat2.py says what each step defends against).
    def read(self, qualified: str, path: str, limit: int = 64 << 20) -> bytes:
        return self._in(qualified, path, lambda root, mounts: openat2.read_file(root, path, limit, mounts))

    def write(self, qualified: str, path: str, data, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput("data must be bytes or a string")
        _check_owner(mode, uid, gid, self.store.idmap.count - 1)
        idmap = self.store.idmap
        hu, hg = idmap.host_uid(uid), idmap.host_gid(gid)

        def go(root, mounts):
            parent = path.rsplit("/", 1)[0]
            if parent:
                openat2.make_dirs(root, parent, 0o755, hu, hg, mounts)
            try:
                openat2.write_file(root, path, bytes(data), mode, hu, hg, mounts)
            except TooLarge:
                raise LimitExceeded(f"{path}: the volume quota is full ({len(data)} bytes not written)",
                                    path=path, size=len(data), limit="max_volumes") from None
        self._in(qualified, path, go)

    def mkdir(self, qualified: str, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
        _check_owner(mode, uid, gid, self.store.idmap.count - 1)
        idmap = self.store.idmap
        self._in(qualified, path, lambda root, mounts: openat2.make_dirs(
            root, path, mode, idmap.host_uid(uid), idmap.host_gid(gid), mounts))

    def remove(self, qualified: str, path: str) -> None:
        self._in(qualified, path, lambda root, mounts: openat2.remove(root, path, mounts))

    def stat(self, qualified: str, path: str) -> dict:
        """A path of the volume (a link itself, not what it points to): name, type, path, size, mode,
        uid, gid (the sandbox's ids), atime, mtime, ctime, and a link's target."""
        def go(root, mounts):
            parent, name = path.rstrip("/").rpartition("/")[::2] if path.rstrip("/") else ("", "")
            if not name:
                return self._entry(root, ".", "/")
            dfd = openat2.open_in_root(root, parent or "/", os.O_PATH | os.O_DIRECTORY)
            try:
                return self._entry(dfd, name, path.rstrip("/"))
            except FileNotFoundError:
                raise PathNotFound(f"no such file in the volume: {path}", path=path) from None
            finally:
                os.close(dfd)
        return self._in(qualified, path, go)

    def ls(self, qualified: str, path: str = "/", depth: int = 1) -> list[dict]:
        """The entries under a directory of the volume (stat's fields each), `depth` levels deep
        (links are listed, never entered); at most MAX_LISTED."""
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= 64:
            raise InvalidInput(f"depth is 1 to 64, not {depth!r}", depth=depth)

        def walk(root, mounts):
            out: list[dict] = []
            todo = [(path.rstrip("/") or "/", 1)]
            while todo and len(out) < openat2.MAX_LISTED:
                d, level = todo.pop(0)
                dfd = openat2.open_in_root(root, d, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    if openat2.mount_id(dfd) not in mounts:
                        raise InvalidInput(f"{d} is not on the volume", path=d)
                    for name in sorted(os.listdir(dfd)):
                        try:
                            e = self._entry(dfd, name, f"{d.rstrip('/')}/{name}")
                        except FileNotFoundError:
                            continue                        # removed while listed
                        out.append(e)
                        if e["type"] == "directory" and level < depth:
                            todo.append((e["path"], level + 1))
                finally:
                    os.close(dfd)
            return out[:openat2.MAX_LISTED]
        return self._in(qualified, path, walk)

    def _entry(self, dfd: int, name: str, path: str) -> dict:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "symlink" if stat.S_ISLNK(st.st_mode) else \
            "file" if stat.S_ISREG(st.st_mode) else "other"
        out = {"name": name if name != "." else "", "type": kind, "path": path, "size": st.st_size,
               "mode": stat.S_IMODE(st.st_mode), "uid": self.store.idmap.uid(st.st_uid),
               "gid": self.store.idmap.gid(st.st_gid), "atime": st.st_atime, "mtime": st.st_mtime,
               "ctime": st.st_ctime}
        if kind == "symlink":
            out["target"] = os.readlink(name, dir_fd=dfd)
        return out

    def _in(self, qualified: str, path, fn):
        """fn(root fd, {its mount}) on the volume's directory, the fd closed after."""
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) >= 4096 \
                or any(len(p) > 255 for p in path.split("/")):
            raise InvalidInput(f"a path in a volume is absolute (at most 4095 bytes), not {path!r}"[:300])
        if ".." in path.split("/"):
            raise InvalidInput(f"a path with '..' is refused: {path}", path=path)
        root = os.open(self.directory(qualified), os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            try:
                return fn(root, {openat2.mount_id(root)})
            except PathNotFound as exc:
                raise PathNotFound(str(exc).replace("in the sandbox", "in the volume"), path=path) from None
        finally:
            os.close(root)

    # ---- the tenancy's names --------------------------------------------------------------------------
    @staticmethod
    def name_of(tenant: str | None, name) -> str:
        """The engine's name of a tenant's volume `name` (tenant None: the operator's)."""
        return qualify(tenant, name)

    @staticmethod
    def mounts_of(tenant: str | None, value) -> list[dict]:
        """sandbox_start's `volumes` of a tenant, its names made the engine's (check_mounts)."""
        if value is not None:
            items = value.items() if isinstance(value, dict) else [(None, v) for v in value] \
                if isinstance(value, (list, tuple)) else None
            for k, v in items or ():
                check_name(k if k is not None else (v.get("name") if isinstance(v, dict) else v))
        return [{"name": qualify(tenant, m["volume"]), "path": m["path"], "readonly": m["readonly"]}
                for m in check_mounts(value)]

    # ---- live sandboxes -------------------------------------------------------------------------------
    def mount(self, mounts: list[dict], ns_fd: int) -> list[str]:
        """Bind each volume of `mounts` (check_mounts, qualified names) into the mount namespace
        `ns_fd`; the directories made for them in the sandbox's root."""
        return host.bind_into(ns_fd, [(self.directory(m["volume"]), m["path"], m["readonly"]) for m in mounts],
                              self._owner)

    def close(self) -> None:
        """Detach the host's mounts of every tenant's volume filesystem (live sandboxes keep theirs)."""
        if not os.path.isdir(self.mount_root):
            return
        with self._lock:
            for key in os.listdir(self.mount_root):
                host.unmount(os.path.join(self.mount_root, key))
                try:
                    os.rmdir(os.path.join(self.mount_root, key))
                except OSError:
                    pass
            try:
                os.rmdir(self.mount_root)
            except OSError:
                pass


def _check_owner(mode, uid, gid, top_id: int) -> None:
    for name, v, top in (("mode", mode, 0o7777), ("uid", uid, top_id), ("gid", gid, top_id)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
            raise InvalidInput(f"{name} must be an integer from 0 to {top if name != 'mode' else oct(top)}",
                               **{name: v})


def _bytes_under(d: str) -> int:
    total = 0
    for dirpath, dirs, files in os.walk(d):
        for f in files + dirs:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [os.path.realpath(line.split()[4]) for line in f]
