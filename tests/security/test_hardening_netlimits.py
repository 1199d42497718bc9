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
            /* loopback fills at once: a few short waits see a full buffer (50 x 200 us each was
             * 20 ms a connection, 20 s for the thousand the fd limit allows) */
            while (spins < 4) { ssize_t n = write(fds[k], buf, sizeof buf); if (n > 0) { total += n; spins = 0; } else { spins++; usleep(100); } }
        }
    }
    printf("%ld\n", total >> 20);
    return 0;
}
"""


@pytest.fixture(scope="module")
def tcp_fill(tmp_path_factory) -> bytes:
    from conftest import compile_static
    return compile_static(tmp_path_factory.mktemp("tcpfill"), "t", TCP_FILL)


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
        # the output drain is a command of the sandbox too (drain.c): same limits. It starts beside
        # the command (it may not have exec'd yet when the command first looks): look until it has
        drain = sb.exec(["/bin/sh", "-c", "for i in $(seq 200); do for p in /proc/[0-9]*; do "
                         "[ \"$(cat $p/comm)\" = sandtree-drain ] && cat $p/limits && exit; done; "
                         "sleep 0.05; done"])
    assert got == _expected_rlimits()
    assert _parse_limits(drain.stdout.decode()) == _expected_rlimits()


# ---- seccomp: system calls libseccomp cannot name --------------------------------------------

SYSCALL_PROBE = r"""
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        long nr = strtol(argv[i], 0, 0);
        errno = 0;
        /* arguments no call accepts: a call that reaches the kernel fails with EBADF/EFAULT/EINVAL */
        long rc = syscall(nr, -1L, 0L, 0L, 0L, 0L, 0L);
        printf("%s %s\n", argv[i], rc < 0 ? strerrorname_np(errno) : "OK");
        fflush(stdout);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def syscall_probe(tmp_path_factory) -> bytes:
    d = tmp_path_factory.mktemp("sysprobe")
    (d / "p.c").write_text(SYSCALL_PROBE)
    subprocess.run(["cc", "-static", "-O1", "-o", str(d / "p"), str(d / "p.c")], check=True)
    return (d / "p").read_bytes()


def _probe(bb, probe, *nrs):
    r = bb.run(["/p", *map(str, nrs)], files=[{"path": "/p", "content": probe, "mode": 0o755}],
               disposable=True)
    return r, dict(line.split() for line in r.stdout.decode().splitlines())


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="numbers and the x32 ABI are x86-64's")
def test_syscalls_newer_than_libseccomp_are_denied(bb, syscall_probe):
    r, got = _probe(bb, syscall_probe, 457, 458, 467, 470, 1000, 39, 452)
    assert got["457"] == "EPERM" and got["458"] == "EPERM", got     # statmount, listmount
    assert got["467"] == "EPERM", got                                 # open_tree_attr
    assert got["470"] == "ENOSYS" and got["1000"] == "ENOSYS", got
    assert got["39"] == "OK", got                                     # getpid: ordinary calls work
    assert got["452"] not in ("EPERM", "ENOSYS"), got                 # fchmodat2 reaches the kernel
    # the x32 ABI stays killed (libseccomp's bad-arch action), new numbers included
    r, got = _probe(bb, syscall_probe, 0x40000000 | 467)
    assert r.signal == 31 or r.exit_code in (128 + 31, -31), (r.exit_code, r.signal, got)


def _bpf_run(prog: bytes, nr: int, arch: int) -> int:
    """Classic BPF as the kernel runs a seccomp filter (the opcodes libseccomp emits) over
    seccomp_data {nr, arch, ip, args[6]}: returns the action word."""
    import struct
    data = struct.pack("=iIQ6Q", nr, arch, 0, *([0] * 6))
    ins = [struct.unpack_from("=HBBI", prog, o) for o in range(0, len(prog), 8)]
    a = x = 0
    mem = [0] * 16
    pc = 0
    while True:
        code, jt, jf, k = ins[pc]
        pc += 1
        if code == 0x20:
            a = struct.unpack_from("=I", data, k)[0]
        elif code == 0x06:
            return k
        elif code in (0x15, 0x25, 0x35, 0x45):
            cond = {0x15: a == k, 0x25: a > k, 0x35: a >= k, 0x45: bool(a & k)}[code]
            pc += jt if cond else jf
        elif code == 0x05:
            pc += k
        elif code == 0x54:
            a &= k
        elif code == 0x02:
            mem[k] = a
        elif code == 0x60:
            a = mem[k]
        elif code == 0x07:
            x = a
        elif code == 0x87:
            a = x
        else:
            raise AssertionError(f"opcode {code:#x} not emulated")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64's arch value")
