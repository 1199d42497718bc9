"""E2B's wire shapes shared by the E2B routes: its error body {"code": <status>, "message": "..."} for a
sandtree error (each class says its own status: errors.py http_status). One place, so every E2B route
answers errors alike (other areas add their shapes here)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from ...errors import SandtreeError

__all__ = ["error_response"]


def error_response(exc: SandtreeError) -> JSONResponse:
    """E2B's error answer for a sandtree error: its status and message, never a 500 for bad input."""
    status = getattr(exc, "http_status", 500)
    return JSONResponse({"code": status, "message": str(exc)}, status_code=status)
