"""The inspect-ai sandbox "sandtree" (issue 17, deliverable 3).

A real `inspect eval` in a subprocess (mockllm/model, scripted) on a real Debian image, in process
and against a real `sandtree serve` on loopback: the eval log, read with inspect's own reader, names
each sample's final image, and that image holds what the sample wrote. Then the provider's exec /
read_file / write_file semantics and errors directly (on the busybox image, in process and over HTTP),
its lifecycle (fork per sample, commit and stop at cleanup, task and CLI cleanup), its config.

The subprocess finds the provider through the `inspect_ai` entry point pyproject.toml declares: a
dist-info written from pyproject.toml goes first on its PYTHONPATH (the shared venv's editable
install points at another checkout and is not reinstalled for a test)."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("inspect_ai")

from inspect_ai.log import read_eval_log  # noqa: E402
from inspect_ai.util import (OutputLimitExceededError, SandboxUnavailableError,  # noqa: E402
                             override_sandbox_output_limit, store)
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv  # noqa: E402

import sandtree  # noqa: E402
from sandtree.integrations.inspect_config import (SandtreeSandboxConfig, close_clients,  # noqa: E402
                                                  load_config)
from sandtree.integrations.inspect_sandbox import RUN, SandtreeSandboxEnvironment as Env  # noqa: E402

from conftest import serve_process  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

TASK = textwrap.dedent('''
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, scorer
    from inspect_ai.solver import generate, solver, use_tools
    from inspect_ai.tool import bash
    from inspect_ai.util import sandbox
    from sandtree.integrations.inspect_config import SandtreeSandboxConfig

    def script(messages, tools, tool_choice, config):
        """The scripted model: one bash call that computes the product, then an answer."""
        if any(m.role == "tool" for m in messages):
            out = ModelOutput.from_content("mockllm/model", "done")
        else:
            out = ModelOutput.for_tool_call("mockllm/model", "bash", {"command":
                "cd /work && python3 -c 'a, b = map(int, open(\\"input.txt\\").read().split()); print(a * b)' > answer.txt"})
        # usage given: mockllm would otherwise count tokens with tiktoken, which downloads its tables
        out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return out

    @solver
    def prepare():
        async def solve(state, generate):
            a, b = state.metadata["factors"]
            await sandbox().write_file("work/input.txt", f"{a} {b}\\n")          # relative: the sandbox's cwd
            await sandbox().write_file("/work/blob.bin", bytes(range(256)))     # bytes as they are
            return state
        return solve

    @scorer(metrics=[accuracy()])
    def product():
        async def score(state, target):
            r = await sandbox().exec(["cat", "/work/answer.txt"])
            got = (await sandbox().read_file("/work/answer.txt")).strip() if r.success else ""
            return Score(value=CORRECT if got == target.text and r.stdout.strip() == got else INCORRECT, answer=got)
        return score

    @task
    def multiply():
        return Task(dataset=[Sample(id="a", input="multiply", target="42", metadata={"factors": [6, 7]}),
                             Sample(id="b", input="multiply", target="15", metadata={"factors": [3, 5]})],
                    solver=[prepare(), use_tools(bash(timeout=60)), generate()], scorer=product(),
                    model=get_model("mockllm/model", custom_outputs=script), sandbox=SANDBOX)
''')


def run(coro):
    return asyncio.run(coro)


def entry_point_path(tmp_path) -> str:
    """A dist-info carrying pyproject.toml's inspect_ai entry points, for the subprocess's path."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"]["inspect_ai"]
    d = tmp_path / "eps" / f"sandtree-{project['version']}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sandtree\nVersion: {project['version']}\n")
    (d / "entry_points.txt").write_text("[inspect_ai]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return str(tmp_path / "eps")


def inspect_env(tmp_path) -> dict:
    path = os.pathsep.join([entry_point_path(tmp_path), str(ROOT / "src")])
    return {**os.environ, "PYTHONPATH": path, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
            "INSPECT_LOG_DIR": str(tmp_path / "logs"), "INSPECT_DISPLAY": "plain", "INSPECT_EVAL_MODEL": ""}


def inspect_eval(tmp_path, sandbox_expr: str, *extra: str):
    """Write the task with SANDBOX = sandbox_expr, run `inspect eval` on it, return its EvalLog."""
    task_dir = tmp_path / "task"
    task_dir.mkdir(exist_ok=True)
    (task_dir / "task.py").write_text(TASK.replace("sandbox=SANDBOX", f"sandbox={sandbox_expr}"))
    p = subprocess.run([os.path.join(os.path.dirname(sys.executable), "inspect"), "eval", "task.py",
                        "--log-dir", str(tmp_path / "logs"), "--log-format", "eval", *extra],
                       cwd=task_dir, env=inspect_env(tmp_path), capture_output=True, text=True, timeout=600)
    logs = glob.glob(str(tmp_path / "logs" / "*.eval"))
    assert p.returncode == 0 and len(logs) == 1, f"inspect eval failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return read_eval_log(logs[0])


def check_eval_log(log, st, source: str) -> None:
    """Both samples scored correct; each names its own final image (sample store and transcript),
    forked from the task image; that image holds the files the sample wrote and the model made."""
    assert log.status == "success", log.error
    assert len(log.samples) == 2
    finals = {}
    for s in log.samples:
        assert s.scores["product"].value == "C", (s.id, s.scores)
        rec = s.store["sandtree:default"]
        assert rec["source"] == source and len(rec["image"]) == 64 and rec["image"] != source
        infos = [e.data for e in s.events if e.event == "info" and isinstance(e.data, dict) and "sandtree" in e.data]
        assert [d["sandtree"] for d in infos] == ["fork", "final"]
        assert infos[0]["sandbox"] == rec["sandbox"] and infos[1]["image"] == rec["image"]
        img = st.image(rec["image"])
        want = {"a": "42", "b": "15"}[s.id]
        assert img.read("/work/answer.txt").decode().strip() == want
        assert img.read("/work/input.txt") == {"a": b"6 7\n", "b": b"3 5\n"}[s.id]
        assert img.read("/work/blob.bin") == bytes(range(256))
        assert st.image(source).id in [p.id for p in img.ancestors()]
        finals[s.id] = rec["image"]
    assert finals["a"] != finals["b"]                  # forks of one image, each its own end state
    with pytest.raises(sandtree.PathNotFound):
        st.image(source).read("/work/answer.txt")     # the task image itself is untouched


@pytest.fixture(scope="module")
def debian(bookworm, tmp_path_factory):
    """The session's Debian image (bash, python3) copied by bundle into a store of this module's own:
    the evals commit their samples' images there, not into the shared one."""
    home, image, _ = bookworm
    work = tmp_path_factory.mktemp("inspect-debian")
    bundle = str(work / "debian.bundle")
    with sandtree.Sandtree(home, warm=0) as src:
        src.bundle(bundle, [image])
    mine = str(work / "home")
    with sandtree.Sandtree(mine, warm=0) as st:
        st.import_bundle(bundle)
        st.tag(image, "debian")
    os.unlink(bundle)
    yield mine, image
    close_clients()
    # a copy of a Debian image is 300 MB: removed with the module (never through a mount: PLATFORM.md)
    if not any(str(work) in line for line in open("/proc/self/mountinfo")):
        shutil.rmtree(work, ignore_errors=True)


def no_live_sandboxes(st) -> None:
    left = st.sandboxes()
    for sb in left:
        sb.stop()
    assert not left, f"sandboxes left running: {left}"


def test_inspect_eval_in_process(debian, tmp_path):
    """`inspect eval` with sandbox="sandtree" and its config as a file beside the task (found by inspect:
    config_files), on an in-process store."""
    home, image = debian
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "sandtree.yaml").write_text(f"home: {home}\nimage: debian\nmemory: 512M\n")
    log = inspect_eval(tmp_path, '"sandtree"')
    assert log.eval.sandbox.type == "sandtree" and log.eval.sandbox.config.endswith("sandtree.yaml")
    with sandtree.Sandtree(home, warm=0) as st:
        check_eval_log(log, st, image)
        no_live_sandboxes(st)