def test_the_filter_answers_enosys_above_the_highest_known_number():
    """No kernel here has numbers above 469 yet (its own answer is ENOSYS too): the exported
    program itself must say ENOSYS for them, and still allow known calls."""
    from sandtree.runtime import seccomp
    fd = seccomp.filter_fd()
    prog = os.pread(fd, 1 << 16, 0)
    x86_64 = 0xC000003E
    enosys, eperm, allow = 0x50000 | 38, 0x50000 | 1, 0x7FFF0000
    for nr in (seccomp.KNOWN_MAX + 1, 500, 1 << 20, 0x3FFFFFFF):
        assert _bpf_run(prog, nr, x86_64) == enosys, nr
    for nr in (457, 458, 467):
        assert _bpf_run(prog, nr, x86_64) == eperm, nr
    for nr in (0, 1, 39, 452, seccomp.KNOWN_MAX):
        assert _bpf_run(prog, nr, x86_64) == allow, nr
    assert _bpf_run(prog, 0x40000000 | 500, x86_64) not in (allow, enosys)    # x32: killed


# ---- live commit: the freezer, and files swapped under the walk -------------------------------

def test_a_live_commit_without_a_freezer_is_refused(bb, monkeypatch):
    """Unfrozen, a sandbox can swap names under the commit's walk: no freezer, no commit (as
    hibernate), a typed error, and nothing recorded."""
    from sandtree.runtime.live import LiveRuntime
    with bb.start(idle_timeout=60, lifetime=120) as sb:
        sb.exec(["/bin/sh", "-c", "echo x > /tmp/f"])
        eng = bb._st._engine
        before = eng.store.db.query("SELECT count(*) FROM operations WHERE kind='commit'")[0][0]
        monkeypatch.setattr(LiveRuntime, "freeze", lambda self, h, frozen=True, **kw: False)
        with pytest.raises(sandtree.RuntimeUnavailable, match="freezer"):
            sb.commit()
        monkeypatch.undo()
        after = eng.store.db.query("SELECT count(*) FROM operations WHERE kind='commit'")[0][0]
        assert after == before
        assert sb.commit().read("/tmp/f") == b"x\n"        # with the freezer it commits


def test_a_directory_swapped_for_a_symlink_mid_commit_reads_no_host_file(bb, tmp_path, monkeypatch):
    """The walk lstat()s d/f as a regular file; before its open, d becomes a symlink to a host
    directory holding another f (what an unfrozen sandbox could do). The commit must not put the
    host's file in the image: it refuses (Conflict) and commits nothing."""
    import sandtree.engine.runs.commit as commit_mod
    host = tmp_path / "host"
    host.mkdir()
    (host / "f").write_bytes(b"HOST SECRET\n")
    upper = tmp_path / "u"
    (upper / "d").mkdir(parents=True)
    (upper / "d" / "f").write_bytes(b"in the upper\n")
    target = os.lstat(upper / "d" / "f").st_ino
    real = commit_mod.is_whiteout

    def swap_after_lstat(st):                   # runs right after the walk's lstat of each name
        if st.st_ino == target and not os.path.islink(upper / "d"):
            os.rename(upper / "d", upper / "d.old")
            os.symlink(str(host), upper / "d")
        return real(st)

    monkeypatch.setattr(commit_mod, "is_whiteout", swap_after_lstat)
    eng = bb._st._engine
    base = eng.store.image(bb.id)
    tmp = eng.store.layers.tmp
    staged_before = set(os.listdir(tmp))
    try:
        cr = eng.committer.commit(base, str(upper))
    except sandtree.Conflict:
        assert set(os.listdir(tmp)) == staged_before, "the refused commit left its staging dir"
        return
    from sandtree.store.layers import remove_tree
    got = open(os.path.join(cr.staged, "d", "f"), "rb").read()
    remove_tree(cr.staged)
    pytest.fail(f"a file swapped under the walk was committed: {got!r}")


