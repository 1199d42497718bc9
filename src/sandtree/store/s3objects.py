"""Objects in S3-compatible storage (`--objects s3://bucket/prefix`): the authoritative
copy of a store's layers (one packed object each, store/layerpack.py), blobs that have a file of
their own, and checkpoints of hibernated sandboxes. The store directory then is a cache of them
(store/layercache.py). Keys under the prefix:

    layers/<layer>.tar        a layer, its sha256 and size in the `layer_objects` table
    blobs/<sha256>            a blob by its content hash
    checkpoints/<sandbox>.tar a hibernated sandbox's checkpoint directory (store/checkpoints.py),
                              its sha256 and size in the sandbox's row

Nothing read back is trusted: every download is hashed while it streams and compared with the
digest the metadata database recorded before the bytes are used (StoreCorrupt otherwise, and the
partial file is removed). Endpoint and credentials: config.s3_endpoint() and boto3's own chain
(AWS_* variables, ~/.aws/config and credentials, AWS_PROFILE)."""

from __future__ import annotations

import hashlib
import os
import queue
import tempfile
import threading

import boto3                                    # the `s3` extra; this module is loaded only for S3 objects
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import config
from ..errors import StoreCorrupt, StoreUnavailable, TooLarge
from ..procid import owner_prefix
from .objecturl import parse_url

CHUNK = 1 << 20
PREFETCH = 32                 # chunks a stream reads ahead of its consumer (32 MiB)


