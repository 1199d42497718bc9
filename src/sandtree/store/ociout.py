"""OCI out: what an image is as OCI blobs (a Plan), written as an OCI image layout (a
tar stream); a push sends the same Plan to a registry (store/registry.py push_image). What the
layers hold is store/ocilayers.py.

A layer's digests depend only on the two images it lies between, so they are kept in the
database (oci_layers) once computed: an unchanged image is planned from rows alone, and a push
writes a layer's bytes only when the registry lacks them (HEAD per blob first; the manifest
is left alone when the tag already names the same one). A push of an unchanged image therefore
uploads nothing and costs one request (HEAD of the tag's manifest: when it is ours, the registry
already holds every blob it names, as it checked them when it took the manifest).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from dataclasses import dataclass

from ..errors import StoreCorrupt
from .ocilayers import (ENCODING, MANIFEST_MEDIA, LayerBlob, config_json, layer_images, manifest_json,
                        split_config, write_layer)
from .store import Store

__all__ = ["Plan", "plan", "layer_file", "blob_file", "write_layout_tar"]


@dataclass
class Plan:
    image: str
    layers: list[LayerBlob]
    config: bytes
    manifest: bytes
    files: dict[str, str]             # digest -> a file holding the blob, written while planning

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    def discard(self) -> None:
        for path in self.files.values():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.files.clear()


def _cached(store: Store, lower: str | None, upper: str) -> LayerBlob | None | bool:
    """The cached layer, None for a cached empty delta, False when not cached."""
    row = store.db.one("SELECT digest, diff_id, size FROM oci_layers WHERE lower=? AND upper=? AND encoding=?",
                       (lower or "", upper, ENCODING))
    if row is None:
        return False
    return LayerBlob(lower, upper, row[0], row[1], row[2]) if row[0] else None


def _remember(store: Store, lower: str | None, upper: str, blob: LayerBlob | None) -> None:
    with store.db.tx() as con:
        con.execute("INSERT OR REPLACE INTO oci_layers(lower, upper, encoding, digest, diff_id, size) "
                    "VALUES(?,?,?,?,?,?)", (lower or "", upper, ENCODING, blob.digest if blob else "",
                                            blob.diff_id if blob else "", blob.size if blob else 0))


def layer_file(store: Store, lower: str | None, upper: str, workdir: str) -> tuple[LayerBlob | None, str | None]:
    """Write one layer into workdir: (its blob, the file), or (None, None) for an empty delta."""
    fd, path = tempfile.mkstemp(dir=workdir, prefix="layer-")
    try:
        with os.fdopen(fd, "wb") as f:
            blob = write_layer(store, lower, upper, f)
    except BaseException:
        os.unlink(path)
        raise
    if blob is None:
        os.unlink(path)
        return None, None
    return blob, path


def plan(store: Store, image: str, workdir: str, *, write_all: bool = False) -> Plan:
    """The layers, config and manifest of an image. Layers not cached yet are written into
    workdir (their digests are learnt that way); write_all: every layer is (an export needs
    the bytes)."""
    owners = layer_images(store, image)
    layers, files = [], {}
    lower = None
    for upper in owners:
        blob = _cached(store, lower, upper)
        if blob is False or (write_all and blob is not None):
            fresh, path = layer_file(store, lower, upper, workdir)
            if blob not in (False, None) and (fresh is None or fresh.digest != blob.digest):
                raise StoreCorrupt(f"layer {lower} -> {upper} no longer has its recorded digest {blob.digest}")
            if blob is False:
                _remember(store, lower, upper, fresh)
            blob = fresh
            if path is not None:
                files[blob.digest] = path
        if blob is not None:
            layers.append(blob)
            lower = upper
        # an empty delta: the next layer starts from the same lower
    _, _, config = split_config(store, image)
    cfg = config_json(config, layers)
    return Plan(image, layers, cfg, manifest_json(cfg, layers, image), files)


def blob_file(store: Store, p: Plan, blob: LayerBlob, workdir: str) -> str:
    path = p.files.get(blob.digest)
    if path is None:
        fresh, path = layer_file(store, blob.lower, blob.upper, workdir)
        if fresh is None or fresh.digest != blob.digest:
            raise StoreCorrupt(f"layer {blob.lower} -> {blob.upper} no longer has its recorded digest")
        p.files[blob.digest] = path
    return path


# ---- an OCI image layout, as a tar --------------------------------------------------------------------
def write_layout_tar(store: Store, image: str, fileobj, workdir: str, *, ref_name: str | None = None) -> Plan:
    """Write the image as an OCI image layout (oci-layout, index.json, blobs/sha256/...) in a tar
    stream; ref_name: the index's org.opencontainers.image.ref.name annotation."""
    p = plan(store, image, workdir, write_all=True)
    try:
        desc = {"mediaType": MANIFEST_MEDIA, "digest": p.digest, "size": len(p.manifest)}
        if ref_name:
            desc["annotations"] = {"org.opencontainers.image.ref.name": ref_name}
        index = json.dumps({"schemaVersion": 2, "manifests": [desc]}, sort_keys=True).encode()
        with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            def add(name: str, data: bytes | None = None, path: str | None = None, kind=tarfile.REGTYPE):
                ti = tarfile.TarInfo(name)
                ti.type, ti.mode, ti.mtime = kind, 0o755 if kind == tarfile.DIRTYPE else 0o644, 0
                if path is not None:
                    ti.size = os.path.getsize(path)
                    with open(path, "rb") as f:
                        tar.addfile(ti, f)
                else:
                    ti.size = len(data or b"")
                    tar.addfile(ti, io.BytesIO(data or b""))
            add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
            add("index.json", index)
            add("blobs", kind=tarfile.DIRTYPE)
            add("blobs/sha256", kind=tarfile.DIRTYPE)
            done = set()
            for digest, data in ((p.digest, p.manifest), ("sha256:" + hashlib.sha256(p.config).hexdigest(), p.config)):
                add(f"blobs/sha256/{digest[7:]}", data)
                done.add(digest)
            for blob in p.layers:
                if blob.digest not in done:
                    add(f"blobs/sha256/{blob.digest[7:]}", path=blob_file(store, p, blob, workdir))
                    done.add(blob.digest)
        return p
    finally:
        p.discard()
