"""A sandbox's network policy: which destinations its connections may reach.

The shape users know from E2B (`allow_out` / `deny_out` lists of host names, addresses and CIDRs),
with ports. A rule is text:

    example.org            that name (any port)          *.example.org   its subdomains
    203.0.113.7, 10.0.0.0/8, [2001:db8::]/32             an address or a network
    *                      any public address
    ...:443, ...:80,443, ...:8000-8100                   only these ports

A connection is refused when a deny rule matches it; else allowed when an allow rule does. A
destination that is not public (loopback, private, link-local and the metadata addresses in it,
CGNAT, multicast, reserved, the egress host's own addresses) is reached only through a network
rule that names it: never through `*`, `0.0.0.0/0` or a host name (a public name that resolves to
a private address is refused: DNS rebinding). The sandboxes' own range is never reachable.

Policy values are immutable and compare by their canonical JSON (`to_json`), which is what the
records and lineage keep. `from_value` accepts what the surfaces receive (None/False: off,
True/"all": public internet, a rule string or list: an allow-list, a dict with allow_out/deny_out);
bad input raises InvalidInput naming the rule.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Iterable

from ..errors import InvalidInput

SANDBOX_NET = ipaddress.ip_network("100.64.0.0/16")       # sandboxes' own addresses (links.py)
SANDBOX_NET6 = ipaddress.ip_network("fd5a:6e64:7472::/64")  # and their IPv6 ones (a ULA of sandtree's)
MAX_RULES = 256
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_WIRE_LABEL = re.compile(rb"(?!-)[a-z0-9_-]{1,63}(?<!-)")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
# IPv6 that is public: global unicast (2000::/3) less what Python's is_global misses here (3.11:
# the documentation range of RFC 9637), and the forms that stand for an IPv4 address, which is
# then checked as IPv4 is: ::ffff:a.b.c.d (a dual-stack socket connects to a.b.c.d), NAT64's
# well-known prefix and 6to4 (a gateway on the egress host's network may turn them into IPv4).
_GLOBAL6 = ipaddress.ip_network("2000::/3")
_NOT_PUBLIC6 = (ipaddress.ip_network("3fff::/20"),)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")


def unmapped(ip: Address) -> Address:
    """::ffff:a.b.c.d as a.b.c.d (what a connection to it reaches); any other address as it is."""
    return ip.ipv4_mapped if ip.version == 6 and ip.ipv4_mapped else ip


def embedded(ip: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for besides itself (NAT64's well-known prefix, 6to4),
    else None: it is public only when that one is, and a deny rule naming that one denies it."""
    if ip.version != 6:
        return None
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip.sixtofour


def is_public(ip: Address) -> bool:
    """A globally routed unicast address (what `*` reaches)."""
    ip = unmapped(ip)
    if ip.version == 4:
        return ip.is_global and not ip.is_multicast
    inner = embedded(ip)
    if inner is not None:
        return is_public(inner)
    return ip in _GLOBAL6 and ip.is_global and not any(ip in n for n in _NOT_PUBLIC6)


def _parse_ports(text: str, rule: str) -> tuple[tuple[int, int], ...]:
    out = []
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise InvalidInput(f"network rule {rule!r}: bad port {part!r}") from None
        if not (1 <= a <= b <= 65535):
            raise InvalidInput(f"network rule {rule!r}: ports are 1-65535 ({part!r})")
        out.append((a, b))
    return tuple(out)


def host_name(name) -> str | None:
    """A plain host name in lower case without the root dot, or None when it is not one: labels of
    letters, digits, '-' and '_' (1-63, no '-' at either end), 253 characters in all. Only such
    names are decided: a name's text may hold escapes (`x\\.y` is one label holding a dot), and a
    text comparison of those let a label with a dot in it pass a `*.` rule (a DNS channel to the
    rule's parent zone), so everything that compares or looks names up takes them through here (or wire_name)."""
    if not isinstance(name, str):
        return None
    name = name.lower()
    if name.endswith("."):
        name = name[:-1]
    if not name or len(name) > 253:
        return None
    if all(_LABEL.fullmatch(label) for label in name.split(".")):
        return name
    return None


def wire_name(labels) -> str | None:
    """host_name of a name as DNS carries it (dnspython's Name.labels: bytes, the root's empty label
    last): a label holding '.', NUL, '\\' or any byte but a host name's is no host name (None)."""
    labels = list(labels)
    if labels and labels[-1] == b"":
        labels.pop()
    if not labels or not all(_WIRE_LABEL.fullmatch(label.lower()) for label in labels):
        return None
    return host_name(b".".join(labels).decode("ascii"))


