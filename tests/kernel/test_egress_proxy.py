"""The egress path without the daemon: a router namespace with nft.py's ruleset, the proxy and the
resolver on an event loop of their own, a "sandbox" namespace on a veth to it, and the upstream in
the netlab (a test-made internet). Every packet stays in namespaces this test made."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time

import dns.message
import dns.query
import dns.rcode
import pytest
from pyroute2 import IPRoute

from sandtree.network import netns
from sandtree.network.proxy import recheck

from netlab import ProxyRig, netlab, read_all as _read_all


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
        e = ProxyRig(lab)
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


def test_allowed_name_by_dns_and_host(eg):
    eg.policy(["allowed.test"])
    r = eg.dns("allowed.test")
    assert [str(x) for rr in r.answer for x in rr] == [eg.lab.allowed]
    status, body = eg.http(eg.lab.allowed, "allowed.test", "/hello")
    assert status == 200
    assert json.loads(body)["path"] == "/hello" and json.loads(body)["address"] == eg.lab.allowed
    u = eg.link.usage
    assert u.connections == 1 and u.allowed_hosts == ["allowed.test"] and u.bytes_in > 0 and u.bytes_out > 0


def test_allowed_name_by_sni_to_https(eg):
    eg.policy(["allowed.test:443"])
    status, body = eg.https(eg.lab.allowed, "allowed.test", "/tls")
    assert status == 200 and json.loads(body)["path"] == "/tls"
    # the same name on port 80 is not allowed: the rule names 443 only
    status, body = eg.http(eg.lab.allowed, "allowed.test")
    assert status == 403 and b"allowed.test:80" in body


def test_other_names_refused_with_reason(eg):
    eg.policy(["allowed.test"])
    status, body = eg.http(eg.lab.other, "other.test")
    assert status == 403
    assert b"other.test" in body and b"not in the allow-list" in body
    assert refused(eg.https, eg.lab.other, "other.test")
    hosts = {(r["host"], r["port"]) for r in eg.link.usage.refused_hosts}
    assert ("other.test", 80) in hosts and ("other.test", 443) in hosts
    assert eg.lab.hits[(eg.lab.other, 80)] == 0 and eg.lab.hits[(eg.lab.other, 443)] == 0


def test_cidr_port_rule_for_echo(eg):
    eg.policy(["11.1.1.10/32:7"])
    with eg.connect(eg.lab.allowed, 7) as s:
        s.sendall(b"ping")
        assert s.recv(10) == b"ping"
    assert refused(lambda: eg.connect(eg.lab.allowed, 2222).recv(100))
    assert any(r["port"] == 2222 for r in eg.link.usage.refused_hosts)


def test_name_rule_on_other_ports_through_dns_answers(eg):
    eg.policy(["allowed.test:2222"])
    assert refused(lambda: eg.connect(eg.lab.allowed, 2222).recv(100))   # not resolved yet: a bare address
    eg.dns("allowed.test")
    with eg.connect(eg.lab.allowed, 2222) as s:
        assert s.recv(100) == f"BANNER {eg.lab.allowed}\n".encode()


def test_dns_of_disallowed_name_fails(eg):
    eg.policy(["allowed.test"])
    for tcp in (False, True):
        r = eg.dns("other.test", tcp=tcp)
        assert r.rcode() == dns.rcode.NXDOMAIN and not r.answer
    assert eg.link.usage.dns_refused == 2
    assert any(h["host"] == "other.test" and h["port"] == 53 for h in eg.link.usage.refused_hosts)
    assert eg.lab.hits[("dns", "other.test")] == 0          # never asked upstream
    assert eg.dns("allowed.test", "AAAA").answer == []


def test_dns_to_any_address_is_answered_by_the_resolver(eg):
    eg.policy(["allowed.test"])
    r = eg.dns("allowed.test", server="8.8.8.8")                # redirected: never leaves
    assert [str(x) for rr in r.answer for x in rr] == [eg.lab.allowed]


def test_txt_and_other_udp_go_nowhere(eg):
    eg.policy("all")
    r = eg.dns("tunnel.test", "TXT")
    assert r.answer == []                                       # the resolver answers A records only
    assert eg.lab.hits[("dns", "tunnel.test")] == 0
    before = sum(eg.lab.hits.values())
    s = eg.sock(socket.SOCK_DGRAM)
    s.settimeout(1)
    s.sendto(dns.message.make_query("tunnel.test", "TXT").to_wire(), (eg.lab.dns[0], 5353))
    s.sendto(b"x", (eg.lab.allowed, 7))
    with pytest.raises((socket.timeout, ConnectionRefusedError)):
        s.recv(100)
    assert sum(eg.lab.hits.values()) == before


@pytest.mark.parametrize("ip,port", [("169.254.169.254", 80), ("10.1.2.3", 7),
                                     ("100.64.0.1", 80), ("100.64.201.1", 15001), ("100.64.201.1", 2222),
                                     ("11.1.0.2", 80)])
def test_all_refuses_non_public(eg, ip, port):
    # (127.x from the sandbox is its own loopback: it never reaches the router; loop.test covers 127.x)
    eg.policy("*")
    assert refused(lambda: eg.connect(ip, port).recv(100))
    assert eg.link.usage.refused == 1 and eg.link.usage.connections == 0


@pytest.mark.parametrize("name", ["rebind.test", "private.test", "loop.test", "cgnat.test"])
def test_all_refuses_names_resolving_to_non_public(eg, name):
    eg.policy("*")
    status, body = eg.http(eg.lab.allowed, name)
    assert status == 403 and name.encode() in body
    assert refused(eg.https, eg.lab.allowed, name)
    # the proxy dialled by name: had it dialled the answer, the trap listener there would have
    # counted it (checked by the autouse fixture)


def test_etc_hosts_trick_dials_the_real_address(eg):
    eg.policy(["allowed.test"])
    status, body = eg.http(eg.lab.other, "allowed.test")       # 11.1.1.11 with Host: allowed.test
    assert status == 200 and json.loads(body)["address"] == eg.lab.allowed
    status, body = eg.https(eg.lab.other, "allowed.test")
    assert status == 200 and json.loads(body)["address"] == eg.lab.allowed


def test_deny_list(eg):
    eg.policy({"deny_out": ["other.test", "11.1.1.10/32:2222"]})
    assert eg.http(eg.lab.allowed, "allowed.test")[0] == 200
    status, body = eg.http(eg.lab.other, "other.test")
    assert status == 403 and b"denied by rule other.test" in body
    assert eg.dns("other.test").rcode() == dns.rcode.NXDOMAIN
    assert refused(lambda: eg.connect(eg.lab.allowed, 2222).recv(100))
    with eg.connect(eg.lab.allowed, 7) as s:                     # public, not denied
        s.sendall(b"x")
        assert s.recv(1) == b"x"


def test_port_rules(eg):
    eg.policy(["11.1.1.0/24:7,2000-3000"])
    with eg.connect(eg.lab.other, 2222) as s:
        assert s.recv(100).startswith(b"BANNER")
    assert refused(lambda: eg.connect(eg.lab.other, 80).recv(100))


def test_recheck_cuts_open_connection(eg):
    eg.policy(["11.1.1.10/32"])
    s = eg.connect(eg.lab.allowed, 7)
    s.sendall(b"a")
    assert s.recv(1) == b"a"
    keep = eg.connect(eg.lab.allowed, 2222)
    eg.policy(["11.1.1.10/32:2222"])
    assert eg.call(recheck, eg.link) == 1
    assert refused(lambda: (s.sendall(b"b"), s.recv(1))[1])
    assert keep.recv(100).startswith(b"BANNER")
    s.close()
    keep.close()


def _nft(fd, script: str) -> str:
    with netns.entered(fd):
        return subprocess.run(["nft"] + script.split(), capture_output=True, text=True, check=True).stdout


PROBE = "inet probe"        # a table of the test's: counts what got past sandtree's raw-priority chain


def _probe_count(fd) -> int:
    out = json.loads(_nft(fd, f"-j list table {PROBE}"))
    return sum(e["counter"]["packets"] for item in out["nftables"] if "rule" in item
               for e in item["rule"]["expr"] if "counter" in e)


def test_spoofed_source_dropped(eg):
    """A source outside the sandboxes' range, and another link's address: dropped before
    conntrack. The router is given routes back to both (through this link for the first, a
    veth st77 standing for another link for the second), so without the rules the first would
    connect and the second would reach the probe counter after sandtree's raw chain."""
    eg.policy("*")
    hits = eg.lab.hits[(eg.lab.allowed, 7)]
    with netns.entered(eg.sandbox_fd):
        sb = IPRoute()
    with netns.entered(eg.pair.router_fd):
        rt = IPRoute()
    idx = sb.link_lookup(ifname="tp201")[0]
    rt.link("add", ifname="st77", kind="veth", peer="sx77")       # no dummy driver on this kernel
    st77 = rt.link_lookup(ifname="st77")[0]
    rt.link("set", index=rt.link_lookup(ifname="sx77")[0], state="up")
    rt.addr("add", index=st77, address="100.64.77.1", prefixlen=30)
    rt.link("set", index=st77, state="up")
    rt.route("add", dst="10.9.9.9/32", oif=rt.link_lookup(ifname="st201")[0])
    _nft(eg.pair.router_fd, f"add table {PROBE}")
    _nft(eg.pair.router_fd, f"add chain {PROBE} pre {{ type filter hook prerouting priority -150 ; }}")
    _nft(eg.pair.router_fd, f"add rule {PROBE} pre ip saddr {{ 10.9.9.9, 100.64.77.2 }} counter")
    try:
        for src in ("10.9.9.9", "100.64.77.2"):
            sb.addr("add", index=idx, address=src, prefixlen=32)
            try:
                with pytest.raises((socket.timeout, OSError)):
                    eg.connect(eg.lab.allowed, 7, timeout=1, source=src)
            finally:
                sb.addr("del", index=idx, address=src, prefixlen=32)
        assert _probe_count(eg.pair.router_fd) == 0
    finally:
        _nft(eg.pair.router_fd, f"delete table {PROBE}")
        rt.route("del", dst="10.9.9.9/32", oif=rt.link_lookup(ifname="st201")[0])
        rt.link("del", index=st77)
        sb.close()
        rt.close()
    assert eg.lab.hits[(eg.lab.allowed, 7)] == hits
    assert eg.link.usage.connections == 0 and eg.link.usage.refused == 0
    # the link's own address still gets through
    with eg.connect(eg.lab.allowed, 7) as s:
        s.sendall(b"x")
        assert s.recv(1) == b"x"


