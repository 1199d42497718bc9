"""IPv6 through the egress path (the router's ruleset, the proxy and the resolver, without the
daemon): a link carries IPv6 to the same proxy and resolver, addresses and networks are allowed by
rule, the resolver answers AAAA for allowed names, a name is dialled by name as over IPv4, and
what IPv4 refuses IPv6 refuses (loopback, link-local, unique local addresses unless a rule names
them, the sandboxes' own range, and the IPv6 spellings of IPv4 addresses: ::ffff:, NAT64, 6to4).

The IPv6 internet is the netlab's (tests/netlab.py): 2600:1f18::10 and ::11 (public-looking) and
fd00:5::10 (a unique local address the tests allow by rule) on its own namespace, reached from the
edge namespace the proxy dials from. Every packet stays in namespaces this test made."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess

import dns.rcode
import pytest

from pyroute2 import IPRoute

from netlab import SIX, SIX_OTHER, ULA, ProxyRig, netlab
from sandtree.network import netns
from sandtree.network.links import IFA_F_NODAD, addresses6


def refused(fn, *a) -> bool:
    """A connection refusal as the sandbox sees it: reset, closed with nothing, or timed out."""
    try:
        r = fn(*a)
    except (ConnectionError, socket.timeout, ssl.SSLError, OSError):
        return True
    return r in (b"", (0, b""))


@pytest.fixture(scope="module")
def eg():
    with netlab() as lab:
        e = ProxyRig(lab, index=202)
        try:
            yield e
        finally:
            e.close()


@pytest.fixture(autouse=True)
def fresh(eg):
    from sandtree.network.state import Usage
    eg.link.usage = Usage()
    eg.link.names.clear()
    eg.link.policy = None
    yield
    assert eg.lab.trap_hits() == {}, "a never-reach address accepted a connection"


def banner(eg, ip, port=2222) -> bytes:
    with eg.connect(ip, port) as s:
        return s.recv(100)


def echo(eg, ip) -> bytes:
    with eg.connect(ip, 7, timeout=2) as s:
        s.sendall(b"x")
        return s.recv(10)


def answers(reply) -> list[str]:
    return [str(x) for rr in reply.answer for x in rr]


def test_aaaa_answers_for_allowed_names_only(eg):
    eg.policy(["six.test", "dual.test"])
    assert answers(eg.dns("six.test", "AAAA")) == [SIX]
    assert answers(eg.dns("dual.test", "AAAA")) == [SIX] and answers(eg.dns("dual.test")) == [eg.lab.allowed]
    assert answers(eg.dns("six.test", "AAAA", tcp=True)) == [SIX]
    # over IPv6 to the link's gateway, and to any IPv6 address (redirected: it never leaves)
    assert answers(eg.dns("six.test", "AAAA", server=eg.link.gateway6)) == [SIX]
    assert answers(eg.dns("six.test", "AAAA", server="2001:4860:4860::8888", tcp=True)) == [SIX]
    r = eg.dns("other.test", "AAAA")
    assert r.rcode() == dns.rcode.NXDOMAIN and eg.lab.hits[("dns", "other.test")] == 0
    assert eg.link.names[SIX] == {"six.test", "dual.test"}          # what a bare-address connection is judged by


def test_a_name_is_dialled_by_name_over_ipv6(eg):
    eg.policy(["six.test"])
    eg.dns("six.test", "AAAA")
    before = eg.lab.hits[(SIX, 80)]
    status, body = eg.http(SIX, "six.test", "/v6")
    assert status == 200 and json.loads(body)["address"] == SIX and json.loads(body)["path"] == "/v6"
    assert eg.lab.hits[(SIX, 80)] == before + 1
    status, body = eg.https(SIX, "six.test")
    assert status == 200 and json.loads(body)["address"] == SIX
    # by name the proxy dials what the name is: an IPv6 destination the sandbox picked is ignored
    status, body = eg.http(SIX_OTHER, "six.test")
    assert status == 200 and json.loads(body)["address"] == SIX
    # another name at the same address is refused (its Host decides), as over IPv4
    assert eg.http(SIX, "other.test")[0] == 403
    # a port with no name: by the names the resolver answered for the address
    assert banner(eg, SIX) == f"BANNER {SIX}\n".encode()
    assert refused(banner, eg, SIX_OTHER)                              # no name, no rule: refused
    assert eg.link.usage.connections >= 4 and eg.link.usage.refused >= 2


def test_addresses_and_networks_by_rule(eg):
    eg.policy([f"[{SIX}]:2222", "fd00:5::/64"])
    assert banner(eg, SIX) == f"BANNER {SIX}\n".encode()
    assert refused(banner, eg, SIX_OTHER)                              # one address, not its neighbour
    assert refused(echo, eg, SIX)                                       # (its port only)
    # a unique local address, as a private IPv4 one: reached because a rule names its network
    assert banner(eg, ULA) == f"BANNER {ULA}\n".encode()
    with eg.connect(ULA, 7) as s:
        s.sendall(b"echo6")
        assert s.recv(10) == b"echo6"
    eg.policy(["[2600:1f18::]/64:2222"])
    assert banner(eg, SIX) == f"BANNER {SIX}\n".encode()
    assert banner(eg, SIX_OTHER) == f"BANNER {SIX_OTHER}\n".encode()
    assert refused(banner, eg, ULA)
    assert any("not in the allow-list" in r["reason"] or "unique local" in r["reason"]
               for r in eg.link.usage.refused_hosts), eg.link.usage.refused_hosts


def test_non_public_ipv6_is_refused_as_ipv4_is(eg):
    eg.policy("all")
    assert banner(eg, SIX) == f"BANNER {SIX}\n".encode()                # public: `*` reaches it
    for ip in ("fd00:ec2::254", ULA, addresses6(7)[0]):                 # (the last: another link's)
        assert refused(banner, eg, ip), ip
    reasons = " ".join(r["reason"] for r in eg.link.usage.refused_hosts)
    assert "unique local" in reasons and "a sandbox address" in reasons, reasons
    # a name answering a unique local address is refused (DNS rebinding), unless a rule names it
    eg.policy(["ula.test"])
    assert answers(eg.dns("ula.test", "AAAA")) == [ULA]
    assert eg.http(ULA, "ula.test")[0] == 403
    eg.policy(["ula.test", "fd00:5::/64"])
    assert eg.http(ULA, "ula.test")[0] == 200


@pytest.mark.parametrize("name,inner", [("mapped.test", "169.254.169.254"), ("nat64.test", "169.254.169.254")])
def test_ipv6_spellings_of_the_metadata_address_are_refused(eg, name, inner):
    """A name whose AAAA is ::ffff:169.254.169.254 or 64:ff9b::a9fe:a9fe is refused as the IPv4
    address it stands for, whichever family the sandbox connected over."""
    eg.policy("all")
    for ip in (eg.lab.allowed, SIX):
        status, body = eg.http(ip, name)
        assert status == 403 and inner.encode() in body, (ip, status, body)
    assert eg.lab.trap_hits() == {}


def _nft(fd, script: str) -> str:
    with netns.entered(fd):
        return subprocess.run(["nft"] + script.split(), capture_output=True, text=True, check=True).stdout


PROBE = "inet probe6"       # a table of the test's: counts what got past sandtree's raw-priority chain


def test_spoofed_ipv6_source_dropped(eg):
    """As test_egress_proxy's IPv4 one: a source outside the sandboxes' IPv6 range, and another
    link's IPv6 address, are dropped before conntrack, though the router is given routes back to
    both (through this link for the first, a veth st77 standing for another link for the second)."""
    eg.policy("*")
    other = addresses6(7)
    with netns.entered(eg.sandbox_fd):
        sb = IPRoute()
    with netns.entered(eg.pair.router_fd):
        rt = IPRoute()
    idx = sb.link_lookup(ifname="tp202")[0]
    rt.link("add", ifname="st77", kind="veth", peer="sx77")
    st77 = rt.link_lookup(ifname="st77")[0]
    rt.link("set", index=rt.link_lookup(ifname="sx77")[0], state="up")
    rt.addr("add", index=st77, address=other[1], prefixlen=126, flags=IFA_F_NODAD)
    rt.link("set", index=st77, state="up")
    rt.route("add", dst="2001:db8:99::1/128", oif=rt.link_lookup(ifname="st202")[0], family=socket.AF_INET6)
    _nft(eg.pair.router_fd, f"add table {PROBE}")
    _nft(eg.pair.router_fd, f"add chain {PROBE} pre {{ type filter hook prerouting priority -150 ; }}")
    _nft(eg.pair.router_fd, f"add rule {PROBE} pre ip6 saddr {{ 2001:db8:99::1, {other[0]} }} counter")
    try:
        for src in ("2001:db8:99::1", other[0]):
            sb.addr("add", index=idx, address=src, prefixlen=128, flags=IFA_F_NODAD)
            try:
                with pytest.raises((socket.timeout, OSError)):
                    eg.connect(SIX, 2222, timeout=1, source=src).recv(100)
            finally:
                sb.addr("del", index=idx, address=src, prefixlen=128)
        assert _probe_count(eg.pair.router_fd) == 0
    finally:
        _nft(eg.pair.router_fd, f"delete table {PROBE}")
        rt.route("del", dst="2001:db8:99::1/128", family=socket.AF_INET6)
        rt.link("del", index=st77)
        sb.close()
        rt.close()
    assert eg.link.usage.connections == 0 and eg.link.usage.refused == 0
    assert banner(eg, SIX) == f"BANNER {SIX}\n".encode()                 # its own address: through


def _probe_count(fd) -> int:
    out = json.loads(_nft(fd, f"-j list table {PROBE}"))
    return sum(e["counter"]["packets"] for item in out["nftables"] if "rule" in item
               for e in item["rule"]["expr"] if "counter" in e)
