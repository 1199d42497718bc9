"""contree-sdk 0.3.6 and contree-cli 0.9.4, as published, against a real `sandtree serve` on
loopback: every code example of contree-sdk's README run as written (a script in the clients' own
venv; only the base URL, through the SDK's documented auth.ini, and, against a server with tokens,
the token differ), and contree-cli's documented everyday commands.

The clients live in .venv/contree-sdk, installed once from tests/contree-sdk-requirements.txt
(sandtree's own dependency set is untouched); without PyPI the tests skip, saying so. The
examples read and write the local paths they name (/local/files/..., /some/local/file.txt): the
test makes them, if they are absent, and removes them afterwards.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import uuid

import httpx
import pytest
from conftest import serve_process

import sandtree

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.path.join(ROOT, ".venv", "contree-sdk")
REQUIREMENTS = os.path.join(ROOT, "tests", "contree-sdk-requirements.txt")
LOCAL_ROOTS = ("/local", "/some")          # the README's local paths live under these


@pytest.fixture(scope="session")
def venv() -> str:
    """The clients' venv (its bin directory), built once per requirements file."""
    bindir = os.path.join(VENV, "bin")
    stamp = os.path.join(VENV, ".requirements")
    with open(REQUIREMENTS) as f:
        wanted = f.read()
    os.makedirs(os.path.dirname(VENV), exist_ok=True)
    with open(VENV + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ok = os.path.exists(stamp) and open(stamp).read() == wanted
        if not ok:
            subprocess.run([sys.executable, "-m", "venv", "--clear", VENV], check=True)
            r = subprocess.run([os.path.join(bindir, "pip"), "install", "-q", "-r", REQUIREMENTS],
                               capture_output=True, text=True)
            if r.returncode != 0:
                pytest.skip(f"cannot install {REQUIREMENTS} (PyPI unreachable?): {r.stderr.strip()[-300:]}")
            with open(stamp, "w") as f:
                f.write(wanted)
    return bindir


def readme_blocks(bindir: str) -> dict[str, str]:
    """contree-sdk's README (its package description), its python blocks by fixture name."""
    text = subprocess.run([os.path.join(bindir, "python"), "-c",
                           "import importlib.metadata as m; print(m.metadata('contree-sdk').get_payload())"],
                          capture_output=True, text=True, check=True).stdout
    return {m[1]: m[2] for m in re.finditer(r"```python[^\n]*fixture:name:(\S+)\n(.*?)```", text, re.DOTALL)}


@pytest.fixture
def home(tmp_path, rootfs) -> str:
    """A store with the busybox test image under the two tags the README names."""
    h = str(tmp_path / "home")
    st = sandtree.Sandtree(h)
    img = st.import_image(rootfs, tag="ubuntu:latest")
    img.tag("busybox:latest")
    st.close()
    return h


@pytest.fixture
def server(home):
    with serve_process(home) as url:
        yield url


@pytest.fixture
def local_files():
    """The local files the README's examples name, made for them (and only if nobody's are there)."""
    for d in LOCAL_ROOTS:
        if os.path.lexists(d):
            pytest.skip(f"{d} exists on this machine: the README's examples would write into it")
    try:
        os.makedirs("/local/files/downloaded")
        os.makedirs("/local/logs")
        os.makedirs("/some/local")
        files = {
            # /app.sh: reads its stdin, data file and args, and leaves what the next steps look at
            "/local/files/app.sh": "#!/bin/sh\nmkdir -p /files/path/sub /root/work\necho made > /files/path/made.txt\n"
                                   "cat /data.csv; echo \"args: $*\"; echo \"stdin: $(cat)\"; echo \"proxy: $http_proxy\"\n"
                                   "echo to-stderr >&2\n",
            "/local/files/data_ver1.csv": "a,b\n1,2\n",
            # /bin/app of the session example: result.txt in its working directory, a log in /tmp
            "/local/files/app": "#!/bin/sh\necho 'the result' > result.txt\necho '{\"step\": 1}' > /tmp/log.jsonl\n",
            "/some/local/file.txt": "uploaded by the README\n",
        }
        for path, content in files.items():
            with open(path, "w") as f:
                f.write(content)
        yield files
    finally:
        mounts = open("/proc/self/mountinfo").read()
        for d in LOCAL_ROOTS:
            assert f" {d}/" not in mounts and f" {d} " not in mounts      # never delete through a mount
            shutil.rmtree(d, ignore_errors=True)


def auth_home(tmp_path, url: str) -> str:
    """contree-sdk's (and contree-cli's) own configuration: a profile naming our server."""
    cfg = tmp_path / "contree"
    cfg.mkdir(exist_ok=True)
    (cfg / "auth.ini").write_text(f"[DEFAULT]\nprofile = default\n\n[profile:default]\nurl = {url}\ntype = jwt\n")
    return str(cfg)


def client_env(config_home: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTREE_", "NEBIUS_", "PYTHON"))}
    env["CONTREE_HOME"] = config_home
    return env


def run_script(bindir: str, code: str, env: dict, tmp_path, timeout: float = 180) -> subprocess.CompletedProcess:
    script = tmp_path / f"example-{uuid.uuid4().hex[:8]}.py"
    script.write_text(code)
    return subprocess.run([os.path.join(bindir, "python"), str(script)], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=timeout)


# The README's fixtures that define names a block uses (its own test suite's, restated here)
SESSION = 'from contree_sdk import ContreeSync\nsession = ContreeSync(token="fake-token").images.use("busybox:latest").session()\n'
IMAGE = 'from contree_sdk import ContreeSync\nimage = ContreeSync(token="fake-token").images.use("busybox:latest")\n'
PRELUDE = {"test_popen_communicate": SESSION, "test_popen_shell": SESSION, "test_stable_image_uuid": IMAGE}
# What each block's run must show (stdout checks and an epilogue that reads its variables)
EPILOGUE = {
    "test_popen_communicate": 'assert stdout == "a\\nb\\nc\\n", stdout\nprint("OK")\n',
    "test_popen_shell": 'out = proc.stdout.read()\nout = out.decode() if isinstance(out, bytes) else out\n'
                        'assert proc.returncode == 0 and out.startswith("hello\\ntotal "), out\nprint("OK")\n',
}


def instance_ops(url: str) -> list[dict]:
    return httpx.get(f"{url}/v1/operations", params={"kind": "instance", "limit": 1000}).json()


EXAMPLES = ["test_quick_start_async_simple", "test_quick_start_sync_simple", "test_quick_start_async",
            "test_quick_start_sync", "test_sessions_versioning", "test_popen_communicate", "test_popen_shell",
            "test_async_sync_clients", "test_client_config", "test_objects_reusing", "test_file_upload"]


def test_readme_has_the_examples_we_run(venv):
    names = set(readme_blocks(venv))
    assert names == set(EXAMPLES) | {"test_stable_image_uuid"}, names


@pytest.mark.parametrize("name", EXAMPLES)
def test_readme_example_runs_as_written(venv, server, local_files, tmp_path, name):
    code = readme_blocks(venv)[name]
    before = instance_ops(server)
    out = run_script(venv, PRELUDE.get(name, "") + code + EPILOGUE.get(name, ""),
                     client_env(auth_home(tmp_path, server)), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    ops = instance_ops(server)[:len(instance_ops(server)) - len(before)]
    assert all(o["status"] == "SUCCESS" for o in ops), ops
    check = CHECKS.get(name)
    if check:
        check(out.stdout, ops, server)


def _quick_start(stdout: str, ops: list[dict], url: str) -> None:
    # result0: the script's stdin, data file, args and env; its stderr
    assert "a,b\n1,2\nargs: arg1 arg2\nstdin: input\nproxy: http://10.20.30.40:1234\n" in stdout
    assert "to-stderr\n" in stdout
    lines = stdout.splitlines()
    # ls("files/path") (relative: from /) found what /app.sh made; ls("~") is /root
    assert "2" in lines and "work True" in lines
    assert len(ops) == 4                 # /app.sh, the grep, the session's two runs
    assert "the result\n" in stdout and '{"step": 1}' in stdout
    with open("/local/logs/session_1.log") as f:
        assert f.read() == '{"step": 1}\n'
    # disposable runs chain on their end states: the grep ran on /app.sh's
    assert ops[2]["image_uuid"] == ops[3]["result_image_uuid"]


def _simple(stdout: str, ops: list[dict], url: str) -> None:
    assert stdout == "Hello from Contree!\n\n" and len(ops) == 1


def _sessions(stdout: str, ops: list[dict], url: str) -> None:
    ops = ops[::-1]                       # oldest first: image.run, result1.run, session x2
    assert len(ops) == 4
    assert ops[1]["image_uuid"] == ops[0]["result_image_uuid"]          # result1.run chains on result1
    assert ops[3]["image_uuid"] == ops[2]["result_image_uuid"]          # the session follows its runs


def _reusing(stdout: str, ops: list[dict], url: str) -> None:
    results = {o["result_image_uuid"] for o in ops}
    assert len(ops) == 3 and len(results) == 3 and None not in results   # three runs, three states
    for image in results:                                               # short-lived: not listed
        assert image not in {i["uuid"] for i in httpx.get(f"{url}/v1/images").json()["images"]}


def _upload(stdout: str, ops: list[dict], url: str) -> None:
    up = stdout.strip()
    import hashlib
    digest = hashlib.sha256(b"uploaded by the README\n").hexdigest()
    assert up == str(uuid.UUID(digest[:32]))
    assert httpx.get(f"{url}/v1/files/{digest}").json()["uuid"] == up


CHECKS = {"test_quick_start_async": _quick_start, "test_quick_start_sync": _quick_start,
          "test_quick_start_async_simple": _simple, "test_quick_start_sync_simple": _simple,
          "test_sessions_versioning": _sessions, "test_objects_reusing": _reusing, "test_file_upload": _upload}


def test_stable_uuid_example(venv, server, tmp_path):
    """As written, the example passes its shell expression as `command` with shell=false: Contree's
    document says that is the path of an executable, and a spawn that cannot start is a FAILED
    operation ("spawn failed: ..."): so it is here. Written with shell= (both runs), it holds."""
    code = readme_blocks(venv)["test_stable_image_uuid"]
    env = client_env(auth_home(tmp_path, server))
    out = run_script(venv, IMAGE + code, env, tmp_path)
    assert out.returncode != 0
    assert "FailedOperationError" in out.stderr and "spawn failed: cannot execute 'echo CHANGES > file.txt'" in out.stderr
    failed = instance_ops(server)[0]
    assert failed["status"] == "FAILED" and failed["error"].startswith("spawn failed")
    shell = code.replace('.run("', '.run(shell="')
    assert shell.count('.run(shell="') == 2
    out = run_script(venv, IMAGE + shell + "print(result0.uuid)\n", env, tmp_path)
    assert out.returncode == 0, out.stderr
    base = httpx.get(f"{server}/v1/inspect/", params={"tag": "busybox:latest"}, follow_redirects=True).json()
    assert out.stdout.strip() not in ("None", base["uuid"])   # the write is a new state; `sleep 5` kept it


def test_placeholder_token_against_a_server_with_tokens(venv, home, tmp_path):
    st = sandtree.Sandtree(home)
    try:
        token = st._engine.tenancy.create_token("team", None)["token"]
        st._engine.tenancy.share(st._engine.resolve("ubuntu:latest"))
    finally:
        st.close()
    code = readme_blocks(venv)["test_quick_start_sync_simple"]
    with serve_process(home) as url:
        env = client_env(auth_home(tmp_path, url))
        out = run_script(venv, code, env, tmp_path)
        assert out.returncode != 0 and "status=401" in out.stderr
        assert "needs one of them as its token" in out.stderr and "sandtree token create" in out.stderr
        r = httpx.get(f"{url}/v1/images", headers={"Authorization": "Bearer fake-token"})
        assert r.status_code == 401 and r.json()["status"] == 401
        assert httpx.get(f"{url}/api/v1/images", headers={"Authorization": "Bearer fake-token"}).json()["error"] \
            == "unauthorized"                           # sandtree's own API keeps its own shape
        out = run_script(venv, code.replace('token="fake-token"', f'token="{token}"'), env, tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout == "Hello from Contree!\n\n"


# ---- contree-cli 0.9.4: its README's everyday commands ------------------------------------------
def test_contree_cli_everyday_commands(venv, server, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    env = client_env(str(tmp_path / "cli-home"))

    def cli(*args: str, ok: bool = True) -> str:
        r = subprocess.run([os.path.join(venv, "contree"), *args], capture_output=True, text=True, env=env,
                           cwd=str(work), timeout=120)
        assert (r.returncode == 0) == ok, (args, r.stdout, r.stderr)
        return r.stdout

    # auth: verified against /v1/whoami, saved as a profile (jwt: a token and our URL)
    cli("auth", "--type", "jwt", "--token", "fake-token", "--url", server)
    assert "default" in cli("auth", "list") and " ok" in cli("auth", "list")
    assert re.search(r"(ubuntu|busybox):latest", cli("images"))            # (one tag an image: the first)
    # a session on an image (`eval $(contree use ...)`)
    export = cli("use", "tag:ubuntu:latest").strip()
    assert export.startswith("export CONTREE_SESSION=")
    env["CONTREE_SESSION"] = export.split("=", 1)[1]
    assert "uname" not in cli("use")
    assert cli("run", "uname", "-s") == "Linux\n"                          # direct execution
    assert cli("run", "-s", "--", "mkdir -p /app && echo hello > /app/greeting && echo $HOME") == "/root\n"
    assert "greeting" in cli("ls", "/app")                                  # inspection, no run
    assert cli("cat", "/app/greeting") == "hello\n"
    cli("cp", "/app/greeting", "./greeting.txt")
    assert (work / "greeting.txt").read_text() == "hello\n"
    (work / "data.txt").write_text("local-data\n")
    assert cli("run", "--file", "./data.txt:/app/data.txt", "--", "cat", "/app/data.txt") == "local-data\n"
    assert cli("run", "-s", "--", "exit 3", ok=False) == ""                 # the command's exit status
    # branches and rollback
    cli("session", "branch", "experiment")
    cli("session", "checkout", "experiment")
    cli("run", "-s", "--", "echo exp > /app/exp")
    assert "exp" in cli("ls", "/app")
    cli("session", "checkout", "main")
    assert "exp" not in cli("ls", "/app") and "data.txt" in cli("ls", "/app")
    cli("session", "rollback", "--", "-2")                                  # before data.txt was added
    listing = cli("ls", "/app")
    assert "data.txt" not in listing and "greeting" in listing
    assert "experiment" in cli("session", "show")
    # images, tags, operations
    image = json.loads(cli("-o", "json", "images").splitlines()[0])["uuid"]
    cli("tag", image, "mytag")
    assert "mytag" in cli("images", "--prefix", "my")
    cli("ps")                                                               # (what is running: nothing)
    ran = instance_ops(server)
    assert len(ran) == 5
    assert httpx.get(f"{server}/v1/operations/{ran[0]['uuid']}").json()["metadata"]["command"] == "echo exp > /app/exp"
    assert cli("show", ran[0]["uuid"])
