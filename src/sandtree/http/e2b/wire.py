"""E2B's wire shapes shared by its areas: the error body of E2B's HTTP answers,
{"code": <status>, "message": "..."}, with the status of sandtree's error (errors.py's table)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ...errors import SandtreeError


def error_response(exc: SandtreeError) -> JSONResponse:
    """A sandtree error as E2B answers one: its status, {"code", "message"}."""
    return JSONResponse({"code": exc.http_status, "message": exc.message}, status_code=exc.http_status)
