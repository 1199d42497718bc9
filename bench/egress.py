"""Egress throughput: a 1 GB download through the transparent proxy (sandbox namespace -> router's
nft redirect -> proxy -> upstream namespace -> server) against the same download straight from the
upstream namespace (what the host would get). Everything runs in namespaces made here (tests/
netlab.py): the server and both clients are processes of their own (nsenter), so the proxy's
event loop is the only Python work in this process. Prints the rates; asserts nothing.

    PYTHONPATH=src .venv/bin/python bench/egress.py [--mb 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from netlab import ALLOWED, ProxyRig, netlab  # noqa: E402

PORT = 8080
SERVER = r"""
import os, socket, sys
n = int(sys.argv[1])
blob = os.memfd_create("blob"); os.ftruncate(blob, 64 << 20)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[3]))); s.listen(8); print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % n)
    left = n
    while left > 0:
        left -= os.sendfile(c.fileno(), blob, 0, min(left, 64 << 20))
    c.close()
"""
CLIENT = r"""
import socket, sys, time
n = int(sys.argv[1])
s = socket.create_connection((sys.argv[2], int(sys.argv[3])))
t0 = time.perf_counter()
s.sendall(b"GET /blob HTTP/1.1\r\nHost: x\r\n\r\n")
buf = bytearray(1 << 20); view = memoryview(buf); got = 0; head = None
while True:
    k = s.recv_into(view)
    if not k:
        break
    if head is None:
        i = bytes(view[:k]).find(b"\r\n\r\n"); head = i + 4; k -= head
    got += k
    if got >= n:
        break
dt = time.perf_counter() - t0
assert got == n, (got, n)
print(dt)
"""


def nsrun(fd: int, code: str, *args, **kw):
    return ["nsenter", f"--net=/proc/{os.getpid()}/fd/{fd}", sys.executable, "-c", code, *map(str, args)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    n = a.mb << 20
    with netlab() as lab:
        rig = ProxyRig(lab)
        server = subprocess.Popen(nsrun(lab.internet_fd, SERVER, n, ALLOWED, PORT), pass_fds=(lab.internet_fd,),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "ready"
            rig.policy([f"{ALLOWED}/32:{PORT}"])
            rates = {"direct (upstream namespace)": [], "through the egress proxy": []}
            for _ in range(a.rounds):
                for label, fd in (("direct (upstream namespace)", lab.edge_fd),
                                  ("through the egress proxy", rig.sandbox_fd)):
                    out = subprocess.run(nsrun(fd, CLIENT, n, ALLOWED, PORT), pass_fds=(fd,),
                                         capture_output=True, text=True, check=True).stdout
                    rates[label].append(n / float(out) / 1e6)
            for label, r in rates.items():
                r.sort()
                print(f"{label:32s} median {r[len(r) // 2]:8.0f} MB/s   (runs: {', '.join(f'{x:.0f}' for x in r)})")
            ratio = sorted(rates["through the egress proxy"])[a.rounds // 2] / \
                sorted(rates["direct (upstream namespace)"])[a.rounds // 2]
            print(f"ratio proxy/direct: {ratio:.2f} (goal >= 0.8); link usage: {rig.link.usage.bytes_in} bytes in")
        finally:
            server.kill()
            server.wait()
            rig.close()


if __name__ == "__main__":
    main()
