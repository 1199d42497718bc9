"""The remote engine: the same methods as engine.Engine, spoken over `sandtree serve`'s HTTP API.

`sandtree.connect(url)` builds the public API objects (Sandtree, Image, RunResult, Branch) on
this instead of an in-process Engine, so code written against the local engine runs unchanged
against a server. Errors come back as the same exception classes, chosen from a fixed table by
the server's error code (never by a name the other side sends).
"""

from __future__ import annotations

import base64
import json
import os
import tarfile
import tempfile

import httpx

from .. import errors
from ..engine import RunRecord
from ..runtime.base import Limits
from ..store.maintenance import GC_GRACE, GC_RETENTION

ERRORS = errors.ERRORS


class _Data(dict):
    """A dict that answers to_dict(), as the engine's value objects do."""

    def to_dict(self) -> dict:
        return dict(self)


class RemoteEngine:
    def __init__(self, url: str, token: str | None = None, timeout: float = 600):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url + "/api/v1", headers=headers, timeout=timeout)
        self.default_limits = Limits()
        self._ops = _RemoteOperations(self)

    # ---- plumbing -------------------------------------------------------------------------------
    def _call(self, method: str, path: str, **kw):
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise errors.SandtreeError(f"cannot reach {self.url}: {exc}") from None
        if r.status_code >= 400:
            self._call_failed(r)
        return r

    def _call_failed(self, r):
        try:
            body = r.json()
        except ValueError:
            body = {"error": "error", "message": r.text[:500]}
        if "error" not in body:                           # FastAPI's own 422 shape
            raise errors.InvalidInput(f"rejected by the server: {json.dumps(body)[:500]}")
        self._raise(body)

    @staticmethod
    def _raise(body: dict):
        cls = ERRORS.get(body.get("error"), errors.SandtreeError)
        details = {k: v for k, v in body.items() if k not in ("error", "message")}
        raise cls(body.get("message", "error"), **details)

    def _json(self, method: str, path: str, **kw):
        return self._call(method, path, **kw).json()

    def close(self) -> None:
        self._ops.close()
        self.http.close()

    @property
    def home(self) -> str:
        return self.url

    @property
    def operations(self):
        return self._ops

    # ---- names, images, refs ----------------------------------------------------------------------
    def resolve(self, ref: str) -> str:
        if not isinstance(ref, str) or not ref:
            raise errors.InvalidInput("an image reference must be a non-empty string")
        return self._json("GET", "/resolve", params={"ref": ref})["image"]

    def images(self) -> list[dict]:
        return self._json("GET", "/images")

    def tag(self, image: str, name: str) -> None:
        self._json("PUT", f"/tags/{name}", json={"image": image})

    def untag(self, name: str) -> str:
        return self._json("DELETE", f"/tags/{name}")["image"]

    def tags(self, image: str | None = None) -> dict:
        return self._json("GET", "/tags", params={"image": image} if image else None)

    def image_info(self, image: str) -> dict:
        return self._json("GET", f"/images/{image}")

    def upload(self, data: bytes) -> str:
        return self._json("POST", "/files", content=bytes(data))["sha256"]

    def download(self, digest: str) -> bytes:
        return self._call("GET", f"/files/{digest}").content

    def file_set_create(self, files: list[dict]) -> str:
        return self._json("POST", "/file-sets", json=files)["id"]

    def registry_login(self, registry_url: str, username: str, secret: str, *, insecure: bool = False) -> str:
        return self._json("POST", "/registries/login",
                          json={"registry": registry_url, "username": username, "token": secret,
                                "insecure": insecure})["registry"]

    def remove_image(self, image: str, *, force: bool = False) -> None:
        self._json("DELETE", f"/images/{image}", params={"force": force})

    def import_path(self, path: str, *, tag: str | None = None, progress=None) -> str:
        """A local directory is sent as a tar; a file (tar, OCI or docker archive) as it is."""
        params = {"tag": tag} if tag else None
        if os.path.isdir(path):
            with tempfile.TemporaryFile() as f:
                with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
                    t.add(path, arcname=".")
                f.seek(0)
                return self._json("POST", "/images/import", params=params, content=f.read())["image"]
        if not os.path.exists(path):
            raise errors.NotFound(f"no such file or directory: {path}")
        with open(path, "rb") as f:
            return self._json("POST", "/images/import", params=params, content=f.read())["image"]

    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False, progress=None) -> str:
        return self._json("POST", "/images/pull", json={"reference": reference, "tag": tag,
                                                        "insecure": insecure})["image"]

    def bootstrap(self, spec, **kw):
        raise errors.RuntimeUnavailable("bootstrap runs on the server's own machine: use `sandtree image "
                                        "bootstrap` there, or import/pull an image")

    def doctor(self) -> list[dict]:
        return self._json("GET", "/doctor")

    def whoami(self) -> dict:
        return self._json("GET", "/whoami")

    def share(self, image: str) -> dict:
        return self._json("POST", f"/images/{image}/share", json={"public": True})

    def unshare(self, image: str) -> dict:
        return self._json("POST", f"/images/{image}/share", json={"public": False})

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        return self._json("GET", "/audit", params={"limit": limit, **({"tenant": tenant} if tenant else {})})

    def fsck(self, verify_content: bool = True) -> dict:
        return self._json("POST", "/admin/fsck", params={"verify_content": verify_content})

    def gc(self, retention: float = GC_RETENTION, grace: float = GC_GRACE) -> dict:
        return self._json("POST", "/admin/gc", params={"retention": retention, "grace": grace})

    # ---- inspection ---------------------------------------------------------------------------------
    def ls(self, image: str, path: str = "/") -> list[_Data]:
        return [_Data(e) for e in self._json("GET", f"/images/{image}/ls", params={"path": path})]

    def stat(self, image: str, path: str) -> _Data:
        return _Data(self._json("GET", f"/images/{image}/stat", params={"path": path}))

    def read(self, image: str, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        params = {"path": path, "offset": offset}
        if limit is not None:
            params["limit"] = limit
        return self._call("GET", f"/images/{image}/read", params=params).content

    def grep(self, image: str, pattern: str, path: str = "/", **kw) -> list[dict]:
        return self._json("GET", f"/images/{image}/grep",
                          params={"pattern": pattern, "path": path, **{k: v for k, v in kw.items() if v is not None}})

    def export_tar(self, image: str, fileobj, path: str = "/") -> None:
        fileobj.write(self._call("GET", f"/images/{image}/export", params={"path": path}).content)

    # ---- runs -------------------------------------------------------------------------------------
    def run(self, ref: str, command, *, on_output=None, stdin=None, files=None, **options) -> RunRecord:
        body = self._run_body(ref, command, stdin, files, options)
        if on_output is None:
            return _record(self._json("POST", "/runs", json={**body, "wait": True}))
        op = self._json("POST", "/runs", json={**body, "wait": False})["id"]
        self._ops.stream(op, on_output)
        return _record(self._json("POST", f"/operations/{op}/wait", params={"timeout": 3600}))

    @staticmethod
    def _run_body(ref, command, stdin, files, options) -> dict:
        stdin_b64 = None
        if isinstance(stdin, (bytes, bytearray)):
            try:
                stdin = bytes(stdin).decode("utf-8")
            except UnicodeDecodeError:                 # exact bytes travel as base64
                stdin, stdin_b64 = None, base64.b64encode(stdin).decode()
        out = []
        for f in files or []:
            f = dict(f)
            if isinstance(f.get("content"), bytes):
                f["content"] = f["content"].decode("utf-8", "surrogateescape")
            out.append(f)
        body = {"image": ref, "command": command, "stdin": stdin, "files": out}
        if stdin_b64 is not None:
            body["stdin_base64"] = stdin_b64
        body.update({k: v for k, v in options.items() if v is not None})
        if "env" in body and body["env"] is None:
            body.pop("env")
        return body

    def operation(self, op: str) -> dict:
        return self._json("GET", f"/operations/{op}")

    # ---- live sandboxes ----------------------------------------------------------------------------
    def sandbox_start(self, ref: str, *, files=None, **options) -> dict:
        body = self._run_body(ref, "", None, files, options)
        body.pop("command"), body.pop("stdin")
        return self._json("POST", "/sandboxes", json=body)

    def sandbox_exec(self, sid: str, command, *, stdin=None, on_output=None, cancel=None, **options) -> RunRecord:
        body = self._run_body(None, command, stdin, None, options)
        body.pop("image"), body.pop("files")
        if body.get("stdin") is None:
            body.pop("stdin")
        if on_output is None:
            return _record(self._json("POST", f"/sandboxes/{_q(sid)}/exec", json=body))
        # live output: the server streams the command's bytes as they come, then its result
        with self.http.stream("POST", f"/sandboxes/{_q(sid)}/exec", params={"stream": "true"}, json=body,
                              timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                self._call_failed(r)
            event = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event in ("stdout", "stderr"):
                    on_output(event, base64.b64decode(line[6:]))
                elif line.startswith("data: ") and event == "end":
                    return _record(json.loads(line[6:]))
                elif line.startswith("data: ") and event == "error":
                    self._raise(json.loads(line[6:]))
        raise errors.SandtreeError(f"{self.url}: the exec stream ended without a result")

    def sandbox_popen(self, sid: str, argv, **options):
        raise errors.RuntimeUnavailable("popen (pipes or a terminal to a process) is in-process only; "
                                        "over HTTP use exec")

    def sandbox_commit(self, sid: str, *, tag: str | None = None) -> str:
        return self._json("POST", f"/sandboxes/{_q(sid)}/commit", json={"tag": tag})["image"]

    def sandbox_stop(self, sid: str) -> dict:
        return self._json("POST", f"/sandboxes/{_q(sid)}/stop")

    # ---- warm pools: the server's ------------------------------------------------------------------
    def pool_create(self, ref: str, size: int, **options) -> dict:
        return self._json("PUT", f"/pools/{_q(ref)}", json={"size": size, **options})

    def pool_list(self) -> list[dict]:
        return self._json("GET", "/pools")

    def pool_wait(self, ref: str, timeout: float = 30.0) -> bool:
        return self._json("POST", f"/pools/{_q(ref)}/wait", params={"timeout": timeout})["ready"]

    def pool_remove(self, ref: str) -> None:
        self._call("DELETE", f"/pools/{_q(ref)}")

    def sandbox_hibernate(self, sid: str) -> dict:
        return self._json("POST", f"/sandboxes/{_q(sid)}/hibernate")

    def sandbox_resume(self, sid: str) -> dict:
        return self._json("POST", f"/sandboxes/{_q(sid)}/resume")

    def sandbox_info(self, sid: str) -> dict:
        return self._json("GET", f"/sandboxes/{_q(sid)}")

    def sandbox_list(self, *, all: bool = False) -> list[dict]:
        return self._json("GET", "/sandboxes", params={"all": all})

    def sandbox_read(self, sid: str, path: str) -> bytes:
        return self._call("GET", f"/sandboxes/{_q(sid)}/file", params={"path": path}).content

    def sandbox_write(self, sid: str, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0,
                      gid: int = 0) -> None:
        self._call("PUT", f"/sandboxes/{_q(sid)}/file", params={"path": path, "mode": mode, "uid": uid, "gid": gid},
                   content=bytes(data))

    # ---- lineage, branching ------------------------------------------------------------------------
    def parents(self, image: str) -> list[dict]:
        return self._json("GET", f"/images/{image}/parents")

    def children(self, image: str) -> list[dict]:
        return self._json("GET", f"/images/{image}/children")

    def log(self, image: str, limit: int = 1000) -> list[dict]:
        return self._json("GET", f"/images/{image}/log", params={"limit": limit})

    def ancestors(self, image: str) -> dict:
        return self._json("GET", f"/images/{image}/ancestors")

    def descendants(self, image: str) -> dict:
        return self._json("GET", f"/images/{image}/descendants")

    def produced_by(self, image: str) -> list[dict]:
        return self._json("GET", f"/images/{image}/produced-by")

    def lineage_tree(self, root: str, *, max_nodes: int = 2000) -> dict:
        return self._json("GET", f"/images/{root}/lineage", params={"max_nodes": max_nodes})["tree"]

    def common_ancestor(self, a: str, b: str) -> str | None:
        return self._json("GET", "/lineage/common", params={"a": a, "b": b})["image"]

    def lineage_path(self, a: str, b: str) -> list[str]:
        return self._json("GET", "/lineage/path", params={"a": a, "b": b})

    def diff(self, a: str, b: str) -> list[_Data]:
        return [_Data(c) for c in self._json("GET", "/diff", params={"a": a, "b": b})["changes"]]

    def patch(self, a: str, b: str) -> str:
        return self._json("GET", "/diff", params={"a": a, "b": b, "patch": True})["patch"]

    def merge(self, base, ours, theirs, *, strategy=None, ignore=None, on_conflict="raise") -> dict:
        return self._json("POST", "/merge", json={"base": base, "ours": ours, "theirs": theirs, "strategy": strategy,
                                                  "ignore": ignore, "on_conflict": on_conflict})

    def branch_create(self, name: str, image: str, *, force: bool = False) -> None:
        self._json("POST", "/branches", json={"name": name, "image": image, "force": force})

    def branch_delete(self, name: str) -> str:
        return self._json("DELETE", f"/branches/{name}")["image"]

    def branches(self) -> dict:
        return self._json("GET", "/branches")

    def branch_head(self, name: str) -> str:
        return self._json("GET", f"/branches/{name}")["image"]

    def branch_log(self, name: str) -> list[dict]:
        return self._json("GET", f"/branches/{name}/log")

    def rollback(self, name: str, *, to=None, steps=None) -> str:
        return self._json("POST", f"/branches/{name}/rollback", json={"to": to, "steps": steps})["image"]

    def bundle_create(self, *a, **k):
        raise errors.RuntimeUnavailable("bundles are made on the server's machine (`sandtree bundle create`)")

    bundle_import = bundle_create


class _RemoteOperations:
    def __init__(self, engine: RemoteEngine):
        self.engine = engine

    def submit_run(self, ref: str, command, *, stdin=None, files=None, **options) -> str:
        body = RemoteEngine._run_body(ref, command, stdin, files, options)
        return self.engine._json("POST", "/runs", json={**body, "wait": False})["id"]

    def wait(self, ops: list[str], timeout: float | None = None) -> list[dict]:
        return [self.engine._json("POST", f"/operations/{op}/wait",
                                  params={"timeout": 3600 if timeout is None else timeout}) for op in ops]

    def cancel(self, op: str) -> dict:
        return self.engine._json("POST", f"/operations/{op}/cancel")

    def get(self, op: str) -> dict:
        return self.engine._json("GET", f"/operations/{op}")

    def list(self, *, status: str | None = None, limit: int = 50) -> list[dict]:
        params = {"limit": limit, **({"status": status} if status else {})}
        return self.engine._json("GET", "/operations", params=params)

    def result(self, op: str):
        """The finished run's record with its full output, or None while it is not done."""
        rec = self.get(op)
        return _record(rec) if rec.get("status") in ("done", "cancelled") else None

    def stream(self, op: str, on_output) -> None:
        """Feed on_output(stream, bytes) from the operation's event stream until it ends."""
        with self.engine.http.stream("GET", f"/operations/{op}/events", timeout=None) as r:
            event, data = None, []
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data.append(line[6:])
                elif line == "" and event:
                    if event in ("stdout", "stderr"):
                        on_output(event, "\n".join(data).encode())
                    if event == "end":
                        return
                    event, data = None, []

    def close(self) -> None:
        pass


def _q(part: str) -> str:
    """One path segment (an id from the caller must not add segments)."""
    from urllib.parse import quote
    if not isinstance(part, str) or not part:
        raise errors.InvalidInput("an id must be a non-empty string")
    return quote(part, safe="")


def _record(op: dict) -> RunRecord:
    """A finished operation's JSON as the engine's RunRecord (exact bytes from base64)."""
    o = op.get("outcome") or {}
    if op.get("status") == "failed" and "error" in o:
        cls = ERRORS.get(o["error"], errors.SandtreeError)
        raise cls(o.get("message", "run failed"))
    return RunRecord(op["id"], op["source"], op.get("result"), o.get("exit_code"), o.get("signal"),
                     base64.b64decode(op.get("stdout_base64", "")), base64.b64decode(op.get("stderr_base64", "")),
                     o.get("stdout_truncated", False), o.get("stderr_truncated", False), o.get("timed_out", False),
                     o.get("oom_killed", False), o.get("usage", {}), o.get("cancelled", False))

