"""The server's secret store: a secret (NAME, value, the hosts it may be sent to) stored once, so
runs, live sandboxes and pools name it instead of carrying its value (trust.parse_secrets'
`{"stored": ...}` entries).

Where the values live, and why there: one JSON file per namespace under `$SANDTREE_HOME/secrets/`
(the directory 0700, each file 0600, root's), never in the store's SQLite. Bundles, exports and
backups of the database copy no value; the store directory is in no sandbox's mount tree (on either
tier); a value leaves this file only for the egress daemon's memory (network/client.py attach).
Not encrypted: a key kept beside the files would protect nothing the file mode does not (whoever
reads the one reads the other), and a key kept elsewhere is a second secret to manage. An operator
who backs up `$SANDTREE_HOME` whole takes this directory along: leave it out, or keep it as secret
as the values.

Namespaces (tenancy/secrets.py says who may use which): None is the operator's (global) one, a
tenant's name its own. A global secret lists the tenants that may use it (`tenants`, "*": every
tenant); a tenant's own are its alone. Writes are whole-file replacements (a temporary file, fsync,
rename) under an flock, so concurrent engines never lose a write and a crash leaves the old file or
the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field

from ..errors import InvalidInput, LimitExceeded, NotFound
from .trust import check_hosts, check_name, check_value

__all__ = ["SecretStore", "StoredSecret", "MAX_STORED", "EVERY_TENANT"]

MAX_STORED = 256                 # secrets per namespace
EVERY_TENANT = "*"               # a global secret's `tenants`: every tenant may use it
_FORMAT = 1
_OWNER = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")     # a tenant name (tenancy/tenant.py TENANT_RE)
_GLOBAL_FILE = "_global.json"                          # no tenant name starts with "_"


@dataclass(frozen=True)
class StoredSecret:
    name: str
    value: str = field(repr=False)       # never in a repr, a log line or an answer
    hosts: tuple[str, ...] = ()
    owner: str | None = None             # None: the operator's (global)
    tenants: tuple[str, ...] = ()        # (global ones) which tenants may use it
    created: float = 0.0
    updated: float = 0.0

    def info(self) -> dict:
        """What a listing shows: everything but the value."""
        out = {"name": self.name, "hosts": list(self.hosts), "owner": self.owner or "global",
               "created": self.created, "updated": self.updated}
        if self.owner is None:
            out["tenants"] = list(self.tenants)
        return out

    def usable_by(self, tenant: str) -> bool:
        return self.owner == tenant or (self.owner is None and (EVERY_TENANT in self.tenants or tenant in self.tenants))


class SecretStore:
    """The files under `directory` (made 0700 on first write)."""

    def __init__(self, directory: str):
        self.dir = directory

    # ---- reads --------------------------------------------------------------------------------
    def get(self, owner: str | None, name: str) -> StoredSecret | None:
        return self._load(owner).get(name)

    def list(self, owner: str | None) -> list[StoredSecret]:
        return sorted(self._load(owner).values(), key=lambda s: s.name)

    # ---- writes -------------------------------------------------------------------------------
    def set(self, owner: str | None, name: str, value: str, hosts, tenants=()) -> StoredSecret:
        """Store (or replace) `name`; InvalidInput naming the secret (never its value) for bad input."""
        check_name(name)
        checked_hosts = check_hosts(name, hosts)
        if not isinstance(value, str):
            raise InvalidInput(f"secret {name}: the value must be a string")
        check_value(name, value)
        tenants = tuple(sorted(set(tenants or ())))
        if owner is not None and tenants:
            raise InvalidInput(f"secret {name}: only the operator's secrets are shared with tenants")
        with self._locked():
            secrets = self._load(owner)
            if name not in secrets and len(secrets) >= MAX_STORED:
                raise LimitExceeded(f"at most {MAX_STORED} stored secrets per namespace", limit="secrets",
                                    max=MAX_STORED)
            now = time.time()
            old = secrets.get(name)
            secrets[name] = StoredSecret(name, value, checked_hosts, owner, tenants,
                                         old.created if old else now, now)
            self._save(owner, secrets)
        return secrets[name]

    def remove(self, owner: str | None, name: str) -> None:
        with self._locked():
            secrets = self._load(owner)
            if secrets.pop(name, None) is None:
                raise NotFound(f"no stored secret {name!r}")
            self._save(owner, secrets)

    # ---- the files ----------------------------------------------------------------------------
    def _path(self, owner: str | None) -> str:
        if owner is None:
            return os.path.join(self.dir, _GLOBAL_FILE)
        if not isinstance(owner, str) or not _OWNER.match(owner):
            raise InvalidInput(f"invalid tenant name {owner!r}")
        return os.path.join(self.dir, owner + ".json")

    def _load(self, owner: str | None) -> dict[str, StoredSecret]:
        path = self._path(owner)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read())
        if doc.get("format") != _FORMAT:
            raise InvalidInput(f"{path}: unknown secret store format {doc.get('format')!r}")
        return {n: StoredSecret(n, s["value"], tuple(s["hosts"]), owner, tuple(s.get("tenants", ())),
                                s["created"], s["updated"]) for n, s in doc["secrets"].items()}

    def _save(self, owner: str | None, secrets: dict[str, StoredSecret]) -> None:
        path = self._path(owner)
        doc = {"format": _FORMAT, "secrets": {
            s.name: {"value": s.value, "hosts": list(s.hosts), **({"tenants": list(s.tenants)} if s.tenants else {}),
                     "created": s.created, "updated": s.updated} for s in secrets.values()}}
        tmp = f"{path}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(doc, separators=(",", ":")).encode())
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    @contextlib.contextmanager
    def _locked(self):
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        os.chmod(self.dir, 0o700)
        fd = os.open(os.path.join(self.dir, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)
