"""Port exposure (issue 14, item 5): network/expose.py's relay, the engine's rows, the server's
proxy under /api/v1/sandboxes/{sid}/ports/{port}/ (HTTP and WebSocket), signed URLs.

Real sockets only: servers run in network namespaces the test made (portnet.py) or in live
sandboxes, whose links the store's real egress daemon makes (network/daemon.py: adopt); every
connection is to 127.0.0.1 or into those namespaces."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time

import httpx
import pytest
from websockets.asyncio.client import connect as ws_connect

import sandtree
from sandtree.network.expose import expose

from served import client, get as pget, serving, ws_kwargs
from portnet import WS_ECHO, LinkPair, echo, http_hello


@pytest.fixture
def pair():
    p = LinkPair(index=201)
    yield p
    p.close()


def _run(coro):
    return asyncio.run(coro)


async def _client(port: int, data: bytes) -> bytes:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(data)
    w.write_eof()
    out = await asyncio.wait_for(r.read(), 5)
    w.close()
    return out


def test_expose_relays_to_the_sandbox_and_counts_bytes(pair):
    pair.serve(7000, echo)

    async def main():
        ex = await expose(pair.link, 7000, pair.router_fd, pair.host_fd)
        try:
            payload = b"x" * 300_000
            got = await _client(ex.host_port, payload)
            assert got == payload
            await asyncio.sleep(0.05)
            s = ex.stats()
            assert (s["connections"], s["bytes_in"], s["bytes_out"]) == (1, len(payload), len(payload))
            return ex.host_port
        finally:
            ex.close()
    port = _run(main())
    with pytest.raises(OSError):                     # closed: nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_an_exposed_port_with_nothing_listening_resets(pair):
    async def main():
        ex = await expose(pair.link, 7001, pair.router_fd, pair.host_fd)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", ex.host_port)
            w.write(b"hello")
            try:
                got = await asyncio.wait_for(r.read(), 5)
            except ConnectionResetError:
                got = b""
            assert got == b""
            assert ex.stats()["failed"] == 1 and ex.stats()["connections"] == 0
        finally:
            ex.close()
    _run(main())


def test_only_the_exposed_port_is_relayed(pair):
    """The listener relays to its own port only (another port of the sandbox is not reachable
    through it), and listens on the host's loopback only."""
    pair.serve(7002, http_hello(b"seven-two"))
    pair.serve(7003, http_hello(b"seven-three"))

    async def main():
        ex = await expose(pair.link, 7002, pair.router_fd, pair.host_fd)
        try:
            got = await _client(ex.host_port, b"GET / HTTP/1.0\r\n\r\n")
            assert b"seven-two" in got and b"seven-three" not in got
            assert [s.getsockname()[0] for s in ex.server.sockets] == ["127.0.0.1"]
        finally:
            ex.close()
    _run(main())


def test_close_cuts_open_relays(pair):
    pair.serve(7004, echo)

    async def main():
        ex = await expose(pair.link, 7004, pair.router_fd, pair.host_fd)
        r, w = await asyncio.open_connection("127.0.0.1", ex.host_port)
        w.write(b"ping")
        assert await asyncio.wait_for(r.read(4), 5) == b"ping"
        ex.close()
        t0 = time.monotonic()
        try:
            rest = await asyncio.wait_for(r.read(), 5)
        except ConnectionResetError:
            rest = b""
        assert rest == b"" and time.monotonic() - t0 < 2
    _run(main())


def test_exposure_works_under_the_routers_ruleset(pair):
    """With network/nft.py's ruleset in the router namespace (a link may send nothing in but
    answers, DNS and proxied TCP), the router's own connection to an exposed port still works:
    the sandbox's answers are `established` there."""
    from sandtree.network import nft
    nft.install(pair.router_fd)
    pair.serve(7005, http_hello(b"under nft"))

    async def main():
        ex = await expose(pair.link, 7005, pair.router_fd, pair.host_fd)
        try:
            got = await _client(ex.host_port, b"GET / HTTP/1.0\r\n\r\n")
            assert b"under nft" in got and ex.stats()["connections"] == 1
        finally:
            ex.close()
    _run(main())


