"""Fixtures: stores in temporary homes and a tiny busybox root filesystem (milliseconds to build).

Everything here runs against the real kernel: real namespaces, overlayfs, cgroups and seccomp.
The session finaliser checks that the tests left no mount, cgroup or process behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import select
import subprocess
import sys
import time

import pytest
from filelock import FileLock

import sandtree

BUSYBOX = shutil.which("busybox") or "/bin/busybox"


def make_rootfs(path: str) -> str:
    os.makedirs(path)
    for d in ("bin", "etc", "root", "tmp", "proc", "dev", "usr/bin", "var"):
        os.makedirs(os.path.join(path, d), exist_ok=True)
    os.chmod(os.path.join(path, "tmp"), 0o1777)
    os.chmod(os.path.join(path, "root"), 0o700)
    shutil.copy2(BUSYBOX, os.path.join(path, "bin", "busybox"))
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for a in applets:
        p = os.path.join(path, "bin", a)
        if not os.path.lexists(p):
            os.symlink("busybox", p)
    with open(os.path.join(path, "etc", "passwd"), "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
                "user:x:1000:1000:user:/tmp:/bin/sh\n")
    with open(os.path.join(path, "etc", "group"), "w") as f:
        f.write("root:x:0:\nnogroup:x:65534:\nuser:x:1000:\n")
    with open(os.path.join(path, "etc", "greeting"), "w") as f:
        f.write("hello from the image\n")
    return path


def terminal_reader(master: int):
    """until(marker, timeout=15): what a pty's master showed, read until it holds `marker` (the
    bytes so far); fails saying what came when it does not come in time."""
    got = bytearray()

    def until(marker: bytes, timeout: float = 15) -> bytes:
        end = time.monotonic() + timeout
        while marker not in got:
            assert time.monotonic() < end, (marker, bytes(got))
            r, _, _ = select.select([master], [], [], 0.2)
            if r:
                try:
                    got.extend(os.read(master, 4096))
                except OSError:                 # EIO: no one holds the terminal any more
                    assert marker in got, (marker, bytes(got))
        return bytes(got)
    return until


def interrupt_a_sleep(master: int, until) -> None:
    """^C typed into a terminal's interactive shell ends its foreground `sleep 30`, not the shell:
    the next command runs and says 130 (until: terminal_reader's)."""
    os.write(master, b"sleep 30; echo not-interrupted\n")
    time.sleep(0.5)
    os.write(master, b"\x03")
    os.write(master, b"echo after-$?\n")
    assert b"\nnot-interrupted" not in until(b"after-130")    # (the echoed line holds the words)


def free_port() -> int:
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    """Until a server we started listens on loopback `port`."""
    import socket
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def listening(home: str, *command: str):
    """`sandtree --home HOME COMMAND... --port P` on a free loopback port, until it listens;
    yields its base URL; stopped afterwards."""
    port = free_port()
    ports = ("--ports-port", "0") if command[:1] == ("serve",) else ()     # its exposed ports: any free port
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(home), *command, "--port", str(port),
                             *ports],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_process(home: str, *extra: str):
    """A real `sandtree serve` (extra: its options)."""
    return listening(home, "serve", *extra)


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory) -> str:
    return make_rootfs(str(tmp_path_factory.mktemp("rootfs") / "root"))


TIER = {"current": "namespaces"}
TIERS = ["namespaces", "gvisor"]


@pytest.fixture(params=TIERS)
def each_tier(request, shared_st):
    """Run the requesting test once per isolation tier (skipped, with doctor's reason, where the
    tier cannot run). Tests marked `namespaces_only` check the namespaces tier's own mechanisms."""
    tier = request.param
    status = {r["tier"]: r for r in shared_st.doctor()}[tier]
    if not status["available"]:
        pytest.skip(f"tier {tier} unavailable here: {status['reason']}")
    if tier != "namespaces" and request.node.get_closest_marker("namespaces_only"):
        pytest.skip(f"checks a mechanism of the namespaces tier, not of {tier}")
    old = shared_st._engine.default_tier
    shared_st._engine.default_tier = TIER["current"] = tier
    yield tier
    shared_st._engine.default_tier = old
    TIER["current"] = "namespaces"


