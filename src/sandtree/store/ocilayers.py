"""OCI out: an image as OCI layers, an OCI config and a manifest.

Layers map to sandtree's layers. An image's layer stack (top first) was made one commit at a time;
each layer is the top layer of exactly one image, its *owner* (the image whose layer list is that
suffix of the stack). OCI layer k is the tree delta from owner k-1 to owner k (the first from the
empty tree), computed from objects, never from the layer directories (they hold host-shifted ids,
v3 capabilities and inert placeholders). A layer whose owner is gone is folded into the one above;
a delta that is empty once the config is taken out (a config-only step) is left out.

Deterministic: a layer's bytes depend only on the two trees (the states), not on when or where
they were recorded: names in byte order, depth first; every mtime 0; ids, modes, xattrs, link
targets and device numbers as the tree records them; no user or group names; gzip level 6 with
mtime 0 and no file name. So the same image gives the same digests on every push and on every
store that holds the same layer history, and a layer's digest can be cached by (lower, upper).

Mapping (docs/design.md "OCI export and push"): a deleted name is an OCI whiteout `.wh.NAME` (the
exact per-name delta, so opaque markers are never needed); a hard-link group is its first path
as a file and the others as tar hard links to it (which may lie in a lower layer); devices are
exported as recorded, except a 0/0 char device (an overlay whiteout to overlay-based unpackers:
refused); sockets have no tar form and are left out. The image config (imageconfig.CONFIG_PATH)
is taken out of the layers and becomes the OCI config when it is in its canonical form (else it
stays a plain file of the layers and is still copied into the OCI config): a pull writes it back,
so a push and a pull give the same image ID.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import tarfile
from dataclasses import dataclass

from ..errors import InvalidInput
from .imageconfig import CONFIG_PATH, MAX_CONFIG_BYTES, ImageConfig
from .layers import is_recorded_xattr
from .objects import BLK, CHR, DIR, FIFO, FILE, SOCK, SYMLINK, Entry, tree_hash_and_data
from .store import Store

__all__ = ["LAYER_MEDIA", "CONFIG_MEDIA", "MANIFEST_MEDIA", "ENCODING", "LayerBlob", "layer_images",
           "split_config", "write_layer", "config_json", "manifest_json"]

LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_MEDIA = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"
ENCODING = "tar+gzip6-mtime0-v1"          # names how a layer is written (the cache's key): change on any change
_DIR_NAME, _FILE_NAME = CONFIG_PATH.strip("/").split("/")


@dataclass(frozen=True)
class LayerBlob:
    lower: str | None          # the image below (None: the empty tree)
    upper: str                 # the image this layer makes
    digest: str                # sha256:... of the compressed blob
    diff_id: str               # sha256:... of the tar
    size: int                  # bytes of the compressed blob


def layer_images(store: Store, image_id: str) -> list[str]:
    """The owners of an image's layers, bottom first (the last is the image itself)."""
    stack = store.image(image_id).layers
    owners = []
    for k in range(len(stack) - 1, 0, -1):
        row = store.db.one("SELECT id FROM images WHERE layers=?", (json.dumps(stack[k:]),))
        if row is not None:
            owners.append(row[0])
    return owners + [image_id]


# ---- the config file, taken out of the trees ------------------------------------------------------
def _canonical_dir(e: Entry) -> bool:
    return e.kind == DIR and (e.mode, e.uid, e.gid, e.xattrs) == (0o755, 0, 0, ())


def split_config(store: Store, root: str) -> tuple[dict[str, Entry], dict[str, dict], ImageConfig]:
    """(the root's entries as the layers carry them, trees made for that, the image's config).
    The config file leaves the layers when it is exactly what a pull writes back (canonical
    JSON, 0644, 0:0, no xattrs, no hard link); /.sandtree leaves with it when nothing else is in
    it and it is 0755 0:0. The config is the file's content either way (empty: no file)."""
    entries = dict(store.tree(root))
    made: dict[str, dict] = {}
    sd = entries.get(_DIR_NAME)
    if sd is None or sd.kind != DIR:
        return entries, made, ImageConfig()
    sub = store.tree(sd.ref)
    cf = sub.get(_FILE_NAME)
    if cf is None or cf.kind != FILE or cf.size > MAX_CONFIG_BYTES:
        return entries, made, ImageConfig()
    with store.blobs.open(cf.ref) as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    try:
        config = ImageConfig.from_json(data)
    except InvalidInput:
        return entries, made, ImageConfig()        # not a config: an ordinary file of the image
    if (cf.mode, cf.uid, cf.gid, cf.xattrs, cf.hl) != (0o644, 0, 0, (), None) or config.to_json() != data:
        return entries, made, config
    rest = {k: v for k, v in sub.items() if k != _FILE_NAME}
    if not [k for k in rest if k != "."] and _canonical_dir(sd):
        del entries[_DIR_NAME]
    else:
        h, _ = tree_hash_and_data(rest)
        made[h] = rest
        entries[_DIR_NAME] = sd._replace(ref=h)
    return entries, made, config


