"""The remote engine: the operation table's methods, spoken over `sandtree serve`'s HTTP API.

`sandtree.connect(url)` builds the public API objects (Sandtree, Image, RunResult, Branch) on
this instead of an in-process Engine, so code written against the local engine runs unchanged
against a server. Every operation with an HTTP binding in sandtree/table/ becomes a method here
through one generic call (`_invoke`); only streams, tars and run bodies are written by hand.
Errors come back as the same exception classes, chosen from the one error table by the server's
error code (never by a name the other side sends).

This module loads the table, errors, models and httpx: no engine, no runtime.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import tarfile
import tempfile
from urllib.parse import quote

import httpx

from .. import errors, table
from .. import defaults as D
from ..defaults import Limits
from ..defaults import RunRecord

__all__ = ["RemoteEngine", "RemoteOperations", "run_body", "raise_for", "raise_error", "record"]


class _Data(dict):
    """A dict that answers to_dict(), as the engine's value objects do."""

    def to_dict(self) -> dict:
        return dict(self)


def _segment(value, keep_slashes: bool) -> str:
    """One path parameter (an id from the caller must not add segments; a ref may hold '/'; a port)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        raise errors.InvalidInput("an id or reference must be a non-empty string")
    return quote(value, safe="/" if keep_slashes else "")


def _path(http: table.Http, args: dict) -> str:
    out, rest = [], http.path
    while "{" in rest:
        head, rest = rest.split("{", 1)
        spec, rest = rest.split("}", 1)
        name, _, kind = spec.partition(":")
        out += [head, _segment(args[name], kind == "path")]
    return "".join(out + [rest])


def _wire(value):
    """JSON for a value the engine takes as bytes (file contents travel as text, exact bytes kept)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "surrogateescape")
    return value


def _answer(row: table.Op, r: httpx.Response):
    http = row.http
    if http.raw:
        return r.content
    if r.status_code == 204 or not r.content:
        return None
    body = r.json()
    if http.result is not None:
        body = body[http.result]
    if http.data:
        body = [_Data(x) for x in body] if isinstance(body, list) else _Data(body)
    return body


def _unavailable(row: table.Op):
    def method(self, *args, **kwargs):
        row.bind(*args, **kwargs)                       # a wrong call is still a TypeError first
        raise errors.RuntimeUnavailable(f"{row.name} is in-process only ({row.local})")
    return method


def _generic(row: table.Op):
    def method(self, *args, **kwargs):
        return self._invoke(row, row.bind(*args, **kwargs))
    return method


def _install(cls, rows: dict) -> None:
    """Give `cls` a method per row it does not write by hand, with the row's signature and doc."""
    for name, row in rows.items():
        if row.custom_remote or name in cls.__dict__:
            continue
        fn = _generic(row) if row.http is not None else _unavailable(row)
        fn.__name__, fn.__qualname__ = row.name, f"{cls.__name__}.{row.name}"
        fn.__doc__ = row.doc
        fn.__signature__ = row.signature.replace(
            parameters=[_SELF] + list(row.signature.parameters.values()))
        setattr(cls, row.name, fn)


_SELF = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _declared(name: str):
    """A hand-written method shows its row's signature and doc (it binds its arguments by it)."""
    row = table.OPS[name]

    def deco(fn):
        fn.__signature__ = row.signature.replace(parameters=[_SELF] + list(row.signature.parameters.values()))
        fn.__doc__ = row.doc
        return fn
    return deco


