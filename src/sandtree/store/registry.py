"""Pulling images from OCI registries (the distribution protocol) into a staged root filesystem.

`docker://HOST[:PORT]/NAME[:TAG|@sha256:...]` (also `oci://`; no host means Docker Hub). The
manifest (an index is resolved to linux/amd64, or the first entry) and every layer are verified
against their digests before anything is applied; layers are applied in order with their
whiteouts by importers.apply_layers. Auth: anonymous, HTTP basic, or the Bearer token dance the
registry asks for (WWW-Authenticate), with stored credentials if any. Plain HTTP is used only for
loopback registries or when asked (insecure=True).

Pushing: push_image sends an image's OCI blobs (store/ociout.py Plan) with monolithic
uploads (POST a session, PUT the bytes with their digest), each only when a HEAD finds it missing,
then the manifest under the tag. When the tag already names the same manifest nothing else is
asked: the registry checked that manifest's blobs when it took it. An unchanged image's push is
one request.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import ociout, ocilayers
from ..errors import BadArchive, InvalidInput, NotFound, RegistryError, SandtreeError, TooLarge  # noqa: F401 - RegistryError: re-exported

if TYPE_CHECKING:
    import httpx


def _httpx():
    """httpx, imported on a registry's first use: the engine (every `sandtree run`) loads this module, and httpx
    costs more to import than the rest of a run's start-up."""
    import httpx                 # (not at the top: see above)
    return httpx

