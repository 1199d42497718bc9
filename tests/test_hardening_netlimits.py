"""Hardening: resources a sandbox takes outside its limits (attack review 2, network and limits).

F3. Loopback TCP buffers outside the run's memory cgroup (cgroup v1): a run with memory=64 MiB
    held 514 MB in socket buffers over 127.0.0.1 connections to itself.
Also: system calls libseccomp cannot name, rlimits inherited from the engine, and a live commit
that trusted the freezer alone.
"""

from __future__ import annotations

import os
import subprocess

import pytest

import sandtree

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


# ---- 3. socket buffers outside the memory cgroup (cgroup v1) -----------------------------------

TCP_FILL = r"""
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long target = atol(argv[1]) << 20, total = 0;
    struct rlimit r; getrlimit(RLIMIT_NOFILE, &r); r.rlim_cur = r.rlim_max; setrlimit(RLIMIT_NOFILE, &r);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(5555), .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(l, (void *)&a, sizeof a) || listen(l, 4096)) { perror("listen"); return 1; }
    static char buf[65536];
    memset(buf, 'x', sizeof buf);
    while (total < target) {
        int c = socket(AF_INET, SOCK_STREAM, 0);
        if (c < 0 || connect(c, (void *)&a, sizeof a)) break;
        int s = accept(l, 0, 0);
        if (s < 0) break;
        fcntl(c, F_SETFL, O_NONBLOCK); fcntl(s, F_SETFL, O_NONBLOCK);
        int fds[2] = {c, s};
        for (int k = 0; k < 2; k++) {
            int spins = 0;
            while (spins < 50) { ssize_t n = write(fds[k], buf, sizeof buf); if (n > 0) { total += n; spins = 0; } else { spins++; usleep(200); } }
        }
    }
    printf("%ld\n", total >> 20);
    return 0;
}
"""


@pytest.fixture(scope="module")
def tcp_fill(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("tcpfill")
    (d / "t.c").write_text(TCP_FILL)
    subprocess.run(["cc", "-static", "-O1", "-o", str(d / "t"), str(d / "t.c")], check=True)
    return (d / "t").read_bytes()


def test_loopback_tcp_buffers_count_against_the_memory_limit(bb, tcp_fill):
    """A run with 64 MiB may not park hundreds of MB in loopback TCP buffers (unaccounted on
    cgroup v1 unless memory.kmem.tcp.limit_in_bytes is set; all of the host's TCP shares tcp_mem)."""
    r = bb.run(["/t", "384"], files=[{"path": "/t", "content": tcp_fill, "mode": 0o755}],
               memory=64 << 20, timeout=60, disposable=True)
    if r.oom_killed:
        return
    held = int(r.stdout.decode().split()[-1])
    assert held <= 128, f"a 64 MiB run held {held} MB in TCP buffers"


# ---- rlimits: the sandbox's own, never the engine's ---------------------------------------------

_LIMIT_NAMES = {"Max cpu time": "cpu", "Max file size": "fsize", "Max data size": "data",
                "Max stack size": "stack", "Max core file size": "core", "Max resident set": "rss",
                "Max processes": "nproc", "Max open files": "nofile", "Max locked memory": "memlock",
                "Max address space": "as", "Max file locks": "locks", "Max pending signals": "sigpending",
                "Max msgqueue size": "msgqueue", "Max nice priority": "nice",
                "Max realtime priority": "rtprio"}


def _parse_limits(text: str) -> dict:
    out = {}
    for line in text.splitlines()[1:]:
        for label, key in _LIMIT_NAMES.items():
            if line.startswith(label):
                soft, hard = line[len(label):].split()[:2]
                out[key] = tuple(None if v == "unlimited" else int(v) for v in (soft, hard))
    return out


def _expected_rlimits() -> dict:
    """base.COMMAND_RLIMITS as the kernel lets the helper apply it: never above the engine's
    (this test process's) hard limit."""
    import resource
    from sandtree.runtime.base import COMMAND_RLIMITS
    exp = {}
    for key, (soft, hard) in COMMAND_RLIMITS.items():
        num = getattr(resource, f"RLIMIT_{key.upper()}", None)
        eh = resource.getrlimit(10 if num is None else num)[1]       # RLIMIT_LOCKS: 10, unnamed
        eh = None if eh == resource.RLIM_INFINITY else eh
        cap = lambda v: eh if v is None else (v if eh is None else min(v, eh))   # noqa: E731
        h = cap(hard)
        s = cap(soft)
        exp[key] = (s if h is None or (s is not None and s <= h) else h, h)
    return exp


def test_a_runs_rlimits_are_the_sandboxs_not_the_engines(bb):
    r = bb.run(["/bin/cat", "/proc/self/limits"], disposable=True)
    assert r.exit_code == 0, r.stderr
    got = _parse_limits(r.stdout.decode())
    assert got == _expected_rlimits()


def test_a_live_execs_rlimits_are_the_sandboxs_not_the_engines(bb):
    with bb.start(idle_timeout=60, lifetime=120) as sb:
        got = _parse_limits(sb.exec(["/bin/cat", "/proc/self/limits"]).stdout.decode())
        # the output drain is a command of the sandbox too (drain.c): same limits
        drain = sb.exec(["/bin/sh", "-c", "for p in /proc/[0-9]*; do "
                         "[ \"$(cat $p/comm)\" = sandtree-drain ] && cat $p/limits && break; done"])
    assert got == _expected_rlimits()
    assert _parse_limits(drain.stdout.decode()) == _expected_rlimits()
