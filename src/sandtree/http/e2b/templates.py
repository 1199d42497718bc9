"""E2B's templates under /e2b: the `e2b` package's Template.build (its template builder, or a
Dockerfile it parses itself into the same steps) becomes a sandtree build (docs/builds.md): the
steps are written as a Dockerfile, the files its COPY steps uploaded are its context, and the
result is tagged with the template's name (E2B's alias). Its start and ready commands are kept as
labels of the image; a sandbox created from it runs the start command in the background and
waits until the ready command succeeds (control.py).

    POST /v3/templates                        a build is requested: a template ID and a build ID
    GET  /templates/{id}/files/{hash}         where to upload a COPY step's files (present: already)
    PUT  /templates/{id}/files/{hash}         the upload (a tar, gzip or not, as the SDK makes it)
    POST /v2/templates/{id}/builds/{build}    the steps: the build starts (in the background)
    GET  /templates/{id}/builds/{build}/status   its state and log lines since logsOffset
    GET  /templates/aliases/{alias}           whether a template (a tag) of that name exists
    POST|DELETE /templates/tags, GET /templates/{id}/tags    its `name:tag` tags

Builds and uploads in flight are this server process's (a restart forgets them: the SDK's build
then fails and is retried); what a build makes is an image and a tag of the caller's tenant."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import threading
import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ... import config
from ... import defaults as D
from ...errors import InvalidInput, NotFound, SandtreeError
from ..gate import engine_for
from . import wire

START_LABEL = "sandtree.e2b.start_cmd"
READY_LABEL = "sandtree.e2b.ready_cmd"
_HASH = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[0-9a-f]{32}$")


def _who(engine) -> str:
    """The caller's tenant (builds and uploads are answered only to it)."""
    t = getattr(engine, "tenant", None)
    return getattr(t, "name", None) or "local"


class _Build:
    def __init__(self, tenant: str, template_id: str, name: str):
        self.tenant, self.template_id, self.name = tenant, template_id, name
        self.id = uuid.uuid4().hex
        self.status = "waiting"                # waiting (for its steps), building, ready, error
        self.logs: list[dict] = []
        self.reason: dict | None = None
        self.image: str | None = None
        self.lock = threading.Lock()

    def log(self, message: str, level: str = "info") -> None:
        with self.lock:
            self.logs.append({"timestamp": wire.when(time.time()), "level": level, "message": message})


def dockerfile(body: dict, uploaded) -> str:
    """E2B's build steps (TemplateBuildStartV2) as a Dockerfile; `uploaded(hash)` -> the directory
    of the context holding that COPY step's files. InvalidInput for a step it cannot say."""
    base = body.get("fromTemplate") or body.get("fromImage")
    if not isinstance(base, str) or not base.strip():
        raise InvalidInput("a template needs a base: fromTemplate (a template: an image tag or ID) or fromImage")
    if body.get("fromImageRegistry"):
        raise InvalidInput("fromImageRegistry: private registries' credentials are the server's "
                           "(`sandtree registry login`), not a build's")
    lines, user = [f"FROM {base.strip()}"], None
    for i, step in enumerate(body.get("steps") or []):
        kind, args = (step or {}).get("type"), [str(a) for a in ((step or {}).get("args") or [])]
        if kind == "RUN" and args:
            as_user = args[1] if len(args) > 1 and args[1] else None
            if as_user:
                lines.append(f"USER {as_user}")
            lines.append("RUN " + json.dumps(["/bin/sh", "-c", args[0]]))
            if as_user:
                lines.append(f"USER {user or 'root'}")
        elif kind == "ENV" and len(args) >= 2 and len(args) % 2 == 0:
            lines.append("ENV " + " ".join(f"{k}={json.dumps(v)}" for k, v in zip(args[::2], args[1::2])))
        elif kind == "WORKDIR" and args:
            lines.append(f"WORKDIR {json.dumps(args[0])}")
        elif kind == "USER" and args:
            user = args[0]
            lines.append(f"USER {user}")
        elif kind == "COPY" and len(args) >= 2 and step.get("filesHash"):
            src, dest = args[0], args[1]
            owner = args[2] if len(args) > 2 and args[2] else None
            mode = args[3] if len(args) > 3 and args[3] else None
            flags = (f"--chown={owner} " if owner else "") + (f"--chmod={mode} " if mode else "")
            here = uploaded(step["filesHash"])
            lines.append(f"COPY {flags}" + json.dumps([f"{here}/{_rel(src) or '.'}", dest]))
        else:
            raise InvalidInput(f"step {i + 1}: {kind!r} with {len(args)} argument(s) is not a step this server builds")
    labels = {START_LABEL: body.get("startCmd"), READY_LABEL: body.get("readyCmd")}
    said = {k: v for k, v in labels.items() if isinstance(v, str) and v.strip()}
    if said:
        lines.append("LABEL " + " ".join(f"{k}={json.dumps(v)}" for k, v in said.items()))
    return "\n".join(lines) + "\n"