def tier_or_skip(request, st, tier: str) -> str:
    """`tier`, or skip with the reason: this host cannot run it (doctor's), or the test is marked
    not_on_gvisor(reason) (a mechanism that tier does differently or lacks)."""
    status = {r["tier"]: r for r in st.doctor()}[tier]
    if not status["available"]:
        pytest.skip(f"tier {tier} unavailable here: {status['reason']}")
    mark = request.node.get_closest_marker("not_on_gvisor")
    if tier == "gvisor" and mark:
        pytest.skip(f"not on gvisor: {mark.args[0]}")
    return tier


@pytest.fixture(params=TIERS)
def live_tier(request, shared_st):
    """Run the requesting live-sandbox test once per tier that has live sandboxes (issue 18)."""
    return tier_or_skip(request, shared_st, request.param)


@pytest.fixture(scope="session")
def shared_st(tmp_path_factory):
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("home-shared")))
    yield st
    st.close()


@pytest.fixture(scope="session")
def bb(shared_st, rootfs) -> sandtree.Image:
    """The busybox image in the shared store (tests must not depend on that store being empty)."""
    return shared_st.import_image(rootfs, tag="busybox")


def compile_static(directory, name: str, source: str) -> bytes:
    """A C probe built static (the busybox image has no libc to link against): its bytes, for a
    run's files=."""
    c = os.path.join(str(directory), name + ".c")
    with open(c, "w") as f:
        f.write(source)
    out = os.path.join(str(directory), name)
    subprocess.run(["cc", "-static", "-O1", "-o", out, c], check=True)
    with open(out, "rb") as f:
        return f.read()


@pytest.fixture
def loop_device(tmp_path):
    """A loop device over a 1 MiB temp file of b"HOSTDISK" markers: stands in for a host disk
    (this VM forbids opening its own). Detached afterwards."""
    backing = tmp_path / "disk.img"
    backing.write_bytes(b"HOSTDISK" * (1 << 17))
    dev = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True, text=True,
                         check=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture(scope="session")
def pg_cluster():
    """One throwaway PostgreSQL cluster a session (tests/pgcluster.py); skipped, saying why, only
    when it cannot start here."""
    from pgcluster import PgCluster, Unavailable
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.skip("psycopg not installed (pip install 'psycopg[binary]')")
    cluster = PgCluster()
    try:
        cluster.start()
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL cannot start here: {exc}")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def s3_server():
    """One throwaway S3 server a session (SeaweedFS, tests/s3server.py), its endpoint and keys in
    this process's environment (what a deployment sets: config.s3_endpoint(), boto3's AWS_*);
    skipped, saying why, only when it cannot start here."""
    from s3server import S3Server, Unavailable
    try:
        import boto3  # noqa: F401
    except ImportError:
        pytest.skip("boto3 not installed (pip install 'sandtree[s3]')")
    server = S3Server()
    try:
        server.start()
    except Unavailable as exc:
        pytest.skip(f"the S3 server cannot start here: {exc}")
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    yield server
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    server.stop()


@pytest.fixture
def store_database():
    """The metadata database of the `st` fixture's store: None = SQLite. The backend conformance
    suite (test_store_backends.py) overrides it with every backend."""
    return None


@pytest.fixture
def store_objects():
    """The objects URL of the `st` fixture's store: None = the store directory; tests/backends.py's
    S3 combinations override it with a fresh bucket."""
    return None


@pytest.fixture
def st(tmp_path, store_database, store_objects):
    """A fresh, empty store."""
    s = sandtree.Sandtree(str(tmp_path / "home"), tier=TIER["current"], database=store_database,
                          objects=store_objects)
    yield s
    s.close()