class RemoteEngine:
    def __init__(self, url: str, token: str | None = None, timeout: float = 600):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url + "/api/v1", headers=headers, timeout=timeout)
        self.default_limits = Limits()
        self._ops = RemoteOperations(self)

    # ---- plumbing -------------------------------------------------------------------------------
    def request(self, method: str, path: str, **kw) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise errors.SandtreeError(f"cannot reach {self.url}: {exc}") from None
        if r.status_code >= 400:
            raise_for(r)
        return r

    def _invoke(self, row: table.Op, args: dict):
        """One table operation over HTTP: path, query, JSON body or raw content from the row."""
        http = row.http
        sent = {k: v for k, v in args.items() if k not in http.drop}
        kw = {}
        # a dict in a query (labels) travels as repeated NAME=K=V parameters
        query = {http.rename.get(k, k): ([f"{a}={b}" for a, b in sent[k].items()] if isinstance(sent[k], dict)
                                         else sent[k]) for k in http.query if sent.get(k) is not None}
        # None is "not given" (the server's default), except for a parameter with no default,
        # where it is the value itself (set_network(None): no network): it travels as null
        given = {k for k, p in row.signature.parameters.items() if p.default is inspect.Parameter.empty}
        body = {http.rename.get(k, k): _wire(sent[k]) for k in http.body
                if sent.get(k) is not None or (k in sent and k in given)}
        extra = {k: v for k, v in sent.items() if k not in _named(row) and v is not None}
        if extra:                                        # **options of the row (grep's flags, ...)
            (body if http.body else query).update(extra)
        if http.method == "GET":
            query.update(http.const)
        else:
            body.update(http.const)
        if query:
            kw["params"] = query
        if http.whole_body is not None:
            kw["json"] = [{k: _wire(v) for k, v in dict(f).items()} for f in sent[http.whole_body]]
        elif http.content is not None:
            data = sent[http.content]
            kw["content"] = data.encode() if isinstance(data, str) else bytes(data)
        elif body or http.method in ("PUT",) or http.const:
            kw["json"] = body
        return _answer(row, self.request(http.method, _path(http, sent), **kw))

    def close(self) -> None:
        self.http.close()

    @property
    def home(self) -> str:
        return self.url

    @property
    def operations(self):
        return self._ops

    # ---- written by hand: bodies and streams the table cannot describe -----------------------------
    def import_path(self, path: str, *, tag: str | None = None, progress=None) -> str:
        """A local directory is sent as a tar; a file (tar, OCI or docker archive) as it is."""
        params = {"tag": tag} if tag else None
        if os.path.isdir(path):
            with tempfile.TemporaryFile() as f:
                with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
                    t.add(path, arcname=".")
                f.seek(0)
                return self.request("POST", "/images/import", params=params, content=f.read()).json()["image"]
        if not os.path.exists(path):
            raise errors.NotFound(f"no such file or directory: {path}")
        with open(path, "rb") as f:
            return self.request("POST", "/images/import", params=params, content=f.read()).json()["image"]

    def export_tar(self, image: str, fileobj, path: str = "/") -> None:
        with self.http.stream("GET", f"/images/{_segment(image, True)}/export", params={"path": path},
                              timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                raise_for(r)
            for chunk in r.iter_bytes():
                fileobj.write(chunk)

    def export_oci(self, image: str, fileobj, *, name: str | None = None) -> dict:
        params = {"name": name} if name is not None else {}
        with self.http.stream("GET", f"/images/{_segment(image, True)}/oci", params=params, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                raise_for(r)
            for chunk in r.iter_bytes():
                fileobj.write(chunk)
            return json.loads(r.headers["x-sandtree-oci"])

    # ---- builds: a context tar up, progress and the result down as Server-Sent Events ---
    @_declared("build_context")
    def build_context(self, context, **options):
        a = table.OPS["build_context"].bind(context, **options)
        progress = a.pop("progress")
        params = {"dockerfile": a["dockerfile"], "text": a["text"], "tag": a["tag"], "target": a["target"],
                  "no_cache": "true" if a["no_cache"] else None,
                  "build_arg": [f"{k}={v}" for k, v in (a["build_args"] or {}).items()],
                  "no_cache_filter": [str(f) for f in a["no_cache_filter"] or ()],
                  "network": a["network"] if a["network"] is None or isinstance(a["network"], str)
                  else json.dumps(getattr(a["network"], "to_json", lambda: a["network"])())}
        params = {k: v for k, v in params.items() if v not in (None, [])}
        with tempfile.TemporaryFile() as f:
            if context is not None and os.path.isdir(context):
                with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as t:
                    t.add(context, arcname=".", filter=_context_member)
            elif context is not None:
                with open(context, "rb") as src:
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
            f.seek(0)
            return self._build_stream(params, _chunks(f), progress)

    def _build_stream(self, params: dict, body, progress):
        with self.http.stream("POST", "/builds", params=params, content=body, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                raise_for(r)
            event = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    if event == "progress" and progress is not None:
                        if "output_base64" in data:
                            data["output"] = base64.b64decode(data.pop("output_base64"))
                        progress(data)
                    elif event == "result":
                        return _Build(data)
                    elif event == "error":
                        raise_error(data)
        raise errors.SandtreeError(f"{self.url}: the build stream ended without a result")

    @_declared("image_config")
    def image_config(self, ref):
        """The image's OCI config object (Env, WorkingDir, User, Entrypoint, Cmd, ExposedPorts, Labels)."""
        return _Data(self.request("GET", f"/images/{_segment(ref, True)}/config").json()["config"])

    @_declared("configure")
    def configure(self, ref, config, *, tag=None) -> str:
        oci = config.to_oci() if hasattr(config, "to_oci") else dict(config)
        return self.request("POST", f"/images/{_segment(ref, True)}/configure",
                            json={"config": oci, "tag": tag}).json()["image"]

    @_declared("run")
    def run(self, ref, command, **options) -> RunRecord:
        args = table.OPS["run"].bind(ref, command, **options)
        on_output = args.pop("on_output")
        args.pop("cancel")
        body = run_body(args)
        if on_output is None:
            return record(self.request("POST", "/runs", json={**body, "wait": True}).json())
        op = self.request("POST", "/runs", json={**body, "wait": False}).json()["id"]
        self._ops.stream(op, on_output)
        return record(self.request("POST", f"/operations/{op}/wait", params={"timeout": D.WAIT_MAX}).json())

    @_declared("fork")
    def fork(self, ref, commands, **options) -> list[RunRecord]:
        args = table.OPS["fork"].bind(ref, commands, **options)
        body = run_body(args)
        return [record(op) for op in self.request("POST", "/fork", json=body).json()]

    @_declared("sandbox_start")
    def sandbox_start(self, ref, **options) -> dict:
        body = run_body(table.OPS["sandbox_start"].bind(ref, **options))
        return self.request("POST", "/sandboxes", json=body).json()

    @_declared("sandbox_exec")
    def sandbox_exec(self, sid, command, **options) -> RunRecord:
        args = table.OPS["sandbox_exec"].bind(sid, command, **options)
        on_output = args.pop("on_output")
        args.pop("cancel")
        body = run_body({k: v for k, v in args.items() if k != "sid"})
        path = f"/sandboxes/{_segment(sid, False)}/exec"
        if on_output is None:
            return record(self.request("POST", path, json=body).json())
        # live output: the server streams the command's bytes as they come, then its result
        with self.http.stream("POST", path, params={"stream": "true"}, json=body, timeout=None) as r:
            if r.status_code >= 400:
                r.read()
                raise_for(r)
            event = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event in ("stdout", "stderr"):
                    on_output(event, base64.b64decode(line[6:]))
                elif line.startswith("data: ") and event == "end":
                    return record(json.loads(line[6:]))
                elif line.startswith("data: ") and event == "error":
                    raise_error(json.loads(line[6:]))
        raise errors.SandtreeError(f"{self.url}: the exec stream ended without a result")


class RemoteOperations:
    """engine.operations over HTTP: runs submitted now, awaited later."""

    def __init__(self, engine: RemoteEngine):
        self.engine = engine
        self._invoke = engine._invoke

    def submit_run(self, ref: str, command, **options) -> str:
        args = table.OPS["run"].bind(ref, command, **options)
        for k in ("on_output", "cancel"):
            if args.pop(k) is not None:
                raise errors.InvalidInput(f"{k} cannot travel with a submitted run (stream its events)")
        return self.engine.request("POST", "/runs", json={**run_body(args), "wait": False}).json()["id"]

    def wait(self, ops: list[str], timeout: float | None = None) -> list[dict]:
        return [self.engine.request("POST", f"/operations/{_segment(op, False)}/wait",
                                    params={"timeout": D.WAIT_MAX if timeout is None else timeout}).json()
                for op in ops]

    def result(self, op: str):
        """The finished run's record with its full output, or None while it is not done."""
        rec = self.get(op)
        return record(rec) if rec.get("status") in ("done", "cancelled") else None

    def stream(self, op: str, on_output) -> None:
        """Feed on_output(stream, bytes) from the operation's event stream until it ends."""
        with self.engine.http.stream("GET", f"/operations/{_segment(op, False)}/events", timeout=None) as r:
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


_install(RemoteEngine, table.ENGINE_OPS)
_install(RemoteOperations, table.OPERATIONS_OPS)


class _Build(_Data):
    """A BuildResult as the server sent it: .image, .steps (each .index, .text, .cached, .image, ...)."""

    def __init__(self, data: dict):
        super().__init__(data)
        self.image = data["image"]
        self.steps = tuple(_Step(s) for s in data["steps"])


class _Step(_Data):
    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _chunks(f):
    while chunk := f.read(1 << 20):
        yield chunk


def _context_member(info: tarfile.TarInfo):
    """A local context as the server takes it: files, directories, symlinks (no device, no FIFO)."""
    return info if info.isfile() or info.isdir() or info.issym() or info.islnk() else None


def _named(row: table.Op) -> set[str]:
    http = row.http
    named = set(http.query) | set(http.body) | {http.content, http.whole_body} | set(http.drop)
    return named | {seg.split("}")[0].split(":")[0] for seg in http.path.split("{")[1:]}


def run_body(args: dict) -> dict:
    """A run's (or a sandbox's, or an exec's) arguments as the server's JSON body: the image as
    `image`, stdin as text or (bytes that are not UTF-8) base64, file contents as text."""
    body = {("image" if k == "ref" else k): v for k, v in args.items() if v is not None}
    stdin = body.pop("stdin", None)
    if isinstance(stdin, (bytes, bytearray)):
        try:
            body["stdin"] = bytes(stdin).decode("utf-8")
        except UnicodeDecodeError:                     # exact bytes travel as base64
            body["stdin_base64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        body["stdin"] = stdin
    if "files" in body:
        body["files"] = [{k: _wire(v) for k, v in dict(f).items()} for f in body["files"]]
    return body


def raise_for(r: httpx.Response):
    try:
        body = r.json()
    except ValueError:
        body = {"error": "error", "message": r.text[:500]}
    if not isinstance(body, dict) or "error" not in body:
        raise errors.InvalidInput(f"rejected by the server: {json.dumps(body)[:500]}")
    raise_error(body)


def raise_error(body: dict):
    cls = errors.ERRORS.get(body.get("error"), errors.SandtreeError)
    details = {k: v for k, v in body.items() if k not in ("error", "message")}
    raise cls(body.get("message", "error"), **details)


def record(op: dict) -> RunRecord:
    """A finished operation's JSON as the engine's RunRecord (exact bytes from base64)."""
    o = op.get("outcome") or {}
    if op.get("status") == "failed" and "error" in o:
        cls = errors.ERRORS.get(o["error"], errors.SandtreeError)
        raise cls(o.get("message", "run failed"))
    return RunRecord(op["id"], op["source"], op.get("result"), o.get("exit_code"), o.get("signal"),
                     base64.b64decode(op.get("stdout_base64", "")), base64.b64decode(op.get("stderr_base64", "")),
                     o.get("stdout_truncated", False), o.get("stderr_truncated", False), o.get("timed_out", False),
                     o.get("oom_killed", False), o.get("usage", {}), o.get("cancelled", False))