def test_no_network_policy_refuses_everything(eg):
    assert refused(lambda: eg.connect(eg.lab.allowed, 7).recv(1))
    assert eg.dns("allowed.test").rcode() == dns.rcode.NXDOMAIN


def test_secret_injected_only_for_its_host_through_the_transparent_path(eg):
    """The proxy hands a connection whose SNI a secret is for to the interceptor: the netlab's HTTPS
    server receives the real value; another allowed host gets the placeholder; the sandbox's TLS
    ends at the link's CA, the upstream's is verified against the netlab CA (Upstream.ca_file)."""
    from sandtree.network.trust import bundle, link_ca, parse_secrets
    value = "real-" + "v" * 20
    secrets = parse_secrets({"TOKEN": {"value": value, "hosts": ["allowed.test"]}})
    eg.link.secrets, eg.link.ca = secrets, link_ca(eg.link.key, secrets)
    ph = secrets[0].placeholder
    try:
        eg.policy(["allowed.test", "other.test"])
        ctx = ssl.create_default_context(cadata=bundle(eg.link.ca.pem(), open(eg.lab.ca_file, "rb").read()).decode())
        for name, ip, expect in (("allowed.test", eg.lab.allowed, value), ("other.test", eg.lab.other, ph)):
            s = eg.connect(ip, 443)
            with ctx.wrap_socket(s, server_hostname=name) as t:
                issuer = t.getpeercert()["issuer"]
                t.sendall(f"GET /s HTTP/1.1\r\nHost: {name}\r\nAuthorization: Bearer {ph}\r\n"
                          f"Connection: close\r\n\r\n".encode())
                data = _read_all(t)
            assert data.startswith(b"HTTP/1.1 200")
            assert eg.lab.requests[-1]["headers"]["authorization"] == f"Bearer {expect}"
            assert value.encode() not in data          # the interceptor masks echoes
            netlab_ca = any(("commonName", "netlab test CA") in rdn for rdn in issuer)
            assert netlab_ca == (name == "other.test")   # only the secret's host is intercepted
        assert eg.link.usage.bytes_out > 0 and set(eg.link.usage.allowed_hosts) >= {"allowed.test", "other.test"}
    finally:
        eg.link.secrets, eg.link.ca = [], None


