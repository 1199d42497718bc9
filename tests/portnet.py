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
        self.host_fd = netns.current()
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
        os.close(self.host_fd)


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


class StandInEgress:
    """TEMPORARY stand-in for network/client.py Egress (the links engineer's daemon, not yet
    committed): the same methods the engine's port code calls (adopt, expose, unexpose, usage,
    release), done in this process: a router namespace of its own, a veth into the sandbox's own
    namespace (no default route), and network/expose.py on an event loop in a thread. Replaced
    by the real Egress once e14-links is merged."""

    def __init__(self, first_index: int = 210):
        import asyncio
        self.router_fd = netns.new()
        self.host_fd = netns.current()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.links: dict[str, tuple[LinkState, int]] = {}      # key -> (link, its namespace fd)
        self.exposed: dict[tuple[str, int], object] = {}
        self.next = first_index
        self.calls: list[tuple] = []

    def _run(self, coro):
        import asyncio
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def _known(self, key: str):
        from sandtree.errors import NotFound
        if key not in self.links:
            raise NotFound(f"no link {key!r}")
        return self.links[key]

    def available(self) -> tuple[bool, str]:
        return True, ""

    def adopt(self, key: str, pid: int):
        self.calls.append(("adopt", key, pid))
        from sandtree.errors import Conflict
        if key in self.links:
            raise Conflict(f"link {key!r} exists")
        i = self.next
        self.next += 1
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        link = LinkState(key=key, index=i, address=f"100.64.{i}.2", gateway=f"100.64.{i}.1", policy=None)
        r = _ipr_in(self.router_fd)
        try:
            r.link("add", ifname=f"st{i}", kind="veth", peer=f"eth{i}")
            r.link("set", index=r.link_lookup(ifname=f"eth{i}")[0], net_ns_fd=fd)
            _up(r, "lo", None)
            _up(r, f"st{i}", link.gateway)
        finally:
            r.close()
        s = _ipr_in(fd)
        try:
            _up(s, f"eth{i}", link.address)
        finally:
            s.close()
        self.links[key] = (link, fd)
        return link

    def expose(self, key: str, port: int) -> int:
        from sandtree.network.expose import expose
        self.calls.append(("expose", key, port))
        link, _ = self._known(key)
        if (key, port) not in self.exposed:
            self.exposed[(key, port)] = self._run(expose(link, port, self.router_fd, self.host_fd))
        return self.exposed[(key, port)].host_port

    def unexpose(self, key: str, port: int) -> None:
        from sandtree.errors import NotFound
        self.calls.append(("unexpose", key, port))
        ex = self.exposed.pop((key, port), None)
        if ex is None:
            raise NotFound(f"port {port} of {key!r} is not exposed")
        self.loop.call_soon_threadsafe(ex.close)

    def usage(self, key: str) -> dict:
        self._known(key)
        return {}

    def release(self, key: str) -> dict:
        self.calls.append(("release", key))
        link, fd = self._known(key)
        for k in [k for k in self.exposed if k[0] == key]:
            self.loop.call_soon_threadsafe(self.exposed.pop(k).close)
        del self.links[key]
        r = _ipr_in(self.router_fd)
        try:
            idx = r.link_lookup(ifname=f"st{link.index}")
            if idx:
                r.link("del", index=idx[0])
        finally:
            r.close()
        os.close(fd)
        return {}

    def restart(self) -> None:
        """As a daemon restart: every link and listener gone."""
        for key in list(self.links):
            self.release(key)

    def close(self) -> None:
        self.restart()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        os.close(self.router_fd)
        os.close(self.host_fd)


# A WebSocket echo of one text message for busybox (nc -ll -e): the handshake's accept key by
# sha1sum + xxd + base64, the client's frame (masked, < 126 bytes) read byte by byte with dd and
# unmasked with shell arithmetic, echoed back unmasked with "echo: " in front.
WS_ECHO = r"""#!/bin/sh
key=""
while IFS= read -r line; do
  line=$(printf '%s' "$line" | tr -d '\r')
  [ -z "$line" ] && break
  case "$line" in [Ss]ec-[Ww]eb[Ss]ocket-[Kk]ey:*) key=$(echo "${line#*:}" | tr -d ' ');; esac
done
accept=$(printf '%s' "${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11" | sha1sum | cut -d' ' -f1 | xxd -r -p | base64)
printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n' "$accept"
hex=$(dd bs=1 count=6 2>/dev/null | xxd -p)
len=$(( 0x$(echo "$hex" | cut -c3-4) & 127 ))
payload=$(dd bs=1 count=$len 2>/dev/null | xxd -p | tr -d '\n')
out="echo: "
i=0
while [ $i -lt $len ]; do
  m=$(( 0x$(echo "$hex" | cut -c$(( 5 + (i % 4) * 2 ))-$(( 6 + (i % 4) * 2 ))) ))
  p=$(( 0x$(echo "$payload" | cut -c$(( 1 + i * 2 ))-$(( 2 + i * 2 ))) ))
  out="$out$(printf '\\%03o' $(( m ^ p )))"
  i=$((i + 1))
done
n=$(( len + 6 ))
printf "\201\\$(printf %03o $n)$out"
sleep 1
"""
