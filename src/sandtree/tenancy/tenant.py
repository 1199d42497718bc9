"""A tenant (who a token stands for), its scopes, the names of its limits, and in SQL what it
may see and own. The rules themselves: see the package's docstring (tenancy/__init__.py)."""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from dataclasses import dataclass, field

from ..errors import Forbidden, InvalidInput
from ..network.policy import Grant

SCOPES = ("import", "run", "list", "cancel", "tag")
ALL_SCOPES = SCOPES + ("admin",)
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
SEP = "~"
LIMIT_KEYS = ("max_runs", "max_timeout", "max_output", "max_sandboxes", "max_upload", "max_memory", "max_pids",
              "max_disk", "max_cpus", "max_ports", "max_volumes")
SIZE_LIMITS = ("max_output", "max_upload", "max_memory", "max_disk", "max_volumes")
INT_LIMITS = ("max_runs", "max_sandboxes", "max_pids", "max_ports")
DEFAULT_MAX_SANDBOXES = 8
TOKEN_RE = re.compile(r"^stk_([0-9a-f]{16})_([A-Za-z0-9_-]{20,200})$")

# Images a tenant may see (named parameter :t is the tenant).
# A run's result is the tenant's unless the run changed nothing: a no-op run on an image someone
# shared "produces" that image, which must not keep it visible after it is unshared.
PRODUCED = ("SELECT o.result FROM tenant_ops w JOIN operations o ON o.id=w.op WHERE w.tenant=:t "
            "AND o.result IS NOT NULL AND (o.source IS NULL OR o.result != o.source)")
VISIBLE = ("(id IN (SELECT image FROM tenant_images WHERE tenant=:t) OR id IN (SELECT image FROM public_images) "
           f"OR id IN ({PRODUCED}))")
# Images a tenant owns (may share): the same without public ones.
OWNED = f"(id IN (SELECT image FROM tenant_images WHERE tenant=:t) OR id IN ({PRODUCED}))"


@dataclass(frozen=True)
class Tenant:
    name: str
    scopes: tuple[str, ...] = SCOPES
    limits: dict = field(default_factory=dict)
    token: str | None = None              # the token id it authenticated with
    network: Grant = Grant()              # the network policies its runs and sandboxes may ask for
    tier: str | None = None               # the only isolation tier its code runs on (None: any it asks)

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


def token_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_tenant_name(name) -> str:
    if not isinstance(name, str) or not TENANT_RE.match(name):
        raise InvalidInput(f"invalid tenant name {name!r} (lower-case letters, digits and ._-)")
    return name


def parse_scopes(scopes) -> tuple[str, ...]:
    if scopes is None:
        return SCOPES
    if isinstance(scopes, str):
        scopes = [s for s in re.split(r"[,\s]+", scopes) if s]
    bad = [s for s in scopes if s not in ALL_SCOPES]
    if bad or not scopes:
        raise InvalidInput(f"unknown scope(s) {', '.join(bad) or '(none given)'} (from: {', '.join(ALL_SCOPES)})")
    return tuple(s for s in ALL_SCOPES if s in scopes)


# Who the audit names for the store's own operator (CLI on the server, the in-process engine):
# the same name whoami() gives an unscoped engine.
OPERATOR = Tenant("local", ALL_SCOPES, network=Grant(any=True))



def check_public_registry(hostport: str) -> None:
    """A tenant's pull makes the *server* connect to the registry it names: only to public
    addresses, never to the server's own loopback, its private networks or link-local metadata
    services (Forbidden before any connection). Names are resolved here; the operator (admin)
    may pull from anywhere."""
    host = hostport[1:hostport.index("]")] if hostport.startswith("[") else hostport.rsplit(":", 1)[0]
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise InvalidInput(f"registry host {host!r} does not resolve") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if not ip.is_global or ip.is_multicast:
            raise Forbidden(f"registry {hostport} is not a public address ({ip}): a tenant's pulls reach "
                            "public registries only (the admin may pull from others)", scope="admin")


