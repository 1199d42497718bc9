"""POST /api/v1/runs without FastAPI's per-request machinery, for a well-formed body only.

The busiest route of `sandtree serve` (many agents each running commands) paid, per request, for
the router trying route after route, the exception and exit-stack middlewares, dependency solving
and the body model's validation through FastAPI's wrappers. This ASGI middleware sits inside the
TenantGate and BodyLimit (the caller is known, its body capped and counted as before) and answers a
POST to exactly /api/v1/runs whose body is JSON (content-type application/json) that RunIn
validates: the same model, validated the way FastAPI does it (json.loads, then the model in
Python mode), then the same engine call (runs.run_answer). Anything else (another path or
method, another content type, a body that is not valid JSON or not a valid RunIn, a client gone
mid-body) goes on to FastAPI with the body replayed unchanged, so every refusal keeps FastAPI's
exact shape and status (422 with its fields) and changes nothing. Engine errors get the one error
shape through plumbing.error_response, as the app's handlers give it.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from ..errors import SandtreeError
from .plumbing import error_response
from .runs import RunIn

__all__ = ["QuickRuns", "RUNS_PATH"]

RUNS_PATH = "/api/v1/runs"


class QuickRuns:
    """answer: runs.run_answer(p), awaited with the validated RunIn."""

    def __init__(self, app, answer):
        self.app, self.answer = app, answer

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") != RUNS_PATH \
                or scope.get("root_path") or not _json_type(scope):
            return await self.app(scope, receive, send)
        messages = []
        try:
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request" or not message.get("more_body", False):
                    break
        except SandtreeError as exc:          # BodyLimit's TooLarge: 413, as the route's read would get
            return await error_response(exc)(scope, receive, send)
        body = _run_in(messages)
        if body is None:
            return await self.app(scope, _replay(messages, receive), send)
        try:
            response = await self.answer(body)
        except (SandtreeError, OSError) as exc:
            response = error_response(exc)
        await response(scope, receive, send)


def _json_type(scope) -> bool:
    """Content-Type application/json (parameters allowed): what FastAPI reads as JSON. Without one
    or with another, FastAPI's own rules apply (it goes on)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


def _run_in(messages: list) -> RunIn | None:
    if not messages or messages[-1]["type"] != "http.request" or messages[-1].get("more_body", False):
        return None                            # the client went away mid-body: FastAPI's affair
    raw = b"".join(m.get("body", b"") for m in messages)
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):       # (UnicodeDecodeError, JSONDecodeError, a 5,000-digit int: ValueErrors;
        return None                            # JSON nested ~1,000 deep: RecursionError): FastAPI's 400
    if not isinstance(obj, dict):
        return None
    try:
        return RunIn.model_validate(obj)
    except (ValidationError, RecursionError):
        return None


def _replay(messages: list, receive):
    """A receive that gives the messages already read, then the client's own."""
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()
    return replayed
