"""The bodies /api/v1 takes: one model per route, each refusing a field it does not name.

Every JSON body of the REST server is one of these (a list of FileIn for file sets); an unknown
field is a 422 invalid_input naming it (http/plumbing.py's handler), never taken silently. Their
defaults come from defaults.py, the same ones the SDK, the MCP tools and the CLI use.
"""

from __future__ import annotations

import base64
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .. import defaults as D, vocabulary
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


class RunOptionsIn(In):
    """What a run takes beside its image and command (a fork's runs take the same)."""
    env: dict[str, str] = {}
    cwd: str | None = Field(None, description="working directory (default: the image's WORKDIR, else /)")
    uid: int | None = Field(None, description="user id (default: the image's USER, else 0)")
    gid: int | None = None
    hostname: str = D.HOSTNAME
    files: list[FileIn] = []
    file_set: str | None = None
    disposable: bool = False
    timeout: float | None = None
    memory: str | int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk: str | int | None = None
    output: str | int | None = None
    tier: str | None = None
    labels: dict[str, str] = Field({}, description="names and values kept with the run (its operation's spec)")
    network: NetworkIn = Field(None, description=vocabulary.PARAMS["network"])
    secrets: SecretsIn = Field(None, description=vocabulary.PARAMS["secrets"])
    retries: int = Field(0, ge=0, le=D.RUN_RETRIES_MAX, description="on a cluster: run it again on another node "
                         "this many times at most if its node is lost before it committed")


class RunIn(RunOptionsIn):
    image: str = Field(description="an image ID, prefix, tag, or branch:NAME")
    command: str | list[str] = Field(description="a string runs in /bin/sh -c; a list is argv")
    stdin: str | None = None
    stdin_base64: str | None = Field(None, description="stdin as base64, for bytes that are not UTF-8")
    wait: bool = True


class ForkIn(RunOptionsIn):
    image: str = Field(description="an image ID, prefix, tag, or branch:NAME (resolved once; no run moves a branch)")
    commands: list[str | list[str]] = Field(description="one run each, all from the same image")
    parallel: int | None = Field(None, description="at most this many running at once (default: all)")


class StartIn(In):
    image: str = Field(description="an image ID, prefix, tag, or branch:NAME")
    env: dict[str, str] = {}
    cwd: str | None = Field(None, description="working directory (default: the image's WORKDIR, else /)")
    hostname: str = D.HOSTNAME
    files: list[FileIn] = []
    file_set: str | None = None
    idle_timeout: float = Field(D.SANDBOX_IDLE_TIMEOUT, description="seconds without a command before it is stopped")
    lifetime: float = Field(D.SANDBOX_LIFETIME, description="seconds until it is stopped in any case")
    idle_action: Literal["stop", "hibernate"] = Field("stop", description="what the idle timeout does: stop it, "
                                                       "or hibernate it (resume brings it back)")
    tier: str | None = Field(None, description="isolation tier (default: the server's; a token may force one)")
    timeout: float | None = Field(None, description="default seconds per command")
    memory: str | int | None = None
    pids: int | None = None
    cpus: float | None = None
    disk: str | int | None = None
    output: str | int | None = None
    labels: dict[str, str] = Field({}, description="names and values kept with the sandbox (list filters by them)")
    network: NetworkIn = Field(None, description=vocabulary.PARAMS["network"])
    secrets: SecretsIn = Field(None, description=vocabulary.PARAMS["secrets"])


class ExecIn(In):
    command: str | list[str] = Field(description="a string runs in the sandbox's shell session (cd and export "
                                                 "carry over); a list is a fresh process")
    env: dict[str, str] = {}
    cwd: str | None = None
    stdin: str | None = None
    stdin_base64: str | None = Field(None, description="stdin as base64, for bytes that are not UTF-8")
    uid: int | None = None
    gid: int | None = None
    timeout: float | None = None
    output: str | int | None = None


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
