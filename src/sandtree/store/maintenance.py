"""fsck (verify hashes and references; layers nothing references; device nodes in layers) and
gc (remove what nothing references).

gc keeps: every image a ref (tag, branch) points at or pointed at within the retention age (the
reflog), with its whole ancestry through lineage edges; every image younger than the retention
age; and whatever those images use (layers, trees, blobs). Everything else goes. Staging leftovers of dead processes are removed too.
"""

from __future__ import annotations

import json
import os
import stat
import time

from . import tapes
from .blobs import hash_file
from .layers import remove_dead_transfers
from .objects import DIR, FILE, decode_tree, tree_hash_and_data
from . import ephemeral
from .store import Store


# Untagged images younger than GC_RETENTION seconds are kept; anything younger than GC_GRACE is
# never judged (a commit may be publishing it). The numbers live with every other default.
from ..defaults import EPHEMERAL_TTL, GC_GRACE, GC_RETENTION, LIVE_STATE_RETENTION  # noqa: E402,F401

def reachable(store: Store, roots, problems: list | None = None) -> tuple[set[str], set[str]]:
    """(tree hashes, blob digests) reachable from the given root trees."""
    trees, blobs = set(), set()
    todo = list(roots)
    while todo:
        h = todo.pop()
        if h in trees:
            continue
        data = store.db.tree_data(h)
        if data is None:
            if problems is not None:
                problems.append({"kind": "missing_tree", "tree": h})
            continue
        trees.add(h)
        for e in decode_tree(data).values():
            if e.kind == DIR and e.name != ".":
                todo.append(e.ref)
            elif e.kind == FILE and e.ref:
                blobs.add(e.ref)
    return trees, blobs


def fsck(store: Store, *, verify_content: bool = True, grace: float = GC_GRACE, now: float | None = None) -> dict:
    """grace: a layer nothing references is reported once it is older than this (a commit
    publishes its layer, then writes the image row: a younger one may be in between). A store in
    use changes while it is read (an ephemeral image and its layer go between the read of the rows
    and the listing of the layers): what looks wrong is checked again, and only what is wrong both
    times is a problem."""
    first = _fsck(store, verify_content, grace, now)
    if first["ok"]:
        return first
    again = _fsck(store, verify_content, grace, now)
    return {**again, "problems": [p for p in again["problems"] if p in first["problems"]],
            "ok": not any(p in first["problems"] for p in again["problems"])}


def _fsck(store: Store, verify_content: bool, grace: float, now: float | None) -> dict:
    now = time.time() if now is None else now
    problems: list[dict] = []
    images = store.db.query("SELECT id, layers FROM images")
    on_disk_layers = set(store.layers.all())
    remote = _remote_layers(store, problems) if store.objects else set()
    used: set[str] = set()
    for image_id, layers in images:
        for layer in json.loads(layers):
            used.add(layer)
            if layer not in on_disk_layers and layer not in remote:
                problems.append({"kind": "missing_layer", "image": image_id, "layer": layer})
    for layer in sorted(on_disk_layers):
        path = store.layers.path(layer)
        if layer not in used:
            age = now - os.lstat(path).st_ctime
            if age >= grace:
                problems.append({"kind": "unreferenced_layer", "layer": layer, "age": round(age)})
        for rel in device_nodes(path):
            problems.append({"kind": "device_node_in_layer", "layer": layer, "path": rel})
    trees, blobs = reachable(store, [i for i, _ in images], problems)
    for h in trees:
        data = store.db.tree_data(h)
        if tree_hash_and_data(decode_tree(data))[0] != h:
            problems.append({"kind": "tree_hash_mismatch", "tree": h})
    if store.cache is not None and verify_content:
        problems.extend(store.cache.check())     # cached layers against their S3 object's hash
    for b in blobs:
        path = store.blobs.path(b)
        if not os.path.exists(path):
            problems.append({"kind": "missing_blob", "blob": b})
        elif verify_content and hash_file(path)[0] != b:
            problems.append({"kind": "blob_hash_mismatch", "blob": b})
    known = {i for i, _ in images}
    for kind, name, image in store.db.query("SELECT kind, name, image FROM refs"):
        if image not in known:
            problems.append({"kind": "dangling_ref", "ref": f"{kind}:{name}", "image": image})
    return {"ok": not problems, "problems": problems, "images": len(images), "trees": len(trees),
            "blobs": len(blobs), "layers": len(on_disk_layers)}


