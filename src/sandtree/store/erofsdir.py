"""A node's EROFS images of layers: erofs/ in the store directory (store/erofs.py says why and
how they are built and mounted; store/layercache.py decides when).

erofs/<layer>.img is a layer's image, put there only after its sha256 and size matched its row,
mounted at layers/<layer>. erofs/<layer>.ok stamps the last check (boot id, inode, size, ctime):
an image whose mount went (a release, a restart) is mounted again without hashing it anew only
if it is the same file, unchanged, in the same boot (any write or rename moves the ctime).
Order: the image is renamed in before its mount point is made, and removed only after the mount
point is, so an empty layers/<layer> beside its image always means "mount it", never a layer.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets

from ..procid import boot_id, owner_prefix
from . import erofs
from .blobs import hash_file

__all__ = ["ImageDir"]


class ImageDir:
    def __init__(self, root: str, layers):
        self.root, self.layers = root, layers      # layers: the store's LayerDirs
        os.makedirs(root, mode=0o700, exist_ok=True)

    def path(self, layer: str) -> str:
        return os.path.join(self.root, f"{layer}.img")

    def has(self, layer: str) -> bool:
        return os.path.exists(self.path(layer))

    def names(self) -> list[str]:
        return sorted(n[:-4] for n in os.listdir(self.root) if n.endswith(".img"))

    def mounted(self, layer: str) -> bool:
        return erofs.is_mounted(self.layers.path(layer))

    def present(self, layer: str) -> bool:
        """Whether layers/<layer> holds the layer: a dir, mounted if an image backs it."""
        return os.path.isdir(self.layers.path(layer)) and (not self.has(layer) or self.mounted(layer))

    def download(self, body, layer: str) -> None:
        """Write a VerifiedStream (S3Objects.stream) to tmp/, then, only once its finish()
        matched sha256 and size, rename it in and stamp it. A kill -9 leaves a tmp file
        (LayerDirs.clean_stale's) or a checked image; StoreCorrupt leaves nothing."""
        tmp = os.path.join(self.layers.tmp, f"erofs-{owner_prefix()}{secrets.token_hex(6)}")
        try:
            with open(tmp, "xb") as f:
                while chunk := body.read(1 << 20):
                    f.write(chunk)
            body.finish()                        # StoreCorrupt: other bytes than the row's
            os.rename(tmp, self.path(layer))
            self._write_stamp(layer)
        except BaseException:
            _unlink(tmp)
            raise
        finally:
            body.close()

    def verified(self, layer: str, digest: str, size: int) -> bool:
        """Whether the image still has the row's sha256 and size (its stamp, else hashed)."""
        try:
            with open(self._stamp_path(layer)) as f:
                if f.read() == self._stamp(layer):
                    return True
        except OSError:
            pass
        ok = hash_file(self.path(layer)) == (digest, size)
        if ok:
            self._write_stamp(layer)
        return ok

    def mount(self, layer: str) -> None:
        """Mount the (verified) image at layers/<layer>, unless a process did already (the
        image's flock: two fetches of one layer mount it once). OSError if the kernel refuses."""
        path = self.layers.path(layer)
        fd = os.open(self.path(layer), os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                os.mkdir(path, 0o755)            # after the image is in
            except FileExistsError:
                pass
            if not erofs.is_mounted(path):
                erofs.mount(self.path(layer), path)
        finally:
            os.close(fd)

    def unmount(self, layer: str, keep_image: bool) -> None:
        """Unmount (detached) and remove the mount point; then, unless kept, the image."""
        path = self.layers.path(layer)
        while erofs.is_mounted(path):
            erofs.unmount(path)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError as exc:                   # a real dir (its tar's): the layer stays, unbacked
            if exc.errno != errno.ENOTEMPTY:
                raise
        if not keep_image:
            _unlink(self.path(layer))
            _unlink(self._stamp_path(layer))

    def _stamp_path(self, layer: str) -> str:
        return os.path.join(self.root, f"{layer}.ok")

    def _stamp(self, layer: str) -> str:
        st = os.stat(self.path(layer))
        return f"{boot_id()} {st.st_ino} {st.st_size} {st.st_ctime_ns}"

    def _write_stamp(self, layer: str) -> None:
        tmp = os.path.join(self.layers.tmp, f"stamp-{owner_prefix()}{secrets.token_hex(6)}")
        with open(tmp, "w") as f:
            f.write(self._stamp(layer))
        os.rename(tmp, self._stamp_path(layer))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