def start_commands(engine, info: dict) -> None:
    """A sandbox just created from a template with a start command: it runs in the background, and
    the sandbox is answered once the ready command exits 0 (at most E2B_READY_TIMEOUT seconds;
    else the sandbox is stopped and the create fails with the ready command's output)."""
    labels = dict(engine.image_config(info["image"]).labels)
    start, ready = labels.get(START_LABEL), labels.get(READY_LABEL)
    if not start:
        return
    engine.sandbox_spawn(info["id"], start)
    if not ready:
        return
    end = time.monotonic() + D.E2B_READY_TIMEOUT
    while True:
        r = engine.sandbox_exec(info["id"], ready, timeout=max(1.0, min(30.0, end - time.monotonic())))
        if r.exit_code == 0:
            return
        if time.monotonic() > end:
            engine.sandbox_stop(info["id"])
            out = (r.stdout + r.stderr)[-500:].decode("utf-8", "replace")
            raise InvalidInput(f"the template's ready command {ready!r} did not succeed within "
                               f"{D.E2B_READY_TIMEOUT:g} s (last exit code {r.exit_code}): {out!r}")
        time.sleep(0.2)


def templates_router(prefix: str) -> APIRouter:
    router = APIRouter(prefix=prefix, tags=["e2b"], route_class=wire.E2BRoute, include_in_schema=False)
    builds: dict[str, _Build] = {}
    lock = threading.Lock()
    made: list[str] = []

    def uploads_dir() -> str:
        """Made at the first upload (0700: the server's alone)."""
        with lock:
            if not made:
                made.append(tempfile.mkdtemp(prefix="sandtree-e2b-uploads-"))
            return made[0]

    def upload_path(tenant: str, files_hash: str) -> str:
        if not _HASH.match(files_hash or ""):
            raise InvalidInput("a files hash is 64 hex digits")
        who = hashlib.sha256(tenant.encode()).hexdigest()[:16]
        return os.path.join(uploads_dir(), f"{who}-{files_hash}.tar")

    def build_of(engine, template_id: str, build_id: str) -> _Build:
        b = builds.get(build_id)
        if b is None or b.tenant != _who(engine) or b.template_id != template_id:
            raise NotFound(f"build {build_id!r} of template {template_id!r} not found")
        return b

    @router.post("/v3/templates", status_code=202)
    async def request_build(request: Request) -> JSONResponse:
        engine = engine_for(request)
        body = await _json(request)
        name = body.get("name") or body.get("alias")
        if not isinstance(name, str) or not name.strip():
            raise InvalidInput("a template needs a name")
        tags = [t for t in (body.get("tags") or []) if isinstance(t, str)]
        b = _Build(_who(engine), uuid.uuid4().hex, name.strip())
        b.tags = tags
        with lock:
            builds[b.id] = b
        names = [b.name] + [f"{b.name}:{t}" for t in tags]
        return JSONResponse({"templateID": b.template_id, "buildID": b.id, "public": False, "names": names,
                             "tags": tags, "aliases": [b.name]}, status_code=202)

    @router.get("/templates/{template_id}/files/{files_hash}", status_code=201)
    async def file_link(template_id: str, files_hash: str, request: Request) -> JSONResponse:
        engine = engine_for(request)
        path = upload_path(_who(engine), files_hash)
        url = str(request.url)          # the same path, PUT: the caller's key goes with it (headers)
        key = request.headers.get("x-api-key")
        auth = request.headers.get("authorization")
        headers = {"X-API-Key": key} if key else {"Authorization": auth} if auth else {}
        return JSONResponse({"present": os.path.exists(path), "url": url, "headers": headers}, status_code=201)

    @router.put("/templates/{template_id}/files/{files_hash}")
    async def file_upload(template_id: str, files_hash: str, request: Request) -> Response:
        engine = engine_for(request)
        path = upload_path(_who(engine), files_hash)
        tmp = path + f".{uuid.uuid4().hex}.part"
        with open(tmp, "wb") as f:
            async for chunk in request.stream():
                f.write(chunk)
        os.replace(tmp, path)
        return Response(status_code=200)

    @router.post("/v2/templates/{template_id}/builds/{build_id}", status_code=202)
    async def start_build(template_id: str, build_id: str, request: Request) -> Response:
        engine = engine_for(request)
        b = build_of(engine, template_id, build_id)
        body = await _json(request)
        if b.status != "waiting":
            raise InvalidInput(f"build {build_id} was started already")
        workdir = tempfile.mkdtemp(prefix="ctx-", dir=uploads_dir())
        try:
            context = os.path.join(workdir, "context.tar")
            used: list[str] = []

            def uploaded(files_hash: str) -> str:
                if not os.path.exists(upload_path(b.tenant, files_hash)):
                    raise InvalidInput(f"the files of hash {files_hash[:12]}... were not uploaded")
                used.append(files_hash)
                return f"h{files_hash[:32]}"
            text = dockerfile(body, uploaded)
            _context(context, [(f"h{h[:32]}", upload_path(b.tenant, h)) for h in dict.fromkeys(used)])
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        b.status = "building"
        b.log(f"building {b.name} ({len(body.get('steps') or [])} steps)")
        policy = config.network_default()
        net = None if policy.strip().lower() in ("off", "none", "") else policy

        def run():
            try:
                res = engine.build_context(context, text=text, tag=b.name, network=net,
                                           no_cache=bool(body.get("force")), progress=lambda ev: _progress(b, ev))
                b.image = res.image
                for t in getattr(b, "tags", []):
                    engine.tag(res.image, f"{b.name}:{t}")
                b.log(f"built {res.image}")
                b.status = "ready"
            except SandtreeError as exc:
                b.log(exc.message, "error")
                b.reason, b.status = {"message": exc.message}, "error"
            except Exception as exc:                     # noqa: BLE001 - the build's answer, not a 500
                b.log(f"{type(exc).__name__}: {exc}", "error")
                b.reason, b.status = {"message": f"the build failed: {exc}"}, "error"
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        threading.Thread(target=run, name=f"e2b-build-{b.id[:8]}", daemon=True).start()
        return Response(status_code=202)

    @router.get("/templates/{template_id}/builds/{build_id}/status")
    async def build_status(template_id: str, build_id: str, request: Request, logsOffset: int = 0,
                           limit: int = 100) -> dict:
        b = build_of(engine_for(request), template_id, build_id)
        with b.lock:
            status = b.status
            entries = b.logs[max(0, logsOffset):max(0, logsOffset) + max(1, min(limit, 100))]
        out = {"templateID": b.template_id, "buildID": b.id, "status": status, "logEntries": entries,
               "logs": [e["message"] for e in entries]}
        if status == "error" and b.reason:
            out["reason"] = b.reason
        return out

    # ---- tags: a template's `name:tag` names are sandtree tags of its image ------------------------
    @router.post("/templates/tags", status_code=201)
    async def assign_tags(request: Request) -> JSONResponse:
        engine, body = engine_for(request), await _json(request)
        target, tags = body.get("target"), body.get("tags")
        if not isinstance(target, str) or not target or not isinstance(tags, list) or not tags \
                or not all(isinstance(t, str) and t and ":" not in t for t in tags):
            raise InvalidInput('tags are {"target": "name[:tag]", "tags": ["tag", ...]}')
        name = _name(target)

        def assign():
            image = engine.resolve(target)
            for t in tags:
                engine.tag(image, f"{name}:{t}")
            return image
        image = await asyncio.to_thread(assign)
        return JSONResponse({"tags": tags, "buildID": _build_id(image)}, status_code=201)

    @router.delete("/templates/tags", status_code=204)
    async def remove_tags(request: Request) -> Response:
        engine, body = engine_for(request), await _json(request)
        name, tags = body.get("name"), body.get("tags")
        if not isinstance(name, str) or not name or not isinstance(tags, list) \
                or not all(isinstance(t, str) and t for t in tags):
            raise InvalidInput('removing tags is {"name": "name", "tags": ["tag", ...]}')

        def remove():
            have = engine.tags()
            missing = [t for t in tags if f"{_name(name)}:{t}" not in have]
            if missing:
                raise NotFound(f"template {name!r} has no tag {missing[0]!r}")
            for t in tags:
                engine.untag(f"{_name(name)}:{t}")
        await asyncio.to_thread(remove)
        return Response(status_code=204)

    @router.get("/templates/{template_id}/tags")
    async def template_tags(template_id: str, request: Request) -> list:
        engine = engine_for(request)
        name = _name(template_id)

        def listing():
            have = engine.tags()
            if name not in have and not any(t.startswith(name + ":") for t in have):
                raise NotFound(f"template {template_id!r} not found")
            out = []
            for tag, image in sorted(have.items()):
                if tag.startswith(name + ":"):
                    created = engine.image_info(image).get("created") or 0
                    out.append({"tag": tag.split(":", 1)[1], "buildID": _build_id(image),
                                "createdAt": wire.when(created)})
            return out
        return await asyncio.to_thread(listing)

    @router.get("/templates/aliases/{alias:path}")
    async def alias(alias: str, request: Request) -> dict:
        engine = engine_for(request)
        try:
            image = await asyncio.to_thread(engine.resolve, alias)
        except NotFound:
            raise NotFound(f"template {alias!r} not found") from None
        return {"templateID": image, "public": False}

    return router


