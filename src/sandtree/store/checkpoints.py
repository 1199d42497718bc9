"""Checkpoints of hibernated sandboxes in S3 objects: a hibernated sandbox
resumes on any node, not only on the one whose home holds its checkpoint directory.

A checkpoint directory (CRIU images for the namespaces tier, runsc's checkpoint files for the
gVisor tier: both in <home>/sandboxes/<id>.ckpt) is packed as layers are (store/layerpack.py: a
PAX tar with exact owners, modes, times and xattrs) and uploaded whole as
`checkpoints/<sandbox id>.tar`; publish() returns its sha256 and size, which the caller writes
into the sandbox's row in the same transaction that says `hibernated`, so an upload cut off
halfway is never resumable. fetch() is layercache's fetch for one directory: the object is
unpacked while it downloads into a staging dir beside the destination (layerpack's checks on every
name, path, type and size: a checkpoint read back from S3 is from outside), and renamed into place
only once the whole object's sha256 and size matched the row (StoreCorrupt otherwise, nothing
left behind). A sidecar `<id>.ckpt.sha256` says which upload a local directory is, so a stale
directory (a node that resumed it, then another node hibernated it again) is never restored.

A live state (engine/sandboxes/livestates.py: the checkpoint of a live fork or of a hibernation,
kept with its image) is the same, as `live/<image>.tar` (live_key): publish and fetch take its key."""

from __future__ import annotations

import os
import secrets

from ..errors import StoreCorrupt
from ..procid import owner_prefix
from . import layerpack
from .layers import remove_tree


def checkpoint_key(sid: str) -> str:
    return f"checkpoints/{sid}.tar"


def live_key(image: str) -> str:
    return f"live/{image}.tar"


def _sidecar(directory: str) -> str:
    return directory.rstrip("/") + ".sha256"


def publish(store, sid: str, directory: str, key: str | None = None) -> dict:
    """Pack `directory` and upload it as sandbox `sid`'s checkpoint (or as `key`); returns
    {"sha256", "size"} (for its row). Returns once the object is complete in S3."""
    tmp = os.path.join(os.path.dirname(directory), f".pack-{owner_prefix()}{sid}-{secrets.token_hex(6)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)   # memory: root only
        with os.fdopen(fd, "wb") as f:
            w = layerpack.HashingWriter(f)
            layerpack.pack(directory, w, store.idmap)
        store.objects.put_file(key or checkpoint_key(sid), tmp)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    record = {"sha256": w.h.hexdigest(), "size": w.size}
    _write_sidecar(directory, record["sha256"])
    return record


def _write_sidecar(directory: str, digest: str) -> None:
    with open(_sidecar(directory), "w") as f:
        f.write(digest)


def is_local(directory: str, record: dict) -> bool:
    """Whether `directory` holds the checkpoint `record` names (uploaded or fetched here)."""
    digest = record.get("sha256") if isinstance(record, dict) else None
    try:
        with open(_sidecar(directory)) as f:
            return bool(digest) and os.path.isdir(directory) and f.read().strip() == digest
    except OSError:
        return False


def fetch(store, sid: str, record: dict, directory: str, key: str | None = None) -> bool:
    """Make `directory` sandbox `sid`'s checkpoint of `record` ({"sha256", "size"}): nothing to do
    (False) when it already is; else (True) fetched, verified and renamed into place, replacing a
    stale one. StoreCorrupt (BadArchive inside) when the object is not the recorded one.
    key: the object's, if not sandbox `sid`'s checkpoint (a live state's: live_key)."""
    digest, size = (record.get("sha256"), record.get("size")) if isinstance(record, dict) else (None, None)
    if not isinstance(digest, str) or not isinstance(size, int) or size < 0:
        raise StoreCorrupt(f"sandbox {sid}'s checkpoint record is damaged", sandbox=sid)
    if is_local(directory, record):
        return False
    staged = os.path.join(os.path.dirname(directory), f".fetch-{owner_prefix()}{sid}-{secrets.token_hex(6)}")
    os.mkdir(staged, 0o700)
    try:
        layerpack.unpack_verified(store.objects.stream(key or checkpoint_key(sid), digest, size), staged, store.idmap, size)
        remove(directory)                        # a stale one (another upload): files only
        os.rename(staged, directory)
        _write_sidecar(directory, digest)
    except BaseException:
        remove_tree(staged)
        raise
    return True


def keep(store, sid: str, record: dict, directory: str, key: str) -> None:
    """Sandbox `sid`'s uploaded checkpoint `record` copied to `key` in S3 (server-side), the local
    `directory` (if any) marked as that copy: a resumed sandbox's checkpoint kept as a live state."""
    store.objects.copy(checkpoint_key(sid), key)
    if os.path.isdir(directory):
        _write_sidecar(directory, record["sha256"])


def remove(directory: str) -> None:
    """The local checkpoint directory and its sidecar (files only: remove_tree refuses mounts)."""
    try:
        os.unlink(_sidecar(directory))
    except FileNotFoundError:
        pass
    remove_tree(directory)


def delete(store, sid: str) -> None:
    """Sandbox `sid`'s checkpoint object (S3 ignores a key that is not there)."""
    store.objects.delete([checkpoint_key(sid)])
