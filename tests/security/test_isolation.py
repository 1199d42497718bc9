"""Isolation against the real kernel: files, processes, network, privileges, resources.

A static probe (tests/probe.c, built here with the system compiler) is injected into the
sandbox to try each forbidden system call directly.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

import sandtree

pytestmark = pytest.mark.usefixtures("each_tier")     # the whole module, once per tier


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> bytes:
    out = tmp_path_factory.mktemp("probe") / "probe"
    subprocess.run(["cc", "-static", "-O1", "-o", str(out), os.path.join(os.path.dirname(__file__), "..", "probe.c")],
                   check=True)
    return out.read_bytes()


def run_probe(bb, probe, *args, **kw):
    return bb.run(["/probe", *args], files=[{"path": "/probe", "content": probe, "mode": 0o755}],
                  disposable=True, **kw)


@pytest.mark.parametrize("mode", ["mount", "unshare", "module", "bpf", "keyctl"])
def test_privileged_syscalls_denied(bb, probe, mode, each_tier):
    if each_tier == "gvisor" and mode == "unshare":
        pytest.skip("namespaces inside gVisor's kernel are gVisor's, not the host's: allowed there")
    r = run_probe(bb, probe, mode)
    assert r.exit_code == 0, r.stderr
    denied = (b"Operation not permitted", b"Function not implemented") if each_tier == "gvisor" \
        else (b"Operation not permitted",)
    assert b"ALLOWED" not in r.stdout and any(d in r.stdout for d in denied), r.stdout


def test_cannot_ptrace_outside(bb, probe):
    r = run_probe(bb, probe, "ptrace", str(os.getpid()))
    assert b"No such process" in r.stdout            # the host pid does not exist in the sandbox


def test_no_host_files_visible(bb, tmp_path):
    secret = tmp_path / "host-secret"
    secret.write_text("TOPSECRET")
    r = bb.run(f"cat {secret}; cat /etc/hostname; ls /; find / -name sandtree.db -o -name 'host-secret' "
               f"2>/dev/null; grep -rl TOP""SECRET /bin /etc /root /tmp /usr /var 2>/dev/null | head -1", disposable=True,
               timeout=60)
    assert b"TOPSECRET" not in r.stdout
    assert b"sandtree.db" not in r.stdout
    listing = bb.run("ls /", disposable=True).stdout.decode().split()
    assert set(listing) <= {"bin", "dev", "etc", "proc", "root", "tmp", "usr", "var", "sys"}   # gVisor's own /sys


def test_no_host_processes_visible(bb):
    r = bb.run("ps -o pid,comm; ls /proc | grep -c '^[0-9]'; kill -0 1 && echo init-ok", disposable=True)
    pids = [int(l.split()[0]) for l in r.stdout.decode().splitlines()[1:] if l.split()[0].isdigit()]
    assert max(pids) < 10                             # only the sandbox's own few processes
    assert str(os.getpid()).encode() not in r.stdout.split(b"\n")[0]


@pytest.mark.namespaces_only       # gVisor shows its own id view; its host mapping is in test_tiers
def test_uid0_is_not_host_root(bb):
    r = bb.run("cat /proc/self/uid_map /proc/self/gid_map; grep -E 'NoNewPrivs|Seccomp:|CapBnd' /proc/self/status",
               disposable=True)
    out = r.stdout.decode()
    if os.geteuid() == 0:
        first = out.split("\n")[0].split()
        assert first[0] == "0" and int(first[1]) >= 1000 and first[1] != "0"
    assert "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out
    capbnd = int(out.split("CapBnd:\t")[1].split()[0], 16)
    assert not capbnd & (1 << 21)                     # no CAP_SYS_ADMIN
    assert not capbnd & (1 << 16)                     # no CAP_SYS_MODULE
    assert not capbnd & (1 << 19)                     # no CAP_SYS_PTRACE


def test_proc_masked_and_readonly(bb):
    r = bb.run("echo 1 > /proc/sys/kernel/printk && echo WROTE; cat /proc/kcore 2>&1 | head -c 20; "
               "cat /proc/sysrq-trigger 2>&1 | head -c 5; echo; ls /dev", disposable=True)
    assert b"WROTE" not in r.stdout
    devs = set(r.stdout.decode().split())
    assert {"null", "zero", "urandom", "pts", "shm"} <= devs
    assert not any(d.startswith(("sd", "vd", "nvme", "kmsg", "mem")) for d in devs)


def test_network_loopback_only(bb):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(0.1)
    port = srv.getsockname()[1]
    accepted = []

    def accept():
        end = time.time() + 3
        while time.time() < end:
            try:
                accepted.append(srv.accept())
            except socket.timeout:
                pass

    t = threading.Thread(target=accept)
    t.start()
    r = bb.run(f"cat /proc/net/dev | tail -n +3 | cut -d: -f1; "
               f"wget -q -T 2 -O - http://127.0.0.1:{port}/ && echo REACHED; "
               f"wget -q -T 2 -O - http://10.0.2.2:{port}/ 2>&1 | head -1", disposable=True, timeout=20)
    t.join()
    srv.close()
    assert not accepted
    assert b"REACHED" not in r.stdout
    assert [l.strip() for l in r.stdout.decode().splitlines() if l.strip() and ":" not in l][:1] == ["lo"]


def test_loopback_inside_works(bb):
    r = bb.run("(echo pong | nc -l -p 9000 &) ; sleep 0.3; nc 127.0.0.1 9000 </dev/null", disposable=True, timeout=10)
    assert b"pong" in r.stdout


def test_fork_bomb_contained(bb):
    t0 = time.monotonic()
    r = bb.run("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", pids=64, timeout=8, disposable=True)
    assert r.timed_out or r.exit_code is not None
    assert time.monotonic() - t0 < 30
    assert subprocess.run(["true"], timeout=5).returncode == 0      # the host still forks
    assert bb.run("echo ok", disposable=True).stdout == b"ok\n"


def test_memory_hog_oom_reported(bb, probe, each_tier):
    if not bb._st._engine.runtime.cgroups.available:
        pytest.skip("no cgroup access: memory limits unenforceable here")
    r = run_probe(bb, probe, "hog", "512", memory="64M", timeout=30)
    assert r.oom_killed
    assert r.signal == 9 or each_tier == "gvisor"          # gVisor's sandbox itself is what dies
    assert b"hog survived" not in r.stdout


def test_disk_write_capped(bb):
    r = bb.run("dd if=/dev/zero of=/big bs=1M count=10240; echo rc=$?", disk="32M", timeout=60)
    assert b"No space left" in r.stderr
    assert b"rc=1" in r.stdout
    assert r.image.stat("/big")["size"] <= 32 << 20
    assert bb.run("test -e /big || echo clean", disposable=True).stdout == b"clean\n"


def test_rm_rf_root_leaves_source_intact(bb):
    before = bb.read("/etc/greeting")
    r = bb.run("rm -rf / 2>/dev/null; ls / | wc -l")
    assert r.image.ls("/") != bb.ls("/")
    assert bb.read("/etc/greeting") == before
    assert bb.run("cat /etc/greeting", disposable=True).stdout == before


def test_parallel_runs_do_not_see_each_other(bb):
    out = {}

    def writer():
        out["w"] = bb.run("echo mine > /tmp/shared; sleep 1; cat /tmp/shared")

    def reader():
        time.sleep(0.4)
        out["r"] = bb.run("cat /tmp/shared 2>&1 || echo absent", disposable=True)

    ts = [threading.Thread(target=writer), threading.Thread(target=reader)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert out["w"].stdout == b"mine\n"
    assert b"absent" in out["r"].stdout
    with pytest.raises(sandtree.PathNotFound):
        bb.read("/tmp/shared")


def test_sparse_file_cannot_fill_the_host(bb):
    before = len(bb._st.images())
    with pytest.raises(sandtree.InvalidInput, match="apparent size"):
        bb.run("truncate -s 20G /sparse; echo done", disk="64M")
    with pytest.raises(sandtree.InvalidInput, match="disk limit"):
        bb.run("for i in $(seq 10); do truncate -s 60M /s$i; done", disk="64M")
    assert len(bb._st.images()) == before
    r = bb.run("truncate -s 1M /small")                        # within the limit: kept whole
    assert r.image.stat("/small")["size"] == 1 << 20


@pytest.mark.namespaces_only          # (in gVisor pid 1 is the command itself, in gVisor's kernel)
def test_sandbox_init_is_out_of_reach(bb):
    r = bb.run("ls /proc/1/fd 2>&1; echo 'exit 0' > /proc/1/fd/3 2>&1 || echo WRITE-DENIED; "
               "ls /proc/1/root 2>&1", disposable=True)
    out = r.stdout.decode()
    assert "Permission denied" in out and "WRITE-DENIED" in out
    assert "bin" not in out.split("WRITE-DENIED")[1]
