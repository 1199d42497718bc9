"""envd's HTTP /files: GET downloads a file of the sandbox (?path=, ?username=), POST uploads one or
several, as E2B's SDK sends them: multipart/form-data (a part named `file` each, its filename the
destination, or ?path= for a single one) or, from envd 0.5.7, the raw body as
application/octet-stream (?path=, optionally gzip Content-Encoding). Each file is sandbox_write's
(a new file renamed over the name, parents made, owned by the user); the answer is E2B's list of
{name, type, path}. Bodies are capped by http/bodylimit.py (the upload cap: serve --max-upload or
the tenant's), a gzip body's inflated size by the same cap; errors are E2B's {"code", "message"}."""

from __future__ import annotations

import asyncio
import posixpath
import zlib
from urllib.parse import quote

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ....errors import InvalidInput, MethodNotAllowed, SandtreeError, TooLarge
from ...bodylimit import CAP_KEY, DEFAULT_MAX_UPLOAD, upload_cap
from ...gate import current_engine
from ..dispatch import SANDBOX_KEY
from . import users
from .app import route

MAX_FILES = 1000            # parts of one multipart upload


@route("/files")
async def files(scope, receive, send):
    request = Request(scope, receive)
    try:
        if request.method == "GET":
            answer = await _download(request)
        elif request.method == "POST":
            answer = await _upload(request)
        else:
            raise MethodNotAllowed(f"/files takes GET and POST, not {request.method}")
    except SandtreeError as exc:
        answer = http_error(exc)
    await answer(scope, receive, send)


async def _user(engine, sid: str, request: Request) -> users.User:
    name = request.query_params.get("username") or users.basic_user(request.headers.get("authorization"))
    return await asyncio.to_thread(users.resolve, engine, sid, name)


async def _download(request: Request) -> Response:
    engine, sid = current_engine(), request.scope[SANDBOX_KEY][0]
    user = await _user(engine, sid, request)
    path = user.path(request.query_params.get("path") or "")
    data = await asyncio.to_thread(engine.sandbox_read, sid, path)   # (bounded by the engine's read limit)
    name = posixpath.basename(path)
    return Response(bytes(data), media_type="application/octet-stream",
                    headers={"Content-Disposition": f"inline; filename*=UTF-8''{_quote(name)}"})


async def _upload(request: Request) -> Response:
    engine, sid = current_engine(), request.scope[SANDBOX_KEY][0]
    if any(k.lower().startswith("x-metadata-") for k in request.headers.keys()):
        # refused, not dropped: the caller would believe its files carry it
        raise InvalidInput("file metadata (envd's extended attributes, metadata=) is not supported by sandtree")
    user = await _user(engine, sid, request)
    cap = request.scope.get(CAP_KEY) or upload_cap(request.scope, DEFAULT_MAX_UPLOAD)
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    given = request.query_params.get("path")
    written = []
    if kind == "multipart/form-data":
        try:
            form = await request.form(max_files=MAX_FILES, max_fields=MAX_FILES)
        except HTTPException as exc:                      # starlette's word on a malformed multipart body
            raise InvalidInput(f"malformed multipart upload: {exc.detail}") from None
        try:
            parts = [v for k, v in form.multi_items() if k == "file" and hasattr(v, "read")]
            if not parts:
                raise InvalidInput("no file in the upload (multipart parts named 'file')")
            for part in parts:
                dest = given if given and len(parts) == 1 else part.filename
                if not dest:
                    raise InvalidInput("a file of the upload has no path (its filename, or ?path= for one file)")
                written.append((user.path(dest), await part.read()))
        finally:
            await form.close()
    elif kind in ("application/octet-stream", ""):
        if not given:
            raise InvalidInput("an octet-stream upload needs ?path=")
        body = await request.body()
        if request.headers.get("content-encoding", "").lower() == "gzip":
            body = _gunzip(body, cap)
        written.append((user.path(given), body))
    else:
        raise InvalidInput(f"uploads are multipart/form-data or application/octet-stream, not {kind}")
    for path, data in written:
        await asyncio.to_thread(engine.sandbox_write, sid, path, data, uid=user.uid, gid=user.gid)
    return JSONResponse([{"name": posixpath.basename(p), "type": "file", "path": p} for p, _ in written])


def http_error(exc: SandtreeError) -> JSONResponse:
    """E2B's error body: {"code": <status>, "message"}."""
    return JSONResponse({"code": exc.http_status, "message": exc.message}, status_code=exc.http_status)


def _gunzip(body: bytes, cap: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, cap + 1)
    except zlib.error as exc:
        raise InvalidInput(f"the gzip body is not gzip: {exc}") from None
    if len(out) > cap or d.unconsumed_tail:
        raise TooLarge(f"the upload inflates past the {cap}-byte cap", limit=cap)
    return out


def _quote(name: str) -> str:
    return quote(name, safe="")
