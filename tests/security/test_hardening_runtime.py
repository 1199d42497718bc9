"""Hardening of the runtime tiers (issue 12): device nodes, socket families, per-user kernel
limits, output and disk accounting, leftovers, big injected files.

A static probe (PROBE below, compiled here) tries each thing from inside the sandbox and prints
what the kernel answered. Every test here ran against the unfixed code first and failed there.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

import sandtree
from sandtree.errors import LimitExceeded
from tests.conftest import make_rootfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (uid ranges, cgroups, device nodes)")

PROBE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <mqueue.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static int say(const char *what, long rc) {
    printf("%s %s\n", what, rc < 0 ? strerror(errno) : "ALLOWED");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *m = argv[1];
    if (!strcmp(m, "socket")) {            /* socket FAMILY TYPE */
        int s = socket(atoi(argv[2]), atoi(argv[3]), 0);
        say("socket", s);
    } else if (!strcmp(m, "open")) {       /* open PATH: an open that succeeds is the escape */
        say("open", open(argv[2], O_RDONLY | O_NONBLOCK));
    } else if (!strcmp(m, "mknod")) {      /* mknod PATH c|b MAJ MIN */
        mode_t t = argv[3][0] == 'b' ? S_IFBLK : S_IFCHR;
        say("mknod", mknod(argv[2], t | 0666, makedev(atoi(argv[4]), atoi(argv[5]))));
    } else if (!strcmp(m, "mq")) {         /* mq N SECONDS: hold up to N 80 KiB message queues */
        struct mq_attr at = {0};
        at.mq_maxmsg = 10; at.mq_msgsize = 8192;
        int n = atoi(argv[2]), got = 0;
        char name[32];
        for (; got < n; got++) {
            snprintf(name, sizeof name, "/q%d", got);
            if (mq_open(name, O_CREAT | O_RDWR, 0600, &at) < 0) break;
        }
        printf("held %d %s\n", got, got < n ? strerror(errno) : "all");
        fflush(stdout);
        sleep(atoi(argv[3]));
    } else if (!strcmp(m, "inotify")) {    /* inotify N SECONDS: hold up to N instances */
        int n = atoi(argv[2]), got = 0;
        for (; got < n; got++) if (inotify_init1(IN_CLOEXEC) < 0) break;
        printf("held %d %s\n", got, got < n ? strerror(errno) : "all");
        fflush(stdout);
        sleep(atoi(argv[3]));
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> bytes:
    from conftest import compile_static
    return compile_static(tmp_path_factory.mktemp("hprobe"), "p", PROBE)


def pfile(probe: bytes) -> dict:
    return {"path": "/probe", "content": probe, "mode": 0o755}


def run_probe(img, probe, *args, **kw):
    return img.run(["/probe", *args], files=[pfile(probe)], disposable=True, timeout=60, **kw)


# ---- 1. device nodes ---------------------------------------------------------------------------

@pytest.fixture
def devimg(st, tmp_path, loop_device):
    """An image whose layer holds real device nodes, planted straight into the layer directory
    (as the old importer made them): /x/zero (char 1:5) and /x/loop (the test's loop device)."""
    img = st.import_image(make_rootfs(str(tmp_path / "devroot")))
    eng = st._engine
    layer = eng.store.image(img.id).layers[0]
    x = os.path.join(eng.store.layers.path(layer), "x")
    os.mkdir(x, 0o755)
    rdev = os.stat(loop_device).st_rdev
    os.mknod(os.path.join(x, "zero"), 0o666 | 0o020000, os.makedev(1, 5))
    os.mknod(os.path.join(x, "loop"), 0o666 | 0o060000, rdev)
    os.mknod(os.path.join(x, "uffd"), 0o666 | 0o020000, os.makedev(10, 257))   # would bypass the
    return img                                                                  # userfaultfd(2) ban


DENIED = (b"Permission denied", b"Operation not permitted")


def test_device_nodes_in_a_layer_cannot_be_opened(devimg, probe, each_tier):
    for node in ("/x/zero", "/x/loop", "/x/uffd"):
        r = run_probe(devimg, probe, "open", node)
        assert r.exit_code == 0, r.stderr
        assert b"ALLOWED" not in r.stdout and any(d in r.stdout for d in DENIED), (node, r.stdout, r.stderr)
    # the runtime's own nodes still work
    r = devimg.run("head -c 4 /dev/zero | wc -c; echo x > /dev/null && echo null-ok", disposable=True)
    assert r.stdout.split() == [b"4", b"null-ok"], r.stderr


def test_mknod_inside_is_refused(devimg, probe, loop_device, each_tier):
    minor = os.minor(os.stat(loop_device).st_rdev)
    r = devimg.run(f"/probe mknod /tmp/l b 7 {minor}; /probe mknod /tmp/k c 1 11; "
                   f"/probe open /tmp/l; /probe open /tmp/k", files=[pfile(probe)], timeout=60,
                   disposable=True)
    lines = r.stdout.decode().splitlines()
    assert len(lines) == 4 and not [ln for ln in lines if "ALLOWED" in ln], r.stdout


def test_device_nodes_unusable_in_a_live_sandbox(devimg, probe):
    from sandtree.runtime import criu
    with devimg.start(idle_timeout=60, lifetime=120, files=[pfile(probe)]) as sb:
        rounds = ["started"] + (["resumed"] if criu.find()[0] else [])
        for when in rounds:
            if when == "resumed":             # CRIU rebuilds the mounts: still nodev, same cgroup policy
                sb.hibernate()
                sb.resume()
            for node in ("/x/zero", "/x/loop", "/x/uffd"):
                r = sb.exec(["/probe", "open", node])
                assert b"ALLOWED" not in r.stdout and any(d in r.stdout for d in DENIED), (when, node, r.stdout)
            r = sb.exec("head -c 3 /dev/urandom | wc -c; /probe mknod /tmp/z c 1 5")
            assert r.stdout.split(b"\n")[0].strip() == b"3", (when, r.stdout, r.stderr)
            assert b"mknod ALLOWED" not in r.stdout, (when, r.stdout)


def test_run_cgroup_denies_devices_the_runtime_does_not_provide(loop_device):
    """The device cgroup by itself (defence in depth under nodev): a process in a run's cgroup
    can open /dev/null but not the host's loop device, even as host root."""
    from sandtree.runtime.cgroups import Cgroups
    cgs = Cgroups()
    if not cgs.available:
        pytest.skip("no writable cgroups")
    cg = cgs.create(memory=64 << 20, pids=16, cpus=None)
    try:
        code = ("import os,sys\n"
                "for f in sys.argv[1:]:\n"
                "    with open(f, 'w') as c: c.write(str(os.getpid()))\n"
                "for p in ('/dev/null', %r):\n"
                "    try: os.close(os.open(p, os.O_RDONLY)); print(p, 'ALLOWED')\n"
                "    except OSError as e: print(p, e.strerror)\n") % loop_device
        out = subprocess.run([sys.executable, "-c", code, *cg.procs_files], capture_output=True, text=True,
                             timeout=30).stdout
        assert "/dev/null ALLOWED" in out, out
        assert f"{loop_device} Operation not permitted" in out, out
    finally:
        cg.kill_all()
        cg.remove(wait=2.0)


def _cgroup2_root() -> str | None:
    for d in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if os.path.exists(os.path.join(d, "cgroup.procs")) and os.path.exists(os.path.join(d, "cgroup.subtree_control")) \
                or os.path.exists(os.path.join(d, "cgroup.controllers")):
            return d
    return None


@pytest.mark.skipif(_cgroup2_root() is None, reason="no cgroup v2 hierarchy here")
def test_cgroup_v2_device_program_allows_only_the_runtime_nodes(loop_device, tmp_path):
    """The v2 device policy (an eBPF program; on a hybrid host like this one the unified
    hierarchy takes it too): the runtime's nodes open, a loop device, /dev/kmsg and mknod of
    anything else do not."""
    from sandtree.runtime import cgroups, devices
    parent = os.path.join(_cgroup2_root(), "sandtree")
    made_parent = not os.path.isdir(parent)
    os.makedirs(parent, exist_ok=True)
    d = os.path.join(parent, f"{os.getpid()}-devtest")
    os.mkdir(d)
    try:
        devices.attach(d, cgroups.DEVICES)
        code = ("import os,sys\n"
                "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                "for p in sys.argv[2:]:\n"
                "    try: os.close(os.open(p, os.O_RDONLY | os.O_NONBLOCK)); print(p, 'ALLOWED')\n"
                "    except OSError as e: print(p, e.strerror)\n"
                "try: os.mknod(%r, 0o20600, os.makedev(1, 11)); print('mknod ALLOWED')\n" % str(tmp_path / "kmsg") +
                "except OSError as e: print('mknod', e.strerror)\n")
        out = subprocess.run([sys.executable, "-c", code, os.path.join(d, "cgroup.procs"), "/dev/null",
                              "/dev/urandom", "/dev/ptmx", loop_device, "/dev/kmsg"],
                             capture_output=True, text=True, timeout=30).stdout
        assert out.splitlines() == ["/dev/null ALLOWED", "/dev/urandom ALLOWED", "/dev/ptmx ALLOWED",
                                    f"{loop_device} Operation not permitted", "/dev/kmsg Operation not permitted",
                                    "mknod Operation not permitted"], out
    finally:
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.02)
        if made_parent:
            os.rmdir(parent)


