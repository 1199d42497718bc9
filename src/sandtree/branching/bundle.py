"""Bundles: images (optionally with their ancestry) as one self-contained, verifiable file.

Format (a zstd-compressed tar, see docs/formats.md):
    sandtree-bundle.json      {"format": "sandtree-bundle", "version": 1, "images": [...],
                               "edges": [...], "operations": {...}, "refs": [...]}
    sandtree-bundle.sha256    sha256 of the manifest bytes
    trees/<sha256>            tree objects (their hash is recomputed from the decoded entries)
    blobs/<sha256>            file contents (hash verified while reading)
Importing yields the same image IDs and lineage; layers are rebuilt from objects, each image as
a delta on a parent already present. Any mismatch rejects the bundle and changes nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time

import zstandard

from ..errors import BadArchive
from ..store.maintenance import reachable
from ..store.objects import DIR, FILE, decode_tree, tree_hash_and_data
from ..store.store import Store

FORMAT, VERSION = "sandtree-bundle", 1


def create(store: Store, fileobj, images: list[str], *, with_ancestry: bool, ancestors) -> dict:
    wanted: list[str] = []
    for image in images:
        for i in (ancestors(image) if with_ancestry else [image]):
            if i not in wanted and store.has_image(i):
                wanted.append(i)
    wanted_set = set(wanted)
    tree_set, blobs = reachable(store, wanted)
    trees = {h: store.db.tree_data(h) for h in tree_set}
    edges = [{"parent": p, "child": c, "op": op} for p, c, op in store.db.query("SELECT parent, child, op FROM edges")
             if p in wanted_set and c in wanted_set]
    ops = {}
    for e in edges:
        r = store.db.one("SELECT id, kind, source, result, spec, outcome, started, finished FROM operations WHERE id=?",
                         (e["op"],))
        if r:
            ops[r[0]] = {"kind": r[1], "source": r[2], "result": r[3], "spec": json.loads(r[4]),
                         "outcome": json.loads(r[5]) if r[5] else None, "started": r[6], "finished": r[7]}
    manifest = {"format": FORMAT, "version": VERSION, "created": time.time(),
                "images": [{"id": i, "links": store.image(i).links, "size": store.image(i).size,
                            "files": store.image(i).files} for i in wanted],
                "edges": edges, "operations": ops,
                "refs": [{"kind": k, "name": n, "image": im} for k, n, im in
                         store.db.query("SELECT kind, name, image FROM refs WHERE kind='tag'") if im in wanted_set]}
    mbytes = json.dumps(manifest, sort_keys=True).encode()
    cctx = zstandard.ZstdCompressor(level=6)
    with cctx.stream_writer(fileobj, closefd=False) as z, tarfile.open(fileobj=z, mode="w|") as tar:
        _add(tar, "sandtree-bundle.json", mbytes)
        _add(tar, "sandtree-bundle.sha256", hashlib.sha256(mbytes).hexdigest().encode())
        for h, data in sorted(trees.items()):
            _add(tar, f"trees/{h}", data)
        for b in sorted(blobs):
            path = store.blobs.path(b)
            ti = tarfile.TarInfo(f"blobs/{b}")
            ti.size = os.path.getsize(path)
            with open(path, "rb") as f:
                tar.addfile(ti, f)
    return {"images": len(wanted), "trees": len(trees), "blobs": len(blobs)}


def _add(tar, name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size = len(data)
    tar.addfile(ti, io.BytesIO(data))


def read(store: Store, fileobj, staging: str) -> tuple[dict, dict[str, bytes], set[str]]:
    """Verify and unpack: (manifest, trees, blob digests). New blobs are written into `staging`
    (named by digest); the caller moves them into the store only once everything verified."""
    manifest = checksum = None
    trees: dict[str, bytes] = {}
    blobs: set[str] = set()
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(fileobj)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for m in tar:
                if not m.isreg():
                    raise BadArchive(f"unexpected bundle member {m.name!r}")
                f = tar.extractfile(m)
                if m.name == "sandtree-bundle.json":
                    manifest = f.read()
                elif m.name == "sandtree-bundle.sha256":
                    checksum = f.read().decode().strip()
                elif m.name.startswith("trees/"):
                    h = m.name[6:]
                    data = f.read()
                    try:
                        ok = tree_hash_and_data(decode_tree(data))[0] == h
                    except (ValueError, TypeError, IndexError, KeyError):
                        ok = False
                    if not ok:
                        raise BadArchive(f"bundle tree {h[:12]} does not match its hash")
                    trees[h] = data
                elif m.name.startswith("blobs/"):
                    h = m.name[6:]
                    data = f.read()
                    if hashlib.sha256(data).hexdigest() != h:
                        raise BadArchive(f"bundle blob {h[:12]} does not match its hash")
                    blobs.add(h)
                    if not store.blobs.has(h):
                        with open(os.path.join(staging, h), "wb") as out:
                            out.write(data)
                else:
                    raise BadArchive(f"unexpected bundle member {m.name!r}")
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise BadArchive(f"not a readable sandtree bundle: {exc}") from None
    if manifest is None or checksum is None or hashlib.sha256(manifest).hexdigest() != checksum:
        raise BadArchive("bundle manifest missing or altered")
    man = json.loads(manifest)
    if man.get("format") != FORMAT or man.get("version") != VERSION:
        raise BadArchive(f"not a {FORMAT} v{VERSION} file")
    # every image's whole tree and every file must be in the bundle
    for img in man["images"]:
        todo = [img["id"]]
        while todo:
            h = todo.pop()
            if h not in trees and store.db.tree_data(h) is None:
                raise BadArchive(f"bundle lacks tree {h[:12]} of image {img['id'][:12]}")
            for e in decode_tree(trees.get(h) or store.db.tree_data(h)).values():
                if e.kind == DIR and e.name != ".":
                    todo.append(e.ref)
                elif e.kind == FILE and e.ref not in blobs and not store.blobs.has(e.ref):
                    raise BadArchive(f"bundle lacks the content of {e.name!r} ({e.ref[:12]})")
    return man, trees, blobs