def test_inspect_eval_against_server(debian, tmp_path):
    """The same task against `sandtree serve` (connect()): config as the model, the image by ID."""
    home, image = debian
    with serve_process(home) as url:
        log = inspect_eval(tmp_path, f'("sandtree", SandtreeSandboxConfig(url="{url}", image="{image[:16]}"))')
        remote = sandtree.connect(url)
        try:
            check_eval_log(log, remote, image)
            no_live_sandboxes(remote)
        finally:
            remote.close()


def test_inspect_eval_dockerfile(bb_home, tmp_path):
    """A Dockerfile beside the task is the task's image (built with st.build, cached): each sample's
    sandbox has what its RUN made. --no-sandbox-cleanup keeps the sandboxes, as inspect documents;
    `inspect sandbox cleanup sandtree` then stops them."""
    home, _ = bb_home
    task_dir = tmp_path / "task"
    task_dir.mkdir()
    (task_dir / "Dockerfile").write_text("FROM bb\nRUN mkdir -p /work && echo built > /work/built\n")
    (task_dir / "task.py").write_text(textwrap.dedent('''
        from inspect_ai import Task, task
        from inspect_ai.dataset import Sample
        from inspect_ai.model import ModelOutput, ModelUsage, get_model
        from inspect_ai.scorer import CORRECT, INCORRECT, Score, accuracy, scorer
        from inspect_ai.util import sandbox

        def script(messages, tools, tool_choice, config):
            out = ModelOutput.from_content("mockllm/model", "nothing to do")
            out.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)   # no tiktoken download
            return out

        @scorer(metrics=[accuracy()])
        def built():
            async def score(state, target):
                got = await sandbox().read_file("/work/built")
                return Score(value=CORRECT if got == "built\\n" else INCORRECT)
            return score

        @task
        def dockerfile():
            return Task(dataset=[Sample(input="x", id=1)], scorer=built(), sandbox="sandtree",
                        model=get_model("mockllm/model", custom_outputs=script))
    '''))
    env = {**inspect_env(tmp_path), "SANDTREE_HOME": home}
    inspect = os.path.join(os.path.dirname(sys.executable), "inspect")
    p = subprocess.run([inspect, "eval", "task.py", "--no-sandbox-cleanup",
                        "--log-dir", str(tmp_path / "logs")], cwd=task_dir, env=env, capture_output=True, text=True,
                       timeout=600)
    logs = glob.glob(str(tmp_path / "logs" / "*.eval"))
    assert p.returncode == 0 and logs, p.stdout[-2000:] + p.stderr[-2000:]
    log = read_eval_log(logs[0])
    assert log.samples[0].scores["built"].value == "C"
    rec = log.samples[0].store["sandtree:default"]
    assert "image" not in rec                          # not cleaned up: still running, nothing committed
    with sandtree.Sandtree(home, warm=0) as st:
        assert st.image(rec["source"]).read("/work/built") == b"built\n"
        assert st.sandbox(rec["sandbox"]).state == "running"
        c = subprocess.run([inspect, "sandbox", "cleanup", "sandtree"], env=env, capture_output=True, text=True,
                           timeout=120)
        assert c.returncode == 0, c.stderr
        assert st.sandbox(rec["sandbox"]).state == "stopped"


