"""Hardening: the egress path (issue 14) under attack from inside a sandbox (attack review 3).

E1. link.names grew without bound: every A answer the resolver gave a link added its addresses to
    link.names (address -> names), capped per address but not in addresses. A sandbox allowed a
    wildcard (or `all`) asking names of a zone that answers a fresh address each time grew the
    shared daemon's memory for as long as it lived (5000 queries: 5000 entries, no cap).
E2. No cap on one link's open proxied connections: one sandbox could hold thousands of connections
    (two daemon fds each) through the daemon every sandbox shares, until the daemon ran out of fds
    and refused every other tenant's connections and control requests.
E3. On a kept-alive plain-HTTP connection (port 80) only the first request's Host was decided; a
    later request could name any Host and reach the allowed name's address (virtual hosting, CDNs).

Everything real but the upstream's answers in E1: the rig's Upstream.resolve is replaced by one
answering a fresh public address per name, standing in for a DNS zone the attacker controls (the
netlab zone is fixed). Every packet stays in namespaces netlab made."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from sandtree.network import resolver, state
from netlab import ALLOWED, ProxyRig, netlab


@pytest.fixture(scope="module")
def rig():
    with netlab() as lab:
        r = ProxyRig(lab)
        try:
            yield r
        finally:
            r.close()


def test_link_names_stay_bounded_under_fresh_addresses(rig, monkeypatch):
    count = [0]

    async def fresh(name):
        count[0] += 1
        return [ipaddress.IPv4Address(int(ipaddress.IPv4Address("11.2.0.0")) + count[0])]

    monkeypatch.setattr(rig.upstream, "resolve", fresh)
    rig.policy(["*.attacker.test"])
    rig.link.names.clear()
    n = resolver.MAX_NAMED_ADDRESSES + 500
    for i in range(n):
        rig.dns(f"n{i}.attacker.test")
    assert count[0] == n
    assert len(rig.link.names) <= resolver.MAX_NAMED_ADDRESSES
    # the newest answers are the ones kept (what the sandbox connects to next)
    assert str(ipaddress.IPv4Address(int(ipaddress.IPv4Address("11.2.0.0")) + n)) in rig.link.names
    rig.link.names.clear()


def test_one_link_can_not_hold_unbounded_connections(rig):
    from sandtree.network import proxy
    rig.policy([f"{ALLOWED}/32:7"])
    held = []
    try:
        for _ in range(proxy.MAX_LINK_CONNECTIONS):
            s = rig.connect(ALLOWED, 7)
            s.sendall(b"x")
            assert s.recv(1) == b"x"          # an echo: the connection is proxied and open
            held.append(s)
        try:                                  # refused by a reset: connect itself may see it
            extra = rig.connect(ALLOWED, 7)
            held.append(extra)
            extra.settimeout(3)
            extra.sendall(b"y")
            got = extra.recv(1)
        except (ConnectionError, socket.timeout, OSError):
            got = b""
        assert got == b"", "a connection past the link's cap was proxied"
        assert any("connections" in r["reason"] for r in rig.link.usage.refused_hosts)
    finally:
        for s in held:
            s.close()
    # once they close, the link connects again
    import time
    time.sleep(0.5)
    s = rig.connect(ALLOWED, 7)
    with s:
        s.sendall(b"z")
        assert s.recv(1) == b"z"


# ---- E3. a kept-alive plain-HTTP connection: only the first request's Host was decided ----------
# (fixed: network/plainhttp.py decides each request; its attacks are in tests/kernel/test_egress_http.py)

def test_a_second_request_on_a_kept_alive_connection_can_not_name_another_host(rig):
    import json
    rig.policy(["allowed.test"])
    s = rig.connect(ALLOWED, 80)
    with s:
        s.sendall(b"GET /a HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
                  b"GET /b HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            more = s.recv(65536)
            if not more:
                break
            data += more
    hosts = [json.loads(part.split(b"HTTP/1.1", 1)[0])["headers"]["host"]
             for part in data.split(b"\r\n\r\n")[1:] if part.startswith(b"{")]
    assert "other.test" not in hosts, f"the upstream saw requests for {hosts}"
    assert hosts == ["allowed.test"] and b"HTTP/1.1 403 Forbidden" in data and b"other.test:80" in data
    assert ("other.test", 80) in [(r["host"], r["port"]) for r in rig.link.usage.refused_hosts]


# ---- E4. the resolver's TCP side had no cap per link ---------------------------------------------

def test_one_link_can_not_hold_unbounded_dns_tcp_connections(rig):
    rig.policy(["allowed.test"])
    held = []
    try:
        for _ in range(resolver.MAX_LINK_TCP):
            s = rig.connect(rig.link.gateway, 53)
            held.append(s)
        import dns.message, dns.query
        try:
            extra = rig.connect(rig.link.gateway, 53)
            held.append(extra)
            r = dns.query.tcp(dns.message.make_query("allowed.test", "A"), rig.link.gateway,
                              timeout=3, sock=extra)
        except Exception:
            r = None
        assert r is None, "a DNS TCP connection past the link's cap was served"
    finally:
        for s in held:
            s.close()


# ---- held: raw ICMP, UDP other than DNS, IPv6 from the sandbox's namespace as root ----------------

def test_raw_icmp_other_udp_and_ipv6_go_nowhere(rig):
    import struct
    rig.policy("all")

    def csum(b):
        s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
        s = (s >> 16) + (s & 0xffff)
        return ~(s + (s >> 16)) & 0xffff
    body = struct.pack("!BBHHH", 8, 0, 0, 7, 1) + b"ping"
    pkt = body[:2] + struct.pack("!H", csum(body)) + body[4:]
    from sandtree.network import netns
    for dst in (ALLOWED, rig.link.gateway):   # (127.0.0.1 here is the sandbox's own lo: it answers)
        with netns.entered(rig.sandbox_fd):
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        s.settimeout(0.5)
        with s:
            s.sendto(pkt, (dst, 0))
            try:
                while True:
                    data, src = s.recvfrom(2048)
                    assert src[0] != dst or data[20] != 0, f"an ICMP echo reply from {dst}"
            except socket.timeout:
                pass
    u = rig.sock(socket.SOCK_DGRAM)
    with u:
        u.settimeout(1)
        u.sendto(b"hello", (ALLOWED, 7))
        with pytest.raises((socket.timeout, OSError)):
            u.recvfrom(100)
    # IPv6 goes to the same proxy, which refuses a unique local address no rule names
    s6 = rig.sock(socket.SOCK_STREAM, socket.AF_INET6)
    with s6:
        s6.settimeout(5)
        try:
            s6.connect(("fd00:ec2::254", 80))
            s6.sendall(b"GET / HTTP/1.1\r\nHost: fd00-ec2.test\r\n\r\n")
            got = s6.recv(200)
        except OSError:
            got = b""
        assert got == b"" or got.startswith(b"HTTP/1.1 403"), got
    assert rig.lab.trap_hits() == {}
