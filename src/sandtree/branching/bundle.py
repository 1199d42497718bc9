"""Bundles: images (optionally with their ancestry) as one self-contained, verifiable file.

Format (a zstd-compressed tar, see docs/formats.md):
    sandtree-bundle.json      {"format": "sandtree-bundle", "version": 1, "images": [...],
                               "edges": [...], "operations": {...}, "refs": [...]}
    sandtree-bundle.sha256    sha256 of the manifest bytes
    trees/<sha256>            tree objects (their hash is recomputed from the decoded entries)
    blobs/<sha256>            file contents (hash verified while reading)
Importing yields the same image IDs and lineage; layers are rebuilt from objects, each image as
a delta on a parent already present. Any mismatch rejects the bundle and changes nothing:
every name and reference is checked by the one rule (store/names.py) before it is used.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time

import zstandard

from ..errors import BadArchive, TooLarge
from ..store.importers import ImportBudget
from ..store.maintenance import reachable
from ..store.names import PATH_BYTES_MAX, check_digest, check_entries, check_path, check_tag
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


def read(store: Store, fileobj, staging: str, budget=None) -> tuple[dict, dict[str, bytes], set[str]]:
    """Verify and unpack: (manifest, trees, blob digests). New blobs are written into `staging`
    (named by digest); the caller moves them into the store only once everything verified.
    Everything in a bundle is from outside: member names and references must be digests, every
    tree passes the one name rule (store/names.py), tags the tag rule, and the expansion is capped
    (budget: an importers.ImportBudget; defaults from ImportLimits)."""
    if budget is None:
        budget = ImportBudget()
        try:
            budget.source(os.fstat(fileobj.fileno()).st_size)
        except (AttributeError, OSError, io.UnsupportedOperation):
            pass                                   # not a file: only the absolute caps apply
    manifest = checksum = None
    trees: dict[str, bytes] = {}
    blobs: set[str] = set()
    try:
        reader = budget.wrap(zstandard.ZstdDecompressor().stream_reader(fileobj))
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for m in tar:
                budget.entry()
                if not m.isreg():
                    raise BadArchive(f"unexpected bundle member {m.name!r}")
                f = tar.extractfile(m)
                if m.name in ("sandtree-bundle.json", "sandtree-bundle.sha256"):
                    if m.size > MAX_MANIFEST:
                        raise TooLarge(f"bundle manifest over {MAX_MANIFEST} bytes")
                    data = f.read()
                    if m.name == "sandtree-bundle.json":
                        manifest = data
                    else:
                        checksum = data.decode("ascii", "replace").strip()
                elif m.name.startswith("trees/"):
                    h = check_digest(m.name[6:], BadArchive, "bundle tree name")
                    if m.size > MAX_TREE:
                        raise TooLarge(f"bundle tree {h[:12]} over {MAX_TREE} bytes")
                    data = f.read()
                    try:
                        entries = decode_tree(data)
                        ok = tree_hash_and_data(entries)[0] == h
                    except (ValueError, TypeError, IndexError, KeyError, AttributeError, RecursionError):
                        ok = False
                    if not ok:
                        raise BadArchive(f"bundle tree {h[:12]} does not match its hash")
                    check_entries(entries, BadArchive)
                    trees[h] = data
                elif m.name.startswith("blobs/"):
                    h = check_digest(m.name[6:], BadArchive, "bundle blob name")
                    _stage_blob(store, f, h, staging)
                    blobs.add(h)
                else:
                    raise BadArchive(f"unexpected bundle member {m.name!r}")
    except (tarfile.TarError, zstandard.ZstdError, EOFError) as exc:
        raise BadArchive(f"not a readable sandtree bundle: {exc}") from None
    if manifest is None or checksum is None or hashlib.sha256(manifest).hexdigest() != checksum:
        raise BadArchive("bundle manifest missing or altered")
    try:
        man = json.loads(manifest)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BadArchive("bundle manifest is not JSON") from None
    if not isinstance(man, dict) or man.get("format") != FORMAT or man.get("version") != VERSION:
        raise BadArchive(f"not a {FORMAT} v{VERSION} file")
    _check_manifest(man)
    # every image's whole tree and every file must be in the bundle
    for img in man["images"]:
        todo = [(img["id"], 0)]                    # (tree, byte length of its image path)
        while todo:
            h, plen = todo.pop()
            if h not in trees and store.db.tree_data(h) is None:
                raise BadArchive(f"bundle lacks tree {h[:12]} of image {img['id'][:12]}")
            for e in decode_tree(trees.get(h) or store.db.tree_data(h)).values():
                if e.name == ".":
                    continue
                sub = plen + 1 + len(e.name.encode("utf-8", "surrogateescape"))
                if sub > PATH_BYTES_MAX:
                    raise BadArchive(f"bundle image {img['id'][:12]} has a path over {PATH_BYTES_MAX} bytes")
                if e.kind == DIR:
                    todo.append((e.ref, sub))
                elif e.kind == FILE and e.ref not in blobs and not store.blobs.has(e.ref):
                    raise BadArchive(f"bundle lacks the content of {e.name!r} ({e.ref[:12]})")
        # hard-link groups name paths the layer writer will create: each must be a non-directory
        for key, members in img.get("links", {}).items():
            for p in [key, *members]:
                e = _entry_at(store, trees, img["id"], p)
                if e is None or e.kind == DIR:
                    raise BadArchive(f"bundle hard-link path {p[:80]!r} is not a file of image {img['id'][:12]}")
    return man, trees, blobs


def _entry_at(store: Store, trees: dict[str, bytes], root: str, path: str):
    h = root
    parts = path.strip("/").split("/")
    for i, part in enumerate(parts):
        data = trees.get(h) or store.db.tree_data(h)
        e = decode_tree(data).get(part) if data is not None else None
        if e is None or i == len(parts) - 1:
            return e
        if e.kind != DIR:
            return None
        h = e.ref
    return None


MAX_MANIFEST = 256 << 20
MAX_TREE = 64 << 20


def _stage_blob(store: Store, f, h: str, staging: str) -> None:
    """Stream one blob into staging while hashing it (never whole in memory)."""
    out_path = os.path.join(staging, h)
    keep = not store.blobs.has(h) and not os.path.exists(out_path)
    tmp = out_path + ".part"
    digest = hashlib.sha256()
    out = open(tmp, "wb") if keep else None
    try:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            if out:
                out.write(chunk)
    finally:
        if out:
            out.close()
    if digest.hexdigest() != h:
        if keep:
            os.unlink(tmp)
        raise BadArchive(f"bundle blob {h[:12]} does not match its hash")
    if keep:
        os.rename(tmp, out_path)


def _check_manifest(man: dict) -> None:
    """Every name and reference in the manifest: IDs are digests, link groups are paths, tags
    pass the tag rule and point at an image of the bundle."""
    images = man.get("images")
    if not isinstance(images, list) or not all(isinstance(i, dict) for i in images):
        raise BadArchive("bundle manifest lists no images")
    ids = set()
    for img in images:
        ids.add(check_digest(img.get("id"), BadArchive, "bundle image id"))
        links = img.get("links", {})
        if not isinstance(links, dict):
            raise BadArchive("bundle image links must be an object")
        for key, members in links.items():
            if not isinstance(members, list):
                raise BadArchive("bundle image link group must be a list")
            for p in [key, *members]:
                if not isinstance(p, str) or not p.startswith("/"):
                    raise BadArchive(f"bundle hard-link path {str(p)[:80]!r} is not absolute")
                check_path(p[1:], BadArchive, "bundle hard-link path")
        for k in ("size", "files"):
            if not isinstance(img.get(k, 0), int) or img.get(k, 0) < 0:
                raise BadArchive(f"bundle image {k} must be a non-negative integer")
    if not isinstance(man.get("edges", []), list) or not isinstance(man.get("operations", {}), dict):
        raise BadArchive("bundle edges/operations malformed")
    for e in man.get("edges", []):
        if not isinstance(e, dict):
            raise BadArchive("bundle edge malformed")
        check_digest(e.get("parent"), BadArchive, "bundle edge parent")
        check_digest(e.get("child"), BadArchive, "bundle edge child")
        if not isinstance(e.get("op"), str):
            raise BadArchive("bundle edge without an operation id")
    for op_id, op in man.get("operations", {}).items():
        if not isinstance(op, dict) or not all(k in op for k in ("kind", "source", "result", "spec",
                                                                  "outcome", "started", "finished")):
            raise BadArchive(f"bundle operation {str(op_id)[:40]!r} malformed")
    refs = man.get("refs", [])
    if not isinstance(refs, list):
        raise BadArchive("bundle refs malformed")
    for r in refs:
        if not isinstance(r, dict) or r.get("kind") != "tag":
            raise BadArchive("bundle refs may only be tags")
        check_tag(r.get("name"), BadArchive)
        if r.get("image") not in ids:
            raise BadArchive(f"bundle tag {r.get('name')!r} points at an image not in the bundle")
    man.setdefault("edges", [])
    man.setdefault("operations", {})