# ---- the provider directly ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bb_home(rootfs, tmp_path_factory):
    """A store of this module's own with the busybox image tagged "bb"."""
    home = str(tmp_path_factory.mktemp("inspect-bb") / "home")
    with sandtree.Sandtree(home, warm=0) as st:
        image = st.import_image(rootfs, tag="bb").id
    yield home, image
    close_clients()
    with sandtree.Sandtree(home, warm=0) as st:
        no_live_sandboxes(st)


@pytest.fixture(scope="module", params=["local", "remote"])
def target(request, bb_home, rootfs, tmp_path_factory):
    """(config, a client to check with): the provider in process, and against `sandtree serve`."""
    home, _ = bb_home
    if request.param == "local":
        with sandtree.Sandtree(home, warm=0) as st:
            yield SandtreeSandboxConfig(home=home, image="bb"), st
        return
    served = str(tmp_path_factory.mktemp("inspect-served") / "home")
    with sandtree.Sandtree(served, warm=0) as st:
        st.import_image(rootfs, tag="bb")
    with serve_process(served) as url:
        remote = sandtree.connect(url)
        try:
            yield SandtreeSandboxConfig(url=url, image="bb"), remote
            no_live_sandboxes(remote)
        finally:
            close_clients()
            remote.close()


async def one_sample(cfg, fn, sample_id="s"):
    await Env.task_init("t", cfg)
    envs = await Env.sample_init("t", cfg, {"__sample_id__": sample_id})
    try:
        return await fn(envs["default"])
    finally:
        await Env.sample_cleanup("t", cfg, envs, False)


