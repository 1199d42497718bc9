"""What the bodies /api/v1 takes are made of: In (a model refusing a field it does not name), a file of a run
(FileIn), the network and secrets values, and stdin as text or base64.

Each route's body model is made from its row by http/derived.py (on In: an unknown field is a 422 invalid_input
naming it, http/plumbing.py's handler, never taken silently); their defaults are the rows', from defaults.py, the
same ones the SDK, the MCP tools and the CLI use.
"""

from __future__ import annotations

import base64

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import InvalidInput
from ..values import not_utf8


def utf8_only(value):
    """A body's text must be UTF-8 (values.not_utf8): a lone surrogate is refused, 422."""
    if not_utf8(value) is not None:
        raise ValueError("text must be valid Unicode (a lone surrogate escape such as \\ud800 is not)")
    return value


class In(BaseModel):
    """A request body: a field the model does not name is refused (`"timout": 5` was taken
    silently, with the default timeout), not ignored; text that is not Unicode is refused."""
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _utf8(cls, v):
        return utf8_only(v)


class FileIn(In):
    path: str
    sha256: str | None = Field(None, description="an upload's sha256 (POST /files)")
    content: str | None = Field(None, description="text content, instead of sha256")
    mode: int = 0o644
    uid: int = 0
    gid: int = 0


# network=: off/all/inherit or a comma list (text), true/false, a rule list, {allow_out, deny_out}
NetworkIn = bool | str | list[str] | dict[str, list[str] | None] | None
# secrets=: NAME -> {value | stored, hosts}, or a list of stored secrets' names
SecretsIn = dict[str, dict[str, bool | str | list[str]]] | list[str] | None


def stdin_bytes(body) -> bytes | None:
    """A run's or exec's stdin: text, or base64 for bytes that are not UTF-8 (one, not both)."""
    if body.stdin_base64 is not None:
        if body.stdin is not None:
            raise InvalidInput("give stdin or stdin_base64, not both")
        try:
            return base64.b64decode(body.stdin_base64, validate=True)
        except ValueError:
            raise InvalidInput("stdin_base64 is not valid base64") from None
    return body.stdin.encode("utf-8", "surrogateescape") if body.stdin is not None else None