# ---- 5. socket families --------------------------------------------------------------------------

AF_INET, AF_UNIX, AF_VSOCK, AF_ALG, AF_TIPC, AF_KCM, AF_XDP, AF_BLUETOOTH = 2, 1, 40, 38, 30, 41, 44, 31
AF_PACKET, AF_RDS = 17, 21


@pytest.mark.parametrize("family", [AF_VSOCK, AF_TIPC, AF_KCM, AF_XDP, AF_BLUETOOTH, AF_ALG, AF_PACKET, AF_RDS])
def test_unneeded_socket_families_are_denied(bb, probe, family, each_tier):
    # socket() itself must fail: nothing here ever connects anywhere
    typ = {AF_ALG: 5, AF_XDP: 3, AF_PACKET: 3, AF_RDS: 5}.get(family, 1)   # the types they take
    r = run_probe(bb, probe, "socket", str(family), str(typ))
    assert r.exit_code == 0, r.stderr
    assert b"ALLOWED" not in r.stdout, r.stdout
    assert any(m in r.stdout for m in (b"Address family not supported", b"Operation not permitted")), r.stdout


def test_needed_socket_families_still_work(bb, probe, each_tier):
    for fam, typ in ((AF_UNIX, 1), (AF_INET, 1), (10, 2)):
        r = run_probe(bb, probe, "socket", str(fam), str(typ))
        assert r.stdout == b"socket ALLOWED\n", (fam, r.stdout, r.stderr)