def _remote_layers(store: Store, problems: list) -> set[str]:
    """Layers with a complete S3 object and a row saying what it must hash to (a row whose object
    is missing is a problem; an object without a row is an upload that never finished: gc's)."""
    keys = {k[len("layers/"):]: size for k, size, _ in store.objects.keys("layers/")}
    found = set()
    for layer, size, image_size in store.db.query("SELECT layer, size, erofs_size FROM layer_objects"):
        if f"{layer}.tar" not in keys:
            problems.append({"kind": "missing_layer_object", "layer": layer})
        elif keys[f"{layer}.tar"] != size:
            problems.append({"kind": "layer_object_size_mismatch", "layer": layer})
        else:
            found.add(layer)
        if image_size is not None and keys.get(f"{layer}.erofs") != image_size:
            problems.append({"kind": "layer_image_object_mismatch", "layer": layer})     # missing or cut
    return found


def _layer_of(name: str) -> str:
    """The layer a layers/ object is of: <id>.tar, its EROFS image <id>.erofs (layercache.py)."""
    return name.removesuffix(".tar").removesuffix(".erofs")


def device_nodes(layer_dir: str) -> list[str]:
    """Char/block device nodes in a layer other than overlay whiteouts (0/0): a layer must hold
    none (store/layers.py), a store written before that rule may. Iterative walk."""
    found = []
    todo = [""]
    while todo:
        rel = todo.pop()
        with os.scandir(os.path.join(layer_dir, rel)) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                sub = f"{rel}/{e.name}" if rel else e.name
                if stat.S_ISDIR(st.st_mode):
                    todo.append(sub)
                elif (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)) and st.st_rdev != 0:
                    found.append("/" + sub)
    return sorted(found)


def gc(store: Store, *, retention: float = GC_RETENTION, grace: float = GC_GRACE, now: float | None = None,
       ephemeral_ttl: float = EPHEMERAL_TTL) -> dict:
    """`grace`: layers and blobs younger than this are kept even when unreferenced (a concurrent
    commit may have published them and not yet written its image row). `ephemeral_ttl`: how long
    an ephemeral image nothing uses is kept (never longer than `retention`; store/ephemeral.py)."""
    with store.collecting():
        return _gc(store, retention, grace, time.time() if now is None else now, min(ephemeral_ttl, retention))


