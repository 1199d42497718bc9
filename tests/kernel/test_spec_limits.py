"""A run's command and environment: larger than a pipe holds, they reach the sandbox on every
start path (cold, warm, gVisor, a live sandbox); beyond the documented limits (defaults.py
COMMAND_* / ARG_* / ENV_*) they are refused as invalid_input before anything starts; a run that
was told to stop always ends, and `serve` stops on SIGTERM with a run in flight.

Before: a warm helper wrote a spec over 64 KiB into a pipe nobody read (helper/main.c), so the run
hung past its timeout and cancel, held a --max-runs slot and the server's shutdown; a cold start
with a 130 KiB command failed in execve (E2BIG, answered "internal").
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

import sandtree
from sandtree import defaults as D
from sandtree.engine import Engine
from sandtree.runtime.base import RunSpec
from sandtree.runtime.pump import pump
from sandtree.values import DEFAULT_ENV

from conftest import free_port, wait_for_port

SUMS = 'for v in "$B1" "$B2" "$1"; do printf %s "$v" | sha256sum | cut -c1-64; done'


def _text(n: int, seed: str) -> str:
    """n bytes of UTF-8 text, some of it two-byte characters (limits count bytes, not characters)."""
    unit = (seed + "-é-" + "x" * 57).encode()
    out = (unit * (n // len(unit) + 1))[:n].decode("utf-8", "ignore")     # (a cut é dropped)
    return out + "y" * (n - len(out.encode()))


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def _big_spec():
    """An env of two variables and an argument each just under their limits (over 300 KiB in all,
    five pipes' worth): what the sandbox must see byte for byte."""
    env = {"B1": _text(D.ENV_VAR_MAX_BYTES - 3, "one"), "B2": _text(D.ENV_VAR_MAX_BYTES - 3, "two")}
    assert all(len(f"{k}={v}".encode()) == D.ENV_VAR_MAX_BYTES for k, v in env.items())
    arg = _text(D.ARG_MAX_BYTES, "arg")
    assert len(arg.encode()) == D.ARG_MAX_BYTES
    return env, ["/bin/sh", "-c", SUMS, "sh", arg], [_sha(env["B1"]), _sha(env["B2"]), _sha(arg)]


@pytest.fixture(params=["cold", "warm"])
def started(request, tmp_path, rootfs):
    """An image on a store whose runs start cold, or on a warm helper (started[2] counts them)."""
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0 if request.param == "cold" else 2)
    image = st.import_image(rootfs)
    rt = st._engine.runtime
    warm_starts = []
    if request.param == "warm":
        image.run("true")                    # the first run starts the pool
        if rt._pool is None:
            pytest.skip("warm starts need root and cgroups")
        for _ in range(500):
            if rt._pool.ready:
                break
            time.sleep(0.01)
        assert rt._pool.ready, rt._pool.broken
        take = rt._start_warm                # (counted, not replaced: the real start runs)

        def counted(spec):
            got = take(spec)
            warm_starts.append(got is not None)
            return got
        rt._start_warm = counted
    yield image, request.param, warm_starts
    st.close()


def test_spec_larger_than_a_pipe_reaches_the_sandbox(started):
    image, how, warm_starts = started
    env, argv, sums = _big_spec()
    r = image.run(argv, env=env, timeout=60, disposable=True)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == sums
    if how == "warm":
        assert warm_starts == [True]         # it was a warm helper's spec that carried it


def test_spec_larger_than_a_pipe_with_stdin_larger_than_a_pipe(started):
    """Stdin of 1 MiB beside the spec (the helper's stdin is the command's on both paths)."""
    image, how, warm_starts = started
    env, argv, sums = _big_spec()
    data = os.urandom(1 << 20)
    r = image.run(["/bin/sh", "-c", SUMS + "; sha256sum | cut -c1-64", "sh", argv[-1]], env=env,
                  stdin=data, timeout=60, disposable=True)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == sums + [hashlib.sha256(data).hexdigest()]


