"""The image store: one directory holding the database, blobs and layers.

    $SANDTREE_HOME/
      sandtree.db          trees, images, edges, operations, refs (store/db.py)
      objects/blobs/       file contents by sha256 (store/blobs.py)
      layers/              overlay lower dirs, one per commit (store/layers.py)
      erofs/               with S3 objects: fetched EROFS images, mounted at layers/<id> (store/erofs.py)
      tmp/                 staging for imports and commits; never holds a mount
      cache/               with S3 objects: one marker per cached layer (store/layercache.py)

With `objects` (s3://bucket/prefix) S3 holds the authoritative layers and blobs and this
directory is the node's cache of them: several store directories (nodes) on one metadata
database and one bucket are one store.

Names: an image is addressed by its full ID, a unique prefix of at least 6 hex digits, or a
tag. Tags are refs of kind "tag", written by store/refs.py (every move is in the reflog).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from .. import config
from ..defaults import LAYER_CACHE_MAX
from ..errors import ImageNotFound, InvalidInput, NotFound, StoreCorrupt
from . import durable, ephemeral, refs
from .blobs import BlobStore
from .db import check_url, dumps, open_database
from .layercache import LayerCache
from .layers import IdMap, LayerDirs
from .objecturl import parse_url
from .names import HEX_RE, TAG_RE, check_tag  # noqa: F401 - re-exported; the one rule is names.py
from .objects import EMPTY_TREE_DATA, EMPTY_TREE_HASH, Entry, decode_tree



def _open_objects(url: str | None):
    """S3Objects for an s3:// URL; None (this directory holds the objects) for None."""
    if not url:
        return None
    try:
        from .s3objects import S3Objects    # boto3: 220 ms, the `s3` extra; only stores with S3 objects pay
    except ImportError:
        raise InvalidInput("S3 objects need boto3: pip install 'sandtree[s3]'") from None
    return S3Objects(url)


@dataclass(frozen=True)
class ImageRow:
    id: str
    layers: list[str]
    links: dict[str, list[str]]
    created: float
    size: int
    files: int


