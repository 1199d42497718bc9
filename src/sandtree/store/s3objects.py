"""Objects in S3-compatible storage (`--objects s3://bucket/prefix`, issue 20): the authoritative
copy of a store's layers (one packed object each, store/layerpack.py), blobs that have a file of
their own, and checkpoints of hibernated sandboxes. The store directory then is a cache of them
(store/layercache.py). Keys under the prefix:

    layers/<layer>.tar        a layer, its sha256 and size in the `layer_objects` table
    blobs/<sha256>            a blob by its content hash
    checkpoints/<sandbox>     a hibernated sandbox's checkpoint file

Nothing read back is trusted: every download is hashed while it streams and compared with the
digest the metadata database recorded before the bytes are used (StoreCorrupt otherwise, and the
partial file is removed). Endpoint and credentials: config.s3_endpoint() and boto3's own chain
(AWS_* variables, ~/.aws/config and credentials, AWS_PROFILE)."""

from __future__ import annotations

import hashlib
import os
import tempfile

import boto3                                    # the `s3` extra; this module is loaded only for S3 objects
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import config
from ..errors import StoreCorrupt, StoreUnavailable, TooLarge
from .objecturl import parse_url

CHUNK = 1 << 20
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
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".fetch-")
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