def _gc(store: Store, retention: float, grace: float, now: float, ttl: float) -> dict:
    store.layers.clean_stale()
    with store.db.tx(durable=True) as con:         # the rows gone for good before their files go
        images = {r[0]: (json.loads(r[1]), r[2]) for r in con.execute("SELECT id, layers, created FROM images")}
        expired = ephemeral.collectable(con, now, ttl)       # short-lived: not kept by their age
        keep = {i for i, (_, created) in images.items() if now - created < retention and i not in expired}
        keep |= {r[0] for r in con.execute("SELECT image FROM refs")}          # tags and branches
        for img, head, spec in con.execute(
                "SELECT image, head, spec FROM sandboxes WHERE state IN ('running', 'hibernated', 'ahead')"):
            # live sandboxes' images (and those started ahead); after a resume, the hibernation's commit is their lower
            keep.update(x for x in (img, head, json.loads(spec).get("base")) if x)
        # a ref's recent history stays reachable (rollback to where a branch was yesterday)
        for old, new in con.execute("SELECT old, new FROM reflog WHERE at > ?", (now - retention,)):
            keep.update(x for x in (old, new) if x)
        parents: dict[str, list[str]] = {}
        for p, c in con.execute("SELECT parent, child FROM edges"):
            parents.setdefault(c, []).append(p)
        todo = list(keep)
        while todo:
            for p in parents.get(todo.pop(), []):
                if p not in keep:
                    keep.add(p)
                    todo.append(p)
        keep &= set(images)
        doomed = [i for i in images if i not in keep]
        con.executemany("DELETE FROM images WHERE id=?", [(i,) for i in doomed])
        # build cache rows of removed images (a lookup skips them anyway: engine/builds/cache.py)
        con.execute("DELETE FROM build_cache_by WHERE image NOT IN (SELECT id FROM images)")
        # annotations of collected images (engine/images/annotations.py): the same content made again starts bare
        con.execute("DELETE FROM annotations_by WHERE image NOT IN (SELECT id FROM images)")
        # live states (engine/sandboxes/livestates.py) of removed images, and old ones: they hold a sandbox's
        # memory (their files: the engine's sweep_live_states; their objects: remote_gc)
        con.execute("DELETE FROM live_states WHERE image NOT IN (SELECT id FROM images) OR created < ?",
                    (now - LIVE_STATE_RETENTION,))
        ephemeral.forget(con)
        store.forget_images()
        trees, blobs = reachable(store, keep)
        for (files,) in con.execute("SELECT files FROM file_sets"):       # reusable uploaded sets
            blobs.update(f["sha256"] for f in json.loads(files))
        blobs |= tapes.kept(store, con, now, retention)       # egress tapes records name, and their bodies
        all_trees = [r[0] for r in con.execute("SELECT hash FROM trees")]
        dead_trees = [h for h in all_trees if h not in trees]
        con.executemany("DELETE FROM trees WHERE hash=?", [(h,) for h in dead_trees])
    used_layers = {layer for i in keep for layer in images[i][0]}
    removed_layers = 0
    for layer in store.layers.all():
        if layer not in used_layers:
            path = store.layers.path(layer)
            if now - os.lstat(path).st_ctime >= grace:
                if store.cache is not None:
                    store.cache.local(layer)     # an image's mount point: mounted, to evacuate from
                store.blobs.evacuate(f"layers/{layer}", blobs)
                store.layers.remove(layer)
                removed_layers += 1
    removed_objects = remote_gc(store, used_layers, blobs, now, grace, retention) if store.objects else 0
    removed_blobs = 0
    for b in list(store.blobs.files()):
        if b not in blobs:
            path = store.blobs.file_path(b)
            # an upload waits for its run as long as an untagged image would
            if now - os.lstat(path).st_ctime >= max(grace, retention):
                store.blobs.remove_file(b)
                removed_blobs += 1
    # temp files of transfers a killed process left (blob writes, S3 fetches, checkpoint packs)
    transfers = sum(remove_dead_transfers(d) for d in [*store.blobs.shards(), os.path.join(store.home, "sandboxes")])
    return {"removed_images": len(doomed), "removed_trees": len(dead_trees),
            "removed_layers": removed_layers, "removed_blobs": removed_blobs, "kept_images": len(keep),
            "removed_transfers": transfers,
            **({"removed_objects": removed_objects} if store.objects else {})}


def remote_gc(store: Store, used_layers: set[str], blobs: set[str], now: float, grace: float, retention: float) -> int:
    """S3 objects: layers no kept image names (and their layer_objects rows), blobs nothing
    reaches, checkpoints (checkpoints/<sandbox>.tar, store/checkpoints.py) of sandboxes not
    hibernated now (stopped, resumed, gone), live states (live/<image>.tar) no live_states row names
    (engine/sandboxes/livestates.py); each only once older than the grace (an upload in
    flight has no row yet). Layers of images another node is committing right now are younger
    than the grace too."""
    hibernated = {r[0] for r in store.db.query("SELECT id FROM sandboxes WHERE state='hibernated'")}
    live = {r[0] for r in store.db.query("SELECT image FROM live_states")}
    doomed = []
    for key, _size, modified in store.objects.keys():
        kind, _, name = key.partition("/")
        if now - modified < grace:
            continue
        if kind == "layers" and _layer_of(name) not in used_layers:
            doomed.append(key)
        elif kind == "blobs" and name not in blobs and now - modified >= max(grace, retention):
            doomed.append(key)
        elif kind == "checkpoints" and name.removesuffix(".tar") not in hibernated:
            doomed.append(key)
        elif kind == "live" and name.removesuffix(".tar") not in live:
            doomed.append(key)
    store.objects.delete(doomed)
    gone = sorted({_layer_of(k[len("layers/"):]) for k in doomed if k.startswith("layers/")})
    with store.db.tx() as con:
        con.executemany("DELETE FROM layer_objects WHERE layer=?", [(x,) for x in gone])
        rows = [r[0] for r in con.execute("SELECT layer FROM layer_objects WHERE created < ?", (now - grace,))]
        con.executemany("DELETE FROM layer_objects WHERE layer=?", [(x,) for x in rows if x not in used_layers])
    for layer in gone:                           # this node's cache marker (and image) of it
        store.cache.drop(layer)
        try:
            os.unlink(os.path.join(store.cache.dir, layer))
        except FileNotFoundError:
            pass
    return len(doomed)
