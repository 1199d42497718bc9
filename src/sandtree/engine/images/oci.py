"""OCI out (a mixin of engine.Engine): push an image to a registry, export it as an OCI image
layout. The layers, config and manifest are store/ocilayers.py; the layout store/ociout.py; the
registry protocol store/registry.py (loaded for registry work only: it brings httpx). Credentials
are the ones `registry login` kept for pulls.
"""

from __future__ import annotations

from ...store.layers import remove_tree
from ...store.names import check_tag
from .. import parts             # registry, ociout: loaded on first use (parts.py)


class OciOps:
    """Mixed into engine.Engine, which provides store and resolve."""

    def push(self, image: str, reference: str, *, insecure: bool = False, progress=None) -> dict:
        """Push an image to docker://HOST/NAME:TAG; {reference, digest, layers, uploaded, bytes, seconds}."""
        registry = parts.registry
        image = self.resolve(image)
        ref = registry.parse(reference)
        row = self.store.db.one("SELECT username, secret FROM registry_auth WHERE registry=?", (ref.registry,))
        with self.store.using():
            work = self.store.layers.stage("push")
            try:
                return registry.push_image(self.store, image, reference, work, credentials=tuple(row) if row else None,
                                           insecure=insecure, progress=progress)
            finally:
                remove_tree(work)

    def export_oci(self, image: str, fileobj, *, name: str | None = None) -> dict:
        """Write an image as an OCI image layout in a tar stream; {image, digest, layers}."""
        image = self.resolve(image)
        if name is not None:
            check_tag(name)
        with self.store.using():
            work = self.store.layers.stage("export")
            try:
                p = parts.ociout.write_layout_tar(self.store, image, fileobj, work, ref_name=name)
            finally:
                remove_tree(work)
        return {"image": image, "digest": p.digest, "layers": [b.digest for b in p.layers]}