def test_registered():
    assert registry_find_sandboxenv("sandtree") is Env


def test_exec(target):
    cfg, _ = target

    async def body(e):
        r = await e.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (r.success, r.returncode, r.stdout, r.stderr) == (False, 3, "out\n", "err\n")
        assert (await e.exec(["cat"], input="text in")).stdout == "text in"
        assert (await e.exec(["cat"], input=b"\x00bytes")).stdout == "\x00bytes"
        assert (await e.exec(["pwd"], cwd="/tmp")).stdout == "/tmp\n"
        assert (await e.exec(["pwd"], cwd="etc")).stdout == "/etc\n"           # relative: the sandbox's cwd (/)
        assert (await e.exec(["sh", "-c", "echo $A-$B"], env={"A": "1", "B": "two"})).stdout == "1-two\n"
        assert (await e.exec(["id", "-u"])).stdout == "0\n"
        assert (await e.exec(["id"], user="user")).stdout.startswith("uid=1000(user) gid=1000(user)")
        assert (await e.exec(["id", "-u"], user="65534")).stdout == "65534\n"
        assert (await e.exec(["id", "-u"], user="root")).stdout == "0\n"
        r = await e.exec(["id"], user="ghost")
        assert (r.success, r.returncode) == (False, 126) and "unable to find user ghost" in r.stderr
        r = await e.exec(["no-such-command"])
        assert (r.success, r.returncode) == (False, 127) and "no-such-command" in r.stderr
        with pytest.raises(PermissionError):
            await e.exec(["/etc/greeting"])                # not executable
        with pytest.raises(TimeoutError) as t:
            await e.exec(["sh", "-c", "echo partial; sleep 30"], timeout=1)
        assert "1 seconds" in str(t.value) and t.value.truncated_output == "partial\n"
        with override_sandbox_output_limit(1000, "exec"):
            with pytest.raises(OutputLimitExceededError) as o:
                await e.exec(["sh", "-c", "yes"])
        assert o.value.limit_str == "1000 bytes" and o.value.truncated_output.startswith("y\ny\n")
        r = await e.exec(["sh", "-c", "kill -9 $$"])
        assert (r.success, r.returncode) == (False, 137)
        assert (await e.exec(["true"])).success          # the sandbox goes on after all of that
    run(one_sample(cfg, body))


def test_files(target):
    cfg, _ = target

    async def body(e):
        await e.write_file("/a/b/c.txt", "line\r\nnext\n")       # parents made; CRLF kept
        assert await e.read_file("/a/b/c.txt") == "line\r\nnext\n"
        await e.write_file("rel/x.bin", bytes(range(256)))       # relative: the sandbox's cwd
        assert await e.read_file("/rel/x.bin", text=False) == bytes(range(256))
        assert (await e.exec(["cat", "/a/b/c.txt"])).stdout == "line\r\nnext\n"   # the command sees it
        await e.write_file("/a/b/c.txt", "shorter")
        assert await e.read_file("a/b/c.txt") == "shorter"
        assert await e.read_file("/etc/greeting") == "hello from the image\n"
        with pytest.raises(UnicodeDecodeError):
            await e.read_file("/rel/x.bin")
        with pytest.raises(FileNotFoundError):
            await e.read_file("/no/such")
        for d in ("/etc", "/etc/", ".", "/tmp/.."):
            with pytest.raises(IsADirectoryError):
                await e.read_file(d)
        with pytest.raises(IsADirectoryError):
            await e.write_file("/etc", "x")
        with pytest.raises(PermissionError):
            await e.read_file("/dev/null")               # a device: never read from outside
        with override_sandbox_output_limit(10, "read_file"):
            with pytest.raises(OutputLimitExceededError):
                await e.read_file("/etc/greeting")
        assert (await e.exec(["ls", "-ln", "/a/b/c.txt"])).stdout.split()[2] == "0"   # written as root
    run(one_sample(cfg, body))


