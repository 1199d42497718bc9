"""Namespaces made by the port-exposure tests: a router namespace and a "sandbox" namespace joined
by a veth pair, addressed like a link (100.64.K.1 router side, 100.64.K.2 sandbox side), with a
server the test runs in the sandbox namespace. Nothing here leaves namespaces the test made; every
fd and thread is closed by close()."""

from __future__ import annotations

import os
import socket
import threading

from pyroute2 import IPRoute

from sandtree.network import netns
from sandtree.network.state import LinkState


def _ipr_in(fd: int) -> IPRoute:
    with netns.entered(fd):
        return IPRoute()               # a netlink socket talks to the namespace it was made in


def _up(ipr: IPRoute, name: str, address: str | None) -> None:
    idx = ipr.link_lookup(ifname=name)[0]
    if address:
        ipr.addr("add", index=idx, address=address, prefixlen=30)
    ipr.link("set", index=idx, state="up")


class LinkPair:
    """router_fd, sandbox_fd, link (a LinkState for the sandbox end)."""

    def __init__(self, index: int = 200, sandbox_fd: int | None = None):
        self.router_fd = netns.new()
        self.own_sandbox = sandbox_fd is None
        self.sandbox_fd = netns.new() if sandbox_fd is None else os.dup(sandbox_fd)
        self.link = LinkState(key=f"test{index}", index=index, address=f"100.64.{index}.2",
                              gateway=f"100.64.{index}.1", policy=None)
        r = _ipr_in(self.router_fd)
        try:
            r.link("add", ifname=f"st{index}", kind="veth", peer=f"tp{index}")
            idx = r.link_lookup(ifname=f"tp{index}")[0]
            r.link("set", index=idx, net_ns_fd=self.sandbox_fd)
            _up(r, "lo", None)
            _up(r, f"st{index}", f"{self.link.gateway}")
        finally:
            r.close()
        s = _ipr_in(self.sandbox_fd)
        try:
            _up(s, "lo", None)
            _up(s, f"tp{index}", self.link.address)
        finally:
            s.close()
        self.servers: list[socket.socket] = []

    def serve(self, port: int, handler) -> None:
        """A TCP server in the sandbox namespace on link.address:port; handler(conn) per connection
        (in a thread of its own)."""
        with netns.entered(self.sandbox_fd):
            s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(16)
        self.servers.append(s)

        def loop():
            while True:
                try:
                    c, _ = s.accept()
                except OSError:
                    return
                threading.Thread(target=handler, args=(c,), daemon=True).start()
        threading.Thread(target=loop, daemon=True).start()

    def close(self) -> None:
        for s in self.servers:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        os.close(self.router_fd)            # the veth pair dies with the router namespace
        os.close(self.sandbox_fd)


def echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def http_hello(body: bytes):
    def handler(conn: socket.socket) -> None:
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                d = conn.recv(4096)
                if not d:
                    return
                buf += d
            line = buf.split(b"\r\n", 1)[0]
            out = body + b" " + line
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(out) + out)
    return handler