def _get_stream(eg, n: int) -> socket.socket:
    s = eg.connect(eg.lab.allowed, 80)
    s.sendall(f"GET /bytes/{n} HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n".encode())
    return s


def _count(s: socket.socket, limit: int | None = None) -> int:
    buf = bytearray(1 << 20)
    got = 0
    while limit is None or got < limit:
        try:
            k = s.recv_into(buf)
        except (ConnectionResetError, socket.timeout):
            break
        if not k:
            break
        got += k
    return got


def test_bulk_download_intact_and_counted(eg):
    """Past BULK_BYTES a direction is relayed from a thread: the bytes and the counts still add up."""
    eg.policy(["allowed.test"])
    n = 48 << 20
    with _get_stream(eg, n) as s:
        got = _count(s)
    assert got > n and got - n < 200                         # the body and a short head
    deadline = time.time() + 3
    while eg.link.usage.bytes_in < got and time.time() < deadline:
        time.sleep(0.05)                                     # the thread's last count reaches the loop
    assert eg.link.usage.bytes_in == got


def test_recheck_cuts_a_bulk_transfer(eg):
    eg.policy(["allowed.test"])
    n = 4 << 30                                             # never read to the end
    s = _get_stream(eg, n)
    try:
        assert _count(s, 24 << 20) >= 24 << 20                 # past BULK_BYTES: in a thread now
        eg.policy(["other.test"])
        assert eg.call(recheck, eg.link) == 1
        s.settimeout(3)
        rest = _count(s)                                     # what was in flight, then the end
        assert rest < 256 << 20
    finally:
        s.close()


