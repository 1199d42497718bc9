"""`make bench` rows for the egress path (issue 14): the extra start cost of a run with an
allow-list policy (a link from the egress daemon, its namespace joined, resolv.conf bound), the
rate of a bulk download through the transparent proxy against the same download direct
(bench/egress.py), and the latency secret injection adds to an HTTPS request (the proxy handing
the connection to the interceptor, against the same request spliced through untouched), on a
kept-alive connection and with a new connection each time. Everything but the start rows runs in
namespaces made here (tests/netlab.py); the start rows send no packet. Asserts nothing but that
the measured thing happened."""

from __future__ import annotations

import os
import ssl
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from netlab import ProxyRig, netlab  # noqa: E402

import egress  # noqa: E402

from sandtree.network.trust import bundle, link_ca, parse_secrets  # noqa: E402


def _alternate(im, policy, n: int, plain: list, netted: list) -> None:
    for _ in range(n):
        for out, kw in ((plain, {}), (netted, {"network": policy})):
            t = time.perf_counter()
            im.run(["/bin/true"], disposable=True, **kw)
            out.append(time.perf_counter() - t)


def start_rows(img, cold_img, n: int, timeit, unrecycled_img=None) -> list:
    """(name, samples) rows: a run without network and one with an allow-list policy, warm (the
    engine's pools: a networked run takes a helper started ahead in a link) and cold (warm=0: a
    link attached per run). Plain and networked runs alternate, so load on the machine falls on
    both alike. unrecycled_img: the same image in a store of its own whose engine asks for links
    that are never recycled (Egress.recycle off: a fresh link for every run, removed after, as
    before recycling): measured in blocks that alternate with the warm rows' (A B A B; runs of
    both stores interleaved one by one would put each one's background work on the other's runs)."""
    policy = ["allowed.example", "*.pypi.org:443"]
    rows = []
    for label, im, other in (("warm start", img, unrecycled_img), ("cold start", cold_img, None)):
        for x in (im, other):
            if x is not None:
                x.run(["/bin/true"], network=policy, disposable=True)      # (the first starts the linked pool)
        time.sleep(0.5)
        plain, netted, plain2, unrecycled = [], [], [], []
        for half in (n - n // 2, n // 2):
            _alternate(im, policy, half, plain, netted)
            if other is not None:
                time.sleep(0.3)                      # (the other store's background work settles)
                _alternate(other, policy, half, plain2, unrecycled)
                time.sleep(0.3)
        r = im.run(["/bin/true"], network=policy, disposable=True)
        assert r.usage.get("network") is not None, "the run had no link"
        rows += [(f"run /bin/true, no network ({label})", plain),
                 (f"run /bin/true, allow-list policy ({label})", netted)]
        if other is not None:
            rows += [(f"run /bin/true, no network ({label}, store without recycling)", plain2),
                     (f"run /bin/true, allow-list policy ({label}, links not recycled)", unrecycled)]
    return rows


def _request(t: ssl.SSLSocket, ph: str) -> None:
    t.sendall(f"GET /s HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: Bearer {ph}\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += t.recv(65536)
    head, body = buf.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += t.recv(65536)


def injection_rows(n: int, timeit) -> list:
    """(name, samples) rows: HTTPS GETs to the lab's allowed.test through the proxy, spliced (no
    secret for that host) and intercepted (a secret for it), kept-alive and a connection each."""
    rows = []
    with netlab() as lab:
        rig = ProxyRig(lab)
        try:
            rig.policy(["allowed.test"])
            secrets = parse_secrets({"TOKEN": {"value": "bench-value-" + "x" * 20, "hosts": ["allowed.test"]}})
            ph = secrets[0].placeholder
            ca = link_ca(rig.link.key, secrets)
            ctx = ssl.create_default_context(cadata=bundle(ca.pem(), open(lab.ca_file, "rb").read()).decode())
            for label, on in (("spliced", False), ("secret injected", True)):
                rig.link.secrets, rig.link.ca = (secrets, ca) if on else ([], None)
                t = ctx.wrap_socket(rig.connect(lab.allowed, 443), server_hostname="allowed.test")
                kept = timeit(lambda: _request(t, ph), n)
                t.close()

                def fresh():
                    with ctx.wrap_socket(rig.connect(lab.allowed, 443), server_hostname="allowed.test") as s:
                        _request(s, ph)
                rows.append((f"HTTPS GET through egress, kept-alive, {label}", kept))
                rows.append((f"HTTPS GET through egress, new connection, {label}", timeit(fresh, n // 3)))
                want = "bench-value-" if on else ph
                assert want in lab.requests[-1]["headers"]["authorization"], "not what was measured"
        finally:
            rig.link.secrets, rig.link.ca = [], None
            rig.close()
    return rows


def download(mb: int, rounds: int) -> dict:
    return egress.measure(mb, rounds)

