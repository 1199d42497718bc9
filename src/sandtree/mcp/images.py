"""MCP tools for images and files: import, list, inspect and tag images; read, list and grep
their files without starting a sandbox; files in (upload, rsync) and out (download); registry
credentials for docker:// imports; pushes to a registry.

Over HTTP the tools that touch the *server's* filesystem (import_image of a path, upload path=,
rsync, download destination=) are off (Toolkit.no_host_paths): files come in by content (upload,
then import_image("upload:SHA256") for an image tar) and go out by read_file.
"""

from __future__ import annotations

import base64
import fnmatch
import os
import tempfile

from .. import defaults as D
from ..errors import InvalidInput, TooLarge

from .toolkit import Toolkit

MAX_UPLOAD_IMPORT = 256 << 20     # bytes of an upload import_image("upload:SHA") reads into memory
MAX_READ = 4 << 20                # bytes of a file one read_file call or resource read returns


def register(t: Toolkit) -> None:
    engine = t.engine

    # ---- images -------------------------------------------------------------------------------
    @t.handler
    def import_image(source: str, tag: str | None = None) -> dict:
        """Import an image: docker://HOST/NAME:TAG from a registry (see registry_auth),
        `upload:SHA256` (a tar, gz/zst, OCI or docker archive stored with upload), a local
        directory, tar, OCI layout or docker-archive path (stdio only), or `debian:SUITE` to
        bootstrap Debian (slow: tens of seconds). Prefer existing images (list_images)."""
        if source.startswith("debian:"):
            image = engine.bootstrap(source, tag=tag)
        elif source.startswith(("docker://", "oci://")):
            image = engine.pull(source, tag=tag)
        elif source.startswith("upload:"):
            size = engine.upload_info(source[7:])["size"]     # the caller's own, or not found
            if size > MAX_UPLOAD_IMPORT:
                raise TooLarge(f"an upload:SHA import is at most {MAX_UPLOAD_IMPORT >> 20} MiB "
                               "(it passes through memory); import bigger tars with POST /api/v1/images/import")
            data = engine.download(source[7:])
            fd, tmp = tempfile.mkstemp(prefix="sandtree-mcp-", suffix=".tar")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                del data
                image = engine.import_path(tmp, tag=tag)
            finally:
                os.unlink(tmp)
        else:
            t.no_host_paths("import_image of a path")
            image = engine.import_path(source, tag=tag)
        return {"image": image, "tag": tag}

    @t.handler
    def list_images(tag_prefix: str | None = None, limit: int = D.MCP_IMAGES_LIMIT) -> list[dict]:
        """Images with their tags, newest last; tag_prefix filters by tag."""
        rows = engine.images()
        if tag_prefix:
            rows = [r for r in rows if any(t.startswith(tag_prefix) for t in r["tags"])]
        return [{"image": r["id"], "tags": r["tags"], "files": r["files"], "size": r["size"]} for r in rows[-limit:]]

    @t.handler
    def get_image(image: str) -> dict:
        """One image: id, tags, size, parents and the command that made it."""
        info = engine.image_info(image)
        return {"image": image, "tags": info["tags"], "files": info["files"], "size": info["size"],
                "parents": info["parents"], "made_by": engine.produced_by(image)[:1]}

    # ---- files --------------------------------------------------------------------------------
    @t.handler
    def upload(content: str | None = None, content_base64: str | None = None, path: str | None = None) -> dict:
        """Store a file once (text, base64, or a local path); returns its sha256 for run(files=...)."""
        if sum(x is not None for x in (content, content_base64, path)) != 1:
            raise InvalidInput("give exactly one of content, content_base64, path")
        if path is not None:
            t.no_host_paths("upload path=")
            with open(path, "rb") as f:
                data = f.read()
        elif content_base64 is not None:
            data = base64.b64decode(content_base64, validate=True)
        else:
            data = content.encode()
        digest = engine.upload(data)
        return {"uuid": digest, "sha256": digest, "size": len(data)}

    @t.handler
    def rsync(source: str, destination: str, exclude: list[str] | None = None) -> dict:
        """Sync a local directory into a reusable file set (uploaded once, deduplicated by content),
        injected at `destination` by run(directory_state_id=...)."""
        t.no_host_paths("rsync")
        if not os.path.isdir(source):
            raise InvalidInput(f"{source} is not a directory")
        if not destination.startswith("/"):
            raise InvalidInput("destination must be an absolute path in the image")
        entries = []
        for root, dirs, names in os.walk(source):
            rel_root = os.path.relpath(root, source)
            dirs[:] = [d for d in dirs if not any(fnmatch.fnmatch(d, p) for p in exclude or [])]
            for n in sorted(names):
                if any(fnmatch.fnmatch(n, p) for p in exclude or []):
                    continue
                full = os.path.join(root, n)
                if not os.path.isfile(full) or os.path.islink(full):
                    continue
                with open(full, "rb") as f:
                    digest = engine.upload(f.read())
                rel = n if rel_root == "." else os.path.join(rel_root, n)
                entries.append({"path": destination.rstrip("/") + "/" + rel, "sha256": digest,
                                "mode": os.stat(full).st_mode & 0o7777})
        return {"directory_state_id": engine.file_set_create(entries), "files": len(entries)}

    @t.handler
    def download(image: str, path: str, destination: str) -> dict:
        """Copy one file out of an image to a local path (stdio only: over HTTP use read_file)."""
        t.no_host_paths("download destination=")
        data = engine.read(image, path)
        with open(destination, "wb") as f:
            f.write(data)
        return {"destination": destination, "size": len(data)}

    @t.handler
    def read_file(image: str, path: str, offset: int = 0, limit: int = D.MCP_READ_LIMIT) -> dict:
        """Read a file of an image (text, or base64 for binary), from byte `offset`, at most `limit`
        bytes (at most 4 MiB a call: read on with offset)."""
        if offset < 0 or limit < 0:
            raise InvalidInput("offset and limit are not negative")
        limit = min(limit, MAX_READ)
        size = engine.stat(image, path).to_dict().get("size", 0)
        data = engine.read(image, path, offset, limit)
        try:
            res = {"content": data.decode("utf-8"), "encoding": "text"}
        except UnicodeDecodeError:
            res = {"content": base64.b64encode(data).decode(), "encoding": "base64"}
        res["size"] = size
        if offset + len(data) < size:
            res["truncated"] = f"{size - offset - len(data)} more bytes: read again with offset={offset + len(data)}"
        return res

    # ---- registries -------------------------------------------------------------------------
    @t.handler
    def registry_auth(registry_url: str, username: str, token: str) -> dict:
        """Check registry credentials (a read-only personal access token) against the registry's
        /v2/ API and keep them for import_image("docker://..."). "docker://ghcr.io/org/x" -> ghcr.io."""
        host = engine.registry_login(registry_url, username, token)
        return {"status": "success", "registry": host, "message": f"credentials for {host} stored"}

    @t.handler
    def registry_token_obtain(registry_url: str) -> dict:
        """Where to create a read-only token for a registry (then call registry_auth with it)."""
        host = engine.registry_host(registry_url)
        pages = {"ghcr.io": "https://github.com/settings/tokens (scope: read:packages)",
                 "registry-1.docker.io": "https://app.docker.com/settings/personal-access-tokens (read-only)",
                 "registry.gitlab.com": "https://gitlab.com/-/user_settings/personal_access_tokens (read_registry)"}
        return {"registry": host, "create_token_at": pages.get(host, f"the web settings of {host}"),
                "next": "registry_auth(registry_url, username, token)"}