@dataclass(frozen=True)
class Rule:
    kind: str                                # "any" | "name" | "suffix" | "net"
    target: str                              # the name, the suffix (".example.org") or the network
    ports: tuple[tuple[int, int], ...] = ()  # empty: every port

    @classmethod
    def parse(cls, text) -> "Rule":
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput(f"network rule must be a non-empty string, not {text!r}")
        rule = text.strip()
        host, ports = rule, ()
        if rule.startswith("["):                                 # [v6]/len:ports
            end = rule.find("]")
            if end < 0:
                raise InvalidInput(f"network rule {rule!r}: unclosed '['")
            host, rest = rule[1:end], rule[end + 1:]
            if rest.startswith("/"):
                length, _, p = rest[1:].partition(":")
                host, rest = f"{host}/{length}", (":" + p if p else "")
            if rest:
                if not rest.startswith(":"):
                    raise InvalidInput(f"network rule {rule!r}: expected ':PORTS' after ']'")
                ports = _parse_ports(rest[1:], rule)
        elif rule.count(":") == 1:
            host, p = rule.split(":")
            ports = _parse_ports(p, rule)
        elif rule.count(":") > 1:                                # a bare v6 address/network
            host = rule
        if host == "*":
            return cls("any", "*", ports)
        try:
            net = ipaddress.ip_network(host, strict=False)
        except ValueError:
            net = None
        if net is not None:
            if net.prefixlen == 0:                               # 0.0.0.0/0 says "public", as * does
                return cls("any", "*", ports)
            if net.version == 6 and net.subnet_of(_MAPPED) and net.prefixlen >= 96:
                # ::ffff:a.b.c.d/n is a.b.c.d/(n-96): what it reaches, one canonical spelling
                net = ipaddress.ip_network((int(net.network_address) & 0xFFFFFFFF, net.prefixlen - 96))
            return cls("net", str(net), ports)
        if host.startswith("*."):
            name = host_name(host[2:])
            if name is None:
                raise InvalidInput(f"network rule {rule!r}: not a host name, address or network")
            return cls("suffix", "." + name, ports)
        name = host_name(host)
        if name is None or "*" in host:
            raise InvalidInput(f"network rule {rule!r}: not a host name, address or network "
                               "(wildcards only as a leading '*.')")
        return cls("name", name, ports)

    def __str__(self) -> str:
        host = {"any": "*", "suffix": "*" + self.target}.get(self.kind, self.target)
        if self.kind == "net" and ":" in host:
            addr, _, length = host.partition("/")
            host = f"[{addr}]/{length}"
        if not self.ports:
            return host
        return host + ":" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ports)

    def port_ok(self, port: int) -> bool:
        return not self.ports or any(a <= port <= b for a, b in self.ports)

    def name_ok(self, name: str) -> bool:
        """Whether the rule names host `name` (lower case, no root dot)."""
        if self.kind == "name":
            return name == self.target
        if self.kind == "suffix":           # label by label: below the suffix, never the suffix itself
            below = self.target[1:].split(".")
            labels = name.split(".")
            return len(labels) > len(below) and labels[-len(below):] == below
        return False

    def addr_ok(self, ip: Address) -> bool:
        ip = unmapped(ip)
        if self.kind == "net":
            net = ipaddress.ip_network(self.target)
            return ip.version == net.version and ip in net
        return self.kind == "any" and is_public(ip)

    def denies_addr(self, ip: Address) -> bool:
        """addr_ok for a deny rule: also through the IPv4 address `ip` stands for (NAT64, 6to4),
        so a denied IPv4 address is not reached by its IPv6 spelling."""
        inner = embedded(unmapped(ip))
        return self.addr_ok(ip) or (self.kind == "net" and inner is not None and self.addr_ok(inner))

    def covers(self, other: "Rule") -> bool:
        """Whether everything `other` allows, this allows too (tenant grants)."""
        if self.ports and not all(any(a <= x and y <= b for a, b in self.ports) for x, y in
                                  (other.ports or ((1, 65535),))):
            return False
        if self.kind == "any":
            # `*` (a grant of `all`, a build's `all`) covers what reaches public addresses by name:
            # not an address rule, even a public one. An address rule is decided before the checks
            # `*` gets (the egress host's own addresses), and it is a destination the asker picks,
            # not one the daemon's DNS gives: an address is the operator's to grant, by naming it
            return other.kind in ("any", "name", "suffix")
        if self.kind == "net":
            return other.kind == "net" and _subnet(ipaddress.ip_network(other.target),
                                                   ipaddress.ip_network(self.target))
        if self.kind == "suffix":
            return other.kind in ("name", "suffix") and (other.target.endswith(self.target))
        return other.kind == "name" and other.target == self.target