def _client_hello(name: str | None) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = name is not None
    if name is None:
        ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return out.read()


def test_sniff_parsers():
    from sandtree.network.sniff import http_host, sni
    hello = _client_hello("Allowed.Test")
    assert sni(hello) == "allowed.test"
    assert sni(hello[:3]) is False and sni(hello[:len(hello) - 1]) is False     # more needed
    assert sni(_client_hello(None)) is None and sni(b"GET / HTTP/1.1\r\n") is None
    assert http_host(b"GET / HTTP/1.1\r\nHost: Example.org:8080\r\n\r\n") == "example.org"
    assert http_host(b"GET / HTTP/1.1\r\nhost: [::1]:80\r\n\r\n") == "::1"
    assert http_host(b"GET / HTTP/1.1\r\nHost: a.b\r\n") is False                # head not ended
    assert http_host(b"GET / HTTP/1.1\r\nX: y\r\n\r\n") is None
    assert http_host(b"SSH-2.0-OpenSSH\r\n\r\n") is None


def test_a_network_rule_naming_a_non_public_address_reaches_it(eg):
    """The only way to a private/link-local address: a rule naming it (and only on its ports).
    (The traps record these on purpose; the counts are taken back so the fixture's check holds.)"""
    eg.policy(["*", "169.254.169.254/32:80", "10.1.2.3/32:7"])
    try:
        status, body = eg.http(eg.lab.allowed, "rebind.test")
        assert status == 200 and json.loads(body)["address"] == "169.254.169.254"
        with eg.connect("10.1.2.3", 7) as s:
            s.sendall(b"x")
            assert s.recv(1) == b"x"
        assert refused(lambda: eg.connect("10.1.2.3", 2222).recv(10))
        assert set(eg.lab.trap_hits()) == {("169.254.169.254", 80), ("10.1.2.3", 7)}
    finally:
        for k in list(eg.lab.trap_hits()):
            del eg.lab.hits[k]


def test_a_slow_reader_does_not_spin_the_proxy(eg):
    """While the sandbox reads nothing, the proxy waits (no busy loop on the upstream's readiness)."""
    eg.policy(["allowed.test"])
    s = _get_stream(eg, 4 << 20)                            # under BULK_BYTES: relayed on the loop
    try:
        time.sleep(0.5)                                      # buffers fill; the relay now waits
        async def cpu():
            return time.thread_time()
        t0 = eg.run(cpu())
        time.sleep(1.0)
        used = eg.run(cpu()) - t0
        assert used < 0.2, f"the proxy's loop used {used:.2f} s of CPU in 1 s of waiting"
        assert _count(s) > 4 << 20
    finally:
        s.close()
