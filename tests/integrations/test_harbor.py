"""Harbor on sandtree (issue 37): Harbor itself, pinned (harbor==0.26.0, on Debian trixie's Python 3.13 that
scripts/install-harbor sets up: Harbor needs Python >= 3.12), runs jobs through
`sandtree.integrations.harbor:SandtreeEnvironment` with its oracle agent, once with the engine in
Harbor's process and once through a real `sandtree serve` on loopback; and each capability the class
declares True is exercised on one environment driven as Harbor's trial drives it (tests/programs/harbor_env.py).

The tasks (tests/harbortasks.py): hello-world (reward 1), the same with a wrong reference solution
(reward 0), a task whose agent phase is offline and whose verifier is allowed one address, and
data/evalset's python-semver-426 in the shape of Harbor's SWE-bench adapter (FROM its prebuilt eval
environment; gold patch as the solution; FAIL_TO_PASS/PASS_TO_PASS graded in the verifier).

Real things only: the egress daemon's upstream is a netlab internet this module made (tests/netlab.py),
so a sandbox's packets reach nothing but namespaces made here. The eval environment is built in the
session's Debian store with the package registry reachable only through that store's egress path (as
test_miniswe.py does; skipped, saying why, when unreachable) and bundled into this module's store."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

import sandtree
from conftest import free_port, wait_for_port
from harbortasks import harbor_python, hello_tasks, job_config, offline_task, swe_task, trials
from netlab import NetLab
from sandtree.errors import BuildFailed
from sandtree.network.client import Egress

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = os.path.join(REPO, "src")
PROGRAM = os.path.join(REPO, "tests", "programs", "harbor_env.py")
IID = "python-semver__python-semver-426"
SWE = IID.lower()
EXPECTED = {"hello-world": 1.0, "wrong-answer": 0.0, "offline-verifier": 1.0, SWE: 1.0}
def _instance() -> dict:
    with open(os.path.join(REPO, "data", "evalset", "instances.jsonl")) as f:
        return next(json.loads(line) for line in f if IID in line)


@pytest.fixture(scope="module")
def harbor_py():
    py, why = harbor_python()
    if py is None:
        pytest.skip(why)
    return py


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    lab = NetLab()
    yield lab
    lab.close()


def lab_env(lab) -> dict:
    """What a process (Harbor's, a server) needs for its store's egress daemon to use the netlab upstream."""
    return {**os.environ, "PYTHONPATH": SRC, "HARBOR_TELEMETRY": "0", "SANDTREE_EGRESS_NETNS": lab.path,
            "SANDTREE_EGRESS_DNS": f"{lab.dns[0]}:{lab.dns[1]}", "SANDTREE_EGRESS_CA": lab.ca_file}


@pytest.fixture(scope="module")
def store(bookworm, lab, tmp_path_factory):
    """This module's store: the Debian image tagged harbor-base, the eval environment of python-semver-426
    as eval/<id> (or None when it could not be built here); its egress daemon's upstream is the netlab."""
    from test_network_pip import HOST_BUNDLE, registry_rules
    from sandtree import evaluation
    src = sandtree.Sandtree(bookworm[0], warm=0)
    env_image, why, bundle = None, "", str(tmp_path_factory.mktemp("bundle") / "harbor.bundle")
    try:
        ctx = tmp_path_factory.mktemp("site")
        shutil.copyfile(HOST_BUNDLE, ctx / "ca.crt")
        site = src.recipe(bookworm[1], context=str(ctx)).copy("ca.crt", "/etc/ssl/certs/ca-certificates.crt").build()
        try:
            env_image = evaluation.environment(src.engine, _instance(), base=site.id, build_network=registry_rules())
        except BuildFailed as exc:               # pragma: no cover - depends on the registry
            env_image, why = None, exc.message[-300:]
        src.bundle(bundle, [bookworm[1]] + ([env_image] if env_image else []))
    finally:
        src.engine.egress.stop_daemon()
        src.close()
    home = str(tmp_path_factory.mktemp("harbor") / "home")
    st = sandtree.Sandtree(home, warm=0)
    try:
        st.import_bundle(bundle)
        st.tag(bookworm[1], "harbor-base")
        if env_image:
            st.tag(env_image, f"eval/{IID}")
    finally:
        st.close()
    os.unlink(bundle)
    yield home, env_image, why
    Egress(home).stop_daemon()


@pytest.fixture(scope="module")
def tasks(store, lab, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("tasks"))
    out = hello_tasks(root, "harbor-base") + [offline_task(root, "harbor-base", lab.allowed)]
    if store[1]:
        out.append(swe_task(root, _instance(), f"eval/{IID}"))
    return out


@contextlib.contextmanager
def serve(home: str, lab):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", home, "serve", "--port", str(port),
                             "--ports-port", "0"], env=lab_env(lab), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, 30)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_job(harbor_py, lab, tmp_path, name: str, tasks: list[str], kwargs: dict) -> dict:
    jobs = str(tmp_path / "jobs")
    cfg = job_config(str(tmp_path / f"{name}.json"), name, jobs, tasks, kwargs)
    harbor = os.path.join(os.path.dirname(harbor_py), "harbor")
    p = subprocess.run([harbor, "run", "-c", cfg, "-y"], env=lab_env(lab), capture_output=True, text=True,
                       timeout=1800, cwd=str(tmp_path))
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    return trials(os.path.join(jobs, name))