def test_bad_ports_are_refused(pair):
    async def main():
        for bad in (0, 65536, -1, "80", True):
            with pytest.raises(ValueError):
                await expose(pair.link, bad, pair.router_fd, pair.router_fd)
    _run(main())


# ---- through the engine, the SDK and `sandtree serve` ------------------------------------------------



@pytest.fixture
def world(tmp_path, rootfs):
    """A store with the busybox image, a live sandbox running busybox httpd on 8000 (a page) and a
    WebSocket echo on 9000; the store's real egress daemon (network/daemon.py), stopped after."""
    st = sandtree.Sandtree(str(tmp_path / "home"))
    egress = st.engine.egress
    img = st.import_image(rootfs, tag="busybox")
    sb = img.start()
    try:
        sb.write("/www/index.html", "hello from the sandbox\n")
        sb.write("/bin/ws-echo", WS_ECHO, mode=0o755)
        sb.exec("httpd -p 8000 -h /www; (nc -ll -p 9000 -e /bin/ws-echo >/dev/null 2>&1 &)")
        yield st, sb, egress
    finally:
        with contextlib.suppress(Exception):
            sb.stop()
        egress.stop_daemon()
        st.close()


def _get(url: str, **kw) -> httpx.Response:
    return httpx.get(url, timeout=10, trust_env=False, **kw)


def test_a_sandbox_server_answers_only_while_exposed(world):
    st, sb, egress = world
    assert sb.ports() == []
    with serving(st.engine) as srv:
        page = srv.preview(sb.id, 8000)
        r = pget(page + "/index.html")
        assert r.status_code == 404 and "not exposed" in r.json()["message"]
        entry = sb.expose(8000)
        assert entry["port"] == 8000 and entry["path"] == f"/api/v1/sandboxes/{sb.id}/ports/8000/"
        assert entry["url"].startswith("http://127.0.0.1:")
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"
        r = pget(page + "/index.html")
        assert r.status_code == 200 and r.text == "hello from the sandbox\n"
        assert sb.ports() == [entry]
        assert sb.expose(8000) == entry                     # exposing twice: the same port
        # another port of the same sandbox stays unreachable through the server
        assert pget(srv.preview(sb.id, 9000) + "/").status_code == 404
        sb.unexpose(8000)
        assert sb.ports() == []
        with pytest.raises(httpx.ConnectError):
            _get(entry["url"] + "/index.html")
        assert pget(page + "/").status_code == 404
    assert [(l["key"], l["adopted"]) for l in egress.list()] == [(sb.id, True)]     # one link, made by adopt


def test_a_websocket_through_the_url_and_the_server(world):
    st, sb, _ = world
    entry = sb.expose(9000)

    async def echo(url: str, **kw) -> str:
        async with ws_connect(url, open_timeout=10, **({"proxy": None} | kw)) as ws:
            await ws.send("hi there")
            return await asyncio.wait_for(ws.recv(), 10)
    assert _run(echo("ws://" + entry["url"][len("http://"):] + "/")) == "echo: hi there"
    with serving(st.engine) as srv:
        url = srv.preview(sb.id, 9000).replace("http://", "ws://") + "/chat"
        assert _run(echo(url, **ws_kwargs(url))) == "echo: hi there"


def test_bad_ports_and_stopped_sandboxes_are_refused(world):
    st, sb, _ = world
    from sandtree.errors import Conflict, InvalidInput, NotFound
    for bad in (0, 70000, "80", True):
        with pytest.raises(InvalidInput):
            sb.expose(bad)
    with pytest.raises(NotFound):
        sb.unexpose(8000)
    with pytest.raises(NotFound):
        sb.port_url(8000)
    sb.stop()
    with pytest.raises(Conflict):
        sb.expose(8000)


