"""The REST server of an engine in a thread, as `sandtree serve` runs it: uvicorn on two loopback
listeners, the API's and the exposed ports' (http/listeners.py: another origin). Used by the
port-exposure tests."""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import uvicorn

from sandtree.http.listeners import bind
from sandtree.http.server import build_app

from conftest import wait_for_port


class Served(NamedTuple):
    api: str            # http://127.0.0.1:PORT: the API and the web page
    ports: str          # http://127.0.0.1:PORT: exposed ports of sandboxes


@contextlib.contextmanager
def serving(engine):
    sockets = bind("127.0.0.1", 0, 0)
    api, ports = (s.getsockname()[1] for s in sockets)
    server = uvicorn.Server(uvicorn.Config(build_app(engine, ports_port=ports), log_level="warning"))
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