def test_spec_larger_than_a_pipe_on_gvisor_and_live(request, bb, shared_st):
    """The other start paths: a gVisor run (its OCI config), and a command in a live sandbox of
    each tier (entering helper started ahead: its spec comes on a pipe too)."""
    env, argv, sums = _big_spec()
    status = {r["tier"]: r for r in shared_st.doctor()}
    tiers = [t for t in ("namespaces", "gvisor") if status[t]["available"]]
    for tier in tiers:
        if tier == "gvisor":
            r = bb.run(argv, env=env, tier="gvisor", timeout=120, disposable=True)
            assert r.exit_code == 0, r.stderr
            assert r.stdout.decode().split() == sums
        sb = bb.start(tier=tier)
        try:
            for _ in range(2):               # the second takes a helper entered ahead, if any
                r = sb.exec(argv, env=env, timeout=120)
                assert r.exit_code == 0, (tier, r.stderr)
                assert r.stdout.decode().split() == sums, tier
        finally:
            sb.stop()
    if "gvisor" not in tiers:
        pytest.skip(f"gVisor unavailable here ({status['gvisor']['reason']}): only the namespaces tier's live path ran")


# ---- limits, through the engine -----------------------------------------------------------------
def _over(cap: int) -> str:
    return "z" * (cap + 1)


@pytest.mark.parametrize("case", ["arg", "argv-total", "argc", "var", "env-total", "vars", "cwd",
                                  "name-eq", "name-nul", "value-nul", "argv-nul", "surrogate"])