def _progress(b: _Build, ev: dict) -> None:
    text = ev.get("text") or ""
    status = ev.get("status") or ""
    out = ev.get("output")
    if text:
        b.log(f"[{ev.get('step', '?')}/{ev.get('total', '?')}] {text} {status}".rstrip())
    if out:
        for line in (out if isinstance(out, str) else out.decode("utf-8", "replace")).splitlines()[-50:]:
            b.log(line)


def _context(path: str, parts: list[tuple[str, str]]) -> None:
    """One context tar: each upload's files under its own directory (a COPY step names it)."""
    with tarfile.open(path, "w") as out:
        for directory, upload in parts:
            with open(upload, "rb") as f:
                head = f.read(2)
            opener = gzip.open if head == b"\x1f\x8b" else open
            with opener(upload, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tin:
                for m in tin:
                    name = _rel(m.name)
                    if not name or ".." in name.split("/") or m.isdev():
                        continue
                    m.name = f"{directory}/{name}"
                    if m.islnk():
                        m.linkname = f"{directory}/{_rel(m.linkname)}"
                    out.addfile(m, tin.extractfile(m) if m.isfile() else None)


def _name(ref: str) -> str:
    """A template's name without its tag ("name:tag" -> "name")."""
    return ref.split(":", 1)[0]


def _build_id(image: str) -> str:
    """E2B's buildID is a UUID: the image ID's first 128 bits (one build, one image)."""
    return str(uuid.UUID(image[:32]))


def _rel(name: str) -> str:
    """A path of the context as the SDK wrote it (relative; "./x" is "x")."""
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


async def _json(request: Request) -> dict:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise InvalidInput("the body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidInput("the body is a JSON object")
    return body