# ---- one layer: the delta of two trees as a tar -------------------------------------------------
def _members(store: Store, lower: dict[str, Entry] | None, upper: dict[str, Entry], made: dict):
    """(path, entry or None for a whiteout) of the delta lower -> upper, in tar order. Iterative:
    an image's depth is untrusted."""
    def tree(h):
        return made[h] if h in made else store.tree(h)

    if "." in upper and (lower is None or "." not in lower or lower["."].hashed() != upper["."].hashed()):
        yield ".", upper["."]
    stack = [("", lower, upper, None)]
    while stack:
        base, old, new, it = stack.pop()
        if it is None:
            names = set(new) | set(old or ())
            names.discard(".")
            it = iter(sorted(names, key=lambda n: n.encode("utf-8", "surrogateescape")))
        for name in it:
            path = f"{base}{name}"
            o, n = (old or {}).get(name), new.get(name)
            if n is None:
                yield f"{base}.wh.{name}", None
                continue
            if o is not None and o.hashed() == n.hashed():
                continue
            yield path, n
            if n.kind == DIR:
                stack.append((base, old, new, it))           # come back to this directory after
                stack.append((path + "/", tree(o.ref) if o is not None and o.kind == DIR else None,
                              tree(n.ref), None))
                break


def _tarinfo(path: str, e: Entry) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(path if path != "." else "./")
    ti.mode, ti.uid, ti.gid, ti.mtime = e.mode, e.uid, e.gid, 0
    xattrs = sorted((k, v) for k, v in e.xattrs if is_recorded_xattr(k))
    if xattrs:
        ti.pax_headers = {"SCHILY.xattr." + k: base64.b64decode(v).decode("utf-8", "surrogateescape")
                          for k, v in xattrs}
    return ti


class _Hashing:
    """A write-only stream that hashes and counts what passes to `out` (None: nothing)."""

    def __init__(self, out=None):
        self.out, self.h, self.n = out, hashlib.sha256(), 0

    def write(self, b) -> int:
        self.h.update(b)
        self.n += len(b)
        if self.out is not None:
            self.out.write(b)
        return len(b)

    def flush(self) -> None:
        pass


def write_layer(store: Store, lower: str | None, upper: str, fileobj) -> LayerBlob | None:
    """Write the layer lower -> upper (image IDs; lower None: from nothing) as a gzip tar to
    fileobj; None (nothing written) when the delta is empty once the config is taken out."""
    new, made, _ = split_config(store, upper)
    old, made_old, _ = split_config(store, lower) if lower is not None else (None, {}, None)
    made.update(made_old)
    members = _members(store, old, new, made)
    first = next(members, None)
    if first is None:
        return None
    blob = _Hashing(fileobj)
    gz = gzip.GzipFile(filename="", mode="wb", compresslevel=6, fileobj=blob, mtime=0)
    raw = _Hashing(gz)
    with tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path, e in _chain(first, members):
            _add(store, tar, path, e)
    gz.close()
    return LayerBlob(lower, upper, "sha256:" + blob.h.hexdigest(), "sha256:" + raw.h.hexdigest(), blob.n)


def _chain(first, rest):
    yield first
    yield from rest


def _add(store: Store, tar: tarfile.TarFile, path: str, e: Entry | None) -> None:
    if e is None:                                          # a whiteout: an empty file named .wh.NAME
        ti = tarfile.TarInfo(path)
        ti.mode, ti.mtime = 0o644, 0
        tar.addfile(ti)
        return
    ti = _tarinfo(path, e)
    if e.kind == FILE and e.hl and e.hl.lstrip("/") != path:
        ti.type, ti.linkname = tarfile.LNKTYPE, e.hl.lstrip("/")
        tar.addfile(ti)
        return
    if e.kind == FILE:
        ti.size = e.size
        with store.blobs.open(e.ref) as f:
            tar.addfile(ti, f)
        return
    if e.kind == SOCK:
        return                                             # no tar form
    if e.kind == CHR and int(e.ref) == 0:
        raise InvalidInput(f"/{path} is a 0/0 character device, which overlay-based unpackers take "
                           "for a whiteout: the image cannot be exported as OCI layers")
    ti.type = {DIR: tarfile.DIRTYPE, SYMLINK: tarfile.SYMTYPE, CHR: tarfile.CHRTYPE,
               BLK: tarfile.BLKTYPE, FIFO: tarfile.FIFOTYPE}[e.kind]
    if e.kind == SYMLINK:
        ti.linkname = e.ref
    elif e.kind in (CHR, BLK):
        ti.devmajor, ti.devminor = os.major(int(e.ref)), os.minor(int(e.ref))
    tar.addfile(ti)


# ---- config and manifest ---------------------------------------------------------------------------
def _canon(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def config_json(config: ImageConfig, layers: list[LayerBlob]) -> bytes:
    """The OCI image config (no `created`: the same image gives the same bytes)."""
    return _canon({"architecture": "amd64", "os": "linux", "config": config.to_oci(),
                   "rootfs": {"type": "layers", "diff_ids": [b.diff_id for b in layers]}})


def manifest_json(config: bytes, layers: list[LayerBlob], image_id: str) -> bytes:
    return _canon({"schemaVersion": 2, "mediaType": MANIFEST_MEDIA,
                   "config": {"mediaType": CONFIG_MEDIA, "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
                              "size": len(config)},
                   "layers": [{"mediaType": LAYER_MEDIA, "digest": b.digest, "size": b.size} for b in layers],
                   "annotations": {"dev.sandtree.image": image_id}})
