"""The router namespace's nftables ruleset: the only way out of a link is the daemon's proxy and
resolver. Every TCP connection arriving on a link (`st*`) is redirected to the transparent proxy,
every DNS packet (UDP and TCP port 53, to any address) to the resolver; anything else from a link
is dropped, nothing is forwarded. (All of a link's TCP reaches the proxy, even to the proxy's own
address and port, so the proxy refuses it with a reason rather than the ruleset dropping it
silently; UDP reaches the resolver only through the DNS redirect.) A link's packets must come
from the sandboxes' range and, by the
reverse-path check (`fib`), from the address routed to that very link, so one sandbox can not pass
for another (the proxy picks the link by the connection's local address, and counts by it).
IPv6 the same (the table is `inet`: one redirect for both), from the sandboxes' IPv6 range; the
neighbour discovery a link needs to reach its gateway (solicitations and advertisements, hop
limit 255 as only an on-link sender can set it) is the one other thing the router takes in."""

from __future__ import annotations

import subprocess

from ..errors import RuntimeUnavailable
from . import netns
from .policy import SANDBOX_NET, SANDBOX_NET6

__all__ = ["PROXY_PORT", "RESOLVER_PORT", "TABLE", "RULESET", "install"]

PROXY_PORT = 15001
RESOLVER_PORT = 15053
TABLE = "sandtree"

RULESET = f"""
table inet {TABLE}
delete table inet {TABLE}
table inet {TABLE} {{
    chain pre_raw {{
        type filter hook prerouting priority raw; policy accept;
        iifname "st*" ip saddr != {SANDBOX_NET} drop
        iifname "st*" ip6 saddr != {SANDBOX_NET6} drop
        iifname "st*" fib saddr . iif oif missing drop
    }}
    chain pre_nat {{
        type nat hook prerouting priority dstnat; policy accept;
        iifname "st*" meta l4proto {{ tcp, udp }} th dport 53 redirect to :{RESOLVER_PORT}
        iifname "st*" meta l4proto tcp redirect to :{PROXY_PORT}
    }}
    chain in_filter {{
        type filter hook input priority filter; policy accept;
        iifname "st*" ct state established,related accept
        iifname "st*" icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} ip6 hoplimit 255 accept
        iifname "st*" tcp dport {{ {PROXY_PORT}, {RESOLVER_PORT} }} accept
        iifname "st*" ct status dnat udp dport {RESOLVER_PORT} accept
        iifname "st*" drop
    }}
    chain fwd_filter {{
        type filter hook forward priority filter; policy drop;
    }}
}}
"""


def install(router_fd: int) -> None:
    """Load RULESET into namespace `router_fd` (replacing an earlier copy of the table) and turn
    forwarding off there. Raises RuntimeUnavailable with nft's message when it refuses the ruleset."""
    netns.write_sysctl(router_fd, "net.ipv4.ip_forward", "0")
    netns.write_sysctl(router_fd, "net.ipv6.conf.all.forwarding", "0")
    with netns.entered(router_fd):
        # nft talks netlink to the namespace it starts in: the child inherits this thread's
        try:
            p = subprocess.run(["nft", "-f", "-"], input=RULESET, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            raise RuntimeUnavailable("nft (nftables) is not installed: the egress path needs it") from None
    if p.returncode != 0:
        raise RuntimeUnavailable(f"nft refused the egress ruleset: {p.stderr.strip()}")