def test_vsock_denied_in_a_live_sandbox(bb, probe):
    with bb.start(idle_timeout=60, lifetime=120, files=[pfile(probe)]) as sb:
        r = sb.exec(["/probe", "socket", str(AF_VSOCK), "1"])
        assert b"ALLOWED" not in r.stdout and r.stdout, r.stdout


# ---- 8. per-user kernel limits -------------------------------------------------------------------

def _host_inotify_ok() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0o2000000)
    if fd < 0:
        return ctypes.get_errno()
    os.close(fd)
    return 0


def _hold_in(target, probe, n: int, seconds: int, **kw):
    """Start a run (or exec) holding up to n inotify instances; returns (thread, result box,
    event set once they are held)."""
    held = threading.Event()
    box: dict = {}

    def on_output(stream, chunk):
        if b"held" in chunk:
            box["line"] = chunk
            held.set()

    def go():
        try:
            box["r"] = target(["/probe", "inotify", str(n), str(seconds)], on_output=on_output, **kw)
        except Exception as exc:          # noqa: BLE001 - reported by the test
            box["exc"] = exc
        held.set()
    t = threading.Thread(target=go)
    t.start()
    return t, box, held


def test_inotify_in_a_sandbox_does_not_starve_host_root(bb, probe, each_tier):
    assert _host_inotify_ok() == 0
    t, box, held = _hold_in(lambda argv, **kw: bb.run(argv, files=[pfile(probe)], disposable=True,
                                                      timeout=60, **kw), probe, 130, 4)
    try:
        assert held.wait(30), "the probe never reported"
        host = _host_inotify_ok()
    finally:
        t.join(60)
    assert "exc" not in box, box.get("exc")
    assert host == 0, f"host root got {errno.errorcode.get(host)} while a sandbox held {box.get('line')}"
    got = int(box["line"].split()[1])
    assert got >= 100, box["line"]         # the sandbox still has a working quota of its own


