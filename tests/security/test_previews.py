"""Previews, each on an origin of its own (engine/sandboxes/previews.py, http/listeners.py, http/ports.py):
one sandbox's page can neither answer for another's (a service worker), nor reach its cookies,
nor leave its own origin through the headers it answers with; a signed URL is exchanged for a
cookie of its preview's host only and works nowhere else.

Real things only: a live sandbox's busybox httpd behind the store's egress daemon, `sandtree
serve`'s app on two loopback listeners (served.py), httpx, and Debian's Chromium (browser.py),
which resolves every *.localhost name to loopback itself."""

from __future__ import annotations

import httpx
import pytest

from served import client, get, serving
from test_ports import tenants, world  # noqa: F401 - the fixtures: a store, alice's and bob's tokens

SW_JS = """
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', e => e.waitUntil(self.clients.claim()));
self.addEventListener('fetch', e => {
  if (e.request.mode === 'navigate' && !e.request.url.includes('ALICE')) {
    e.respondWith(new Response('<pre id=stolen>' + e.request.url + '</pre>',
                               {headers: {'Content-Type': 'text/html'}}));
  }
});
"""
# (busybox httpd hands a CGI's headers on as they are: the worker's script with a scope header)
SW_CGI = """#!/bin/sh
printf 'Content-Type: text/javascript\\r\\nService-Worker-Allowed: /\\r\\n\\r\\n'
cat /www/sw.txt
"""
ALICE_PAGE = """<!doctype html><html><body><pre id=state>starting</pre><script>
(async () => {
  const s = document.getElementById('state');
  try {
    let reg;
    try { reg = await navigator.serviceWorker.register('cgi-bin/sw', {scope: '/'}); }
    catch (e) { reg = await navigator.serviceWorker.register('cgi-bin/sw'); }  // (the widest it may take)
    const w = reg.installing || reg.waiting || reg.active;
    if (w.state !== 'activated')
      await new Promise(r => w.addEventListener('statechange', () => { if (w.state === 'activated') r(); }));
    s.textContent = 'worker ' + reg.scope;
  } catch (e) { s.textContent = 'failed ' + e; }
})();
</script></body></html>
"""
HEADERS_CGI = """#!/bin/sh
printf 'Content-Type: text/plain\\r\\n'
printf 'Service-Worker-Allowed: /\\r\\n'
printf 'Clear-Site-Data: "cookies", "storage"\\r\\n'
printf 'Alt-Svc: h2=":9999"\\r\\n'
printf 'Set-Cookie: a=1; Domain=localhost; Path=/\\r\\n'
printf 'Set-Cookie: b=2; Path=/; domain=.localhost; HttpOnly\\r\\n'
printf 'Set-Cookie: st_port=forged.value; Path=/\\r\\n'
printf 'Set-Cookie: c=3; Path=/\\r\\n'
printf 'X-Kept: yes\\r\\n\\r\\n'
echo headers
"""


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def _bobs_sandbox(eng, bob: str, image: str) -> str:
    view = eng.as_tenant(eng.tenancy.authenticate(bob))
    sid = view.sandbox_start(image)["id"]
    view.sandbox_write(sid, "/www/index.html", b"bob's page\n")
    view.sandbox_exec(sid, "httpd -p 8000 -h /www")
    return sid


