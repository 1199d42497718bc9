"""Edits: a new image made by the engine writing files itself, without a sandbox (a build's COPY,
an image's config). The files go into a fresh upper directory in overlay form, exactly what a run
leaves, and the committer (commit.py) makes it an image: same tree rules, same IDs, same rows.

Parent directories that exist in the image are made in the upper with the image's metadata (so a
commit keeps them as they were); a symlink on the way is resolved inside the image (Docker
resolves COPY destinations in the container's root), never on the host.
"""

from __future__ import annotations

import os
import stat
import time
import uuid

from ...errors import InvalidInput, NotFound, PathEscape
from ...store import inspect
from ...store.layers import make_whiteout, remove_tree
from ...store.names import PATH_BYTES_MAX
from ...store.objects import DIR
from ...store.store import Store

__all__ = ["Upper", "commit_edit"]


def _real_dir(path: str) -> bool:
    """A directory itself, not a symlink to one (the upper is host paths: a link made by this edit
    from a copied symlink must never be followed on the host)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


class Upper:
    """A fresh upper directory over image `image`, filled by the caller (host ids via the idmap)."""

    def __init__(self, store: Store, image: str):
        self.store, self.image, self.idmap = store, image, store.idmap
        self.path = store.layers.stage("edit")
        root = store.tree(image)["."]
        os.chown(self.path, self.idmap.host_uid(root.uid), self.idmap.host_gid(root.gid))
        os.chmod(self.path, root.mode)
        self.made: dict[str, str] = {"/": self.path}     # image path -> host dir made in the upper

    def find(self, path: str):
        try:
            return inspect.resolve(self.store, self.image, path)
        except (NotFound, PathEscape):
            return None

    def dir(self, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0, meta: bool = False) -> tuple[str, str]:
        """(normalised image path, host dir in the upper) of directory `path`, made with every
        parent. Existing directories (image or upper) keep their metadata unless meta: then this
        mode/owner is set (a copied directory's own). New ones get mode/uid/gid.

        A symlink on the way starts the walk again from its resolved target (a loop, not a
        recursion: `/l/l/l/...` under `l -> /` was a RecursionError); each restart resolves at
        least one more component, and the path may not grow past PATH_BYTES_MAX."""
        while True:
            found_link = self._walk(path, mode, uid, gid, meta)
            if isinstance(found_link, tuple):
                return found_link
            path = found_link
            if len(path.encode("utf-8", "surrogateescape")) > PATH_BYTES_MAX:
                raise InvalidInput(f"a path through the image's symlinks is over {PATH_BYTES_MAX} bytes",
                                   path=path[:200])

    def _walk(self, path: str, mode: int, uid: int, gid: int, meta: bool):
        """dir()'s walk: the result, or the path to walk again (a symlink's target + the rest)."""
        parts = inspect.split_path(path)
        cur = "/"
        for i, name in enumerate(parts):
            nxt = cur.rstrip("/") + "/" + name
            if nxt in self.made and not _real_dir(self.made[nxt]):
                self._forget(nxt)                  # replaced by a file or link of this edit since
            if nxt not in self.made:
                found = self.find(nxt)
                if found is not None and found[0] != nxt:     # a symlink on the way: its target
                    if found[1].kind != DIR:
                        raise InvalidInput(f"{nxt} is not a directory in the image", path=nxt)
                    return found[0] + "/" + "/".join(parts[i + 1:])
                host = os.path.join(self.made[cur], name)
                if not _real_dir(host):            # never through a link: lstat, not isdir
                    if os.path.lexists(host):
                        os.unlink(host)                      # written by this edit: replaced by a dir
                    os.mkdir(host)
                e = found[1] if found is not None and found[1].kind == DIR else None
                last = i == len(parts) - 1
                m, u, g = (e.mode, e.uid, e.gid) if e is not None and not (last and meta) else (mode, uid, gid)
                os.lchown(host, self.idmap.host_uid(u), self.idmap.host_gid(g))
                os.chmod(host, m)
                self.made[nxt] = host
            elif i == len(parts) - 1 and meta:
                os.lchown(self.made[nxt], self.idmap.host_uid(uid), self.idmap.host_gid(gid))
                os.chmod(self.made[nxt], mode)
            cur = nxt
        return cur, self.made[cur]

    def _leaf(self, path: str) -> tuple[str, str]:
        parts = inspect.split_path(path)
        if not parts:
            raise InvalidInput(f"cannot write at {path!r}")
        parent, host_dir = self.dir("/" + "/".join(parts[:-1]))
        host = os.path.join(host_dir, parts[-1])
        if _real_dir(host):
            remove_tree(host)            # (made by this edit; nothing mounted under a staged dir)
        elif os.path.lexists(host):
            os.unlink(host)
        self._forget(parent.rstrip("/") + "/" + parts[-1])
        return parent.rstrip("/") + "/" + parts[-1], host

    def _forget(self, path: str) -> None:
        """Drop the dirs made at and under `path` (it is replaced): a later write under it must
        make them again, never reach them through what replaced them."""
        for p in [p for p in self.made if p == path or p.startswith(path + "/")]:
            del self.made[p]

    def file(self, path: str, write, *, mode: int, uid: int, gid: int) -> str:
        """A regular file at `path`, its bytes from write(fileobj); its host path."""
        _, host = self._leaf(path)
        with open(host, "xb") as out:
            write(out)
        os.lchown(host, self.idmap.host_uid(uid), self.idmap.host_gid(gid))
        os.chmod(host, mode)
        return host

    def symlink(self, path: str, target: str, *, uid: int, gid: int) -> None:
        _, host = self._leaf(path)
        os.symlink(target, host)
        os.lchown(host, self.idmap.host_uid(uid), self.idmap.host_gid(gid))

    def remove(self, path: str) -> None:
        """Delete `path` of the image (a whiteout in the upper)."""
        _, host = self._leaf(path)
        make_whiteout(host, self.idmap)

    def close(self) -> None:
        remove_tree(self.path)


def commit_edit(engine, source: str, fill, spec: dict, *, kind: str, also=None,
                op: str | None = None, mtime_clamp: int | None = None) -> tuple[str, str]:
    """(new image, operation id): fill(Upper) then commit it on `source`, recorded as an
    operation of `kind` with `spec` (spec["command"] labels the lineage edge). also(con, image):
    more rows in the same transaction (a build step's cache row). mtime_clamp: a build step's
    SOURCE_DATE_EPOCH (runs/commit.clamp_mtimes)."""
    started = time.time()
    op = op or uuid.uuid4().hex
    with engine.store.using():
        row = engine.store.image(source)
        upper = Upper(engine.store, source)
        try:
            fill(upper)
            cr = engine.committer.commit(row, upper.path, mtime_clamp=mtime_clamp)
        finally:
            upper.close()
        write = engine.committer.image_writer(cr)
        engine.records.record(op, source, spec, started, cr.image, {"files": cr.files, "size": cr.size}, write,
                              kind=kind, also=(lambda con: also(con, cr.image)) if also is not None else None)
    return cr.image, op