def test_two_sandboxes_have_separate_inotify_quotas(bb, probe):
    t1, box1, held1 = _hold_in(lambda argv, **kw: bb.run(argv, files=[pfile(probe)], disposable=True,
                                                         timeout=60, **kw), probe, 130, 6)
    try:
        assert held1.wait(30)
        r = run_probe(bb, probe, "inotify", "100", "0")
    finally:
        t1.join(60)
    assert r.stdout.startswith(b"held 100 all"), (box1.get("line"), r.stdout)


def _has_cap(cap: int) -> bool:
    with open("/proc/self/status") as f:
        eff = int(next(ln for ln in f if ln.startswith("CapEff:")).split()[1], 16)
    return bool(eff >> cap & 1)


@pytest.mark.skipif(not _has_cap(24), reason="without CAP_SYS_RESOURCE (this VM withholds it) CRIU could "
                    "not dump a live sandbox whose user namespace root does not own: live ones stay root's")
def test_inotify_in_a_live_sandbox_does_not_starve_host_root(bb, probe):
    with bb.start(idle_timeout=60, lifetime=120, files=[pfile(probe)]) as sb:
        t, box, held = _hold_in(lambda argv, **kw: sb.exec(argv, timeout=60, **kw), probe, 130, 4)
        try:
            assert held.wait(30)
            host = _host_inotify_ok()
        finally:
            t.join(60)
        assert host == 0, box.get("line")


def _host_mq_ok() -> int:
    """Whether host root can still make an 80 KiB POSIX message queue (its RLIMIT_MSGQUEUE
    binds it here: this VM withholds CAP_SYS_RESOURCE)."""
    class Attr(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                    ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Attr)]
    name = f"/sandtree-test-{os.getpid()}".encode()
    a = Attr(0, 10, 8192, 0)
    fd = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a))
    if fd < 0:
        return ctypes.get_errno()
    os.close(fd)
    libc.mq_unlink(name)
    return 0


@pytest.mark.namespaces_only      # gVisor's message queues are the Sentry's own
def test_mqueue_bytes_in_a_sandbox_are_not_host_roots(bb, probe, each_tier):
    """Adversarial review: POSIX message queue bytes are charged up the user namespace chain
    to its owner too (RLIMIT_MSGQUEUE, 800 KiB): with host root as the owner, a sandbox holding
    ten queues left host root unable to make one."""
    if _has_cap(24):
        pytest.skip("host root holds CAP_SYS_RESOURCE here: RLIMIT_MSGQUEUE does not bind it")
    assert _host_mq_ok() == 0
    held = threading.Event()
    box: dict = {}

    def on_output(stream, chunk):
        box["line"] = chunk
        held.set()
    t = threading.Thread(target=lambda: box.setdefault("r", bb.run(
        ["/probe", "mq", "40", "4"], files=[pfile(probe)], disposable=True, timeout=60, on_output=on_output)))
    t.start()
    try:
        assert held.wait(30)
        host = _host_mq_ok()
    finally:
        t.join(60)
    assert host == 0, f"host root got {errno.errorcode.get(host)} while a sandbox held {box.get('line')}"


