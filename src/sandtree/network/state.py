"""What the egress daemon knows of one link (a networked sandbox): its addresses, policy, secrets,
usage counters, the names its resolver answered, and its open connections. The daemon
(daemon.py) owns these values; the proxy (proxy.py), resolver (resolver.py) and interceptor
(intercept.py) read them and count into them, all on the daemon's one event loop (no locks)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .policy import Policy

MAX_HOSTS = 50          # distinct host names kept per list in a link's usage


@dataclass
class Usage:
    bytes_out: int = 0             # sandbox -> upstream, payload bytes
    bytes_in: int = 0              # upstream -> sandbox
    connections: int = 0           # allowed connections
    refused: int = 0               # refused connections
    dns_queries: int = 0
    dns_refused: int = 0
    allowed_hosts: list[str] = field(default_factory=list)
    refused_hosts: list[dict] = field(default_factory=list)    # {"host", "port", "reason"}

    def allow(self, host: str) -> None:
        self.connections += 1
        if host not in self.allowed_hosts and len(self.allowed_hosts) < MAX_HOSTS:
            self.allowed_hosts.append(host)

    def refuse(self, host: str, port: int | None, reason: str) -> None:
        self.refused += 1
        if len(self.refused_hosts) < MAX_HOSTS and not any(
                r["host"] == host and r["port"] == port for r in self.refused_hosts):
            self.refused_hosts.append({"host": host, "port": port, "reason": reason})

    def to_json(self) -> dict:
        return {"bytes_out": self.bytes_out, "bytes_in": self.bytes_in, "connections": self.connections,
                "refused": self.refused, "dns_queries": self.dns_queries, "dns_refused": self.dns_refused,
                "allowed_hosts": list(self.allowed_hosts), "refused_hosts": [dict(r) for r in self.refused_hosts]}


@dataclass
class Secret:
    name: str                      # the variable's name in the sandbox's env
    value: str = field(repr=False)  # the real value: only ever in the daemon's memory (never in a repr)
    placeholder: str = ""          # what the sandbox sees instead
    hosts: tuple[str, ...] = ()    # policy-rule-shaped names ("api.example.org", "*.example.org")
    stored: str | None = None      # the stored secret it came from (secretstore.py), None: given by value


@dataclass
class LinkState:
    key: str                       # the run's operation id or the live sandbox's id
    index: int                     # K of 100.64.K.0/30 (links.py)
    address: str                   # the sandbox's end (eth0), e.g. 100.64.3.2
    gateway: str                   # the router's end (stK): the proxy's and resolver's local address
    policy: Policy | None          # None: nothing goes out (a link made only for exposed ports)
    address6: str | None = None    # the same in IPv6 (links.addresses6)
    gateway6: str | None = None
    secrets: list[Secret] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    names: dict[str, set[str]] = field(default_factory=dict)    # ip -> names the resolver answered with it
    conns: set = field(default_factory=set)   # open proxied connections (objects with .dest_names, .ip, .port, .close())
    ca: object = None              # the link's CA (intercept.py), made when it has secrets or a tape
    tape: object = None            # tape.Tape: what it fetched is recorded, or answered from a tape
    attached: float = field(default_factory=time.time)