@pytest.fixture(scope="session")
def bookworm(tmp_path_factory):
    """One Debian bookworm image with pip, bootstrapped once a session (debootstrap takes a minute
    and a half here), in a store of its own: (home, image id, debootstrap's log lines). Tests open
    their own engine on that home (the store takes several engines, one after another or at once)."""
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        pytest.skip("needs root and debootstrap")
    # A developer running a few test files over and over may point this at a store that already holds
    # the image (home:image): the bootstrap test itself still checks debootstrap's log, so it skips then.
    reuse = os.environ.get("SANDTREE_TEST_BOOKWORM", "")
    if reuse:
        home, _, image = reuse.rpartition(":")
        return home, image, []
    # `make test` runs on pytest-xdist workers (-n 2 --dist loadfile): the first worker to ask
    # bootstraps into the run's shared temporary root, the others wait for it and reuse that store
    # (under `make test` the controller has started it already: pytest_configure below).
    if os.environ.get("PYTEST_XDIST_WORKER"):
        got = _bootstrap_bookworm(tmp_path_factory.getbasetemp().parent)
    else:
        got = _bootstrap_bookworm(tmp_path_factory.mktemp("bookworm"), shared=False)
    if "skip" in got:
        pytest.skip(got["skip"])
    return got["home"], got["image"], got["lines"]


def _bootstrap_bookworm(root, shared: bool = True) -> dict:
    """The bookworm store in `root` ({home, image, lines}, or {skip: why}): made by the first
    process to ask (others wait on its lock and read what it wrote to bookworm.json)."""
    made = root / "bookworm.json"
    with FileLock(str(root / "bookworm.lock")) if shared else contextlib.nullcontext():
        if made.exists():
            return json.loads(made.read_text())
        home = str((root / "bookworm" if shared else root) / "home")
        s = sandtree.Sandtree(home, warm=0)
        lines: list[str] = []
        try:
            # git and patch: the evaluation harness applies patches the way swebench's does, in a git work tree
            got = {"home": home, "image": s.bootstrap("debian:bookworm", include=["python3-pip", "git", "patch"],
                                                     log=lines.append).id, "lines": lines}
        except sandtree.SandtreeError as e:
            got = {"skip": f"debootstrap could not build an image with pip: {e}"}
        finally:
            s.close()
        made.write_text(json.dumps(got))
        return got


_AHEAD: list = []


@pytest.hookimpl(trylast=True)                  # after the tmp_path plugin's: its factory is made
def pytest_configure(config):
    """Under `make test` (SANDTREE_TEST_BOOKWORM_AHEAD=1, xdist) the controller, which runs no test,
    bootstraps the bookworm image while the workers run other tests: else the first worker to need
    it spends a minute and a half on it and the other may wait as long for it."""
    if (os.environ.get("SANDTREE_TEST_BOOKWORM_AHEAD") != "1" or hasattr(config, "workerinput")
            or not getattr(config.option, "numprocesses", None) or os.environ.get("SANDTREE_TEST_BOOKWORM")
            or os.geteuid() != 0 or not shutil.which("debootstrap")):
        return
    import threading
    root = config._tmp_path_factory.getbasetemp()      # the workers' base temps are inside it
    t = threading.Thread(target=_bootstrap_bookworm, args=(root,), name="bookworm-ahead", daemon=True)
    t.start()
    _AHEAD.append(t)


@pytest.hookimpl(tryfirst=True)                 # before pytest's own -m selection reads them
def pytest_collection_modifyitems(config, items):
    """Each test's markers for what it needs (root, gvisor, network, postgres, ...): tests/marks.py. And the
    files that need the bookworm image last (each file's tests in their order): under `make test` the
    controller bootstraps it while the workers run the others (pytest_configure above), where a worker that
    reached such a file first waited for it (30-40 s of setup in CI, per worker)."""
    import marks
    marks.apply(items)
    late = {item.path for item in items if "bookworm" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.path in late)          # stable: the rest keep their order


_WORKER_LEAKS: list[str] = []


