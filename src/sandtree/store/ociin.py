"""An OCI image's config on the way in: read from a layout or docker-archive (a
registry's is read by store/registry.py) and kept in the staged root as imageconfig.CONFIG_PATH,
so the image's env, working directory, user, entrypoint and command live in the image itself and
a pushed image pulled back has the same ID (store/ocilayers.py takes the file out on the way out).
"""

from __future__ import annotations

import os
import stat

from ..errors import BadArchive, InvalidInput
from . import names
from .imageconfig import CONFIG_PATH, ImageConfig
from .importers import clean_name, layout_file, layout_json

__all__ = ["oci_config", "write_config"]


def oci_config(layout: str) -> dict | None:
    """The image config document of an OCI layout or extracted docker-archive (None: none named)."""
    if os.path.lexists(os.path.join(layout, "index.json")):
        doc = layout_json(layout, "index.json")
        for _ in range(4):
            desc = (doc.get("manifests") or [None])[0] if isinstance(doc, dict) else None
            if not isinstance(desc, dict):
                return None
            doc = layout_json(layout, _blob_rel(desc.get("digest")))
            if not isinstance(doc, dict):
                raise BadArchive("an OCI manifest is not a JSON object")
            if "manifests" not in doc:
                break
            choices = doc["manifests"]
            if isinstance(choices, list):
                doc = {"manifests": [next((m for m in choices if isinstance(m, dict) and (m.get("platform") or {})
                                           .get("architecture") == "amd64"), choices[0] if choices else None)]}
        desc = doc.get("config")
        rel = _blob_rel(desc.get("digest")) if isinstance(desc, dict) else None
    elif os.path.lexists(os.path.join(layout, "manifest.json")):
        manifest = layout_json(layout, "manifest.json")
        name = manifest[0].get("Config") if isinstance(manifest, list) and manifest and isinstance(manifest[0], dict) else None
        rel = clean_name(name) if isinstance(name, str) else None
    else:
        return None
    if rel is None or not os.path.lexists(os.path.join(layout, rel)):
        return None                  # no config to keep (imports without one worked before: still do)
    path = layout_file(layout, rel)
    if os.path.getsize(path) > 4 << 20:
        raise BadArchive("the image config is over 4 MiB")
    doc = layout_json(layout, rel)
    if not isinstance(doc, dict):
        raise BadArchive("the image config is not a JSON object")
    return doc


def _blob_rel(digest) -> str:
    algo, _, hexd = digest.partition(":") if isinstance(digest, str) else ("", "", "")
    if algo != "sha256":
        raise BadArchive(f"unsupported digest {str(digest)[:80]!r}")
    names.check_digest(hexd, BadArchive, "OCI digest")
    return f"blobs/sha256/{hexd}"


def write_config(root: str, oci: dict | None, chown: bool) -> None:
    """Keep an OCI image's config in the staged root as imageconfig.CONFIG_PATH (canonical
    JSON, 0644, 0:0 in /.sandtree 0755 0:0) unless its layers already hold that file; nothing
    for an empty config. Never written through a symlink: a /.sandtree that is not a directory
    is refused."""
    if not isinstance(oci, dict):
        return
    try:
        config = ImageConfig.from_oci(oci.get("config"))
    except InvalidInput as exc:
        raise BadArchive(f"the image config: {exc}") from None
    if config.is_empty():
        return
    dname, fname = CONFIG_PATH.strip("/").split("/")
    dpath = os.path.join(root, dname)
    try:
        st = os.lstat(dpath)
    except FileNotFoundError:
        os.mkdir(dpath, 0o755)
        os.chmod(dpath, 0o755)
        if chown:
            os.lchown(dpath, 0, 0)
        st = os.lstat(dpath)
    if not stat.S_ISDIR(st.st_mode):
        raise BadArchive(f"the image's /{dname} is not a directory: its config cannot be kept")
    dfd = os.open(dpath, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(fname, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        except FileExistsError:
            return                                   # the layers carry the file: it wins
        with os.fdopen(fd, "wb") as f:
            f.write(config.to_json())
            os.fchmod(fd, 0o644)
            if chown:
                os.fchown(fd, 0, 0)
    finally:
        os.close(dfd)
