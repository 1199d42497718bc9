"""Uploads and file sets (a mixin of engine.Engine): bytes stored once by sha256, which runs
inject by reference; a file set is a named list of them. Storage is store/blobs.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time

from ...errors import InvalidInput, NotFound
from ...store.blobs import hash_file
from ...store.db import dumps
from ...values import newest_page


class UploadOps:
    """Mixed into engine.Engine, which provides store and specs."""

    def upload(self, data: bytes) -> str:
        """Store bytes once; runs reference them by sha256 (files=[{"path", "sha256"}])."""
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidInput("upload takes bytes")
        return self.store.blobs.put_bytes(bytes(data))

    def upload_file(self, path: str, digest: str | None = None) -> str:
        """Store a file's bytes once (copied; the file stays the caller's). digest: its sha256,
        if the caller computed it while writing the file."""
        if digest is None:
            digest, _ = hash_file(path)
        if not self.store.blobs.has(digest):
            self.store.blobs.put_file(path, digest)
        return digest

    def download(self, digest: str) -> bytes:
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or not self.store.blobs.has(digest):
            raise NotFound(f"no uploaded file {digest!r}")
        with self.store.blobs.open(digest) as f:
            return f.read()

    def upload_info(self, digest: str) -> dict:
        """Size and time of stored content (NotFound if absent), without reading it."""
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or not self.store.blobs.has(digest):
            raise NotFound(f"no uploaded file {digest!r}")
        st = os.stat(self.store.blobs.path(digest))
        return {"sha256": digest, "size": st.st_size, "created": st.st_mtime}

    def uploads(self, *, limit: int = 100, offset: int = 0) -> list[dict]:
        """Stored file contents runs may name by sha256 (uploads, and content gc kept as files),
        newest first."""
        return newest_page([self.upload_info(d) for d in self.store.blobs.files()], limit, offset)

    def find_upload(self, prefix: str) -> str:
        """The sha256 of stored content by a unique prefix of at least 32 hex digits (Contree
        clients name uploads by a UUID, which holds only 128 of the digest's 256 bits)."""
        if not isinstance(prefix, str) or not re.fullmatch(r"[0-9a-f]{32,64}", prefix):
            raise InvalidInput(f"an upload prefix is 32 to 64 hex digits, not {prefix!r}")
        sub = os.path.join(self.store.blobs.root, prefix[:2])
        found = {prefix[:2] + n for n in (os.listdir(sub) if os.path.isdir(sub) else ()) if n.startswith(prefix[2:])}
        found.update(r[0] for r in self.store.db.query("SELECT hash FROM blob_loc WHERE hash >= ? AND hash < ? LIMIT 2",
                                                       (prefix, prefix + "g")))
        found = {d for d in found if self.store.blobs.has(d)}
        if not found:
            raise NotFound(f"no uploaded file {prefix!r}")
        if len(found) > 1:
            raise InvalidInput(f"upload prefix {prefix!r} is ambiguous")
        return found.pop()

    def _upload_path(self, digest: str) -> str:
        """Where an upload's bytes are (NotFound if absent): runs copy them from there."""
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or not self.store.blobs.has(digest):
            raise NotFound(f"no uploaded file {digest!r}")
        return self.store.blobs.path(digest)

    def file_set_create(self, files: list[dict]) -> str:
        """A named, reusable set of files to inject ({"path", "sha256", "mode"}); its ID is the
        hash of its content, so syncing the same tree twice gives the same set."""
        entries = []
        for f in files:
            inj = self.specs.file(f)                  # validates, and that every sha256 exists
            entries.append({"path": inj.path, "sha256": f.get("sha256") or self.upload(inj.content),
                            "mode": inj.mode, "uid": inj.uid, "gid": inj.gid})
        entries.sort(key=lambda e: e["path"])
        data = dumps(entries)
        set_id = hashlib.sha256(data.encode()).hexdigest()
        with self.store.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO file_sets(id, files, created) VALUES(?,?,?)", (set_id, data, time.time()))
        return set_id

    def file_set(self, set_id: str) -> list[dict]:
        row = self.store.db.one("SELECT files FROM file_sets WHERE id=?", (set_id,))
        if row is None:
            raise NotFound(f"no file set {set_id!r}")
        return json.loads(row[0])

