"""Blob storage: file contents named by their sha256, each stored once.

A blob lives in one of two places: a file of its own under objects/blobs/ab/cdef... (uploads,
contents whose layer was collected), or, most often, the layer file that first held it, recorded
in the `blob_loc` table. Layers are immutable, so a layer file is as good a blob as any, and
committing 100 MB writes 100 MB once. Neither a hard link (the sandbox would see st_nlink grow)
nor a copy is made. When gc removes a layer, the contents still referenced move out to blob
files first (evacuate). Trees (the other object kind) live in the database (store/db.py).

With S3 objects (store/s3objects.py) a blob file of its own is uploaded as blobs/<sha256> when
written, and one missing here is fetched (its hash checked) when asked for; a blob in a layer
that is not cached on this node brings the layer in (ensure_layer, store/layercache.py).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile

from ..errors import NotRegularFile
from ..procid import owner_prefix
from . import durable
from .names import check_digest

CHUNK = 1 << 20


def hash_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


class BlobStore:
    def __init__(self, root: str, home: str, db):
        self.root = root
        self.home = home
        self.db = db
        self.remote = None                       # S3Objects, or None: this directory only
        self.ensure_layer = None                 # fetches a layer into the cache (S3 objects)
        os.makedirs(root, mode=0o700, exist_ok=True)

    def file_path(self, digest: str) -> str:
        # A digest from outside is joined into a path: only 64 hex digits may be (a bundle's
        # "//etc/shadow" made this /etc/shadow, and `cat` printed it).
        check_digest(digest)
        return os.path.join(self.root, digest[:2], digest[2:])

    def path(self, digest: str) -> str:
        """Where the bytes of `digest` are: its own file, else the layer file recorded for it."""
        own = self.file_path(digest)
        if os.path.exists(own):
            return own
        row = self.db.one("SELECT path FROM blob_loc WHERE hash=?", (digest,))
        if row and self.ensure_layer is not None and row[0].startswith("layers/"):
            self.ensure_layer(row[0].split("/")[1])      # (a cached layer: a few stats)
        if row:
            return os.path.join(self.home, row[0])
        if self.remote is not None and self.remote.exists(f"blobs/{digest}"):
            self.remote.fetch(f"blobs/{digest}", own, digest)     # StoreCorrupt if the bytes differ
            os.chmod(own, 0o444)
        return own

    def has(self, digest: str) -> bool:
        return os.path.exists(self.path(digest))

    @staticmethod
    def record(con, locations: dict[str, str]) -> None:
        """Inside the image's transaction: digest -> home-relative path of a published layer file."""
        con.executemany("INSERT OR IGNORE INTO blob_loc(hash, path) VALUES(?, ?)", locations.items())

    def evacuate(self, layer_rel: str, wanted: set[str]) -> int:
        """Before a layer goes: give every still-wanted content it holds a file of its own."""
        moved = 0
        rows = self.db.query("SELECT hash, path FROM blob_loc WHERE path >= ? AND path < ?",
                             (layer_rel + "/", layer_rel + "0"))
        linked: set[str] = set()
        for digest, rel in rows:
            if digest in wanted and not os.path.exists(self.file_path(digest)):
                dst = self.file_path(digest)
                self._shard(dst)
                try:
                    os.link(os.path.join(self.home, rel), dst)   # the layer is going: no one sees nlink
                    linked.add(os.path.dirname(dst))
                except OSError:
                    self.put_file(os.path.join(self.home, rel), digest)
                if self.remote is not None:
                    self.remote.put_file(f"blobs/{digest}", dst)
                moved += 1
        for d in linked:                         # the new names on the disk before the layer goes
            durable.sync_dir(d)
        with self.db.tx(durable=True) as con:
            con.execute("DELETE FROM blob_loc WHERE path >= ? AND path < ?", (layer_rel + "/", layer_rel + "0"))
        return moved

    def put_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.has(digest):
            self._write_atomic(digest, [data])
        return digest

    def put_file(self, src: str, digest: str) -> None:
        def chunks():
            with open(src, "rb", buffering=0) as f:
                while chunk := f.read(CHUNK):
                    yield chunk
        self._write_atomic(digest, chunks())

    def _shard(self, dst: str) -> None:
        """dst's shard directory, made (and its name synced) if it is new."""
        d = os.path.dirname(dst)
        if not os.path.isdir(d):
            os.makedirs(d, exist_ok=True)
            durable.sync_dir(self.root)

    def _write_atomic(self, digest: str, chunks) -> None:
        """The bytes on the disk, then their name: a blob told to a caller survives a power cut."""
        dst = self.file_path(digest)
        self._shard(dst)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=f".tmp-{owner_prefix()}")
        try:
            with os.fdopen(fd, "wb") as f:
                for c in chunks:
                    f.write(c)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o444)
            if self.remote is not None:
                self.remote.put_file(f"blobs/{digest}", tmp)    # in S3 before it exists here
            os.rename(tmp, dst)
            durable.sync_dir(os.path.dirname(dst))
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def open(self, digest: str):
        """The blob's bytes, opened without following a final symlink and only if it is a
        regular file (a FIFO or device would block or reach the host's device)."""
        fd = os.open(self.path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegularFile(f"blob {digest[:12]} is not stored as a regular file")
        except BaseException:
            os.close(fd)
            raise
        return os.fdopen(fd, "rb")

    def files(self):
        """Digests that have a file of their own."""
        for d in os.listdir(self.root):
            sub = os.path.join(self.root, d)
            if len(d) != 2 or not os.path.isdir(sub):
                continue
            for name in os.listdir(sub):
                if not name.startswith("."):          # temp files (layers.TRANSFER_PREFIXES)
                    yield d + name

    def shards(self) -> list[str]:
        """The directories blob files (and their temp files) are in."""
        return [os.path.join(self.root, d) for d in os.listdir(self.root) if len(d) == 2]

    def remove_file(self, digest: str) -> None:
        try:
            os.unlink(self.file_path(digest))
        except FileNotFoundError:
            pass
