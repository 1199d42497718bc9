"""Egress tapes: an HTTPS download through the egress proxy plain (the TLS bytes relayed as they are,
by splice), recorded (TLS ended with the link's CA and dialled again, the body hashed into the tape's
directory: network/tape.py) and replayed from that tape (no upstream: the body read from the
tape's file). The paths take turns in each round. The server is the netlab's HTTPS server (Python,
TLS), the client a process of its own in the rig's sandbox namespace (nsenter) trusting the lab's
CA and the link's. Prints the rates; asserts nothing.

    PYTHONPATH=src .venv/bin/python bench/tapes.py [--mb 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from netlab import ALLOWED, ProxyRig, netlab  # noqa: E402

from sandtree.network.ca import CA  # noqa: E402
from sandtree.network.tape import TAPE_FILE, Tape  # noqa: E402

CLIENT = r"""
import socket, ssl, sys, time
n, ip, bundle = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ctx = ssl.create_default_context(cafile=bundle)
t0 = time.perf_counter()
s = ctx.wrap_socket(socket.create_connection((ip, 443)), server_hostname="allowed.test")
s.sendall(b"GET /bytes/%d HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n" % n)
buf = bytearray(1 << 20); view = memoryview(buf); got = 0; head = None; pending = b""
while True:
    k = s.recv_into(view)
    if not k:
        break
    if head is None:
        pending += bytes(view[:k]); i = pending.find(b"\r\n\r\n")
        if i < 0:
            continue
        head = i + 4; k = len(pending) - head
    got += k
    if got >= n:
        break
dt = time.perf_counter() - t0
assert got == n, (got, n)
print(dt)
"""


def nsrun(fd: int, *args):
    return ["nsenter", f"--net=/proc/{os.getpid()}/fd/{fd}", sys.executable, "-c", CLIENT, *map(str, args)]


def measure(mb: int = 100, rounds: int = 3) -> dict:
    n = mb << 20
    work = tempfile.mkdtemp(prefix="tapes-bench-")
    try:
        with netlab(serve=(443,)) as lab:
            rig = ProxyRig(lab)
            try:
                rig.policy(["allowed.test"])
                ca = CA.new("bench")
                bundle = os.path.join(work, "bundle.pem")
                with open(bundle, "wb") as f:
                    f.write(open(lab.ca_file, "rb").read() + ca.pem())
                rates: dict = {"plain": [], "record": [], "replay": []}
                for r in range(rounds):
                    for label in rates:
                        tape = None
                        if label == "record":
                            tape = Tape("bench", os.path.join(work, f"rec{r}"), True, None, None, {})
                        elif label == "replay":
                            d = os.path.join(work, f"rec{r}")
                            with open(os.path.join(d, TAPE_FILE)) as f:
                                old = json.load(f)
                            paths = {x["response_body"]: os.path.join(d, x["response_body"]) for x in old["http"]}
                            replay = os.path.join(work, f"replay{r}.json")
                            with open(replay, "w") as f:
                                json.dump({"id": None, "tape": old, "paths": paths}, f)
                            tape = Tape("bench", None, False, replay, None, {})
                        rig.link.tape, rig.link.ca = tape, (ca if tape is not None else None)
                        out = subprocess.run(nsrun(rig.sandbox_fd, n, ALLOWED, bundle), pass_fds=(rig.sandbox_fd,),
                                             capture_output=True, text=True)
                        if out.returncode:
                            raise RuntimeError(out.stderr[-500:])
                        if label == "record":
                            rig.call(tape.finish)
                        elif label == "replay":
                            assert not tape.misses, tape.misses
                        rates[label].append(n / float(out.stdout) / 1e6)
                med = lambda v: sorted(v)[len(v) // 2]             # noqa: E731
                return {k: med(v) for k, v in rates.items()} | {"runs": rates}
            finally:
                rig.link.tape = None
                rig.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    r = measure(a.mb, a.rounds)
    for key, label in (("plain", "HTTPS through the egress path (splice)"), ("record", "recorded (TLS ended, body hashed to the tape)"),
                       ("replay", "replayed from the tape (no upstream)")):
        runs = ", ".join(f"{x:.0f}" for x in sorted(r["runs"][key]))
        print(f"{label:48s} median {r[key]:6.0f} MB/s   (runs: {runs})")
    print(f"recording overhead {1 - r['record'] / r['plain']:+.0%} (target <= 10%), replay {r['replay'] / r['plain']:.2f}x plain "
          "(target >= 1)")


if __name__ == "__main__":
    main()