# ---- 9. output and disk accounting ---------------------------------------------------------------

def test_on_output_sees_no_more_than_the_cap(bb):
    seen = {"stdout": 0, "stderr": 0}

    def on_output(stream, chunk):
        seen[stream] += len(chunk)
    r = bb.run("head -c 3000000 /dev/zero", output="64k", disposable=True, on_output=on_output, timeout=60)
    assert r.stdout_truncated
    assert len(r.stdout) == 65536 and seen["stdout"] == 65536, seen


def test_disk_caps_inodes(bb, each_tier):
    r = bb.run("cd /tmp && i=0; while [ $i -lt 20000 ]; do touch f$i 2>/dev/null || break; i=$((i+1)); done; echo $i",
               disk="1M", disposable=True, timeout=120)
    made = int(r.stdout.split()[-1])
    assert made < 2000, f"{made} empty files under disk=1M"


@pytest.mark.namespaces_only      # gVisor's /dev/shm is the Sentry's memory, inside the run's memory cgroup
def test_dev_shm_caps_inodes(bb, each_tier):
    """Adversarial review: /dev/shm is a tmpfs of the sandbox's own (64 MiB); its inodes were
    uncapped (the kernel's default: half of RAM in pages), so empty files there cost kernel
    memory without limit."""
    r = bb.run("cd /dev/shm && i=0; while [ $i -lt 30000 ]; do touch f$i 2>/dev/null || break; i=$((i+1)); "
               "done; echo $i", disposable=True, timeout=180)
    made = int(r.stdout.split()[-1])
    assert made < 20000, f"{made} empty files in /dev/shm"


# ---- 14. leftovers ---------------------------------------------------------------------------------

def _our_cgroups() -> set[str]:
    out = set()
    for ctrl in ("memory", "pids", "cpu", "freezer", "devices"):
        d = os.path.join("/sys/fs/cgroup", ctrl, "sandtree")
        if os.path.isdir(d):
            out |= {f"{ctrl}/{n}" for n in os.listdir(d) if not n.startswith("live-")}
    return out


