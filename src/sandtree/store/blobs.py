"""Blob storage: file contents named by their sha256, one file each under objects/blobs/ab/cdef...

A blob is written once and never modified. Where a layer file already holds the same bytes the
blob is a hard link to it (no copy); the layer may be removed later and the blob lives on.
Trees (the other object kind) live in the metadata database (store/db.py).
"""

from __future__ import annotations

import hashlib
import os
import tempfile

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
    def __init__(self, root: str):
        self.root = root
        os.makedirs(root, mode=0o700, exist_ok=True)

    def path(self, digest: str) -> str:
        return os.path.join(self.root, digest[:2], digest[2:])

    def has(self, digest: str) -> bool:
        return os.path.exists(self.path(digest))

    def adopt(self, src: str, digest: str) -> None:
        """Make `src` (a finished, never-again-written file) the blob `digest`, by hard link."""
        dst = self.path(digest)
        if os.path.exists(dst):
            return
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except FileExistsError:
            pass
        except OSError:          # another filesystem, or links not allowed: copy
            self.put_file(src, digest)

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

    def _write_atomic(self, digest: str, chunks) -> None:
        dst = self.path(digest)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                for c in chunks:
                    f.write(c)
            os.chmod(tmp, 0o444)
            os.rename(tmp, dst)
        except BaseException:
            os.unlink(tmp)
            raise

    def open(self, digest: str):
        return open(self.path(digest), "rb")

    def all(self):
        for d in os.listdir(self.root):
            sub = os.path.join(self.root, d)
            if len(d) != 2 or not os.path.isdir(sub):
                continue
            for name in os.listdir(sub):
                if not name.startswith(".tmp-"):
                    yield d + name

    def remove(self, digest: str) -> None:
        try:
            os.unlink(self.path(digest))
        except FileNotFoundError:
            pass