def _signed(base: str, sid: str, port: int, token: str) -> str:
    r = httpx.post(f"{base}/api/v1/sandboxes/{sid}/ports/{port}", headers=_auth(token), trust_env=False, timeout=60)
    assert r.status_code == 201, r.text
    r = httpx.post(f"{base}/api/v1/sandboxes/{sid}/port-url/{port}", headers=_auth(token), trust_env=False,
                   timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["url"]


def test_a_previews_service_worker_never_answers_for_another_preview(tenants):
    """The reported attack, in a real browser: alice's page registers a service worker as wide as
    it may (scope '/', with a Service-Worker-Allowed: / answer); bob opens his own signed preview
    later in the same browser. Bob must get his own page, and alice's worker never his URL."""
    from browser import headless_chromium
    eng, alice_sid, alice, bob = tenants
    view = eng.as_tenant(eng.tenancy.authenticate(alice))
    view.sandbox_write(alice_sid, "/www/index.html", ALICE_PAGE.encode())
    view.sandbox_write(alice_sid, "/www/sw.txt", SW_JS.replace("ALICE", alice_sid).encode())
    view.sandbox_write(alice_sid, "/www/cgi-bin/sw", SW_CGI.encode(), mode=0o755)
    bob_sid = _bobs_sandbox(eng, bob, eng.sandbox_info(alice_sid)["image"])
    try:
        with serving(eng) as srv:
            alice_url = _signed(srv.api, alice_sid, 8000, alice)
            bob_url = _signed(srv.api, bob_sid, 8000, bob)
            with headless_chromium() as browser:
                context = browser.new_context()
                page = context.new_page()
                page.goto(alice_url)
                page.wait_for_function("document.getElementById('state').textContent != 'starting'", timeout=20000)
                assert "st_sig" not in page.url                     # (exchanged: in no Referer, no history)
                state = page.inner_text("#state")
                assert state.startswith("worker "), state           # alice's worker is live, on her origin
                theirs = context.new_page()
                theirs.goto(bob_url)
                body = theirs.inner_text("body")
                assert "bob's page" in body and bob_url not in body, body
                assert theirs.locator("#stolen").count() == 0
                # ... and alice's own worker still answers her own origin only
                assert theirs.evaluate("navigator.serviceWorker.controller") is None
                context.close()
    finally:
        eng.sandbox_stop(bob_sid)


def test_a_signed_url_becomes_a_cookie_of_its_preview_only(tenants):
    """The signed GET answers 303 to the same address less the signature, with the grant as a
    host-only cookie (no Domain), Path=/, HttpOnly, SameSite=Lax; no Referer ever carries the
    signature. The grant works for its own preview's name only: a Host of another sandbox or
    port refuses it, and a cookie a sibling preview tossed in beside it does not shadow it."""
    eng, alice_sid, alice, bob = tenants
    bob_sid = _bobs_sandbox(eng, bob, eng.sandbox_info(alice_sid)["image"])
    try:
        with serving(eng) as srv:
            alice_url = _signed(srv.api, alice_sid, 8000, alice)
            bob_url = _signed(srv.api, bob_sid, 8000, bob)
            page = srv.preview(alice_sid, 8000)
            r = get(alice_url.replace("/?", "/index.html?a=1&"))
            assert r.status_code == 303 and r.headers["location"] == "/index.html?a=1"
            assert r.headers["referrer-policy"] == "no-referrer"
            cookie = r.headers["set-cookie"]
            attrs = {a.strip().split("=", 1)[0].lower() for a in cookie.split(";")[1:]}
            assert cookie.startswith("st_port=") and "domain" not in attrs, cookie
            assert {"httponly", "path", "samesite", "max-age"} <= attrs and "Path=/;" in cookie + ";", cookie
            assert "samesite=lax" in cookie.lower()
            for sneaky in ("//evil.test/x", "/\\evil.test/x"):     # the exchange redirects on this host only
                r = get(page + sneaky + "?" + alice_url.split("?", 1)[1])
                at = r.headers.get("location", "")
                assert r.status_code == 303 and at.startswith("/") and at[1:2] not in ("/", "\\"), at
            grant = cookie.split(";")[0]
            assert get(page + "/index.html", headers={"Cookie": grant}).text == "alice's page\n"
            # the grant on another name: refused (another sandbox, another port of hers)
            for other in (srv.preview(bob_sid, 8000), srv.preview(alice_sid, 9000)):
                r = get(other + "/", headers={"Cookie": grant})
                assert r.status_code == 403, other
                r = get(other + "/?" + alice_url.split("?", 1)[1])
                assert r.status_code == 403, other
            assert "signature" in get(srv.preview(bob_sid, 8000) + "/", headers={"Cookie": grant}).json()["message"]
            # the port's path of bob's sandbox under alice's name is a path of alice's page: bob's
            # signature does not open it, and nothing of bob's is reached by it
            r = get(page + f"/api/v1/sandboxes/{bob_sid}/ports/8000/?" + bob_url.split("?", 1)[1])
            assert r.status_code == 403
            # the cookie opens the page to its own requests and to a navigation, never to another
            # site's page (a sibling preview's frame or fetch: same-site under a shared domain)
            for site, dest, status in (("same-origin", "script", 200), ("none", "document", 200),
                                       ("same-site", "document", 200), ("cross-site", "document", 200),
                                       ("same-site", "iframe", 401), ("same-site", "empty", 401),
                                       ("cross-site", "iframe", 401), ("cross-site", "image", 401)):
                r = get(page + "/index.html", headers={"Cookie": grant, "Sec-Fetch-Site": site,
                                                       "Sec-Fetch-Dest": dest})
                assert r.status_code == status, (site, dest, r.status_code)
            # bob's own grant, tossed in first: alice's page still opens with hers
            bob_grant = get(bob_url).headers["set-cookie"].split(";")[0]
            r = get(page + "/index.html", headers={"Cookie": f"{bob_grant}; x=1; {grant}"})
            assert r.status_code == 200 and r.text == "alice's page\n"
            assert get(page + "/index.html", headers={"Cookie": bob_grant}).status_code == 403
    finally:
        eng.sandbox_stop(bob_sid)


def test_a_previews_answer_headers_stay_in_its_origin(world):
    """What the sandbox answers reaches the browser less what acts beyond its preview: no
    Service-Worker-Allowed, Clear-Site-Data or Alt-Svc; cookies lose their Domain (host-only),
    one named like the server's grant is dropped; the rest is passed on as it came."""
    st, sb, _ = world
    sb.write("/www/cgi-bin/headers", HEADERS_CGI, mode=0o755)
    sb.expose(8000)
    with serving(st.engine) as srv:
        r = get(srv.preview(sb.id, 8000) + "/cgi-bin/headers")
        assert r.status_code == 200 and r.text == "headers\n" and r.headers["x-kept"] == "yes"
        for name in ("service-worker-allowed", "clear-site-data", "alt-svc"):
            assert name not in r.headers, name
        cookies = r.headers.get_list("set-cookie")
        assert cookies == ["a=1; Path=/", "b=2; Path=/; HttpOnly", "c=3; Path=/"], cookies
        with client() as c:                                   # a client's jar keeps them to this host
            c.get(srv.preview(sb.id, 8000) + "/cgi-bin/headers")
            assert {(k.name, k.domain) for k in c.cookies.jar} == {
                (n, f"p8000-{sb.id}.localhost") for n in ("a", "b", "c")}


COOKIES_CGI = b"#!/bin/sh\nprintf 'Content-Type: text/plain\\r\\n\\r\\n'\necho \"cookies:[$HTTP_COOKIE]\"\n"


def test_the_server_keeps_no_sandboxs_cookies(tenants):
    """The proxy's own upstream client keeps no cookie jar: every sandbox's server is at
    127.0.0.1 (cookies ignore the port), so a jar would send what alice's server set to bob's."""
    eng, alice_sid, alice, bob = tenants
    view = eng.as_tenant(eng.tenancy.authenticate(alice))
    view.sandbox_write(alice_sid, "/www/cgi-bin/headers", HEADERS_CGI.encode(), mode=0o755)
    bob_sid = _bobs_sandbox(eng, bob, eng.sandbox_info(alice_sid)["image"])
    eng.as_tenant(eng.tenancy.authenticate(bob)).sandbox_write(bob_sid, "/www/cgi-bin/cookies", COOKIES_CGI,
                                                               mode=0o755)
    try:
        with serving(eng) as srv:
            alice_url, bob_url = _signed(srv.api, alice_sid, 8000, alice), _signed(srv.api, bob_sid, 8000, bob)
            with client(follow_redirects=True) as a, client(follow_redirects=True) as b:
                assert a.get(alice_url.replace("/?", "/cgi-bin/headers?")).text == "headers\n"
                assert b.get(bob_url.replace("/?", "/cgi-bin/cookies?")).text == "cookies:[]\n"
    finally:
        eng.sandbox_stop(bob_sid)


def test_cookies_of_one_preview_never_reach_another(tenants):
    """In the browser: a cookie alice's server sets (even with Domain=localhost), and one her
    page's script sets, are not sent to bob's preview (his server echoes what it gets)."""
    from browser import headless_chromium
    eng, alice_sid, alice, bob = tenants
    view = eng.as_tenant(eng.tenancy.authenticate(alice))
    view.sandbox_write(alice_sid, "/www/cgi-bin/headers", HEADERS_CGI.encode(), mode=0o755)
    bob_sid = _bobs_sandbox(eng, bob, eng.sandbox_info(alice_sid)["image"])
    bobs = eng.as_tenant(eng.tenancy.authenticate(bob))
    bobs.sandbox_write(bob_sid, "/www/cgi-bin/cookies", COOKIES_CGI, mode=0o755)
    try:
        with serving(eng) as srv:
            alice_url = _signed(srv.api, alice_sid, 8000, alice)
            bob_url = _signed(srv.api, bob_sid, 8000, bob)
            with headless_chromium() as browser:
                context = browser.new_context()
                page = context.new_page()
                page.goto(alice_url.replace("/?", "/cgi-bin/headers?"))
                assert "headers" in page.inner_text("body")
                page.goto(srv.preview(alice_sid, 8000) + "/index.html")
                page.evaluate("document.cookie = 'js=1; path=/'")
                theirs = context.new_page()
                theirs.goto(bob_url.replace("/?", "/cgi-bin/cookies?"))
                body = theirs.inner_text("body")
                assert body.startswith("cookies:[") and all(n not in body for n in ("a=1", "b=2", "c=3", "js=1")), body
                assert "st_port" not in body                       # (nor the server's own grant)
                names = {(c["name"], c["domain"]) for c in context.cookies()}
                assert ("a", f"p8000-{alice_sid}.localhost") in names and ("a", "localhost") not in names, names
                context.close()
    finally:
        eng.sandbox_stop(bob_sid)


def test_an_unexpose_revokes_signed_urls_and_a_stopped_sandbox_answers_nothing(tenants):
    """A signed URL names one exposure: after an unexpose it stays refused, even once the same
    port is exposed again (a URL handed out before does not come back to life), and its cookie
    with it. A stopped sandbox's preview answers 404, saying so."""
    eng, sid, alice, _ = tenants
    with serving(eng) as srv:
        old = _signed(srv.api, sid, 8000, alice)
        grant = get(old).headers["set-cookie"].split(";")[0]
        assert get(srv.preview(sid, 8000) + "/", headers={"Cookie": grant}).status_code == 200
        r = httpx.delete(f"{srv.api}/api/v1/sandboxes/{sid}/ports/8000", headers=_auth(alice), trust_env=False)
        assert r.status_code == 204
        assert get(old).status_code == 403
        new = _signed(srv.api, sid, 8000, alice)               # exposed again: a new exposure
        r = get(old)
        assert r.status_code == 403 and "unexposed" in r.json()["message"]
        assert get(srv.preview(sid, 8000) + "/", headers={"Cookie": grant}).status_code == 403
        assert get(new).status_code == 303
        eng.sandbox_stop(sid)
        r = get(new, follow_redirects=False)
        assert r.status_code in (303, 404)
        with client(follow_redirects=True) as browser:
            r = browser.get(new)
            assert r.status_code == 404 and "not running" in r.json()["message"], r.text