def test_cli_run_leaves_no_cgroups(tmp_path, rootfs):
    home = str(tmp_path / "h")
    cli = [sys.executable, "-m", "sandtree", "--home", home]
    subprocess.run(cli + ["image", "import", rootfs, "--tag", "bb"], check=True, capture_output=True)
    before = _our_cgroups()
    p = subprocess.Popen(cli + ["run", "bb", "--", "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    # the CLI's engine was `python -m sandtree` (pid p.pid): its groups are "<pid>-..."
    left = {c for c in _our_cgroups() - before if c.split("/", 1)[1].startswith(f"{p.pid}-")}
    assert not left, f"cgroups left by a finished CLI run: {sorted(left)}"


def test_killed_helper_build_leaves_nothing(tmp_path):
    """kill -9 during the first build of the helper: no `cc` keeps running, no .build- file
    stays, and the next build works."""
    cache = str(tmp_path / "bin")
    code = ("import sys; from sandtree.runtime import build; build.helper_path(sys.argv[1])")
    p = subprocess.Popen([sys.executable, "-c", code, cache], start_new_session=True)
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if os.path.isdir(cache) and any(n.startswith(".build-") for n in os.listdir(cache)) \
                    and _children_named(p.pid, ("cc", "gcc", "cc1", "collect2", "ld", "as")):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the build never started")
        os.kill(p.pid, 9)
        p.wait()
        time.sleep(0.2)                   # the kernel's kills are delivered by then
        stray = [pid for pid in _pids() if _cmd(pid).find(cache) >= 0]
        assert not stray, [_cmd(x) for x in stray]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    from sandtree.runtime import build
    path = build.helper_path(cache)
    assert os.access(path, os.X_OK)
    assert not [n for n in os.listdir(cache) if n.startswith(".build-")], os.listdir(cache)


def _pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmd(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children_named(pid: int, names) -> bool:
    """Whether a descendant of pid runs one of `names`."""
    kids: dict[int, list] = {}
    for q in _pids():
        try:
            with open(f"/proc/{q}/stat") as f:
                st = f.read()
        except OSError:
            continue
        ppid = int(st[st.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append((q, st[st.index("(") + 1:st.rindex(")")]))
    todo = [pid]
    while todo:
        for q, comm in kids.get(todo.pop(), []):
            if comm in names:
                return True
            todo.append(q)
    return False


# ---- 15. big injected files ----------------------------------------------------------------------

GIB = 1 << 30


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """1.1 GiB of bytes to inject (an all-zero file: cheap to make; the run sees its size)."""
    return bytes(int(1.1 * GIB))


def test_files_above_one_gib_with_enough_disk(bb, big):
    # twice: the shared store keeps a warm pool, whose scratch is made before the run's disk
    # size is known; the first run may start cold, the second is served warm
    for _ in range(2):
        r = bb.run("stat -c %s /big", files=[{"path": "/big", "content": big}], disk="2G", memory="3G",
                   disposable=True, timeout=120)
        assert r.exit_code == 0, r.stderr
        assert int(r.stdout) == len(big)


def test_files_larger_than_disk_are_refused_up_front(bb, big):
    with pytest.raises(LimitExceeded) as ei:
        bb.run("true", files=[{"path": "/big", "content": big}], disk="1G", disposable=True, timeout=60)
    assert "disk" in str(ei.value) and str(len(big)) in str(ei.value)


def test_uploaded_files_are_streamed_into_the_run(st, rootfs, tmp_path):
    """An upload injected by its sha256 is copied from the store in chunks, never read whole
    into the engine's memory."""
    import hashlib
    import tracemalloc
    img = st.import_image(rootfs)
    src = tmp_path / "up"
    n = 256 << 20
    with open(src, "wb") as f:
        f.truncate(n)
    digest = hashlib.sha256(bytes(n)).hexdigest()
    st._engine.store.blobs.put_file(str(src), digest)
    tracemalloc.start()
    try:
        r = img.run("md5sum /f | cut -c1-8; stat -c %s /f", files=[{"path": "/f", "sha256": digest}],
                    disposable=True, timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.stdout.split()[1] == str(n).encode(), r
    assert peak < 64 << 20, f"the engine held {peak >> 20} MiB for a {n >> 20} MiB file"


# ---- 18. a flooding command is stopped at its output cap -----------------------------------------

def test_flooding_command_stops_at_the_cap(bb, each_tier):
    t = time.monotonic()
    r = bb.run("yes", output="1M", timeout=120, disposable=True)
    took = time.monotonic() - t
    assert took < 30, f"yes ran {took:.1f}s"
    assert r.stdout_truncated and len(r.stdout) == 1 << 20
    assert r.usage.get("killed_by") == "output_limit", r.usage
    assert not r.timed_out


def test_flooding_exec_in_a_live_sandbox_stops_at_the_cap(bb):
    """A live exec goes through the same pump: it is stopped at its cap and says why."""
    if os.geteuid() != 0:
        pytest.skip("live sandboxes need root")
    sb = bb.start()
    try:
        t = time.monotonic()
        r = sb.exec(["yes"], output="256k", timeout=120)
        assert time.monotonic() - t < 30
        assert r.stdout_truncated and len(r.stdout) == 256 << 10
        assert r.usage.get("killed_by") == "output_limit", r.usage
        assert sb.exec("echo still here").stdout == b"still here\n"   # the sandbox lives on
    finally:
        sb.stop()
