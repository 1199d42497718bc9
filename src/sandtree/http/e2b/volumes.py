"""E2B's volumes under /e2b: the control plane's routes (Volume.create / list / get_info / destroy:
POST, GET /volumes, GET, DELETE /volumes/{volumeID}) and the volume content API (Volume's own client:
/volumecontent/{volumeID}/dir, /file, /path), each one row of the operation table (table/volumes.py)
called on the engine as the caller's tenant sees it. A volume's E2B ID is its name (names are per
tenant, as sandtree's are).

The content API's URL is E2B_VOLUME_API_URL (the SDK defaults it to https://api.<domain>), so a
client sets it to the same http://HOST:PORT/e2b as E2B_API_URL. The volume token E2B hands out is sent
back as `Authorization: Bearer`; sandtree has no per-volume tokens, so it is the caller's own API key
(the key that asked), which the server's gate accepts: it gives no one more than they had.

Sandbox.create's `volume_mounts` ([{name, path}]): the control plane passes it through start_volumes()
onto sandbox_start's `volumes`; wire.listed() answers a sandbox's back as volumeMounts.
"""

from __future__ import annotations

from datetime import datetime, timezone

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from ...errors import InvalidInput, SandtreeError
from ..gate import engine_for
from .wire import error_response

__all__ = ["PREFIX", "volumes_router", "start_volumes"]

PREFIX = "/e2b"


def start_volumes(mounts) -> list[dict] | None:
    """E2B's NewSandbox.volumeMounts ([{name, path}]) as sandbox_start's `volumes` (read-write, as E2B's)."""
    if not mounts:
        return None
    if not isinstance(mounts, list) or not all(isinstance(m, dict) for m in mounts):
        raise InvalidInput("volumeMounts is a list of {name, path}")
    return [{"name": m.get("name"), "path": m.get("path"), "readonly": False} for m in mounts]


def _token(request: Request) -> str:
    """The key the caller presented (its volume token: see the module doc)."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key", "") or "none"


def _volume(info: dict, request: Request | None = None) -> dict:
    out = {"volumeID": info["name"], "name": info["name"]}
    return {**out, "token": _token(request)} if request is not None else out


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat()


def _entry(e: dict) -> dict:
    """A volume entry (engine/volumes.py stat) as E2B's VolumeEntryStat."""
    out = {"name": e["name"], "type": e["type"] if e["type"] in ("file", "directory", "symlink") else "unknown",
           "path": e["path"], "size": e["size"], "mode": e["mode"], "uid": e["uid"], "gid": e["gid"],
           "atime": _time(e["atime"]), "mtime": _time(e["mtime"]), "ctime": _time(e["ctime"])}
    if e.get("target") is not None:
        out["target"] = e["target"]
    return out


def _answer(fn, status: int = 200):
    try:
        out = fn()
    except SandtreeError as exc:
        return error_response(exc)
    if status == 204:
        return Response(status_code=204)
    if isinstance(out, Response):
        return out
    return JSONResponse(out, status_code=status)


def volumes_router() -> APIRouter:
    # not in sandtree's OpenAPI: these are E2B's routes, with E2B's statuses and shapes (its own spec says them)
    router = APIRouter(prefix=PREFIX, tags=["e2b"], include_in_schema=False)

    # ---- the control plane (E2B_API_URL) --------------------------------------------------------------
    @router.post("/volumes", status_code=201)
    def create_volume(body: dict, request: Request, eng=Depends(engine_for)):
        return _answer(lambda: _volume(eng.volume_create(body.get("name") if isinstance(body, dict) else None),
                                       request), 201)

    @router.get("/volumes")
    def list_volumes(eng=Depends(engine_for)):
        return _answer(lambda: [_volume(v) for v in eng.volume_list()])

    @router.get("/volumes/{volume_id}")
    def get_volume(volume_id: str, request: Request, eng=Depends(engine_for)):
        return _answer(lambda: _volume(eng.volume_info(volume_id), request))

    @router.delete("/volumes/{volume_id}", status_code=204)
    def delete_volume(volume_id: str, eng=Depends(engine_for)):
        return _answer(lambda: eng.volume_delete(volume_id), 204)

    # ---- the volume content API (E2B_VOLUME_API_URL) ----------------------------------------------------
    content = "/volumecontent/{volume_id}"

    @router.get(content + "/dir")
    def list_dir(volume_id: str, path: str, depth: int = 1, eng=Depends(engine_for)):
        return _answer(lambda: [_entry(e) for e in eng.volume_ls(volume_id, path, depth=depth)])

    @router.post(content + "/dir", status_code=201)
    def make_dir(volume_id: str, path: str, uid: int = 0, gid: int = 0, mode: int = 0o755, force: bool = True,
                 eng=Depends(engine_for)):
        def go():
            eng.volume_mkdir(volume_id, path, mode=mode, uid=uid, gid=gid)
            return _entry(eng.volume_stat(volume_id, path))
        return _answer(go, 201)

    @router.get(content + "/path")
    def stat_path(volume_id: str, path: str, eng=Depends(engine_for)):
        return _answer(lambda: _entry(eng.volume_stat(volume_id, path)))

    @router.delete(content + "/path", status_code=204)
    def remove_path(volume_id: str, path: str, eng=Depends(engine_for)):
        return _answer(lambda: eng.volume_remove(volume_id, path), 204)

    @router.get(content + "/file")
    def read_file(volume_id: str, path: str, eng=Depends(engine_for)):
        return _answer(lambda: Response(eng.volume_read(volume_id, path), media_type="application/octet-stream"))

    @router.put(content + "/file", status_code=201)
    async def write_file(volume_id: str, request: Request, path: str = Query(...), uid: int = 0, gid: int = 0,
                         mode: int = 0o644, force: bool = True, eng=Depends(engine_for)):
        data = await request.body()

        def go():
            eng.volume_write(volume_id, path, data, mode=mode, uid=uid, gid=gid)
            return _entry(eng.volume_stat(volume_id, path))
        return await run_in_threadpool(_answer, go, 201)

    return router