def test_fork_per_sample_and_final_image(target):
    """Samples fork the task image: each sees only its own writes; cleanup commits each one's final
    state (its ID in the sample's store) and stops the sandbox."""
    cfg, st = target

    async def both():
        await Env.task_init("t", cfg)
        a = await Env.sample_init("t", cfg, {"__sample_id__": "a"})
        b = await Env.sample_init("t", cfg, {"__sample_id__": "b"})
        ea, eb = a["default"], b["default"]
        assert ea.sandbox.id != eb.sandbox.id and ea.source == eb.source == st.image("bb").id
        await ea.write_file("/mine", "a")
        with pytest.raises(FileNotFoundError):
            await eb.read_file("/mine")
        info = ea.sandbox.info()
        assert info["labels"] == {"inspect.run": RUN, "inspect.task": "t", "inspect.sample": "a"}
        assert store().get("sandtree:default") == {"sandbox": eb.sandbox.id, "source": eb.source}
        await Env.sample_cleanup("t", cfg, a, False)
        assert store().get("sandtree:default")["image"] == ea.image
        await Env.sample_cleanup("t", cfg, b, True)      # interrupted: still committed, still stopped
        return ea, eb

    ea, eb = run(both())
    assert st.image(ea.image).read("/mine") == b"a"
    with pytest.raises(sandtree.PathNotFound):
        st.image(eb.image).read("/mine")
    assert ea.sandbox.info()["state"] == eb.sandbox.info()["state"] == "stopped"
    with pytest.raises(SandboxUnavailableError):
        run(ea.exec(["true"]))


def test_cleanup_of_a_gone_sandbox_and_task_cleanup(target):
    cfg, st = target

    async def body():
        await Env.task_init("t2", cfg)
        envs = await Env.sample_init("t2", cfg, {"__sample_id__": 1})
        e = envs["default"]
        e.sandbox.stop()                                 # gone under inspect (lifetime, a crash)
        await Env.sample_cleanup("t2", cfg, envs, False)
        assert e.image is None and "error" in store().get("sandtree:default")
        left = await Env.sample_init("t2", cfg, {"__sample_id__": 2})
        other = await Env.sample_init("t3", cfg, {"__sample_id__": 3})
        await Env.task_cleanup("t2", cfg, True)          # stops this task's leftovers, not another task's
        assert left["default"].sandbox.info()["state"] == "stopped"
        assert other["default"].sandbox.info()["state"] == "running"
        await Env.task_cleanup("t3", cfg, False)         # --no-sandbox-cleanup: kept
        assert other["default"].sandbox.info()["state"] == "running"
        await Env.task_cleanup("t3", cfg, True)
        assert other["default"].sandbox.info()["state"] == "stopped"
    run(body())


def test_connection_is_a_shell_in_the_sandbox(bb_home, tmp_path):
    home, _ = bb_home
    cfg = SandtreeSandboxConfig(home=home, image="bb")

    async def body(e):
        await e.write_file("/tmp/mark", "inside\n")
        conn = await e.connection()
        assert conn.type == "sandtree" and conn.container == e.sandbox.id
        p = subprocess.run(shlex.split(conn.command), input="cat /tmp/mark; exit\n", capture_output=True, text=True,
                           timeout=60, env=inspect_env(tmp_path))
        assert p.returncode == 0 and "inside" in p.stdout, p.stderr
        assert "--uid 1000" in (await e.connection(user="user")).command
    run(one_sample(cfg, body))


