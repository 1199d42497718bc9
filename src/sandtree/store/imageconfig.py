"""An image's run configuration: the environment, working directory, user, entrypoint,
command, exposed ports and labels that a Dockerfile's ENV/WORKDIR/USER/ENTRYPOINT/CMD/EXPOSE/LABEL set
and an OCI image's config carries.

It lives *in the image*, as the file CONFIG_PATH (canonical JSON, mode 0644, owned by 0:0), so the
image ID stays its root tree's hash and "same state, same ID" holds for configuration too: two builds
that set the same ENV on the same files get the same ID, diff and merge see a config change as the
change of one file, and commit-while-running keeps it. An image without the file has the empty
config (today's defaults). Docker's /.dockerenv is the precedent for a marker at the root. OCI export
strips the file from the layers and writes its content as the OCI config; import writes it back, so
a push and a pull give the same ID.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..errors import InvalidInput

__all__ = ["ImageConfig", "CONFIG_PATH", "MAX_CONFIG_BYTES"]

CONFIG_PATH = "/.sandtree/config.json"
MAX_CONFIG_BYTES = 1 << 20        # a config larger than this is refused (env and labels are small)


def _str_pairs(value, what: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    items = value.items() if isinstance(value, dict) else value
    out = []
    for item in items:
        if isinstance(item, str):                       # "K=V" as OCI and Docker write them
            k, sep, v = item.partition("=")
            if not sep:
                raise InvalidInput(f"{what} entry {item!r} is not NAME=VALUE")
            item = (k, v)
        if not (isinstance(item, (tuple, list)) and len(item) == 2
                and all(isinstance(x, str) and "\0" not in x for x in item)) or not item[0]:
            raise InvalidInput(f"bad {what} entry {item!r}")
        out.append((item[0], item[1]))
    seen: dict[str, str] = {}
    for k, v in out:                                   # later wins, first position kept (Docker's ENV)
        seen[k] = v
    return tuple(seen.items())


def _argv(value, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(a, str) and "\0" not in a for a in value):
        raise InvalidInput(f"{what} is a list of strings")
    return tuple(value)


@dataclass(frozen=True)
class ImageConfig:
    env: tuple[tuple[str, str], ...] = ()     # ordered NAME, VALUE (applied over DEFAULT_ENV)
    cwd: str | None = None                    # absolute; None: "/"
    user: str | None = None                   # "NAME|UID[:GROUP|GID]" resolved in the image's /etc/passwd
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    expose: tuple[str, ...] = ()              # "8080/tcp"
    labels: tuple[tuple[str, str], ...] = ()
    extra: tuple[tuple[str, str], ...] = field(default=())   # other OCI config keys kept verbatim (JSON text)

    def __post_init__(self):
        object.__setattr__(self, "env", _str_pairs(self.env, "env"))
        object.__setattr__(self, "labels", _str_pairs(self.labels, "label"))
        object.__setattr__(self, "entrypoint", _argv(self.entrypoint, "entrypoint"))
        object.__setattr__(self, "cmd", _argv(self.cmd, "cmd"))
        if self.cwd is not None and (not isinstance(self.cwd, str) or not self.cwd.startswith("/") or "\0" in self.cwd):
            raise InvalidInput(f"the working directory must be an absolute path, not {self.cwd!r}")
        if self.user is not None and (not isinstance(self.user, str) or not self.user or "\0" in self.user):
            raise InvalidInput(f"bad user {self.user!r}")
        object.__setattr__(self, "expose", tuple(sorted(set(str(p) for p in self.expose))))

    # ---- the file in the image ------------------------------------------------------------------------
    def is_empty(self) -> bool:
        return self == ImageConfig()

    def to_json(self) -> bytes:
        """Canonical bytes (sorted keys, no spaces, fields at their default left out): what
        CONFIG_PATH holds, so equal configs are equal files."""
        d: dict = {}
        if self.env:
            d["env"] = [f"{k}={v}" for k, v in self.env]
        for name in ("cwd", "user"):
            if getattr(self, name) is not None:
                d[name] = getattr(self, name)
        for name in ("entrypoint", "cmd"):
            if getattr(self, name) is not None:
                d[name] = list(getattr(self, name))
        if self.expose:
            d["expose"] = list(self.expose)
        if self.labels:
            d["labels"] = dict(self.labels)
        if self.extra:
            d["extra"] = {k: json.loads(v) for k, v in self.extra}
        return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> "ImageConfig":
        if len(data) > MAX_CONFIG_BYTES:
            raise InvalidInput(f"{CONFIG_PATH} is over {MAX_CONFIG_BYTES} bytes")
        try:
            d = json.loads(data)
        except ValueError as e:
            raise InvalidInput(f"{CONFIG_PATH} is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise InvalidInput(f"{CONFIG_PATH} is not a JSON object")
        extra = d.get("extra") or {}
        if not isinstance(extra, dict):
            raise InvalidInput(f"{CONFIG_PATH}: extra is an object")
        return cls(env=d.get("env"), cwd=d.get("cwd"), user=d.get("user"), entrypoint=d.get("entrypoint"),
                   cmd=d.get("cmd"), expose=tuple(d.get("expose") or ()), labels=d.get("labels"),
                   extra=tuple(sorted((str(k), json.dumps(v, sort_keys=True)) for k, v in extra.items())))

    # ---- OCI ------------------------------------------------------------------------------------------
    def to_oci(self) -> dict:
        """The OCI image config's `config` object (image-spec config.md)."""
        c: dict = {k: json.loads(v) for k, v in self.extra}
        if self.env:
            c["Env"] = [f"{k}={v}" for k, v in self.env]
        if self.cwd is not None:
            c["WorkingDir"] = self.cwd
        if self.user is not None:
            c["User"] = self.user
        if self.entrypoint is not None:
            c["Entrypoint"] = list(self.entrypoint)
        if self.cmd is not None:
            c["Cmd"] = list(self.cmd)
        if self.expose:
            c["ExposedPorts"] = {p: {} for p in self.expose}
        if self.labels:
            c["Labels"] = dict(self.labels)
        return c

    KNOWN_OCI = ("Env", "WorkingDir", "User", "Entrypoint", "Cmd", "ExposedPorts", "Labels")

    @classmethod
    def from_oci(cls, c: dict | None) -> "ImageConfig":
        """From an OCI image config's `config` object (None/{}: the empty config). Other keys
        (Volumes, StopSignal, ...) are kept verbatim in `extra` so a round trip loses nothing."""
        c = c or {}
        if not isinstance(c, dict):
            raise InvalidInput("the OCI config's config is not an object")
        return cls(env=c.get("Env"), cwd=c.get("WorkingDir") or None, user=c.get("User") or None,
                   entrypoint=c.get("Entrypoint"), cmd=c.get("Cmd"), expose=tuple(c.get("ExposedPorts") or ()),
                   labels=c.get("Labels"),
                   extra=tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in c.items()
                                      if k not in cls.KNOWN_OCI and v not in (None, {}, []))))

    def replace(self, **changes) -> "ImageConfig":
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        d.update(changes)
        return ImageConfig(**d)
