"""A node's local layer cache when the store's objects are in S3.

The kernel mounts layers as overlay lower dirs, so they must be local: layers/<id>/ stays what
it was, but is now a cache of the authoritative copies in S3 (store/s3objects.py). Publishing a
layer packs and uploads it (complete) and records its sha256 and size in `layer_objects` before
the image row that names it can be written, so an upload cut off halfway is never an image.
ensure() fetches what a run needs on first use: downloaded to tmp/, its sha256 checked against
the row, unpacked with layerpack's checks into a staging dir, renamed in.

A layer with many files (erofs.worth) is also uploaded as an EROFS image
(layers/<id>.erofs, store/erofs.py; its sha256 and size in the same row): a node that can mount
it (root, file-backed EROFS, the packer's id map) downloads it to erofs/<id>.img, and mounts it
at layers/<id> once its sha256 and size matched, with no file created: one GET and a mount.
Such a layer is present when its dir is a mount; an image whose mount is gone (a restart, a
release) is mounted again on its next use, hashed again first unless unchanged in this boot.

Bookkeeping survives restarts and lives beside the layers: cache/<layer> is a marker per cached
layer, its content the layer's size in bytes, its mtime the last use (LRU). A layer in use is
pinned: a shared flock on its marker, held by the operation (Store.using) that ensured it.
evict() brings the cached bytes under the cap, oldest use first, and skips a layer that is
pinned (its exclusive flock fails), mounted by any sandbox (an overlay in any process's
mountinfo names it), or the lower of a live sandbox (the sandboxes table), or has no S3 copy."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import StoreCorrupt
from ..procid import owner_prefix
from . import durable, erofs, layerpack
from .blobs import hash_file
from .erofsdir import ImageDir
from .layers import remove_tree

log = logging.getLogger("sandtree.store")
FETCHES = 4                   # layers of one image fetched at once


def layer_key(layer: str) -> str:
    return f"layers/{layer}.tar"


def image_key(layer: str) -> str:
    return f"layers/{layer}.erofs"


class LayerCache:
    def __init__(self, store, objects, cap: int):
        self.store, self.objects, self.cap = store, objects, cap
        self.dir = os.path.join(store.home, "cache")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.images = ImageDir(os.path.join(store.home, "erofs"), store.layers)   # mounted at layers/<id>
        self.build_images = erofs.can_build() and not store.idmap.rootless
        self.mount_images = erofs.can_mount(store.idmap.rootless)
        self.idmap_text = layerpack.idmap_text(store.idmap)
        self.fetched = 0                         # layers this process downloaded (tests, bench)
        self._count = threading.Lock()
        self.timings: dict[str, float] = {}      # seconds spent per fetch phase (bench/coldstart.py)

    # ---- publish --------------------------------------------------------------------------
    def upload(self, staged: str, layer: str) -> None:
        """Pack and upload a staged layer as `layer`, then record its object: all before the
        layer is renamed in and before any image row names it."""
        tmp = os.path.join(self.store.layers.tmp, f"pack-{owner_prefix()}{secrets.token_hex(6)}")
        try:
            with open(tmp, "wb") as f:
                w = layerpack.HashingWriter(f)
                layerpack.pack(staged, w, self.store.idmap)
            self.objects.put_file(layer_key(layer), tmp)
        finally:
            os.unlink(tmp)
        files, size = _dir_stats(staged)
        image = self._upload_image(staged, layer) if self.build_images and erofs.worth(files) else None
        with self.store.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO layer_objects(layer, sha256, size, created, erofs_sha256, erofs_size, "
                        "erofs_idmap) VALUES(?,?,?,?,?,?,?)",
                        (layer, w.h.hexdigest(), w.size, time.time(), *(image or (None, None)),
                         self.idmap_text if image else None))
        self._mark(layer, size)

    def _upload_image(self, staged: str, layer: str) -> tuple[str, int] | None:
        """Build and upload the layer's EROFS image: (sha256, size), or None (the tar alone: an
        optimisation that failed is logged, never the publish's failure)."""
        tmp = os.path.join(self.store.layers.tmp, f"erofs-{owner_prefix()}{secrets.token_hex(6)}")
        try:
            t0 = time.perf_counter()
            erofs.build(staged, tmp)
            self._took("mkfs.erofs", time.perf_counter() - t0)
            digest = hash_file(tmp)
            self.objects.put_file(image_key(layer), tmp)
            return digest
        except OSError as exc:
            log.warning("layer %s: no EROFS image (%s); its tar alone", layer, exc)
            return None
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass

    # ---- use --------------------------------------------------------------------------------
    def ensure(self, layers, pins: list | None = None) -> None:
        """Every layer local, each pinned (into `pins`, released by their holder) before it is
        checked, so no eviction can take it between the check and the mount."""
        held = []
        try:
            missing = []
            for layer in layers:
                fd = self._pin(layer)
                (pins if pins is not None else held).append(fd)
                if not self.local(layer):
                    missing.append(layer)
                os.utime(fd)                     # last use, for LRU
            if len(missing) == 1:
                self._fetch(missing[0])
            elif missing:                        # several layers download and unpack at once
                with ThreadPoolExecutor(min(FETCHES, len(missing)), thread_name_prefix="sandtree-fetch") as pool:
                    for fut in [pool.submit(self._fetch, layer) for layer in missing]:
                        fut.result()
            if missing:
                self.evict()                     # while ours are pinned: never them
        finally:
            for fd in held:                      # no operation holds them: the caller reads now
                os.close(fd)

    def _pin(self, layer: str) -> int:
        fd = os.open(os.path.join(self.dir, layer), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        return fd

    def present(self, layer: str) -> bool:
        """Whether layers/<layer> holds the layer (its mount point alone is never an empty layer)."""
        return self.images.present(layer)

    def local(self, layer: str) -> bool:
        """present(), after mounting again a cached image whose mount is gone (checked again
        first: only an image matching its row is ever mounted)."""
        if self.images.present(layer):
            return True
        if not self.images.has(layer):
            return False
        row = self.store.db.one("SELECT erofs_sha256, erofs_size FROM layer_objects WHERE layer=?", (layer,))
        if row is None or row[0] is None or not self.mount_images or not self.images.verified(layer, *row):
            log.warning("layer %s: cached EROFS image not mounted again (changed, or not mountable here)", layer)
            self.images.unmount(layer, keep_image=False)      # fetched again
            return False
        self.images.mount(layer)
        return True

    def _fetch(self, layer: str) -> None:
        row = self.store.db.one("SELECT sha256, size, erofs_sha256, erofs_size, erofs_idmap FROM layer_objects "
                                "WHERE layer=?", (layer,))
        if row is None:
            raise StoreCorrupt(f"layer {layer} is neither cached here nor recorded in object storage", layer=layer)
        digest, size, image_digest, image_size, image_idmap = row
        if image_digest is not None and self.mount_images and image_idmap == self.idmap_text:
            try:
                return self._fetch_image(layer, image_digest, image_size)
            except _MountRefused as exc:         # the kernel would not mount a verified image
                log.warning("layer %s: cannot mount its EROFS image (%s); tars from now on", layer, exc)
                self.mount_images = False
                self.images.unmount(layer, keep_image=False)
        staged = self.store.layers.stage("fetch")
        try:
            # Unpacked while it downloads (no tar on disk: half the bytes written), into a staging
            # dir nothing uses until the whole object's sha256 and size matched the row.
            t0 = time.perf_counter()
            total = layerpack.unpack_verified(self.objects.stream(layer_key(layer), digest, size), staged,
                                              self.store.idmap, size)
            self._took("download+unpack", time.perf_counter() - t0)
            # on the disk before its name is: after a power cut a cached layer is whole or absent
            # (fetched again), never zeros a run would read (store/durable.py)
            durable.sync_tree(staged)
            try:
                os.rename(staged, self.store.layers.path(layer))
                durable.sync_dir(self.store.layers.root)
            except OSError:
                if not os.path.isdir(self.store.layers.path(layer)):
                    raise                        # else another process fetched it first: ours goes
                remove_tree(staged)
            with self._count:
                self.fetched += 1
            self._mark(layer, total)
        except BaseException:
            remove_tree(staged)
            raise

    def _fetch_image(self, layer: str, digest: str, size: int) -> None:
        """Download the layer's image (checked before it is renamed in: erofsdir.py), mount it."""
        t0 = time.perf_counter()
        self.images.download(self.objects.stream(image_key(layer), digest, size), layer)
        self._took("download", time.perf_counter() - t0)
        t0 = time.perf_counter()
        try:
            self.images.mount(layer)
        except OSError as exc:
            raise _MountRefused(str(exc)) from exc
        self._took("mount", time.perf_counter() - t0)
        with self._count:
            self.fetched += 1
        self._mark(layer, size)

    def drop(self, layer: str) -> None:
        """Before a layer is removed (gc, LayerDirs.remove): its image, if it has one, goes."""
        if self.images.has(layer):
            self.images.unmount(layer, keep_image=False)

    def release_mounts(self) -> list[str]:
        """Unmount the images no one uses (not pinned, no sandbox's lower, no live sandbox's
        layer); each is mounted again (hashed first) on its next use. For a store being closed:
        a mount outlives its process only while something uses it."""
        names = self.images.names()
        if not any(self.images.mounted(n) for n in names):
            return []
        busy = self._live_layers() | mounted_layers()
        out = []
        for layer in names:
            if layer in busy or not self.images.mounted(layer):
                continue
            with self._exclusive(layer) as mine:
                if mine:
                    self.images.unmount(layer, keep_image=True)
                    out.append(layer)
        return out

    @contextlib.contextmanager
    def _exclusive(self, layer: str):
        """Yields whether no operation pins the layer (then none can until the block ends)."""
        fd = os.open(os.path.join(self.dir, layer), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _took(self, phase: str, seconds: float) -> None:
        with self._count:
            self.timings[phase] = self.timings.get(phase, 0.0) + seconds

    def _mark(self, layer: str, size: int) -> None:
        with open(os.path.join(self.dir, layer), "w") as f:
            f.write(str(size))

    # ---- evict --------------------------------------------------------------------------------
    def entries(self) -> list[tuple[float, str, int]]:
        """(last use, layer, bytes) of every cached layer, oldest use first."""
        out = []
        for layer in os.listdir(self.dir):
            if not self._cached(layer):
                continue
            p = os.path.join(self.dir, layer)
            try:
                with open(p) as f:
                    size = int(f.read() or 0)
                out.append((os.stat(p).st_mtime, layer, size))
            except (OSError, ValueError):
                continue
        return sorted(out)

    def evict(self, cap: int | None = None) -> list[str]:
        """Remove least recently used layers until the cache holds at most `cap` bytes (default
        the store's); returns the layers evicted. Never one pinned, mounted, a live sandbox's
        lower, or without an S3 copy."""
        cap = self.cap if cap is None else cap
        entries = self.entries()
        total = sum(s for _, _, s in entries)
        if total <= cap:
            return []
        backed = {r[0] for r in self.store.db.query("SELECT layer FROM layer_objects")}
        live = self._live_layers()
        mounted = mounted_layers()
        gone = []
        for _, layer, size in entries:
            if total <= cap:
                break
            if layer not in backed or layer in live or layer in mounted:
                continue
            doomed = None
            with self._exclusive(layer) as mine:
                if not mine:
                    continue                     # pinned by an operation using it
                if self.images.has(layer):
                    self.images.unmount(layer, keep_image=False)
                else:
                    doomed = self.store.layers.stage("evict")
                    os.rmdir(doomed)
                    os.rename(self.store.layers.path(layer), doomed)
                os.unlink(os.path.join(self.dir, layer))
            if doomed is not None:
                remove_tree(doomed)
            total -= size
            gone.append(layer)
        return gone

    def _cached(self, layer: str) -> bool:
        """A layer dir here, or an image of it (mounted or not)."""
        return os.path.isdir(self.store.layers.path(layer)) or self.images.has(layer)

    def _live_layers(self) -> set[str]:
        out: set[str] = set()
        for img, head in self.store.db.query(
                "SELECT image, head FROM sandboxes WHERE state IN ('running', 'ahead')"):
            for i in (img, head):
                if i and self.store.has_image(i):
                    out.update(self.store.image(i).layers)
        return out

    def check(self) -> list[dict]:
        """fsck of the cache: markers without a layer go, cached layers without a marker get one;
        every cached layer S3 backs is packed again and its sha256 compared with its row."""
        problems = []
        for name in os.listdir(self.dir):
            if not self._cached(name):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except FileNotFoundError:
                    pass
        rows = {r[0]: r[1:] for r in self.store.db.query("SELECT layer, sha256, erofs_sha256, erofs_size "
                                                        "FROM layer_objects")}
        for layer in self.images.names():        # hashed, whatever the stamp says
            if layer not in rows or hash_file(self.images.path(layer)) != tuple(rows[layer][1:]):
                problems.append({"kind": "cached_layer_image_mismatch", "layer": layer})
        for layer in self.store.layers.all():
            if not self.local(layer):
                continue                         # an image that failed its hash (reported above)
            if not os.path.exists(os.path.join(self.dir, layer)):
                self._mark(layer, _dir_stats(self.store.layers.path(layer))[1])
            if layer in rows:
                w = layerpack.HashingWriter(_Null())
                layerpack.pack(self.store.layers.path(layer), w, self.store.idmap)
                if w.h.hexdigest() != rows[layer][0]:     # (a mounted image: its files as packed)
                    problems.append({"kind": "cached_layer_mismatch", "layer": layer})
        return problems


class _MountRefused(Exception):
    """This node's kernel refused to mount a verified image (no file-backed EROFS, say)."""


class _Null:
    def write(self, b):
        return len(b)


def _dir_stats(path: str) -> tuple[int, int]:
    """(entries, bytes of regular files) under path."""
    total = count = 0
    for dirpath, dirs, files in os.walk(path):
        count += len(dirs) + len(files)
        for n in files:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return count, total


def mounted_layers() -> set[str]:
    """Names of layers some overlay mount, in any process's mount namespace, has as a lower dir
    (sandboxes mount in their own namespaces: /proc/self/mountinfo does not show them)."""
    found: set[str] = set()
    seen_ns: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            ns = os.stat(f"/proc/{pid}/ns/mnt").st_ino
            if ns in seen_ns:
                continue
            seen_ns.add(ns)
            with open(f"/proc/{pid}/mountinfo") as f:
                for line in f:
                    if " - overlay " not in line:
                        continue
                    for opt in line.rsplit(" ", 1)[-1].split(","):
                        if opt.startswith(("lowerdir=", "lowerdir+=")):
                            for part in opt.split("=", 1)[1].split(":"):
                                found.add(os.path.basename(part.rstrip("/")))
        except OSError:
            continue
    return found
