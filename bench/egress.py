"""Egress throughput: a 1 GB download through the transparent proxy (sandbox namespace -> router's
nft redirect -> proxy -> upstream namespace -> server) against the same download straight from the
upstream namespace (what the host would get); the sandbox's namespace has a link's socket buffer
limits. Two paths through the proxy: port 8080 allowed by a network rule (an opaque TCP relay: by
the splice relay, the default, and by the kernel's sockmap, network/fastpath.py, which
SANDTREE_EGRESS_RELAY=kernel chooses) and port 80 allowed by name (plain HTTP: each request's Host
decided, the response body spliced by its length). The paths take turns in each round (the
machine's load moves them alike). CPU is given twice: this process's (the proxy: its loop, its
splice threads) and the whole machine's busy time from /proc/stat (the kernel relay's work runs in
kernel workers and softirqs, not in the proxy; other work on the machine is in it too). Everything runs in namespaces made here (tests/
netlab.py): the server and both clients are processes of their own (nsenter), so the proxy's
event loop is the only Python work in this process. Prints the rates; asserts nothing.

    PYTHONPATH=src .venv/bin/python bench/egress.py [--mb 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from netlab import ALLOWED, ProxyRig, netlab  # noqa: E402

from sandtree.network import fastpath, netns  # noqa: E402
from sandtree.network.links import LINK_SYSCTLS  # noqa: E402


def _as_a_link(fd: int) -> None:
    """The rig's sandbox namespace gets a real link's socket buffer limits (links.py: tcp_rmem's
    maximum 256 KiB, tcp_wmem's 64 KiB), so the download is measured as a sandbox would make it."""
    with netns.entered(fd):
        for name, value in LINK_SYSCTLS:
            if name in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
                with open("/proc/sys/" + name.replace(".", "/"), "w") as f:
                    f.write(value)

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
s.sendall(b"GET /blob HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
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


def _cpu() -> float:
    """CPU seconds of this process (the proxy's loop and its splice threads; user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _machine() -> float:
    """Busy CPU seconds of the whole machine (all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


PATHS = (("direct", "direct (upstream namespace)"), ("proxy", "egress, TCP by network rule (splice)"),
         ("kernel", "egress, TCP by network rule (kernel)"), ("http", "egress, plain HTTP on port 80"))


def measure(mb: int = 1024, rounds: int = 3) -> dict:
    """Median MB/s of `mb` MB downloads direct and through the egress proxy:
    {"direct", "proxy" (port 8080, a network rule: the splice relay, the default), "kernel" (the
    same by the kernel relay), "http" (port 80, by name), "runs", "cpu" (the proxy's s/GB),
    "machine" (the machine's busy s/GB), "kernel_off" (why the kernel relay can not run, or '')}."""
    n = mb << 20
    with netlab(serve=(443, 7, 2222)) as lab:     # port 80 is this bench's own server
        rig = ProxyRig(lab)
        _as_a_link(rig.sandbox_fd)
        servers = [subprocess.Popen(nsrun(lab.internet_fd, SERVER, n, ALLOWED, port), pass_fds=(lab.internet_fd,),
                                    stdout=subprocess.PIPE, text=True) for port in (PORT, 80)]
        try:
            for server in servers:
                assert server.stdout.readline().strip() == "ready"
            rig.policy([f"{ALLOWED}/32:{PORT}", "allowed.test:80"])
            rates: dict = {k: [] for k, _ in PATHS}
            cpu: dict = {k: [] for k, _ in PATHS}
            machine: dict = {k: [] for k, _ in PATHS}
            rig.call(fastpath.choose, "kernel")
            kernel = rig.call(fastpath.reason)
            rig.call(fastpath.choose, "splice")
            for _ in range(rounds):
                for label, fd, port in (("direct", lab.edge_fd, PORT), ("proxy", rig.sandbox_fd, PORT),
                                        ("kernel", rig.sandbox_fd, PORT), ("http", rig.sandbox_fd, 80)):
                    if label == "kernel":
                        rig.call(fastpath.choose, "kernel")
                    t0, m0 = _cpu(), _machine()
                    try:
                        out = subprocess.run(nsrun(fd, CLIENT, n, ALLOWED, port), pass_fds=(fd,),
                                             capture_output=True, text=True, check=True).stdout
                    finally:
                        rig.call(fastpath.choose, "splice")
                    cpu[label].append((_cpu() - t0) / (n / 1e9))
                    machine[label].append((_machine() - m0) / (n / 1e9))
                    rates[label].append(n / float(out) / 1e6)
            deadline = time.time() + 3
            while rig.link.usage.bytes_in < 3 * rounds * n and time.time() < deadline:
                time.sleep(0.05)                     # the last counts reach the loop
            assert rig.link.usage.bytes_in >= 3 * rounds * n          # every proxied byte was counted
            med = lambda v: sorted(v)[len(v) // 2]             # noqa: E731
            return ({k: med(v) for k, v in rates.items()} | {"runs": rates, "kernel_off": kernel}
                    | {"cpu": {k: med(v) for k, v in cpu.items()}, "machine": {k: med(v) for k, v in machine.items()}})
        finally:
            for server in servers:
                server.kill()
                server.wait()
            rig.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    r = measure(a.mb, a.rounds)
    if r["kernel_off"]:
        print(f"kernel relay off here: {r['kernel_off']}")
    for key, label in PATHS:
        runs = ", ".join(f"{x:.0f}" for x in sorted(r["runs"][key]))
        print(f"{label:38s} median {r[key]:6.0f} MB/s   (runs: {runs})   proxy CPU {r['cpu'][key]:.2f} s/GB"
              f"   machine CPU {r['machine'][key]:.2f} s/GB")
    print(f"ratio to direct: splice {r['proxy'] / r['direct']:.2f}, kernel {r['kernel'] / r['direct']:.2f}, "
          f"http {r['http'] / r['direct']:.2f} (goal >= 0.8)")


if __name__ == "__main__":
    main()
