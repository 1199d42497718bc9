"""FROM scratch: the empty image (a root directory 0755 owned by 0:0, nothing in it), made once per
store by adopting an empty directory and found again by its cache row."""

from __future__ import annotations

import os

from ..builds import cache as buildcache

__all__ = ["scratch_image"]


def scratch_image(store, adopt) -> str:
    """The empty image's ID (made on first use by adopt(dir, copy=, tag=, source=), the engine's
    import of a staged directory; its import operation says "scratch")."""
    key = buildcache.step_key("", "FROM scratch")
    hit = buildcache.lookup(store, key)
    if hit is not None:
        return hit
    staged = store.layers.stage("import")
    idmap = store.idmap
    os.chown(staged, idmap.host_uid(0), idmap.host_gid(0))
    os.chmod(staged, 0o755)
    image = adopt(staged, copy=False, tag=None, source="scratch")
    with store.db.tx() as con:
        buildcache.put(con, key, image, None, True)
    return image