def check_job(got: dict, home: str, tasks: list[str], lab) -> None:
    names = {os.path.basename(t) for t in tasks}
    assert set(got) == names, (set(got), names)
    st = sandtree.Sandtree(home, warm=0)
    try:
        for name, trial in got.items():
            result = trial["result"]
            assert result["exception_info"] is None, (name, result["exception_info"])
            rewards = result["verifier_result"]["rewards"]
            assert rewards["reward"] == EXPECTED[name], (name, rewards, trial["dir"])
            # the final state, kept as an image: its ID and tag in the trial's sandtree.json, its reward on it
            (session, record), = trial["sandtree"].items()
            assert session.endswith("__env") and record["source"] and record["image"] != record["source"]
            trial_name = os.path.basename(trial["dir"])
            assert record["tag"] == f"harbor/{trial_name}" and st.image(record["tag"]).id == record["image"]
            assert record["reward"] == EXPECTED[name]
            notes = st.annotations(record["image"])
            assert notes["score"] == EXPECTED[name] and notes["meta"]["harbor.trial"] == trial_name, notes
            image = st.image(record["image"])
            if name in ("hello-world", "wrong-answer"):
                want = b"Hello, world!\n" if name == "hello-world" else b"Goodbye, world!\n"
                assert image.read("/app/hello.txt") == want
            elif name == "offline-verifier":
                assert image.read("/app/agent-network") == b"offline\n"
                assert b"ERROR" in image.read("/app/agent-probe.txt")
            else:
                assert b"return type(self)(**version)" in image.read("/testbed/src/semver/version.py")
                assert notes["meta"]["reward.fail_to_pass_passed"] == 1, notes
                assert notes["meta"]["reward.pass_to_pass_failed"] == 0, notes
            assert not st.sandboxes(labels={"harbor.session": session}), "the trial's sandbox is still running"
    finally:
        st.close()
    paths = [r.get("path") for r in lab.requests]
    assert "/harbor-verifier" in paths and "/harbor-agent" not in paths, paths


def _swe_or_skip(store) -> None:
    """After the other tasks held: a skip saying so when the SWE-bench task could not be part of the job."""
    if not store[1]:
        pytest.skip(f"the eval environment did not build here (registry unreachable?), so the job ran without "
                    f"the SWE-bench task: {store[2]}")


def test_harbor_job_in_process(harbor_py, lab, store, tasks, tmp_path):
    """`harbor run` with the engine in Harbor's own process (kwargs: home)."""
    home = store[0]
    lab.requests.clear()
    got = run_job(harbor_py, lab, tmp_path, "in-process", tasks, {"home": home})
    check_job(got, home, tasks, lab)
    _swe_or_skip(store)


def test_harbor_job_through_serve(harbor_py, lab, store, tasks, tmp_path):
    """The same job against a `sandtree serve` on loopback (kwargs: url): the server builds and runs."""
    home = store[0]
    lab.requests.clear()
    with serve(home, lab) as url:
        got = run_job(harbor_py, lab, tmp_path, "served", tasks, {"url": url})
    check_job(got, home, tasks, lab)
    _swe_or_skip(store)


# ---- each capability declared True, on one environment driven as Harbor's trial drives it --------------

