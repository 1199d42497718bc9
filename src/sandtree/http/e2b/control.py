"""E2B's control plane under /e2b (E2B_API_URL=http://HOST:PORT/e2b): the routes the `e2b` package's
REST client calls, each one engine call (or a few) as the caller's tenant sees it."""

from __future__ import annotations

from fastapi import APIRouter

PREFIX = "/e2b"


def control_router() -> APIRouter:
    router = APIRouter(prefix=PREFIX, tags=["e2b"])
    return router