def test_a_file_replaced_after_the_walks_lstat_is_not_committed_as_it(bb, tmp_path, monkeypatch):
    """Same race inside the upper: another file renamed over the one the walk saw. Its open
    succeeds, but it is not the walked inode (its size and metadata were the old one's)."""
    import sandtree.engine.runs.commit as commit_mod
    upper = tmp_path / "u"
    upper.mkdir()
    (upper / "f").write_bytes(b"walked\n")
    (upper / "g").write_bytes(b"swapped in, much longer than the walked one\n")
    target = os.lstat(upper / "f").st_ino
    real = commit_mod.is_whiteout

    def swap_after_lstat(st):
        if st.st_ino == target and (upper / "g").exists():
            os.rename(upper / "g", upper / "f")
        return real(st)

    monkeypatch.setattr(commit_mod, "is_whiteout", swap_after_lstat)
    eng = bb._st._engine
    with pytest.raises(sandtree.Conflict):
        cr = eng.committer.commit(eng.store.image(bb.id), str(upper))
        from sandtree.store.layers import remove_tree
        remove_tree(cr.staged)


# ---- the same bound on every path: gVisor, warm starts; what the sandbox cannot undo ---------

def _fill(img, tcp_fill, **kw):
    return img.run(["/t", "384"], files=[{"path": "/t", "content": tcp_fill, "mode": 0o755}],
                   memory=64 << 20, timeout=60, disposable=True, **kw)


def test_loopback_tcp_buffers_are_bounded_on_each_tier(bb, tcp_fill, each_tier):
    """gVisor: the buffers are its netstack's, so the Sentry's memory, inside the run's cgroup
    (measured: OOM-killed at 64 MiB in 2.4 s)."""
    r = _fill(bb, tcp_fill)
    if r.oom_killed:
        return
    if not r.stdout.split():         # gVisor: the Sentry killed at the limit is not always seen as OOM
        assert each_tier == "gvisor" and (r.signal == 9 or r.exit_code not in (0, None)), r
        return
    held = int(r.stdout.decode().split()[-1])
    assert held <= 128, f"a 64 MiB run held {held} MB in TCP buffers on {each_tier}"


def test_loopback_tcp_buffers_are_bounded_in_a_warm_start(tmp_path, rootfs, tcp_fill, monkeypatch):
    """A warm helper's group exists (and the helper is in it) before the run's memory limit is
    known: the kmem.tcp limit must be on from the start and follow the run's limit."""
    import time
    from sandtree.runtime.namespaces import NamespaceRuntime
    with sandtree.Sandtree(str(tmp_path / "home"), warm=1, tier="namespaces") as st:
        img = st.import_image(rootfs, tag="bb")
        img.run(["/bin/true"], disposable=True)          # starts the warm pool
        time.sleep(3)                                    # until a helper is ready

        def no_cold(self, spec):
            raise AssertionError("the run did not start warm")
        monkeypatch.setattr(NamespaceRuntime, "_start_cold", no_cold)
        r = _fill(img, tcp_fill)
        if r.oom_killed:
            return
        held = int(r.stdout.decode().split()[-1])
        assert held <= 128, f"a warm 64 MiB run held {held} MB in TCP buffers"


def test_the_sandbox_cannot_raise_its_tcp_buffers_or_fd_limit(bb):
    r = bb.run(["/bin/sh", "-c", "echo '4096 131072 33554432' > /proc/sys/net/ipv4/tcp_rmem; "
                "echo '4096 16384 4194304' > /proc/sys/net/ipv4/tcp_wmem; "
                "cat /proc/sys/net/ipv4/tcp_rmem /proc/sys/net/ipv4/tcp_wmem; "
                "ulimit -n 100000 && echo RAISED; ulimit -Hn"], disposable=True)
    out = r.stdout.decode().split("\n")
    assert out[0].split()[-1] == "262144" and out[1].split()[-1] == "65536", out
    assert "RAISED" not in out and out[2] == "2048", out
