"""Namespaces made by the port-exposure tests: a router namespace and a "sandbox" namespace joined
by a veth pair, addressed like a link (100.64.K.1 router side, 100.64.K.2 sandbox side, and the
IPv6 pair of links.addresses6(K)), with a server the test runs in the sandbox namespace. Nothing here leaves namespaces the test made; every
fd and thread is closed by close()."""

from __future__ import annotations

import os
import socket
import threading

from pyroute2 import IPRoute

from sandtree.network import netns
from sandtree.network.links import IFA_F_NODAD, V6_QUIET, addresses6
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
        address6, gateway6 = addresses6(index)
        self.link = LinkState(key=f"test{index}", index=index, address=f"100.64.{index}.2",
                              gateway=f"100.64.{index}.1", policy=None, address6=address6, gateway6=gateway6)
        for fd in (self.router_fd, self.sandbox_fd):      # (as links.py makes them: one IPv6 address a side)
            for name, value in V6_QUIET:
                netns.write_sysctl(fd, name, value)
        r = _ipr_in(self.router_fd)
        try:
            r.link("add", ifname=f"st{index}", kind="veth", peer=f"tp{index}")
            idx = r.link_lookup(ifname=f"tp{index}")[0]
            r.link("set", index=idx, net_ns_fd=self.sandbox_fd)
            _up(r, "lo", None)
            _up(r, f"st{index}", f"{self.link.gateway}")
            r.addr("add", index=r.link_lookup(ifname=f"st{index}")[0], address=gateway6, prefixlen=126,
                   flags=IFA_F_NODAD)
        finally:
            r.close()
        s = _ipr_in(self.sandbox_fd)
        try:
            _up(s, "lo", None)
            _up(s, f"tp{index}", self.link.address)
            s.addr("add", index=s.link_lookup(ifname=f"tp{index}")[0], address=address6, prefixlen=126,
                   flags=IFA_F_NODAD)
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
