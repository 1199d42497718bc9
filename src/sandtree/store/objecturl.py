"""The objects URL of a store (`--objects s3://bucket/prefix`), checked without loading the S3
client: a bad URL is InvalidInput before anything is made, and boto3 (220 ms to import) is loaded
only by a store that has S3 objects (store/s3objects.py)."""

from __future__ import annotations

import re
from urllib.parse import urlparse

from ..errors import InvalidInput

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_PREFIX = re.compile(r"^[A-Za-z0-9._/-]{0,200}$")


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix with a trailing '/' or empty) of s3://bucket/prefix."""
    u = urlparse(url) if isinstance(url, str) else None
    if u is None or u.scheme != "s3" or not _BUCKET.match(u.netloc or "") or u.query or u.fragment:
        raise InvalidInput(f"objects URL must be s3://bucket[/prefix], not {url!r}")
    prefix = u.path.strip("/")
    if not _PREFIX.match(prefix) or ".." in prefix.split("/") or "//" in prefix:
        raise InvalidInput(f"bad prefix in objects URL {url!r}")
    return u.netloc, prefix + "/" if prefix else ""