def _subnet(a, b) -> bool:
    return a.version == b.version and a.subnet_of(b)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str          # which rule allowed it, or why it was refused (an agent reads it)


@dataclass(frozen=True)
class Policy:
    allow: tuple[Rule, ...]
    deny: tuple[Rule, ...] = ()

    # ---- values from the surfaces --------------------------------------------------------
    @classmethod
    def from_value(cls, value) -> "Policy | None":
        """None for "no network"; else the policy `value` describes (see the module doc)."""
        if value is None or value is False:
            return None
        if isinstance(value, Policy):
            return value
        if value is True:
            return cls((Rule("any", "*"),))
        if isinstance(value, str):
            v = value.strip()
            if v.lower() in ("off", "none", ""):
                return None
            if v.lower() in ("all", "on", "public", "internet"):
                return cls((Rule("any", "*"),))
            return cls(_rules(v.split(","), "allow_out"))
        if isinstance(value, (list, tuple)):
            return cls(_rules(value, "allow_out")) if value else None
        if isinstance(value, dict):
            unknown = set(value) - {"allow_out", "deny_out"}
            if unknown:
                raise InvalidInput(f"network: unknown field(s) {sorted(unknown)} "
                                   "(expected allow_out, deny_out)")
            deny = _rules(value.get("deny_out") or [], "deny_out")
            if "allow_out" in value and value["allow_out"] is not None:
                allow = _rules(value["allow_out"], "allow_out")
            else:                       # only a deny-list: the public internet minus it (E2B)
                allow = (Rule("any", "*"),) if deny else ()
            return cls(allow, deny) if allow else None
        raise InvalidInput(f"network must be off/None, True/'all', a rule list or "
                           f"{{'allow_out': [...], 'deny_out': [...]}}, not {type(value).__name__}")

    @classmethod
    def from_json(cls, data) -> "Policy | None":
        return cls.from_value(data)

    def to_json(self) -> dict:
        out = {"allow_out": [str(r) for r in self.allow]}
        if self.deny:
            out["deny_out"] = [str(r) for r in self.deny]
        return out

    def __str__(self) -> str:
        s = ",".join(str(r) for r in self.allow)
        return s + ("".join(f" !{r}" for r in self.deny))

    # ---- decisions -------------------------------------------------------------------------
    def resolves(self, name: str) -> Verdict:
        """May the sandbox resolve `name` (its DNS)? Names that some rule could reach."""
        name = host_name(name)
        if name is None:
            return Verdict(False, "not a host name (letters, digits, '-', '_' in dot-separated labels)")
        for r in self.deny:
            if r.name_ok(name) and not r.ports:
                return Verdict(False, f"{name} is denied by rule {r}")
        for r in self.allow:
            if r.name_ok(name) or r.kind == "any":
                return Verdict(True, f"allowed by rule {r}")
        return Verdict(False, f"{name} is not in the allow-list")

    def connect(self, names: Iterable[str], ip: Address, port: int, own: Iterable = ()) -> Verdict:
        """May a connection to `ip`:`port` go out, known to the sandbox as `names` (SNI, Host,
        or what DNS answered it), `own` the egress host's own addresses?"""
        names = [n for n in (host_name(n) for n in names) if n]
        ip = unmapped(ip)                    # (::ffff:a.b.c.d is decided as a.b.c.d, which it reaches)
        shown = f"{names[0]}:{port}" if names else f"{_show(ip)}:{port}"
        if any(a is not None and (a in SANDBOX_NET or a in SANDBOX_NET6) for a in (ip, embedded(ip))):
            return Verdict(False, f"{shown}: a sandbox address")
        for r in self.deny:
            if r.port_ok(port) and (any(r.name_ok(n) for n in names) or r.denies_addr(ip)):
                return Verdict(False, f"{shown} is denied by rule {r}")
        explicit = [r for r in self.allow if r.kind == "net" and r.port_ok(port) and r.addr_ok(ip)]
        if explicit:
            return Verdict(True, f"allowed by rule {explicit[0]}")
        if not is_public(ip) or ip in set(own):
            what = _address_class(ip, own)
            return Verdict(False, f"{shown} ({_show(ip)}) is {what}: reached only through a "
                                  "network rule naming it")
        for r in self.allow:
            if r.port_ok(port) and (r.kind == "any" or any(r.name_ok(n) for n in names)):
                return Verdict(True, f"allowed by rule {r}")
        return Verdict(False, f"{shown} is not in the allow-list")

    def within(self, grant: "Grant") -> str | None:
        """None when every destination this allows, `grant` allows too; else why not."""
        if grant.any:
            return None
        for r in self.allow:
            if not any(g.covers(r) for g in grant.rules):
                granted = ", ".join(str(g) for g in grant.rules) or "none"
                return f"network rule {r} is beyond what this token may ask for ({granted})"
        return None