def test_limits_refused_before_anything_starts(bb, case):
    room = D.ENV_MAX_BYTES - sum(len(f"{k}={v}".encode()) + 1 for k, v in DEFAULT_ENV.items())
    command, env, cwd = ["true"], {}, None
    if case == "arg":
        command = ["true", _over(D.ARG_MAX_BYTES)]
    elif case == "argv-total":
        n = D.COMMAND_MAX_BYTES // (D.ARG_MAX_BYTES + 1) + 1
        command = ["true"] + ["a" * D.ARG_MAX_BYTES] * n
    elif case == "argc":
        command = ["true"] * (D.COMMAND_MAX_ARGS + 1)
    elif case == "var":
        env = {"V": _over(D.ENV_VAR_MAX_BYTES - 2)}
    elif case == "env-total":
        env = {f"V{i}": "e" * (D.ENV_VAR_MAX_BYTES - 10) for i in range(room // D.ENV_VAR_MAX_BYTES + 1)}
    elif case == "vars":
        env = {f"V{i}": "" for i in range(100_000)}
    elif case == "cwd":
        cwd = "/" + "d/" * 3000
    elif case == "name-eq":
        env = {"A=B": "x"}
    elif case == "name-nul":
        env = {"A\0B": "x"}
    elif case == "value-nul":
        env = {"A": "x\0y"}
    elif case == "argv-nul":
        command = ["echo", "a\0b"]
    elif case == "surrogate":
        command = ["echo", "\ud800"]
    before = len(bb.log())
    with pytest.raises(sandtree.InvalidInput):
        bb.run(command, env=env, cwd=cwd, timeout=5)
    assert len(bb.log()) == before           # nothing ran, nothing was recorded


def _env_at_the_limit() -> dict:
    """Variables that with the image's defaults (DEFAULT_ENV) fill the environment to exactly its limit."""
    room = D.ENV_MAX_BYTES - sum(len(f"{k}={v}".encode()) + 1 for k, v in DEFAULT_ENV.items())
    env, left, i = {}, room, 0
    while left > 0:
        n = min(D.ENV_VAR_MAX_BYTES, left - 1)
        name = f"V{i:03d}"
        env[name] = "v" * (n - len(name) - 1)
        left -= n + 1
        i += 1
    return env


def test_limits_accept_exactly_the_limit(bb):
    """Each limit itself is accepted (and the sandbox sees it)."""
    env = _env_at_the_limit()
    args = ["a" * D.ARG_MAX_BYTES] * (D.COMMAND_MAX_BYTES // (D.ARG_MAX_BYTES + 1))
    fill = D.COMMAND_MAX_BYTES - sum(len(a) + 1 for a in args) - len("/bin/sh\0-c\0") - len("sh\0")
    script = 'echo $#; env | grep -c "^V"'
    script = script + " " * (fill - len(script) - 1)
    argv = ["/bin/sh", "-c", script, "sh"] + args
    assert sum(len(a.encode()) + 1 for a in argv) == D.COMMAND_MAX_BYTES
    r = bb.run(argv, env=env, timeout=60, disposable=True)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.decode().split() == [str(len(args)), str(len(env))]


def test_execve_e2big_is_invalid_input(tmp_path, rootfs):
    """Within the limits execve still says E2BIG where the engine runs with a small stack rlimit
    (execve takes a quarter of it): the caller's input, not an internal error (it was OSError)."""
    code = f"""
import resource, sandtree
resource.setrlimit(resource.RLIMIT_STACK, (1 << 20, resource.getrlimit(resource.RLIMIT_STACK)[1]))
st = sandtree.Sandtree({str(tmp_path / "home")!r}, warm=0)
try:
    img = st.import_image({rootfs!r})
    img.run(["true", "a" * (120 << 10)], env={{"A": "b" * (120 << 10), "B": "c" * (120 << 10)}}, timeout=30)
    print("ran")
except sandtree.InvalidInput as e:
    print("invalid_input", e)
finally:
    st.close()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("invalid_input"), (out.stdout, out.stderr[-2000:])


def test_live_commands_at_the_limit(bb):
    """A live sandbox's shell command carries the caller's env in variables of its own, beside
    the session script (RUNTIME_ROOM): an env at the limit is still the caller's to use; one past
    it is refused naming the caller's variable, not the session's."""
    env = _env_at_the_limit()
    sb = bb.start()
    try:
        r = sb.exec('env | grep -c "^V"', env=env, timeout=60)
        assert r.exit_code == 0 and r.stdout.decode().split() == [str(len(env))], r.stderr
        r = sb.exec(["/bin/sh", "-c", 'env | grep -c "^V"'], env=env, timeout=60)
        assert r.exit_code == 0 and r.stdout.decode().split() == [str(len(env))], r.stderr
        with pytest.raises(sandtree.InvalidInput, match="'BIG'"):
            sb.exec("true", env={"BIG": _over(D.ENV_VAR_MAX_BYTES)})
        with pytest.raises(sandtree.InvalidInput, match=str(D.ARG_MAX_BYTES)):
            sb.exec("echo " + _over(D.ARG_MAX_BYTES))
    finally:
        sb.stop()


# ---- a run told to stop always ends ---------------------------------------------------------------
def test_pump_ends_a_run_whose_kill_does_not_close_its_pipes():
    """The runtime's kill (SIGKILL to the sandbox's pid 1) did nothing to a helper stuck writing its
    spec: the run stayed `running` past its timeout and cancel. Here a real process holds the
    pipes and the kill callback reaches nothing (as it reached nothing then): pump kills the
    process itself, and returns, timed out."""
    proc = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    rep_r, rep_w = os.pipe()
    spec = RunSpec(argv=["x"], layers=[], root_meta=(0o755, 0, 0))
    out: dict = {}
    try:
        t = threading.Thread(target=lambda: out.update(pump(proc, spec, time.monotonic() + 0.2, rep_r,
                                                            bytearray(), kill=lambda: None)), daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), "pump never gave up on a run it was told to stop"
        assert out["timed_out"]
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.wait()
        os.close(rep_r)
        os.close(rep_w)


# ---- through `sandtree serve` ---------------------------------------------------------------------
class Server:
    def __init__(self, home: str, *extra: str):
        self.port = free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port",
                                      str(self.port), "--ports-port", "0", *extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wait_for_port(self.port, 60)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=90)

    def run(self, **body):
        return self.http.post("/api/v1/runs", json={"image": "bb", **body})

    def close(self):
        self.http.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture
def server(tmp_path, rootfs):
    home = str(tmp_path / "home")
    e = Engine(home, warm=0)
    e.import_path(rootfs, tag="bb")
    e.close()
    s = Server(home)
    yield s
    s.close()


def _refused(r, limit: int):
    assert r.status_code == 400, r.text[:500]
    assert r.json()["error"] == "invalid_input", r.text[:500]
    assert str(limit) in r.json()["message"]


def test_rest_command_over_the_limit_on_a_cold_start(server):
    """The first run of a server starts cold: a 130 KiB command was an execve E2BIG (500 internal)."""
    _refused(server.run(command="echo " + "x" * (130 << 10), timeout=5), D.ARG_MAX_BYTES)
    assert server.run(command="echo ok", timeout=30).json()["stdout"] == "ok\n"


def test_rest_big_env_on_a_warmed_server(server):
    """Two small runs warm the server; then an env of 100 KiB runs and is seen exactly, and one
    just over a limit is 400 invalid_input (before: no answer, the run `running` forever)."""
    for _ in range(2):
        assert server.run(command="true", timeout=30).status_code == 201
    time.sleep(0.5)                          # (the pool's helpers start after the first run)
    big = _text(100 << 10, "rest")
    r = server.run(command='printf %s "$BIG" | sha256sum | cut -c1-64', env={"BIG": big}, timeout=5)
    assert r.status_code == 201, r.text[:500]
    assert r.json()["status"] == "done" and r.json()["outcome"]["exit_code"] == 0, r.text[:2000]
    assert r.json()["stdout"].strip() == _sha(big)
    _refused(server.run(command="true", env={"BIG": _over(D.ENV_VAR_MAX_BYTES - 4)}, timeout=5),
             D.ENV_VAR_MAX_BYTES)
    env = {f"V{i}": "e" * (100 << 10) for i in range(3)}
    _refused(server.run(command="true", env=env, timeout=5), D.ENV_MAX_BYTES)
    _refused(server.run(command="true", env={f"V{i}": "" for i in range(100_000)}, timeout=5),
             D.ENV_MAX_VARS)
    _refused(server.run(command="x" * (31 << 20), timeout=5), D.ARG_MAX_BYTES)


def test_rest_oversize_runs_do_not_take_the_slots(server):
    """--max-runs 4: four runs with big specs (submitted, not awaited) and four over the limits,
    then a normal run still runs; each big one ends (done, within its timeout)."""
    for _ in range(2):
        assert server.run(command="true", timeout=30).status_code == 201
    time.sleep(0.5)
    ops = []
    for i in range(4):
        r = server.run(command="true", env={"BIG": _text(100 << 10, str(i))}, timeout=5, wait=False)
        assert r.status_code == 201, r.text[:500]
        ops.append(r.json()["id"])
        _refused(server.run(command="true", env={"BIG": _over(D.ENV_VAR_MAX_BYTES)}, timeout=5),
                 D.ENV_VAR_MAX_BYTES)
    r = server.run(command="echo still", timeout=30)
    assert r.status_code == 201 and r.json()["stdout"] == "still\n", r.text
    for op in ops:
        got = server.http.post(f"/api/v1/operations/{op}/wait", params={"timeout": 60}).json()
        assert got["status"] == "done", got


def test_rest_timeout_and_cancel_end_a_run(server):
    r = server.run(command="sleep 60", timeout=1)
    assert r.status_code == 201 and r.json()["outcome"]["timed_out"], r.text
    op = server.run(command="sleep 60", timeout=60, wait=False).json()["id"]
    for _ in range(200):
        if server.http.get(f"/api/v1/operations/{op}").json()["status"] == "running":
            break
        time.sleep(0.05)
    server.http.post(f"/api/v1/operations/{op}/cancel")
    got = server.http.post(f"/api/v1/operations/{op}/wait", params={"timeout": 60}).json()
    assert got["status"] == "cancelled", got


def test_sigterm_stops_serve_with_a_run_in_flight(server):
    """A request waiting on a long run held uvicorn's graceful shutdown for the run's whole
    timeout: now it waits SHUTDOWN_GRACE, then the run is cancelled and the server exits."""
    waiting = threading.Thread(target=lambda: _quiet(lambda: server.run(command="sleep 600", timeout=600)),
                               daemon=True)
    waiting.start()
    for _ in range(400):                    # the run is in its sandbox
        ops = server.http.get("/api/v1/operations", params={"status": "running"}).json()
        if ops:
            break
        time.sleep(0.05)
    assert ops
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(D.SHUTDOWN_GRACE + 60)
    except subprocess.TimeoutExpired:
        pytest.fail("serve did not stop on SIGTERM with a run in flight")
    waiting.join(30)


def _quiet(call):
    try:
        call()
    except httpx.HTTPError:
        pass