def _leaks(base: str) -> list[str]:
    """What of ours outlives the tests, under this session's temporary tree `base`."""
    problems = []
    with open("/proc/self/mountinfo") as f:
        mounts = [l for l in f if base in l]
    if mounts:
        problems.append(f"mounts left behind: {mounts[:3]}")
    if os.geteuid() == 0:
        for ctrl in ("memory", "pids", "cpu", "freezer", "devices", "unified", ""):
            d = os.path.join("/sys/fs/cgroup", ctrl, "sandtree")
            if os.path.isdir(d):
                left = [n for n in os.listdir(d) if n.startswith(f"{os.getpid()}-")]
                if left:
                    problems.append(f"cgroups left in {d}: {left[:3]}")
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,comm=,args="], capture_output=True, text=True).stdout
    # Ours: helpers built under this session's temporary tree, and the sandbox inits they started
    # (other test sessions may run beside this one). Zombies (state Z) are already dead: the
    # durability test's killed workers leave them to pid 1. A helper is told by its name (comm):
    # its argv may show only a prefix of its path while it runs (the path is cut where it works).
    rows = [l.split(None, 4) for l in out.splitlines() if len(l.split(None, 4)) == 5]
    helpers = {r[0] for r in rows if r[3].startswith("sandtree-exec") and base in r[4]}
    procs = [" ".join(r) for r in rows if r[2][0] != "Z"
             and (r[0] in helpers or (r[3] in ("sandtree-init", "runsc") and r[1] in helpers))]
    # A Ray cluster a test started (tests/raycluster.py) lives in /tmp/st-ray-<this pid>-*
    ray_mark = f"/tmp/st-ray-{os.getpid()}-"
    procs += [" ".join(r)[:200] for r in rows if r[2][0] != "Z" and ray_mark in r[4]]
    if procs:
        problems.append(f"processes left behind: {procs[:3]}")
    return problems


def pytest_sessionfinish(session, exitstatus):
    """Leak check: nothing of ours may outlive the tests. Under xdist each worker checks its own
    tree and hands what it found to the controller (a worker's exit status and stderr are not the
    run's), which checks the whole tree once every worker is done, and fails the run."""
    config = session.config
    base = str(config._tmp_path_factory.getbasetemp())
    if hasattr(config, "workerinput"):
        config.workeroutput["leaks"] = _leaks(base)
        return
    for t in _AHEAD:                             # (done long before, unless no test needed it)
        t.join()
    problems = _WORKER_LEAKS + _leaks(base)
    if problems:
        print("\nLEAK CHECK FAILED:\n  " + "\n  ".join(problems), file=sys.stderr)
        session.exitstatus = 1


def pytest_testnodedown(node, error):
    """(xdist) a worker is done: its leak check's findings."""
    _WORKER_LEAKS.extend(f"{node.gateway.id}: {p}" for p in getattr(node, "workeroutput", {}).get("leaks", []))


@pytest.fixture(scope="module", params=["local", "remote"])
def sdk(request, tmp_path_factory):
    """The public API twice: on an in-process engine and over HTTP (`sandtree.connect` to a real
    `sandtree serve` on loopback): a test using it holds for both."""
    home = tmp_path_factory.mktemp(f"sdk-{request.param}")
    if request.param == "local":
        st = sandtree.Sandtree(str(home))
        yield st
        st.close()
        return
    with serve_process(home) as url:
        st = sandtree.connect(url)
        yield st
        st.close()


@pytest.fixture
def cli(tmp_path):
    """`python -m sandtree ARGS` on a fresh store: the completed process (check: exit 0 or fail)."""
    env = {**os.environ, "SANDTREE_HOME": str(tmp_path / "home")}

    def run(*args, input=None, check=True):
        p = subprocess.run([sys.executable, "-m", "sandtree", *args], env=env, capture_output=True,
                           input=input, timeout=120)
        if check and p.returncode != 0:
            raise AssertionError(f"sandtree {args} -> {p.returncode}: {p.stderr.decode()}")
        return p
    return run
