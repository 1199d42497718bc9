"""The REST server of an engine in a thread, as `sandtree serve` runs it: uvicorn on two loopback
listeners, the API's and the exposed ports' (http/listeners.py: each preview under a host name of
its own, p<port>-<id>.localhost). Used by the port-exposure tests.

Chromium resolves every *.localhost name to loopback itself; this machine's resolver does not, so
the test clients here (`client()`, `ws_kwargs()`) connect to 127.0.0.1 and send the preview's name
as the Host, as a browser would: the server routes by that name alone."""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import httpx
import uvicorn

from sandtree.http.listeners import bind
from sandtree.http.server import build_app

from conftest import wait_for_port


class Served(NamedTuple):
    api: str            # http://127.0.0.1:PORT: the API and the web page
    ports: str          # http://127.0.0.1:PORT: the exposed ports' listener (by the preview's host name only)

    def preview(self, sid: str, port: int) -> str:
        """The origin of exposed port `port` of sandbox `sid` (its full id)."""
        return f"http://p{port}-{sid}.localhost:{self.ports.rsplit(':', 1)[1]}"


class _Loopback(httpx.HTTPTransport):
    """Connects a *.localhost URL to 127.0.0.1 (its Host header, cookies and redirects keep the name)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host.endswith(".localhost"):
            request = httpx.Request(request.method, request.url.copy_with(host="127.0.0.1"),
                                    headers=request.headers, stream=request.stream, extensions=request.extensions)
        return super().handle_request(request)


def client(**kw) -> httpx.Client:
    """An httpx client that reaches preview host names (the module doc); never the environment's proxies."""
    return httpx.Client(transport=_Loopback(), trust_env=False, timeout=kw.pop("timeout", 10), **kw)


def get(url: str, **kw) -> httpx.Response:
    with client() as c:
        return c.get(url, **kw)


def ws_kwargs(url: str) -> dict:
    """websockets' connect() keywords that reach a ws:// URL of a preview's host name on loopback."""
    port = int(url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    return {"host": "127.0.0.1", "port": port, "proxy": None}


@contextlib.contextmanager
def serving(engine, preview_base: str | None = None):
    sockets = bind("127.0.0.1", 0, 0)
    api, ports = (s.getsockname()[1] for s in sockets)
    app = build_app(engine, ports_port=ports, **({"preview_base": preview_base} if preview_base else {}))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=server.run, kwargs={"sockets": sockets}, daemon=True)
    t.start()
    try:
        wait_for_port(api, 20)
        yield Served(f"http://127.0.0.1:{api}", f"http://127.0.0.1:{ports}")
    finally:
        server.should_exit = True
        t.join(10)
        for s in sockets:
            s.close()