def test_connection_over_http_says_where(target):
    cfg, _ = target
    if cfg.url is None:
        pytest.skip("the in-process case is test_connection_is_a_shell_in_the_sandbox")

    async def body(e):
        with pytest.raises(NotImplementedError, match="sandtree shell"):
            await e.connection()
    run(one_sample(cfg, body))


def test_cli_cleanup(bb_home, monkeypatch):
    """`inspect sandbox cleanup sandtree [ID]` in the default store: one by id, or all of inspect's."""
    home, _ = bb_home
    monkeypatch.setenv("SANDTREE_HOME", home)
    cfg = SandtreeSandboxConfig(image="bb")            # no home: the default ($SANDTREE_HOME)

    async def body():
        await Env.task_init("c", cfg)
        a = (await Env.sample_init("c", cfg, {"__sample_id__": 1}))["default"]
        b = (await Env.sample_init("c", cfg, {"__sample_id__": 2}))["default"]
        with sandtree.Sandtree(home, warm=0) as st:
            mine = st.image("bb").start()                # not inspect's: left alone
            try:
                await Env.cli_cleanup(a.sandbox.id)
                assert (a.sandbox.info()["state"], b.sandbox.info()["state"]) == ("stopped", "running")
                await Env.cli_cleanup(None)
                assert b.sandbox.info()["state"] == "stopped" and mine.state == "running"
            finally:
                mine.stop()
    run(body())


def test_config(tmp_path, bb_home):
    home, image = bb_home
    assert load_config(None) == SandtreeSandboxConfig()
    f = tmp_path / "sandtree.yaml"
    f.write_text("image: bb\ndockerfile: sub/Dockerfile\nnetwork: [pypi.org]\n")
    c = load_config(str(f))
    assert c.dockerfile == str(tmp_path / "sub" / "Dockerfile") and c.network == ["pypi.org"]
    (tmp_path / "c.json").write_text(json.dumps({"image": "bb", "memory": "1G"}))
    assert load_config(str(tmp_path / "c.json")).memory == "1G"
    (tmp_path / "Dockerfile").write_text("FROM bb\n")
    assert load_config(str(tmp_path / "Dockerfile")).dockerfile == str(tmp_path / "Dockerfile")
    assert Env.config_deserialize({"image": "x"}) == SandtreeSandboxConfig(image="x")
    for bad in ("unknown: 1\n", "- a list\n", "memory: [1, 2]\n", "image: [unclosed\n"):
        f.write_text(bad)
        with pytest.raises(sandtree.InvalidInput):
            load_config(str(f))
    with pytest.raises(sandtree.InvalidInput, match="no such file"):
        load_config(str(tmp_path / "missing.yaml"))
    from inspect_ai.util._sandbox.compose import ComposeConfig
    with pytest.raises(sandtree.InvalidInput, match="ComposeConfig"):
        load_config(ComposeConfig(services={}))
    both = SandtreeSandboxConfig(home=home, image="bb", dockerfile=str(tmp_path / "Dockerfile"))
    with pytest.raises(sandtree.InvalidInput, match="give one"):
        run(Env.task_init("t", both))
    with pytest.raises(sandtree.ImageNotFound, match="bootstrap"):
        run(Env.task_init("t", SandtreeSandboxConfig(home=home)))      # no image named, no default tag here
    with pytest.raises(sandtree.ImageNotFound):
        run(Env.task_init("t", SandtreeSandboxConfig(home=home, image="no-such-tag")))
    cfg = SandtreeSandboxConfig(home=home, image=image[:12], tag="inspect/{task}/{sample}", memory="64M", env={"X": "y"})

    async def body(e):
        assert (await e.exec(["sh", "-c", "echo $X"])).stdout == "y\n"
        assert e.sandbox.info()["limits"]["memory"] == 64 << 20
    run(one_sample(cfg, body, sample_id="s1"))
    with sandtree.Sandtree(home, warm=0) as st:
        assert "inspect/t/s1" in st.tags()