def _show(ip: Address) -> str:
    return f"[{ip}]" if ip.version == 6 else str(ip)


def _address_class(ip: Address, own) -> str:
    if ip in set(own):
        return "an address of the egress host"
    inner = embedded(ip)
    if inner is not None and not is_public(inner):
        return f"an IPv6 form of {inner}, which is {_address_class(inner, own)}"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local (cloud metadata) address"
    if ip.version == 6 and ip in ipaddress.ip_network("fc00::/7"):
        return "a unique local (private) address"
    if ip.is_private:
        return "a private address"
    return "not a public address"


def _rules(items, field: str) -> tuple[Rule, ...]:
    if isinstance(items, str):
        items = items.split(",")
    if not isinstance(items, (list, tuple)):
        raise InvalidInput(f"network {field} must be a list of rules")
    if len(items) > MAX_RULES:
        raise InvalidInput(f"network {field}: at most {MAX_RULES} rules ({len(items)} given)")
    return tuple(Rule.parse(x) for x in items)


_KIND_ORDER = {"any": 0, "name": 1, "suffix": 2, "net": 3}


def canonical(policy: "Policy | None") -> "Policy | None":
    """The one spelling of `policy`, for what keys on it (a build step's cache key): every list
    sorted, rules of the same destination merged into one with the union of their ports (an allow
    rule with no ports, or ports covering 1-65535, takes every port). Parsing already made each rule's
    own spelling canonical (names in lower case without the root dot, a network's host bits
    cleared, an address as its /32 or /128, `0.0.0.0/0` as `*`). Decisions do not depend on rule
    order, and a union of rules naming one destination allows or denies what they did one by one
    (a deny rule with ports, which leaves the name's lookup alone, keeps them even when they cover
    every port), so the result decides every connection and lookup as `policy` does."""
    if policy is None:
        return None

    def merged(rules: tuple[Rule, ...], deny: bool = False) -> tuple[Rule, ...]:
        ports: dict[tuple[str, str], list | None] = {}
        for r in rules:
            key = (r.kind, r.target)
            if not r.ports or ports.get(key, []) is None:
                ports[key] = None                               # every port
            else:
                ports.setdefault(key, []).extend(r.ports)
        out = []
        for (kind, target), spans in ports.items():
            joined: list[tuple[int, int]] = []
            for a, b in sorted(spans or ()):
                if joined and a <= joined[-1][1] + 1:
                    joined[-1] = (joined[-1][0], max(joined[-1][1], b))
                else:
                    joined.append((a, b))
            if joined == [(1, 65535)] and not deny:
                joined = []
            out.append(Rule(kind, target, tuple(joined)))
        return tuple(sorted(out, key=lambda r: (_KIND_ORDER.get(r.kind, 9), r.target, r.ports)))

    return Policy(merged(policy.allow), merged(policy.deny, deny=True))


@dataclass(frozen=True)
class Grant:
    """What a tenant's token may ask for: any policy (`any`), or policies whose every allow rule is
    covered by one of `rules` (`*`, a grant of `all`: names, `*.` suffixes and `*` itself -- public
    destinations by name; an address rule only under a grant rule naming its network). No rules:
    no network."""
    rules: tuple[Rule, ...] = ()
    any: bool = False

    @classmethod
    def parse(cls, value) -> "Grant":
        if value is None or value is False or value in ("", "off", "none"):
            return cls()
        if value in ("any", True):
            return cls(any=True)
        if value in ("all", "public"):
            return cls((Rule("any", "*"),))
        if isinstance(value, dict) and "any" in value:
            return cls(any=bool(value["any"]))
        if isinstance(value, dict):
            value = value.get("rules") or []
        return cls(_rules(value, "grant"))

    def to_json(self):
        if self.any:
            return "any"
        return [str(r) for r in self.rules] if self.rules else None
