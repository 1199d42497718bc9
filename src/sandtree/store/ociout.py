"""OCI out (issue 15): an image written as an OCI image layout (a tar stream) or pushed to a
registry (distribution API v2). What the layers hold is store/ocilayers.py.

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

import httpx

from ..errors import RegistryError, StoreCorrupt
from .ocilayers import (ENCODING, MANIFEST_MEDIA, LayerBlob, config_json, layer_images, manifest_json,
                        split_config, write_layer)
from .registry import Client, parse
from .store import Store

__all__ = ["Plan", "plan", "write_layout_tar", "push"]


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


def _blob_file(store: Store, p: Plan, blob: LayerBlob, workdir: str) -> str:
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
                    add(f"blobs/sha256/{blob.digest[7:]}", path=_blob_file(store, p, blob, workdir))
                    done.add(blob.digest)
        return p
    finally:
        p.discard()


# ---- a push -----------------------------------------------------------------------------------------
def push(store: Store, image: str, reference: str, workdir: str, *, credentials=None, insecure: bool = False,
         progress=None) -> dict:
    """Push the image to docker://HOST/NAME:TAG. Returns {reference, digest, layers, uploaded,
    bytes, seconds}: uploaded counts the blobs this push sent (0 for an unchanged image)."""
    started = time.monotonic()
    ref = parse(reference)
    if ref.digest:
        raise RegistryError("push to a tag (docker://HOST/NAME:TAG), not to a digest")
    tag = ref.tag or "latest"
    client = Client(ref, credentials, insecure)
    client.actions = "pull,push"
    p = plan(store, image, workdir)
    uploaded, sent = 0, 0
    try:
        try:
            # the tag already names this manifest: the registry checked its blobs when it took it
            head = client.request("HEAD", f"{ref.name}/manifests/{tag}", ok=(200, 404),
                                  headers={"Accept": MANIFEST_MEDIA})
            if head.status_code == 200 and head.headers.get("docker-content-digest") == p.digest:
                return _result(ref, tag, p, 0, 0, started)
            cfg_digest = "sha256:" + hashlib.sha256(p.config).hexdigest()
            for blob in p.layers + [LayerBlob(None, image, cfg_digest, cfg_digest, len(p.config))]:
                if client.request("HEAD", f"{ref.name}/blobs/{blob.digest}", ok=(200, 404)).status_code == 200:
                    continue
                if blob.digest == cfg_digest:
                    _upload(client, ref.name, blob.digest, p.config)
                else:
                    with open(_blob_file(store, p, blob, workdir), "rb") as f:
                        _upload(client, ref.name, blob.digest, f)
                uploaded += 1
                sent += blob.size
                if progress:
                    progress(blob.size)
            client.request("PUT", f"{ref.name}/manifests/{tag}", ok=(200, 201), content=p.manifest,
                           headers={"Content-Type": MANIFEST_MEDIA})
        except httpx.HTTPError as exc:
            raise RegistryError(f"cannot reach {ref.registry}: {exc}") from None
    finally:
        client.close()
        p.discard()
    return _result(ref, tag, p, uploaded, sent, started)


def _result(ref, tag: str, p: Plan, uploaded: int, sent: int, started: float) -> dict:
    return {"reference": f"{ref.registry}/{ref.name}:{tag}", "digest": p.digest, "layers": len(p.layers),
            "uploaded": uploaded, "bytes": sent, "seconds": round(time.monotonic() - started, 4)}


def _upload(client: Client, name: str, digest: str, content) -> None:
    """A monolithic upload: POST a session, PUT the bytes to its Location with the digest."""
    r = client.request("POST", f"{name}/blobs/uploads/", ok=(202,))
    location = r.headers.get("location")
    if not location:
        raise RegistryError(f"{client.ref.registry} gave no upload location")
    location = str(httpx.URL(client.base).join(location))
    size = len(content) if isinstance(content, bytes) else os.fstat(content.fileno()).st_size
    # the digest joins the location's own query (its upload state), which httpx's params would replace
    client.request("PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", ok=(201,),
                   content=content, headers={"Content-Type": "application/octet-stream",
                                             "Content-Length": str(size)})