def test_exposed_ports_are_served_on_an_origin_of_their_own(world):
    """A page the sandbox serves is another origin than the API's and than every other preview's
    (http/listeners.py): p<port>-<id>.localhost on the ports' listener is routed by that name alone;
    the port's path (on either listener) is redirected there; the ports' listener serves nothing
    else; a preview's name on the API's listener is refused; and a call the page's script would
    make to the API (a token-less server here) is refused by its Origin."""
    st, sb, _ = world
    entry = sb.expose(8000)
    with serving(st.engine) as srv:
        base, ports, page = srv.api, srv.ports, srv.preview(sb.id, 8000)
        assert base != ports and page.startswith(f"http://p8000-{sb.id}.localhost:")
        assert pget(page + "/index.html").text == "hello from the sandbox\n"
        assert pget(page.upper().replace("HTTP://", "http://") + "/index.html").status_code == 200   # (names: any case)
        for at in (base, ports):                       # the port's path: to the preview's origin, query and all
            r = pget(at + entry["path"] + "index.html?a=1")
            assert r.status_code == 307 and r.headers["location"] == page + "/index.html?a=1", at
        with client(follow_redirects=True) as c:
            r = c.get(base + entry["path"] + "index.html")
            assert r.status_code == 200 and r.text == "hello from the sandbox\n" and str(r.url).startswith(page)
        for path in ("/api/v1/images", "/", "/ui/", f"/api/v1/sandboxes/{sb.id}", "/v1/images", "/index.html"):
            r = _get(ports + path)
            assert r.status_code == 404 and "exposed ports of sandboxes only" in r.json()["message"], path
        for host in (f"p8000-{sb.id}.example.test", f"x8000-{sb.id}.localhost", f"p08000-{sb.id}.localhost",
                     f"p70000-{sb.id}.localhost", f"p8000-{sb.id[:31]}.localhost", f"a.p8000-{sb.id}.localhost"):
            r = _get(ports + "/index.html", headers={"Host": host})     # not a preview's name here: nothing
            assert r.status_code == 404 and "exposed ports of sandboxes only" in r.json()["message"], host
        r = _get(base + "/api/v1/images", headers={"Host": f"p8000-{sb.id}.localhost:{base.rsplit(':', 1)[1]}"})
        assert r.status_code == 404 and "preview" in r.json()["message"]
        # the page's own requests pass; its script's calls to the API, or to another preview, do not
        assert pget(page + "/index.html", headers={"Origin": page, "Sec-Fetch-Site": "same-origin"}).status_code == 200
        r = _get(base + "/api/v1/images", headers={"Origin": page, "Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403 and "origin" in r.json()["message"]
        assert _get(base + "/api/v1/images", headers={"Sec-Fetch-Site": "same-site"}).status_code == 403
        r = pget(srv.preview(sb.id, 8000) + "/index.html",
                 headers={"Origin": srv.preview(sb.id, 9000), "Sec-Fetch-Site": "same-site"})
        assert r.status_code == 403
        # a link to the preview (the web page's "open" button) is followed; a frame or a form is not
        link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Dest": "document", "Sec-Fetch-Mode": "navigate"}
        assert pget(page + "/index.html", headers=link).status_code == 200
        assert pget(page + "/index.html", headers={**link, "Sec-Fetch-Dest": "iframe"}).status_code == 403
        with client() as c:
            assert c.post(page + "/index.html", headers={**link, "Origin": base}).status_code == 403
        r = httpx.post(f"{base}/api/v1/sandboxes/{sb.id}/port-url/8000", trust_env=False, timeout=10)
        assert r.json()["url"].startswith(page + "/?st_exp=")
        with pytest.raises(Exception) as e:                     # a WebSocket is not redirected: refused
            _run(ws_connect("ws://" + base[len("http://"):] + entry["path"], proxy=None, open_timeout=10).__aenter__())
        assert getattr(getattr(e.value, "response", None), "status_code", None) == 403, e.value
    from fastapi.testclient import TestClient
    from sandtree.http.server import build_app
    with TestClient(build_app(st.engine), base_url="http://127.0.0.1") as c:      # no ports listener: none served
        r = c.get(entry["path"] + "index.html")
        assert r.status_code == 404 and "serves no exposed ports" in r.json()["message"]
    from sandtree.errors import InvalidInput
    for bad in ("http://previews.example.com", "ftp://*.x.test", "https://*.x.test/path", "https://*.bad_name",
                "https://u@*.x.test"):
        with pytest.raises(InvalidInput):
            build_app(st.engine, ports_port=1, preview_base=bad)


def test_no_spelling_of_a_proxy_path_serves_the_sandboxs_page_on_the_apis_origin(world):
    """The API's listener told a proxy path by the gate's strict pattern (32 hex digits, then 1-5
    digits), the router by its own (any segment; the port read as an integer, the sandbox by a
    prefix): `/ports/008000/`, `/ports/+8000/`, `/ports/ 8000/` or a sandbox ID prefix were routed to
    the proxy on the API's listener, and the sandbox's page came back as text/html on the API's
    origin (attack review of issue 33). Every path the router would proxy goes to the ports' origin."""
    st, sb, _ = world
    entry = sb.expose(8000)
    sid = sb.id
    with serving(st.engine) as srv:
        page = srv.preview(sid, 8000)
        for path in (f"{sid}/ports/008000/", f"{sid}/ports/+8000/", f"{sid}/ports/%208000/", f"{sid[:12]}/ports/8000/",
                     f"{sid}/ports/8000/"):
            r = _get(f"{srv.api}/api/v1/sandboxes/{path}index.html")
            assert "hello from the sandbox" not in r.text, (path, r.status_code)
            # the port's own path is sent to the preview's origin; any other spelling is no port's path
            assert (r.status_code == 307 and r.headers["location"] == page + "/index.html") if path.endswith("/8000/") \
                and len(path) > 40 else r.status_code == 404, (path, r.status_code, r.headers, r.text[:80])
            # nor on the ports' listener without the preview's host name
            r = _get(f"{srv.ports}/api/v1/sandboxes/{path}index.html")
            assert "hello from the sandbox" not in r.text and r.status_code in (307, 404), (path, r.status_code)
        assert pget(page + "/index.html").text == "hello from the sandbox\n"
        assert entry["port"] == 8000


def test_the_apis_answers_are_never_a_document_of_its_origin(world):
    """What the API answers holds what sandboxes wrote (a file read, an output): with no type sniffing
    and CSP `sandbox` on every answer but the page's and the docs' own, a body that a browser would take
    as HTML runs in an opaque origin, not the API's (where the page keeps its token). Defence in depth
    behind the answers' own types (attack review of issue 33)."""
    st, sb, _ = world
    sb.write("/www/evil.html", "<script>alert(sessionStorage.length)</script>\n")
    with serving(st.engine) as (base, _ports):
        for path in (f"/api/v1/sandboxes/{sb.id}/file?path=/www/evil.html", "/api/v1/images", "/api/v1/nothing"):
            r = _get(base + path)
            assert r.headers.get("x-content-type-options") == "nosniff", (path, r.headers)
            assert r.headers.get("content-security-policy") == "sandbox", (path, r.headers)
        page = _get(base + "/")
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        assert _get(base + "/ui/app.js").headers["content-security-policy"] == page.headers["content-security-policy"]


def test_a_gvisor_sandbox_exposes_ports_of_its_link(world, request):
    """gVisor fixes a sandbox's network at its start: with a policy (a link, joined on host
    networking) its port is exposed as on namespaces; without one the expose is refused with the
    reason, not a namespace error."""
    from conftest import tier_or_skip
    from sandtree.errors import RuntimeUnavailable
    st, _, _ = world
    tier_or_skip(request, st, "gvisor")
    img = st.image("busybox")
    bare = img.start(tier="gvisor")
    try:
        with pytest.raises(RuntimeUnavailable, match="network is fixed when it starts"):
            bare.expose(8000)
        assert bare.ports() == []
    finally:
        bare.stop()
    sb = img.start(tier="gvisor", network=["allowed.test"])      # (a name no resolver answers)
    try:
        sb.write("/www/index.html", "hello from gvisor\n")
        assert sb.exec("(httpd -p 8000 -h /www &); sleep 0.2").ok
        entry = sb.expose(8000)
        assert _get(entry["url"] + "/index.html").text == "hello from gvisor\n"
        with serving(st.engine) as srv:
            assert pget(srv.preview(sb.id, 8000) + "/index.html").text == "hello from gvisor\n"
        sb.unexpose(8000)
        with pytest.raises(httpx.ConnectError):
            _get(entry["url"] + "/index.html")
    finally:
        sb.stop()


@pytest.fixture
def tenants(world):
    """world, with tokens: alice owns the sandbox (started through her view), bob is another tenant."""
    st, sb_local, egress = world
    eng = st.engine
    eng.share(eng.sandbox_info(sb_local.id)["image"])
    alice = eng.tenancy.create_token("alice")["token"]
    bob = eng.tenancy.create_token("bob")["token"]
    view = eng.as_tenant(eng.tenancy.authenticate(alice))
    info = view.sandbox_start(eng.sandbox_info(sb_local.id)["image"])
    view.sandbox_write(info["id"], "/www/index.html", b"alice's page\n")
    view.sandbox_write(info["id"], "/bin/ws-echo", WS_ECHO.encode(), mode=0o755)
    view.sandbox_exec(info["id"], "httpd -p 8000 -h /www; (nc -ll -p 9000 -e /bin/ws-echo >/dev/null 2>&1 &)")
    try:
        yield eng, info["id"], alice, bob
    finally:
        with contextlib.suppress(Exception):
            eng.sandbox_stop(info["id"])


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def test_another_tenants_token_is_refused(tenants):
    eng, sid, alice, bob = tenants
    with serving(eng) as srv:
        base = srv.api
        r = httpx.post(f"{base}/api/v1/sandboxes/{sid}/ports/8000", headers=_auth(bob), trust_env=False)
        assert r.status_code == 404                          # bob cannot expose alice's sandbox
        r = httpx.post(f"{base}/api/v1/sandboxes/{sid}/ports/8000", headers=_auth(alice), trust_env=False)
        assert r.status_code == 201, r.text
        page = srv.preview(sid, 8000) + "/"
        assert pget(page, headers=_auth(alice)).text == "alice's page\n"
        r = pget(page, headers=_auth(bob))
        assert r.status_code == 404 and r.json()["error"] == "not_found"
        assert pget(page).status_code == 401                 # no token at all
        assert _get(f"{base}/api/v1/sandboxes/{sid}/ports", headers=_auth(bob)).status_code == 404
        assert [p["port"] for p in _get(f"{base}/api/v1/sandboxes/{sid}/ports", headers=_auth(alice)).json()] \
            == [8000]
        # a WebSocket needs the token as well
        httpx.post(f"{base}/api/v1/sandboxes/{sid}/ports/9000", headers=_auth(alice), trust_env=False)
        ws = srv.preview(sid, 9000).replace("http://", "ws://") + "/"

        async def talk(headers):
            async with ws_connect(ws, additional_headers=headers, open_timeout=10, **ws_kwargs(ws)) as c:
                await c.send("alice here")
                return await asyncio.wait_for(c.recv(), 10)
        assert _run(talk(_auth(alice))) == "echo: alice here"
        for headers, status in ((_auth(bob), 404), ({}, 401)):
            with pytest.raises(Exception) as e:
                _run(talk(headers))
            assert getattr(getattr(e.value, "response", None), "status_code", None) == status, e.value


def test_a_signed_url_works_without_a_token_until_it_expires(tenants):
    eng, sid, alice, bob = tenants
    with serving(eng) as srv:
        base, page = srv.api, srv.preview(sid, 8000)
        httpx.post(f"{base}/api/v1/sandboxes/{sid}/ports/8000", headers=_auth(alice), trust_env=False, timeout=60)
        r = httpx.post(f"{base}/api/v1/sandboxes/{sid}/port-url/8000", params={"ttl": 6}, headers=_auth(alice),
                       trust_env=False, timeout=60)
        assert r.status_code == 200, r.text
        url = r.json()["url"]
        assert url.startswith(f"{page}/?st_exp=")
        assert httpx.post(f"{base}/api/v1/sandboxes/{sid}/port-url/8000", headers=_auth(bob),
                          trust_env=False).status_code == 404
        with client(follow_redirects=True) as browser:
            r = browser.get(url)
            assert r.status_code == 200 and r.text == "alice's page\n"
            assert str(r.url) == page + "/"                       # the signature exchanged for the cookie
            assert "st_port" in browser.cookies                  # the page's own requests carry the grant
            assert browser.get(f"{page}/index.html").text == "alice's page\n"
            # the grant is for that port only: the API and other ports need a token
            assert browser.get(f"{base}/api/v1/sandboxes/{sid}").status_code == 401
            assert browser.get(srv.preview(sid, 9000) + "/").status_code == 401
        # a WebSocket by a signed URL of its own port
        httpx.post(f"{base}/api/v1/sandboxes/{sid}/ports/9000", headers=_auth(alice), trust_env=False)
        ws_url = httpx.post(f"{base}/api/v1/sandboxes/{sid}/port-url/9000", headers=_auth(alice),
                            trust_env=False).json()["url"].replace("http://", "ws://")

        async def talk(u):
            async with ws_connect(u, open_timeout=10, **ws_kwargs(u)) as c:
                await c.send("by signature")
                return await asyncio.wait_for(c.recv(), 10)
        assert _run(talk(ws_url)) == "echo: by signature"
        with pytest.raises(Exception) as e:
            _run(talk(url.replace("http://", "ws://").replace("p8000-", "p9000-")))
        assert e.value.response.status_code == 403
        altered = url[:-1] + ("0" if url[-1] != "0" else "1")
        r = pget(altered)
        assert r.status_code == 403 and "signature" in r.json()["message"]
        other_port = url.replace("p8000-", "p8001-")
        assert pget(other_port).status_code == 403
        later = url.replace("st_exp=", "st_exp=9")
        assert pget(later).status_code == 403                    # a longer life is an altered URL
        exp = int(url.split("st_exp=")[1].split("&")[0])
        time.sleep(max(0.0, exp - time.time() + 1.1))
        r = pget(url)
        assert r.status_code == 403 and "expired" in r.json()["message"]
        from sandtree.errors import InvalidInput
        with pytest.raises(InvalidInput):
            eng.sandbox_port_url(sid, 8000, ttl=0)
    key = os.path.join(eng.store.home, "ports.key")
    assert os.stat(key).st_mode & 0o777 == 0o600


def test_exposure_is_remade_after_a_daemon_restart(world):
    st, sb, egress = world
    entry = sb.expose(8000)
    egress.stop_daemon()                                    # every link and listener gone
    with pytest.raises(httpx.ConnectError):
        _get(entry["url"] + "/index.html")
    again = sb.ports()                                      # the rows make them again
    assert [p["port"] for p in again] == [8000] and again[0]["url"] != entry["url"]
    assert _get(again[0]["url"] + "/index.html").text == "hello from the sandbox\n"
    with serving(st.engine) as srv:
        assert pget(srv.preview(sb.id, 8000) + "/index.html").text == "hello from the sandbox\n"


def test_a_request_to_a_hibernated_sandbox_resumes_it(world):
    st, sb, egress = world
    ok, why = st.engine.sandboxes.live.hibernate_available()
    if not ok:
        pytest.skip(f"hibernate unavailable here: {why}")
    entry = sb.expose(8000)
    assert _get(entry["url"] + "/index.html").status_code == 200
    assert sb.hibernate()["state"] == "hibernated"
    assert [p["url"] for p in sb.ports()] == [None]
    with serving(st.engine) as srv:
        r = pget(srv.preview(sb.id, 8000) + "/index.html")
        assert r.status_code == 200 and r.text == "hello from the sandbox\n", r.text
    assert st.engine.sandbox_info(sb.id)["state"] == "running"
    assert [(l["key"], l["ports"]) for l in egress.list()] == [(sb.id, {"8000": int(sb.ports()[0]["url"][17:])})]


def test_the_remote_client_and_mcp_expose_too(tenants):
    """The SDK over HTTP (sandtree.connect) and the MCP tool: the same rows, the same rules."""
    eng, sid, alice, bob = tenants
    with serving(eng) as srv:
        st = sandtree.connect(srv.api, token=alice)
        try:
            entry = eng.as_tenant(eng.tenancy.authenticate(alice)).sandbox_expose(sid, 8000)
            remote = st.engine
            assert remote.sandbox_expose(sid, 8000) == entry
            assert remote.sandbox_ports(sid) == [entry]
            signed = remote.sandbox_port_url(sid, 8000, ttl=60)
            assert signed.startswith(srv.preview(sid, 8000) + "/?st_exp=")
            with client(follow_redirects=True) as browser:
                assert browser.get(signed).text == "alice's page\n"
            from sandtree.errors import InvalidInput, NotFound
            with pytest.raises(InvalidInput):
                remote.sandbox_expose(sid, 0)
            remote.sandbox_unexpose(sid, 8000)
            with pytest.raises(NotFound):
                remote.sandbox_unexpose(sid, 8000)
            with pytest.raises(NotFound):
                sandtree.connect(srv.api, token=bob).engine.sandbox_ports(sid)
        finally:
            st.close()
    actions = [a["action"] for a in eng.audit(tenant="alice", limit=50)]
    assert "sandbox expose" in actions and "sandbox unexpose" in actions

    from mcp.client.client import Client
    from sandtree.mcp.server import build_server

    async def main():
        async with Client(build_server(eng, tools="all")) as c:
            r = await c.call_tool("sandbox_port", {"sandbox_id": sid, "port": 8000, "url_ttl": 60})
            assert not r.is_error, r.content
            got = json.loads(r.content[0].text)
            assert got["port"] == 8000 and got["signed_url"].startswith(f"http://p8000-{sid}.localhost:")
            assert _get(got["url"] + "/").text == "alice's page\n"
            r = await c.call_tool("sandbox_port", {"sandbox_id": sid, "port": 8000, "close": True})
            assert not r.is_error and json.loads(r.content[0].text) == {"port": 8000, "exposed": False}
    _run(main())


def test_the_cli_port_verb(world, monkeypatch, capsys):
    """`sandtree port ID PORT` prints the URL; --url-ttl a signed one; no PORT lists; --close."""
    st, sb, _ = world
    import importlib
    cli_main = importlib.import_module("sandtree.cli.main")
    from sandtree.cli import sandboxes as cli_sandboxes
    monkeypatch.setattr(cli_sandboxes, "open_engine", lambda args: st.engine)   # (the world's engine)

    def cli(*argv) -> str:
        assert cli_main.main(list(argv)) in (0, None)
        return capsys.readouterr().out.strip()
    url = cli("port", sb.id[:8], "8000")
    assert url.startswith("http://127.0.0.1:") and _get(url + "/index.html").text == "hello from the sandbox\n"
    signed = cli("port", sb.id, "8000", "--url-ttl", "60")
    assert signed.startswith(f"/api/v1/sandboxes/{sb.id}/ports/8000/?st_exp=")
    assert cli("port", sb.id) == f"8000  {url}  /api/v1/sandboxes/{sb.id}/ports/8000/"
    assert json.loads(cli("port", sb.id, "--json"))[0]["url"] == url
    cli("port", sb.id, "8000", "--close")
    assert cli("port", sb.id) == ""
    assert cli_main.main(["port", sb.id, "8000", "--close"]) != 0      # not exposed: a clear error
    assert "not exposed" in capsys.readouterr().err


CGI_ECHO = """#!/bin/sh
printf 'Content-Type: application/octet-stream\\r\\nX-Method: %s\\r\\nX-Query: %s\\r\\n\\r\\n' "$REQUEST_METHOD" "$QUERY_STRING"
[ -n "$CONTENT_LENGTH" ] && head -c "$CONTENT_LENGTH" | sha256sum | cut -d' ' -f1
"""


def test_any_method_and_bodies_stream_through_the_server(world):
    """A POST body reaches the sandbox's server whole (a CGI script hashing its input), other
    methods as they are, the query string less the signed-URL fields; the answer's headers come back."""
    st, sb, _ = world
    import hashlib
    sb.write("/www/cgi-bin/echo", CGI_ECHO, mode=0o755)
    entry = sb.expose(8000)
    body = os.urandom(3 * 1024 * 1024)
    with serving(st.engine) as srv, client(timeout=30) as c:
        page = srv.preview(sb.id, 8000) + "/"
        r = c.post(page + "cgi-bin/echo?a=1&st_exp=5&b=2", content=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-method"] == "POST" and r.headers["x-query"] == "a=1&b=2"
        assert r.text.strip() == hashlib.sha256(body).hexdigest()
        for method in ("PUT", "DELETE", "PATCH"):       # (busybox httpd hands a CGI a body on POST only)
            r = c.request(method, page + "cgi-bin/echo")
            assert r.status_code == 200 and r.headers["x-method"] == method, r.text
        r = c.get(page + "nothing-here")
        assert r.status_code == 404                         # the sandbox's own 404, passed on


CGI_WORKER = """#!/bin/sh
printf 'Content-Type: text/javascript\\r\\nService-Worker-Allowed: /\\r\\nClear-Site-Data: "cookies", "storage"\\r\\nX-Kept: yes\\r\\n'
printf 'Set-Cookie: st_port=1.2; Path=/\\r\\nSet-Cookie: app=1; Path=/\\r\\n\\r\\n'
echo 'self.addEventListener("fetch", (e) => e.respondWith(fetch(e.request)));'
"""


def test_a_sandbox_page_cannot_widen_its_service_worker_or_clear_the_hosts_data(world):
    """(When every sandbox's exposed ports shared the ports listener's origin, one port with paths per
    sandbox, a sandbox's `Service-Worker-Allowed: /` let a worker it registered take every path of that origin,
    other tenants' sandboxes' pages included (their answers, the signed URLs a user opens, the grant
    cookie's requests), its `Clear-Site-Data` wiped the host's cookies (every port grant), and a
    `Set-Cookie` of the grant's name replaced another port's grant. None of these is passed on; the
    sandbox's other headers and cookies are (attack review of issue 33). Each preview has an origin
    of its own now; the headers stay dropped, for siblings under one preview domain.)"""
    st, sb, _ = world
    sb.write("/www/cgi-bin/sw.js", CGI_WORKER, mode=0o755)
    entry = sb.expose(8000)
    with serving(st.engine) as srv:
        r = pget(srv.preview(sb.id, entry["port"]) + "/cgi-bin/sw.js")
        assert r.status_code == 200 and "respondWith" in r.text and r.headers["x-kept"] == "yes"
        assert "service-worker-allowed" not in r.headers, r.headers
        assert "clear-site-data" not in r.headers, r.headers
        # nor a cookie of the server's own name (it would replace another port's grant: cookies know no port)
        assert r.headers.get_list("set-cookie") == ["app=1; Path=/"], r.headers


def test_sandtree_port_in_its_own_process(world):
    """`sandtree port ID PORT` as a command: the URL it prints works after it exits (the listener
    is the daemon's), and --close makes it unreachable."""
    import subprocess
    import sys
    st, sb, _ = world
    cmd = [sys.executable, "-m", "sandtree", "--home", st.engine.store.home, "port", sb.id[:12], "8000"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    url = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, timeout=60).stdout.strip()
    assert _get(url + "/index.html").text == "hello from the sandbox\n"
    subprocess.run(cmd + ["--close"], capture_output=True, text=True, check=True, env=env, timeout=60)
    with pytest.raises(httpx.ConnectError):
        _get(url + "/index.html")


def test_a_networked_sandboxs_port_uses_its_own_link(tmp_path, rootfs):
    """A sandbox started with network= has its link from its start (key: its id): exposing a port
    uses it (no second link by adopt), and its policy is unchanged. The upstream is a netlab this
    test made (tests/netlab.py), so nothing the sandbox sends leaves namespaces the test made."""
    from netlab import NetLab
    from sandtree.engine import Engine
    from sandtree.network.client import Egress
    lab = NetLab()
    eng = Engine(str(tmp_path / "home"), warm=0)
    eng._egress = Egress(eng.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                         upstream_ca=lab.ca_file)
    try:
        img = eng.import_path(rootfs)
        info = eng.sandbox_start(img, network={"allow_out": ["allowed.test"]})
        try:
            eng.sandbox_write(info["id"], "/www/index.html", b"networked\n")
            eng.sandbox_exec(info["id"], "httpd -p 8000 -h /www")
            entry = eng.sandbox_expose(info["id"], 8000)
            assert _get(entry["url"] + "/index.html").text == "networked\n"
            links = [l for l in eng.egress.list() if l["key"] == info["id"]]
            assert len(links) == 1 and not links[0]["adopted"] and links[0]["policy"] is not None
            assert links[0]["ports"] == {"8000": int(entry["url"][17:])}
        finally:
            eng.sandbox_stop(info["id"])
    finally:
        eng.egress.stop_daemon()
        eng.close()
        lab.close()