class S3Objects:
    """One bucket/prefix. Keys given to it are relative to the prefix."""

    def __init__(self, url: str, endpoint: str | None = None):
        self.url = url
        self.bucket, self.prefix = parse_url(url)
        self._errors = (BotoCoreError, ClientError)
        self.client = boto3.client("s3", endpoint_url=endpoint or config.s3_endpoint(),
                                   config=Config(retries={"max_attempts": 4, "mode": "standard"},
                                                 connect_timeout=5, read_timeout=60))
        self.transfer = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=16 << 20,
                                       max_concurrency=4)
        self._call(self.client.head_bucket, Bucket=self.bucket)     # unreachable/denied: fail at open

    def _call(self, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except self._errors as exc:
            raise StoreUnavailable(f"object storage {self.url}: {exc}") from None

    def put_file(self, key: str, path: str) -> None:
        """Upload a local file; returns once the object is complete (S3 makes it visible whole)."""
        self._call(self.client.upload_file, path, self.bucket, self.prefix + key, Config=self.transfer)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(self.client.put_object, Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def fetch(self, key: str, dest: str, digest: str, size: int | None = None, limit: int | None = None) -> None:
        """Download `key` to `dest` (created 0600, atomically renamed in) only if its sha256 is
        `digest` (and its size `size`); else StoreCorrupt and nothing is left behind."""
        d = os.path.dirname(dest)
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=f".fetch-{owner_prefix()}")   # (a killed one: gc)
        try:
            resp = self._call(self.client.get_object, Bucket=self.bucket, Key=self.prefix + key)
            body = resp["Body"]
            h = hashlib.sha256()
            got = 0
            cap = size if size is not None else limit
            with os.fdopen(fd, "wb") as f:
                fd = -1
                while chunk := self._call(body.read, CHUNK):
                    got += len(chunk)
                    if cap is not None and got > cap:
                        raise (StoreCorrupt if size is not None else TooLarge)(
                            f"object {key} is larger than recorded ({cap} bytes)", key=key)
                    h.update(chunk)
                    f.write(chunk)
            if h.hexdigest() != digest or (size is not None and got != size):
                raise StoreCorrupt(f"object {key} does not match its recorded sha256 (refused)",
                                   key=key, expected=digest, got=h.hexdigest())
            os.rename(tmp, dest)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise

    def stream(self, key: str, digest: str, size: int) -> "VerifiedStream":
        """`key` as a binary file object read while it downloads (a thread reads ahead); its bytes
        are NOT trusted until finish() has read to the end and compared sha256 and size with the
        recorded ones (StoreCorrupt otherwise): whatever was made from them must stay unused
        until then. close() always."""
        resp = self._call(self.client.get_object, Bucket=self.bucket, Key=self.prefix + key)
        return VerifiedStream(resp["Body"], key, digest, size, self._errors, self.url)

    def copy(self, src: str, dst: str) -> None:
        """Object `src` copied to `dst` in the bucket (server-side: nothing is downloaded)."""
        self._call(self.client.copy, {"Bucket": self.bucket, "Key": self.prefix + src}, self.bucket,
                   self.prefix + dst, Config=self.transfer)

    def exists(self, key: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return True
        except self._errors as exc:
            if _status(exc) == 404:
                return False
            raise StoreUnavailable(f"object storage {self.url}: {exc}") from None

    def keys(self, sub: str = ""):
        """(key relative to the prefix, size, last-modified epoch) of every object under sub."""
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + sub)
        try:
            for page in pages:
                for o in page.get("Contents", []):
                    yield o["Key"][len(self.prefix):], o["Size"], o["LastModified"].timestamp()
        except self._errors as exc:
            raise StoreUnavailable(f"object storage {self.url}: {exc}") from None

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            self._call(self.client.delete_objects, Bucket=self.bucket,
                       Delete={"Objects": [{"Key": self.prefix + k} for k in keys[i:i + 1000]], "Quiet": True})


def _status(exc) -> int | None:
    return getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")


class VerifiedStream:
    """A download as a file object: a reader thread pulls CHUNKs into a bounded queue (the network
    overlaps the consumer's work), read(n) hashes what it hands out, and more bytes than `size`
    are refused at once."""

    def __init__(self, body, key: str, digest: str, size: int, errors, url: str):
        self.body, self.key, self.digest, self.size = body, key, digest, size
        self.h = hashlib.sha256()
        self.got = 0
        self._buf = memoryview(b"")
        self._q: queue.Queue = queue.Queue(PREFETCH)
        self._stop = threading.Event()
        self._errors, self._url = errors, url
        self._thread = threading.Thread(target=self._pull, name="sandtree-s3-stream", daemon=True)
        self._thread.start()

    def _pull(self) -> None:
        try:
            while not self._stop.is_set():
                chunk = self.body.read(CHUNK)
                self._q.put(chunk)
                if not chunk:
                    return
        except BaseException as exc:     # handed to the reader, raised there
            self._q.put(exc)

    def _next(self) -> bytes:
        item = self._q.get()
        if isinstance(item, BaseException):
            if isinstance(item, self._errors):
                raise StoreUnavailable(f"object storage {self._url}: {item}") from None
            raise item
        self.got += len(item)
        if self.got > self.size:
            raise StoreCorrupt(f"object {self.key} is larger than recorded ({self.size} bytes)", key=self.key)
        self.h.update(item)
        return item

    def read(self, n: int = -1) -> bytes:
        out = []
        want = n if n is not None and n >= 0 else float("inf")
        while want > 0:
            if not self._buf:
                chunk = self._next()
                if not chunk:
                    self._q.put(b"")             # EOF stays EOF
                    break
                self._buf = memoryview(chunk)
            take = self._buf[:want] if want != float("inf") else self._buf
            out.append(bytes(take))
            self._buf = self._buf[len(take):]
            want -= len(take)
        return b"".join(out)

    def finish(self) -> None:
        """Read what the consumer left (a tar's end padding) and check the whole object."""
        while self.read(CHUNK):
            pass
        if self.h.hexdigest() != self.digest or self.got != self.size:
            raise StoreCorrupt(f"object {self.key} does not match its recorded sha256 (refused)",
                               key=self.key, expected=self.digest, got=self.h.hexdigest())

    def close(self) -> None:
        self._stop.set()
        try:
            self.body.close()                # a reader blocked on the socket returns
        except Exception:                    # noqa: BLE001 - closing is all that is left to do
            pass
        for _ in range(200):                 # and one blocked on a full queue gets room (10 s at most)
            if not self._thread.is_alive():
                break
            try:
                self._q.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(0.05)