PROBE = ("python3 -c \"import sys, urllib.request\ntry: print(urllib.request.urlopen(sys.argv[1], timeout=8)"
         ".read().decode())\nexcept Exception as e: print('ERROR', type(e).__name__, e)\" ")


def probe(url: str) -> dict:
    return {"op": "exec", "command": PROBE + url}


def drive(harbor_py, lab, tmp_path, task: str, steps: list, *, kwargs: dict, network=None, phases=None,
          init=None) -> dict:
    spec = {"task": task, "trial_dir": str(tmp_path / "trial"), "kwargs": kwargs, "network": network,
            "phases": phases or [], "init": init or {}, "steps": steps}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    p = subprocess.run([harbor_py, PROGRAM, str(path)], env=lab_env(lab), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hello(tasks):
    return next(t for t in tasks if t.endswith("hello-world"))


def _started(out: dict) -> dict:
    assert "init" not in out and out["start"].get("ok"), out.get("init") or out["start"]
    return out


def reached(res: dict, marker: str) -> bool:
    assert res.get("ok"), res
    return marker in res["stdout"] and "ERROR" not in res["stdout"]


def test_capabilities_declared(harbor_py, lab, store, hello, tmp_path):
    out = _started(drive(harbor_py, lab, tmp_path, hello, [], kwargs={"home": store[0]}))
    caps = out["capabilities"]
    for flag in ("disable_internet", "network_allowlist", "network_allowlist_hostnames",
                 "network_allowlist_wildcard_hostnames", "network_allowlist_ipv4_addresses",
                 "network_allowlist_ipv6_addresses", "network_allowlist_ipv4_cidrs",
                 "network_allowlist_ipv6_cidrs", "dynamic_network_policy"):
        assert caps[flag] is True, flag
    for flag in ("gpus", "tpus", "windows", "docker_compose", "mounted", "stream"):
        assert caps[flag] is False, flag
    assert out["resource_capabilities"] == {"cpu_limit": True, "cpu_request": False, "memory_limit": True,
                                            "memory_request": False, "fractional_cpus": True}


def test_disable_internet(harbor_py, lab, store, hello, tmp_path):
    out = _started(drive(harbor_py, lab, tmp_path, hello, [probe(f"http://{lab.allowed}/no-network")],
                         kwargs={"home": store[0]}, network={"network_mode": "no-network"}))
    assert not reached(out["steps"][0], "no-network")


@pytest.mark.parametrize("rule,ok_url,refused_url", [
    ("allowed.test", "http://allowed.test/hostname", "http://other.test/hostname"),
    ("*.allowed.test", "http://www.allowed.test/wildcard", "http://other.test/wildcard"),
    ("11.1.1.10", "http://11.1.1.10/ipv4", "http://11.1.1.11/ipv4"),
    ("11.1.1.8/30", "http://11.1.1.10/ipv4-cidr", "http://11.1.1.53/ipv4-cidr"),
    pytest.param("fd00:ec2::254", "http://[fd00:ec2::254]/ipv6", "http://11.1.1.10/ipv6"),
    pytest.param("fd00:ec2::/64", "http://[fd00:ec2::254]/ipv6-cidr", "http://11.1.1.10/ipv6-cidr"),
], ids=["hostname", "wildcard", "ipv4", "ipv4-cidr", "ipv6", "ipv6-cidr"])
def test_allowlist(harbor_py, lab, store, hello, tmp_path, rule, ok_url, refused_url):
    """network_allowlist with each kind of entry Harbor classifies: the allowed destination is reached,
    another is refused (and never reaches the lab's server)."""
    lab.requests.clear()
    out = _started(drive(harbor_py, lab, tmp_path, hello, [probe(ok_url), probe(refused_url)],
                         kwargs={"home": store[0]}, network={"network_mode": "allowlist", "allowed_hosts": [rule]}))
    marker = ok_url.rsplit("/", 1)[1]
    assert reached(out["steps"][0], marker), out["steps"][0]
    assert not reached(out["steps"][1], marker), out["steps"][1]
    assert [r["path"] for r in lab.requests] == [f"/{marker}"], lab.requests


def _phases(harbor_py, lab, store, hello, tmp_path, start: dict) -> list:
    allow = {"network_mode": "allowlist", "allowed_hosts": [lab.allowed]}
    out = _started(drive(harbor_py, lab, tmp_path, hello, [
        probe(f"http://{lab.allowed}/before"),
        {"op": "set_network", **allow}, probe(f"http://{lab.allowed}/verifier"),
        {"op": "set_network", "network_mode": "no-network"}, probe(f"http://{lab.allowed}/after"),
    ], kwargs={"home": store[0]}, network=start, phases=[{"network_mode": "no-network"}, allow]))
    return out["steps"]


def test_dynamic_network_policy_between_phases(harbor_py, lab, store, hello, tmp_path):
    """Harbor's phases on a sandbox started with a network policy (another host): one host for the
    verifier's phase, then none."""
    steps = _phases(harbor_py, lab, store, hello, tmp_path, {"network_mode": "allowlist",
                                                             "allowed_hosts": ["other.test"]})
    assert not reached(steps[0], "before")
    assert steps[1] == {"ok": True} and reached(steps[2], "verifier")
    assert steps[3] == {"ok": True} and not reached(steps[4], "after")


def test_dynamic_network_policy_from_offline(harbor_py, lab, store, hello, tmp_path):
    """The agent phase offline from the start (no link at all), the verifier given a host later."""
    steps = _phases(harbor_py, lab, store, hello, tmp_path, {"network_mode": "no-network"})
    assert not reached(steps[0], "before")
    assert steps[1] == {"ok": True} and reached(steps[2], "verifier")
    assert steps[3] == {"ok": True} and not reached(steps[4], "after")


def test_resource_limits(harbor_py, lab, store, hello, tmp_path):
    """cpu_limit (fractional), memory_limit and storage as the sandbox's limits: the sandbox's info says
    so, a process over the memory limit is killed, a write past the storage limit fails."""
    out = _started(drive(harbor_py, lab, tmp_path, hello, [
        {"op": "info"},
        {"op": "exec", "command": "python3 -c 'b = bytearray(400 << 20); print(len(b))'"},
        {"op": "exec", "command": "dd if=/dev/zero of=/app/big bs=1M count=300 2>&1; sync"},
    ], kwargs={"home": store[0]}, init={"override_cpus": 0.5, "override_memory_mb": 128, "override_storage_mb": 100,
                                        "cpu_enforcement_policy": "limit", "memory_enforcement_policy": "limit"}))
    info = out["steps"][0]["info"]
    limits = info.get("limits") or info.get("spec") or info
    text = json.dumps(limits)
    assert '"cpus": 0.5' in text and str(128 << 20) in text and str(100 << 20) in text, info
    assert out["steps"][1]["code"] != 0 and "419430400" not in out["steps"][1]["stdout"], out["steps"][1]
    assert out["steps"][2]["code"] != 0 or "No space" in out["steps"][2]["stdout"], out["steps"][2]


def test_resource_requests_refused(harbor_py, lab, store, hello, tmp_path):
    """cpu_request is False: Harbor itself refuses a request policy for this environment."""
    out = drive(harbor_py, lab, tmp_path, hello, [], kwargs={"home": store[0]},
                init={"override_cpus": 1, "cpu_enforcement_policy": "request"})
    assert "does not support CPU resource requests" in out["init"]["error"], out


def test_exec_and_files(harbor_py, lab, store, hello, tmp_path):
    """exec (cwd, env, user, exit codes, timeouts) and upload/download of files and trees, as Harbor uses
    them for /solution, /tests and /logs; then stop: the final image and the trial's record."""
    up = tmp_path / "up"
    (up / "sub" / "deeper").mkdir(parents=True)
    (up / "a.txt").write_text("alpha\n")
    (up / "sub" / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(up / "sub" / "run.sh", 0o755)
    (up / "sub" / "deeper" / "b.bin").write_bytes(bytes(range(256)) * 10)
    os.symlink("a.txt", up / "link")
    down = tmp_path / "down"
    out = _started(drive(harbor_py, lab, tmp_path, hello, [
        {"op": "exec", "command": "pwd; echo $HB_X; id -un", "env": {"HB_X": "x1"}},
        {"op": "exec", "command": "pwd; id -u", "cwd": "/tmp", "user": "nobody"},
        {"op": "exec", "command": "exit 7"},
        {"op": "exec", "command": "sleep 30", "timeout": 1},
        {"op": "exec", "command": "true", "user": "no-such-user"},
        {"op": "upload_dir", "source": str(up), "target": "/work/up"},
        {"op": "exec", "command": "/work/up/sub/run.sh; readlink /work/up/link; stat -c %a /work/up/sub/run.sh"},
        {"op": "upload_file", "source": str(up / "a.txt"), "target": "/work/single/a.txt"},
        {"op": "download_file", "source": "/work/single/a.txt", "target": str(down / "single.txt")},
        {"op": "download_dir", "source": "/work/up", "target": str(down / "tree")},
        {"op": "stop", "delete": True},
    ], kwargs={"home": store[0]}))
    s = out["steps"]
    assert s[0]["stdout"] == "/app\nx1\nroot\n" and s[0]["code"] == 0, s[0]
    assert s[1]["stdout"] == "/tmp\n65534\n", s[1]
    assert s[2]["code"] == 7
    assert "TimeoutError" in s[3]["error"], s[3]
    assert s[4]["code"] == 126 and "unable to find user" in s[4]["stderr"], s[4]
    assert s[5] == {"ok": True} and s[6]["stdout"] == "ran\na.txt\n755\n", s[6]
    assert (down / "single.txt").read_text() == "alpha\n"
    tree = down / "tree"
    assert (tree / "a.txt").read_text() == "alpha\n" and os.readlink(tree / "link") == "a.txt"
    assert (tree / "sub" / "deeper" / "b.bin").read_bytes() == bytes(range(256)) * 10
    assert stat.S_IMODE(os.stat(tree / "sub" / "run.sh").st_mode) == 0o755
    stop = s[10]
    assert stop["ok"] and stop["image"], stop
    (record,) = stop["record"].values()
    assert record["image"] == stop["image"] and record["tag"] == "harbor/trial"
    st = sandtree.Sandtree(store[0], warm=0)
    try:
        assert st.image("harbor/trial").read("/work/up/a.txt") == b"alpha\n"
        assert not st.sandboxes(labels={"harbor.session": "trial__env"})
    finally:
        st.close()


def test_bad_kwargs_refused(harbor_py, lab, store, hello, tmp_path):
    """An unknown kwarg is Harbor's typed options error, before anything starts."""
    out = drive(harbor_py, lab, tmp_path, hello, [], kwargs={"home": store[0], "hmoe": "/x"})
    assert "Unknown option 'hmoe'" in out["init"]["error"], out


def test_prebuilt_image_large_file_stream_and_keep(harbor_py, lab, store, tmp_path):
    """A task with `docker_image` (a store ref) and no Dockerfile: its environment/ files are put in
    the working directory; a file over the engine's read cap still downloads whole; Harbor's scoped
    output callback sees the command's output; stop(delete=False) commits and leaves the sandbox running."""
    task = tmp_path / "prebuilt"
    (task / "environment").mkdir(parents=True)
    (task / "environment" / "data.txt").write_text("from the task\n")
    (task / "tests").mkdir()
    (task / "tests" / "test.sh").write_text("#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n")
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "task.toml").write_text('schema_version = "1.4"\n\n[metadata]\n\n[environment]\n'
                                    'docker_image = "harbor-base"\nworkdir = "/srv"\n')
    out = _started(drive(harbor_py, lab, tmp_path, str(task), [
        {"op": "exec", "command": "pwd; cat data.txt"},
        {"op": "exec", "command": "head -c 70000000 /dev/urandom > /tmp/big && sha256sum /tmp/big"},
        {"op": "download_file", "source": "/tmp/big", "target": str(tmp_path / "big")},
        {"op": "exec_stream", "command": "echo one; echo two >&2"},
        {"op": "stop", "delete": False},
    ], kwargs={"home": store[0]}))
    s = out["steps"]
    assert s[0]["stdout"] == "/srv\nfrom the task\n", s[0]
    big = tmp_path / "big"
    assert s[2] == {"ok": True} and big.stat().st_size == 70000000
    import hashlib
    assert hashlib.sha256(big.read_bytes()).hexdigest() == s[1]["stdout"].split()[0]
    assert ["stdout", "one\n"] in s[3]["chunks"] and ["stderr", "two\n"] in s[3]["chunks"], s[3]
    st = sandtree.Sandtree(store[0], warm=0)
    try:
        (record,) = s[4]["record"].values()
        assert st.image(record["image"]).read("/srv/data.txt") == b"from the task\n"
        kept = st.sandboxes(labels={"harbor.session": "trial__env"})
        assert [sb.id for sb in kept] == [record["sandbox"]]
        kept[0].stop()
    finally:
        st.close()
