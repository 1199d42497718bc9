"""Imports (a mixin of engine.Engine): a directory, a tar, an OCI layout or docker-archive, a
registry pull, a Debian bootstrap; each adopted as an image with its import operation. An OCI
image's config is kept in the image as /.sandtree/config.json (store/ociin.py).

How archives are read and bounded is store/importers.py; the registry client store/registry.py.
"""

from __future__ import annotations

import io
import os
import time
import uuid
from typing import TYPE_CHECKING, Callable

from ...errors import NotFound
from ...store import refs
from ...store.blobs import BlobStore
from ...store.db import Database
from ...store.layers import remove_tree
from ...store.names import check_tag
from ...store.store import Store
from ..runs.records import Records
from .. import parts             # importers, ociin, scan, registry: loaded on an import's first use

if TYPE_CHECKING:
    from ...store import importers


class ImportOps:
    """Mixed into engine.Engine, which provides store."""

    def import_path(self, path: str, *, tag: str | None = None, progress=None) -> str:
        """A directory, a rootfs tar (plain/gz/zst), an OCI layout (dir or tar) or docker-archive."""
        return self.import_limited(path, tag=tag, progress=progress)

    def import_limited(self, path: str, *, tag: str | None = None, progress=None,
                       limits: importers.ImportLimits | None = None) -> str:
        """import_path within `limits`: what an archive may expand to (ImportLimits' defaults; a
        tenant's limits may pass less). Not an operation of the table: the tenant view's way in."""
        if tag is not None:
            check_tag(tag)
        if not os.path.exists(path):
            raise NotFound(f"no such file or directory: {path}")
        if os.path.isdir(path):
            if os.path.exists(os.path.join(path, "index.json")) or os.path.exists(os.path.join(path, "manifest.json")):
                return self._import_layers(path, tag, progress, limits=limits)
            return self._adopt(path, copy=True, tag=tag, progress=progress, source=f"dir:{path}")
        if parts.importers.is_image_archive(path):
            tmp = self.store.layers.stage("oci")
            try:
                outer = parts.importers.ImportBudget(limits)
                outer.source(os.path.getsize(path))
                with open(path, "rb") as raw, parts.importers.open_tar_stream(io.BufferedReader(raw), outer) as t:
                    parts.importers.extract_tar(t, tmp, chown=False, budget=outer)
                return self._import_layers(tmp, tag, progress, source=f"archive:{path}", limits=limits)
            finally:
                remove_tree(tmp)
        staged = self.store.layers.stage("import")
        try:
            budget = parts.importers.ImportBudget(limits)
            budget.source(os.path.getsize(path))
            with open(path, "rb") as raw, parts.importers.open_tar_stream(io.BufferedReader(raw), budget) as t:
                parts.importers.extract_tar(t, staged, chown=not self.store.idmap.rootless, progress=progress,
                                            budget=budget)
            return self._adopt(staged, copy=False, tag=tag, progress=None, source=f"tar:{path}")
        except BaseException:
            remove_tree(staged)
            raise

    def _import_layers(self, layout: str, tag, progress, source: str | None = None,
                       limits: importers.ImportLimits | None = None) -> str:
        staged = self.store.layers.stage("import")
        try:
            parts.importers.apply_layers(parts.importers.oci_layers(layout), staged,
                                         chown=not self.store.idmap.rootless, progress=progress,
                                         budget=parts.importers.ImportBudget(limits))
            parts.ociin.write_config(staged, parts.ociin.oci_config(layout), chown=not self.store.idmap.rootless)
            return self._adopt(staged, copy=False, tag=tag, source=source or f"oci:{layout}")
        except BaseException:
            remove_tree(staged)
            raise

    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False, progress=None) -> str:
        """Pull docker://HOST/NAME:TAG from an OCI registry (digests verified) and import it."""
        return self.pull_operation(reference, tag=tag, insecure=insecure, progress=progress)

    def pull_operation(self, reference: str, *, tag: str | None = None, insecure: bool = False, progress=None,
                       op_id: str | None = None, check_host=None) -> str:
        """pull as operation `op_id` (a submitted pull's, or a new one). check_host("host:port"):
        called before every connection (redirects, token realms), raises to refuse one (the
        tenant view's check_public_registry). Not an operation of the table."""
        registry = parts.registry
        if tag is not None:
            check_tag(tag)
        ref = registry.parse(reference)
        row = self.store.db.one("SELECT username, secret FROM registry_auth WHERE registry=?", (ref.registry,))
        work = self.store.layers.stage("pull")
        staged = self.store.layers.stage("import")
        try:
            layers, config = registry.pull_image(reference, work, credentials=tuple(row) if row else None,
                                                 insecure=insecure, progress=progress, check_host=check_host)
            parts.importers.apply_layers(layers, staged, chown=not self.store.idmap.rootless)
            parts.ociin.write_config(staged, config, chown=not self.store.idmap.rootless)
            return self._adopt(staged, copy=False, tag=tag, source=f"pull:{ref}", op_id=op_id)
        except BaseException:
            remove_tree(staged)
            raise
        finally:
            remove_tree(work)

    def registry_host(self, reference: str) -> str:
        """The registry a URL or image reference names ("docker://ghcr.io/org/x" -> "ghcr.io")."""
        return parts.registry.registry_host(reference)

    def registry_login(self, registry_url: str, username: str, secret: str, *, insecure: bool = False) -> str:
        """Check credentials against the registry's /v2/ and keep them for pulls (the store is
        0700; the secret never appears in records)."""
        registry = parts.registry
        host = registry.registry_host(registry_url)
        registry.check_login(host, username, secret, insecure)
        with self.store.db.tx() as con:
            con.execute("INSERT OR REPLACE INTO registry_auth(registry, username, secret) VALUES(?,?,?)",
                        (host, username, secret))
        return host

    def registry_logout(self, registry_url: str) -> str:
        """Forget the credentials registry_login kept for this registry (NotFound when there are none)."""
        host = parts.registry.registry_host(registry_url)
        with self.store.db.tx() as con:
            gone = con.execute("DELETE FROM registry_auth WHERE registry=?", (host,)).rowcount
        if not gone:
            raise NotFound(f"no credentials stored for {host}", registry=host)
        return host

    def registry_list(self) -> list[dict]:
        """The registries with stored credentials, by host: registry and username (the secret stays in the store)."""
        return [{"registry": r, "username": u} for r, u in
                self.store.db.query("SELECT registry, username FROM registry_auth ORDER BY registry")]

    def bootstrap(self, spec: str, *, include: list[str] = (), tag: str | None = None,
                  log: Callable[[str], None] | None = None, mirror: str | None = None) -> str:
        if tag is not None:
            check_tag(tag)
        staged = self.store.layers.stage("bootstrap")
        try:
            parts.importers.bootstrap_debian(spec, staged, list(include), log=log, mirror=mirror)
            return self._adopt(staged, copy=False, tag=tag or spec,
                               source=f"bootstrap:{spec}" + (f" +{','.join(include)}" if include else ""))
        except BaseException:
            remove_tree(staged)
            raise

    def _adopt(self, src: str, *, copy: bool, tag: str | None, source: str, progress=None,
               op_id: str | None = None) -> str:
        with self.store.using():
            return self._adopt_locked(src, copy=copy, tag=tag, source=source, progress=progress, op_id=op_id)

    def _adopt_locked(self, src: str, *, copy: bool, tag: str | None, source: str, progress=None,
                      op_id: str | None = None) -> str:
        started = time.time()
        dest = self.store.layers.stage("import") if copy else None
        try:
            res = parts.scan.scan(src, dest, self.store.idmap, progress=progress)
            layer_dir = dest if copy else src
            with self.store.db.tx() as con:
                exists = con.execute("SELECT 1 FROM images WHERE id=?", (res.root,)).fetchone()
            layers = None
            if not exists:
                layers = [self.store.layers.publish(layer_dir)]
            elif copy:
                remove_tree(dest)
            op = op_id or uuid.uuid4().hex
            with self.store.db.tx() as con:
                Database.put_trees(con, res.trees)
                if layers:
                    if Store.insert_image(con, res.root, layers, res.links, res.size, res.files):
                        BlobStore.record(con, {h: f"layers/{layers[0]}/{p}" for h, p in res.locations.items()})
                    else:
                        layers = None                   # a concurrent import won the race
                # a submitted import's queued row is completed here
                Records.write(con, op, "import", None, res.root, {"source": source, "tag": tag},
                              {"files": res.files, "size": res.size}, started, time.time())
                if tag:
                    refs.set_tag(con, tag, res.root, "import")
            if exists and not copy:
                remove_tree(src)
            return res.root
        except BaseException:
            if dest is not None:
                remove_tree(dest)
            raise