class Store:
    def __init__(self, home: str, idmap: IdMap, database: str | None = None, objects: str | None = None,
                 cache_max: int | None = None, durability: str | None = None):
        """database: the metadata database's URL (postgresql://...; None: config.database_url(),
        whose default is SQLite in `home`). objects: s3://bucket/prefix (None:
        config.objects_url(), whose default is this directory alone); cache_max: the layer
        cache's cap in bytes (None: config.layer_cache_max(), else defaults.LAYER_CACHE_MAX).
        durability: "strict" or "relaxed" (store/durable.py; None: config.durability(), else
        defaults.DURABILITY)."""
        self.home = os.path.abspath(home)
        url = database if database is not None else config.database_url()
        objects_url = objects if objects is not None else config.objects_url()
        self.durability = durable.check_mode(durability if durability is not None else config.durability())
        if objects_url:
            parse_url(objects_url)               # a bad URL changes nothing
        if check_url(url) == "sqlite":           # a bad URL or an unreachable server makes no home
            os.makedirs(self.home, mode=0o700, exist_ok=True)
        self.idmap = idmap
        self.database_url = url                  # (a cluster's nodes open the same database)
        self.db = open_database(self.home, url, self.durability)
        self.objects = _open_objects(objects_url)
        os.makedirs(self.home, mode=0o700, exist_ok=True)
        self.blobs = BlobStore(os.path.join(self.home, "objects", "blobs"), self.home, self.db)
        self.layers = LayerDirs(os.path.join(self.home, "layers"), os.path.join(self.home, "tmp"))
        self.cache = None
        if self.objects is not None:
            cap = cache_max if cache_max is not None else (config.layer_cache_max() or LAYER_CACHE_MAX)
            self.cache = LayerCache(self, self.objects, cap)
            self.layers.upload = self.cache.upload
            self.layers.drop = self.cache.drop
            self.blobs.remote = self.objects
            self.blobs.ensure_layer = self._ensure_layer
        self._trees: OrderedDict[str, dict[str, Entry]] = OrderedDict()
        self._images: dict[str, ImageRow] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        self.layers.clean_stale()

    def _ensure_layer(self, layer: str) -> None:
        if not self.cache.present(layer):
            self.cache.ensure([layer], self._pins())

    def close(self) -> None:
        """With S3 objects, first unmounts the layers' EROFS images nothing uses (layercache.py)."""
        if self.cache is not None:
            self.cache.release_mounts()
        self.db.close()

    # gc and the operations that use existing images exclude each other in every process using
    # the store's database, on any machine: a run holds the database's fence shared (db.py /
    # pgdb.py fence: a flock beside a SQLite file, an advisory lock on PostgreSQL; either dies
    # with its process), gc holds it exclusive. Before, the lock was a file in the store
    # directory, so a gc on one node could delete the layers a run on another was building on.
    class _Using:
        def __init__(self, fence, local=None):
            self.fence, self.local = fence, local

        def __enter__(self):
            self.fence.__enter__()
            if self.local is not None:           # layer pins taken while this is held (ensure_layers)
                self.local.__dict__.setdefault("stack", []).append([])
            return self

        def __exit__(self, *exc):
            try:
                if self.local is not None:
                    for fd in self.local.stack.pop():
                        os.close(fd)             # unpins the layers this operation used
            finally:
                self.fence.__exit__(*exc)        # releases the lock
            return False

    def using(self):
        """Held while an operation reads or builds on existing images (runs, imports, merges).
        With S3 objects, the layers it ensures stay pinned in the cache until it ends."""
        return self._Using(self.db.fence(shared=True), self._local)

    def _pins(self) -> list | None:
        stack = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    def ensure_layers(self, layers: list[str]) -> None:
        """Before a mount: every layer local (fetched from S3 on first use, hash-checked) and
        pinned for the enclosing using(). A store without S3 objects has them all already, or
        is damaged: StoreCorrupt names the missing layer and where it was looked for."""
        if self.cache is not None:
            self.cache.ensure(layers, self._pins())
            return
        for layer in layers:
            path = self.layers.path(layer)
            if not os.path.isdir(path):
                # (nodes sharing a PostgreSQL database but each with layers of its own: the mount
                # failed with a bare "No such file or directory" that named nothing)
                shared = check_url(self.database_url) == "postgresql"
                raise StoreCorrupt(
                    f"layer {layer} is missing from the store: the {'shared PostgreSQL ' if shared else ''}"
                    f"database names it, but {path} does not exist"
                    + ("; nodes sharing a database must share their objects too (--objects s3://...)"
                       if shared else "; `sandtree fsck` lists what else is missing"),
                    layer=layer, path=path, store=self.home)

    def collecting(self):
        """Held by gc: waits for every operation using images to finish, and holds new ones."""
        return self._Using(self.db.fence(shared=False))

    # ---- trees -------------------------------------------------------------------------------
    def tree(self, digest: str) -> dict[str, Entry]:
        with self._lock:
            t = self._trees.get(digest)
            if t is not None:
                self._trees.move_to_end(digest)
                return t
        data = EMPTY_TREE_DATA if digest == EMPTY_TREE_HASH else self.db.tree_data(digest)
        if data is None:
            raise NotFound(f"tree {digest[:12]} is missing from the store")
        t = decode_tree(data)
        with self._lock:
            self._trees[digest] = t
            if len(self._trees) > 4096:
                self._trees.popitem(last=False)
        return t

    # ---- images ------------------------------------------------------------------------------
    def image(self, image_id: str) -> ImageRow:
        cached = self._images.get(image_id)       # image rows never change once written
        if cached is not None:
            return cached
        row = self.db.one("SELECT id, layers, links, created, size, files FROM images WHERE id=?",
                          (image_id,))
        if row is None:
            raise ImageNotFound(f"no image {image_id!r}", image=image_id)
        img = ImageRow(row[0], json.loads(row[1]), json.loads(row[2]), row[3], row[4], row[5])
        with self._lock:
            if len(self._images) > 4096:
                self._images.clear()
            self._images[image_id] = img
        return img

    def forget_images(self) -> None:
        """Drop cached image rows (after rows were deleted: image rm, gc)."""
        with self._lock:
            self._images.clear()

    def has_image(self, image_id: str) -> bool:
        return self.db.one("SELECT 1 FROM images WHERE id=?", (image_id,)) is not None

    def resolve(self, ref: str) -> str:
        """Image ID for an ID, unique ID prefix, `tag:NAME` or tag name."""
        if not isinstance(ref, str) or not ref:
            raise InvalidInput("an image reference must be a non-empty string")
        if len(ref) == 64 and HEX_RE.match(ref) and self.has_image(ref):
            return ref                           # a full ID is never a tag name (see tag())
        name = ref[4:] if ref.startswith("tag:") else ref
        row = self.db.one("SELECT image FROM refs WHERE kind='tag' AND name=?", (name,))
        if row:
            return row[0]
        if HEX_RE.match(ref):
            rows = self.db.query("SELECT id FROM images WHERE id >= ? AND id < ? LIMIT 2",
                                 (ref, ref + "g"))
            if len(rows) == 1:
                return rows[0][0]
            if len(rows) > 1:
                raise InvalidInput(f"image prefix {ref!r} is ambiguous")
        raise ImageNotFound(f"no image or tag {ref!r}", image=ref)

    def images(self) -> list[dict]:
        tags: dict[str, list[str]] = {}
        for name, image in self.db.query("SELECT name, image FROM refs WHERE kind='tag'"):
            tags.setdefault(image, []).append(name)
        return [{"id": r[0], "created": r[1], "size": r[2], "files": r[3], "tags": sorted(tags.get(r[0], []))}
                for r in self.db.query("SELECT id, created, size, files FROM images "
                                       f"WHERE id NOT IN ({ephemeral.UNLISTED}) ORDER BY created")]

    @staticmethod
    def insert_image(con, image_id: str, layers: list[str], links: dict, size: int, files: int) -> bool:
        cur = con.execute("INSERT OR IGNORE INTO images(id, layers, links, created, size, files) "
                          "VALUES(?,?,?,?,?,?)",
                          (image_id, json.dumps(layers), dumps(links), time.time(), size, files))
        return cur.rowcount == 1

    # ---- tags --------------------------------------------------------------------------------
    def tag(self, image_id: str, name: str) -> None:
        refs.tag(self, image_id, name)

    def untag(self, name: str) -> str:
        return refs.untag(self, name)

    def tags(self, image_id: str | None = None) -> dict[str, str]:
        if image_id:
            rows = self.db.query("SELECT name, image FROM refs WHERE kind='tag' AND image=?", (image_id,))
        else:
            rows = self.db.query("SELECT name, image FROM refs WHERE kind='tag'")
        return dict(sorted(rows))

    def tag_history(self, name: str) -> list[dict]:
        return [{"old": o, "new": n, "at": a, "reason": r} for o, n, a, r in self.db.query(
            "SELECT old, new, at, reason FROM reflog WHERE kind='tag' AND name=? ORDER BY seq", (name,))]
