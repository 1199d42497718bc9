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

import dns.rcode
import pytest

from netlab import SIX, SIX_OTHER, ULA, ProxyRig, netlab
from sandtree.network.links import addresses6


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
    with eg.connect(SIX, 7) as s:                                       # (its port only)
        s.settimeout(2)
        assert refused(lambda: (s.sendall(b"x"), s.recv(10))[1])
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


def test_a_link_cannot_pass_for_another_over_ipv6(eg):
    """The sandboxes' IPv6 range is checked by the router as the IPv4 one: a packet from another
    link's address (FREEBIND lets root in the sandbox's namespace send one) is dropped."""
    eg.policy("all")
    s = eg.sock(family=socket.AF_INET6)
    s.settimeout(1.5)
    with s:
        s.setsockopt(socket.IPPROTO_IPV6, 34, 1)                        # IPV6_FREEBIND
        s.bind(("fd5a:6e64:7472::6", 0))
        with pytest.raises((socket.timeout, OSError)):
            s.connect((SIX, 2222))
            assert s.recv(100) == b""