MANIFEST_TYPES = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json"])
CONFIG_LIMIT = 4 << 20       # bytes of an image config a pull reads (Docker Hub's largest are ~100 KB)
REF_RE = re.compile(r"^(?:(docker|oci)://)?(?:(?P<host>[a-zA-Z0-9.-]+(?::\d+)?|\[[0-9a-fA-F:]+\](?::\d+)?)/)?"
                    r"(?P<name>[a-z0-9]+(?:[._/-][a-z0-9]+)*)(?::(?P<tag>[\w][\w.-]{0,127}))?"
                    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$")


@dataclass(frozen=True)
class Reference:
    registry: str            # host[:port]
    name: str
    tag: str | None
    digest: str | None

    @property
    def ref(self) -> str:
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        return f"{self.registry}/{self.name}" + (f"@{self.digest}" if self.digest else f":{self.tag or 'latest'}")


def parse(reference: str) -> Reference:
    m = REF_RE.match(reference or "")
    if not m:
        raise InvalidInput(f"not an image reference: {reference!r} (docker://HOST/NAME:TAG)")
    host, name = m.group("host"), m.group("name")
    if host is None or ("." not in host and ":" not in host and host != "localhost"):
        if host is not None:                     # "library/alpine" style: the first part was a path
            name = f"{host}/{name}"
        host = "registry-1.docker.io"
        if "/" not in name:
            name = f"library/{name}"
    if host == "docker.io":
        host = "registry-1.docker.io"
    return Reference(host, name, m.group("tag"), m.group("digest"))


def registry_host(url: str) -> str:
    """The registry a URL or reference names ("docker://ghcr.io/org/x" -> "ghcr.io")."""
    return parse(url).registry if "/" in url.split("://", 1)[-1] else parse(url + "/x").registry


def _loopback(host: str) -> bool:
    h = host.rsplit(":", 1)[0].strip("[]") if not host.startswith("[") else host.split("]")[0].strip("[")
    return h in ("localhost", "::1") or h.startswith("127.")


_TLS: list = []


def _tls() -> ssl.SSLContext:
    """One verifying TLS context per process: loading the CA bundle costs about 100 ms, which
    was most of a push of an unchanged image (the context is read-only once made)."""
    if not _TLS:
        _TLS.append(ssl.create_default_context())
    return _TLS[0]


class Client:
    def __init__(self, ref: Reference, credentials: tuple[str, str] | None = None, insecure: bool = False,
                 timeout: float = 60, check_host=None):
        """check_host("host:port"): called before every request, redirects and token realms
        included; raises to refuse (a tenant's pull reaches public addresses only)."""
        self.ref = ref
        scheme = "http" if insecure or _loopback(ref.registry) else "https"
        self.base = f"{scheme}://{ref.registry}/v2/"
        self.credentials = credentials
        hooks = {"request": [lambda req: check_host(f"{req.url.host}:{req.url.port or (443 if req.url.scheme == 'https' else 80)}")]} \
            if check_host is not None else None
        self.http = _httpx().Client(timeout=timeout, follow_redirects=True, event_hooks=hooks, verify=_tls())
        self.token: str | None = None
        self.basic = False
        self.actions = "pull"            # the token scope asked for ("pull,push" for a push)

    def close(self) -> None:
        self.http.close()

    def _headers(self, extra: dict | None = None) -> dict:
        h = dict(extra or {})
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _auth(self, challenge: str) -> None:
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            if not self.credentials:
                raise RegistryError(f"{self.ref.registry} needs credentials (registry login)")
            self.basic = True
            self.http.auth = _httpx().BasicAuth(*self.credentials)
            return
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        if "realm" not in fields:
            raise RegistryError(f"unsupported auth challenge from {self.ref.registry}: {challenge!r}")
        query = {k: fields[k] for k in ("service", "scope") if k in fields}
        query.setdefault("scope", f"repository:{self.ref.name}:{self.actions}")
        r = self.http.get(fields["realm"], params=query,
                          auth=_httpx().BasicAuth(*self.credentials) if self.credentials else None)
        if r.status_code != 200:
            raise RegistryError(f"token request to {fields['realm']} failed: HTTP {r.status_code}")
        body = r.json()
        self.token = body.get("token") or body.get("access_token")
        if not self.token:
            raise RegistryError("the registry's token service returned no token")

    def get(self, path: str, *, accept: str | None = None, stream: bool = False) -> httpx.Response:
        url = self.base + path
        for attempt in range(2):
            req = self.http.build_request("GET", url, headers=self._headers({"Accept": accept} if accept else None))
            r = self.http.send(req, stream=stream)
            if r.status_code == 401 and attempt == 0 and "www-authenticate" in r.headers:
                r.close()
                self._auth(r.headers["www-authenticate"])
                continue
            if r.status_code == 404:
                r.close()
                what = "image" if "/manifests/" in path else "layer" if "/blobs/" in path else "repository"
                raise NotFound(f"{self.ref}: {what} not found in the registry")
            if r.status_code >= 400:
                r.close()
                raise RegistryError(f"{self.ref.registry} answered HTTP {r.status_code} for {path}")
            return r
        raise RegistryError(f"{self.ref.registry} refused the credentials")

    def request(self, method: str, url: str, *, ok=(200,), content=None, headers: dict | None = None,
                params: dict | None = None) -> httpx.Response:
        """One request (a path under /v2/ or an absolute URL, e.g. an upload's Location), with the
        auth dance on a 401; RegistryError unless the status is in `ok`. A content that is a file
        is rewound for the retry."""
        url = url if url.startswith(("http://", "https://")) else self.base + url
        for attempt in range(2):
            if hasattr(content, "seek"):
                content.seek(0)
            r = self.http.request(method, url, content=content, params=params, headers=self._headers(headers))
            if r.status_code == 401 and attempt == 0 and "www-authenticate" in r.headers:
                self._auth(r.headers["www-authenticate"])
                continue
            if r.status_code not in ok:
                detail = r.text[:300] if method != "HEAD" else ""
                raise RegistryError(f"{self.ref.registry} answered HTTP {r.status_code} to {method} "
                                    f"{url.split('?')[0].removeprefix(self.base)}: {detail}".rstrip(": "))
            return r
        raise RegistryError(f"{self.ref.registry} refused the credentials")

    def config(self, manifest: dict, dest_dir: str) -> dict | None:
        """The image config a manifest names (verified, at most CONFIG_LIMIT bytes), or None."""
        desc = manifest.get("config")
        if not isinstance(desc, dict):
            return None
        size = desc.get("size")
        if not isinstance(size, int) or not 0 <= size <= CONFIG_LIMIT:
            raise BadArchive(f"{self.ref}: the image config's size {str(size)[:20]!r} is not 0..{CONFIG_LIMIT}")
        path = self.blob(desc.get("digest"), dest_dir, size=size)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read())
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise BadArchive(f"{self.ref}: the image config is not JSON: {exc}") from None
        finally:
            os.unlink(path)
        if not isinstance(doc, dict):
            raise BadArchive(f"{self.ref}: the image config is not a JSON object")
        return doc

    def check(self) -> None:
        """GET /v2/ with the credentials: do they work here?"""
        self.get("")

    def manifest(self) -> dict:
        ref = self.ref.ref
        for _ in range(3):
            r = self.get(f"{self.ref.name}/manifests/{ref}", accept=MANIFEST_TYPES)
            body = r.content
            want = ref if ref.startswith("sha256:") else r.headers.get("docker-content-digest")
            if want and "sha256:" + hashlib.sha256(body).hexdigest() != want:
                raise BadArchive(f"manifest of {self.ref} does not match its digest {want}")
            doc = json.loads(body)
            if "manifests" not in doc:
                return doc
            choices = doc["manifests"]
            pick = next((m for m in choices if (m.get("platform") or {}).get("architecture") == "amd64"
                         and (m.get("platform") or {}).get("os", "linux") == "linux"), choices[0] if choices else None)
            if pick is None:
                raise BadArchive(f"{self.ref}: the index lists no manifests")
            ref = pick.get("digest") if isinstance(pick, dict) else None
            if not isinstance(ref, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", ref):
                raise BadArchive(f"{self.ref}: the index names a bad manifest digest {str(ref)[:80]!r}")
        raise BadArchive(f"{self.ref}: nested indexes too deep")

    def blob(self, digest: str, dest_dir: str, progress=None, size: int | None = None,
             budget: list[int] | None = None) -> str:
        """Download one layer, verified. size: the manifest's declared size (a registry sending
        more is refused at once, not after the disk filled); budget: [bytes all layers may
        still take] (TooLarge past it)."""
        if not isinstance(digest, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise BadArchive(f"unsupported digest {str(digest)[:80]!r}")
        if size is not None and (not isinstance(size, int) or size < 0):
            raise BadArchive(f"layer {digest[:19]} has a bad size {str(size)[:20]!r}")
        fd, path = tempfile.mkstemp(dir=dest_dir, prefix="blob-")
        h = hashlib.sha256()
        got = 0
        r = self.get(f"{self.ref.name}/blobs/{digest}", stream=True)
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in r.iter_bytes(1 << 20):
                    got += len(chunk)
                    if size is not None and got > size:
                        raise BadArchive(f"layer {digest[:19]} of {self.ref} is larger than its "
                                         f"declared {size} bytes")
                    if budget is not None:
                        budget[0] -= len(chunk)
                        if budget[0] < 0:
                            raise TooLarge(f"the layers of {self.ref} exceed the import limit")
                    h.update(chunk)
                    out.write(chunk)
                    if progress:
                        progress(len(chunk))
        finally:
            r.close()
        if "sha256:" + h.hexdigest() != digest:
            raise BadArchive(f"layer {digest[:19]} of {self.ref} does not match its digest")
        return path


def pull_layers(reference: str, workdir: str, *, credentials=None, insecure: bool = False,
                progress=None, check_host=None, max_bytes: int = 32 << 30) -> list[str]:
    """Download and verify the layers of `reference` into workdir; bottom layer first."""
    return pull_image(reference, workdir, credentials=credentials, insecure=insecure, progress=progress,
                      check_host=check_host, max_bytes=max_bytes)[0]


def pull_image(reference: str, workdir: str, *, credentials=None, insecure: bool = False,
               progress=None, check_host=None, max_bytes: int = 32 << 30) -> tuple[list[str], dict | None]:
    """Download and verify the layers of `reference` into workdir (bottom layer first) and its
    image config (the OCI config document, or None if the manifest names none).
    check_host: see Client. max_bytes: what all layers together may download (then their
    expansion is capped by importers.ImportLimits when applied)."""
    ref = parse(reference)
    client = Client(ref, credentials, insecure, check_host=check_host)
    try:
        try:
            manifest = client.manifest()
            layers = manifest.get("layers")
            if not isinstance(layers, list):
                raise BadArchive(f"{ref}: not an image manifest (schema 2 / OCI)")
            config = client.config(manifest, workdir)
            left = [max_bytes]
            return [client.blob(layer.get("digest") if isinstance(layer, dict) else None, workdir, progress,
                                size=layer.get("size") if isinstance(layer, dict) else None, budget=left)
                    for layer in layers], config
        except _httpx().HTTPError as exc:
            raise RegistryError(f"cannot reach {ref.registry}: {exc}") from None
    finally:
        client.close()


def check_login(registry: str, username: str, secret: str, insecure: bool = False) -> None:
    client = Client(Reference(registry, "library/x", None, None), (username, secret), insecure)
    try:
        try:
            client.check()
        except _httpx().HTTPError as exc:
            raise RegistryError(f"cannot reach {registry}: {exc}") from None
    finally:
        client.close()


# ---- push -----------------------------------------------------------------------------------------
def push_image(store, image: str, reference: str, workdir: str, *, credentials=None, insecure: bool = False,
               progress=None) -> dict:
    """Push the image to docker://HOST/NAME:TAG. Returns {reference, digest, layers, uploaded,
    bytes, seconds}: uploaded counts the blobs this push sent (0 for an unchanged image)."""
    started = time.monotonic()
    ref = parse(reference)
    if ref.digest:
        raise InvalidInput("push to a tag (docker://HOST/NAME:TAG), not to a digest")
    tag = ref.tag or "latest"
    client = Client(ref, credentials, insecure)
    client.actions = "pull,push"
    p = ociout.plan(store, image, workdir)
    uploaded, sent = 0, 0
    try:
        try:
            # the tag already names this manifest: the registry checked its blobs when it took it
            head = client.request("HEAD", f"{ref.name}/manifests/{tag}", ok=(200, 404),
                                  headers={"Accept": ocilayers.MANIFEST_MEDIA})
            if head.status_code == 200 and head.headers.get("docker-content-digest") == p.digest:
                return _result(ref, tag, p, 0, 0, started)
            cfg_digest = "sha256:" + hashlib.sha256(p.config).hexdigest()
            for blob in p.layers + [ocilayers.LayerBlob(None, image, cfg_digest, cfg_digest, len(p.config))]:
                if client.request("HEAD", f"{ref.name}/blobs/{blob.digest}", ok=(200, 404)).status_code == 200:
                    continue
                if blob.digest == cfg_digest:
                    _upload(client, ref.name, blob.digest, p.config)
                else:
                    with open(ociout.blob_file(store, p, blob, workdir), "rb") as f:
                        _upload(client, ref.name, blob.digest, f)
                uploaded += 1
                sent += blob.size
                if progress:
                    progress(blob.size)
            client.request("PUT", f"{ref.name}/manifests/{tag}", ok=(200, 201), content=p.manifest,
                           headers={"Content-Type": ocilayers.MANIFEST_MEDIA})
        except _httpx().HTTPError as exc:
            raise RegistryError(f"cannot reach {ref.registry}: {exc}") from None
    finally:
        client.close()
        p.discard()
    return _result(ref, tag, p, uploaded, sent, started)


def _result(ref, tag: str, p, uploaded: int, sent: int, started: float) -> dict:
    return {"reference": f"{ref.registry}/{ref.name}:{tag}", "digest": p.digest, "layers": len(p.layers),
            "uploaded": uploaded, "bytes": sent, "seconds": round(time.monotonic() - started, 4)}


def _upload(client: Client, name: str, digest: str, content) -> None:
    """A monolithic upload: POST a session, PUT the bytes to its Location with the digest."""
    r = client.request("POST", f"{name}/blobs/uploads/", ok=(202,))
    location = r.headers.get("location")
    if not location:
        raise RegistryError(f"{client.ref.registry} gave no upload location")
    location = str(_httpx().URL(client.base).join(location))
    size = len(content) if isinstance(content, bytes) else os.fstat(content.fileno()).st_size
    # the digest joins the location's own query (its upload state), which httpx's params would replace
    client.request("PUT", f"{location}{'&' if '?' in location else '?'}digest={digest}", ok=(201,),
                   content=content, headers={"Content-Type": "application/octet-stream",
                                             "Content-Length": str(size)})
