"""mini-swe-agent on sandtree (issue 17): its DefaultAgent with its scripted DeterministicModel solves a real
instance of data/evalset (python-semver-426: the gold fix, written and `git apply`d by the agent, then
submitted with `git diff`), once through sandtree's native environment (in process, no server) and once
through mini-swe-agent's own `contree` environment, unchanged, against a real `sandtree serve` on loopback.
Each submission is then graded by the eval harness (swebench's grading): resolved.

The instance's environment is built in the session's Debian store from its Dockerfile (the registry only
through the build's egress path: see test_eval.py's `site`); skipped with the reason when unreachable."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import sandtree
from conftest import serve_process
from sandtree import evaluation
from sandtree.errors import BuildFailed
from test_network_pip import HOST_BUNDLE, registry_rules

pytest.importorskip("minisweagent")
pytest.importorskip("swebench")
yaml = pytest.importorskip("yaml")          # mini-swe-agent's own dependency: its batch report is YAML
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

IID = "python-semver__python-semver-426"
DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "evalset", "instances.jsonl")
AGENT = {"system_template": "You fix bugs.", "instance_template": "{{task}}", "step_limit": 10, "cost_limit": 0}


def _instance() -> dict:
    with open(DATA) as f:
        return next(json.loads(line) for line in f if IID in line)


@pytest.fixture(scope="module")
def env_image(bookworm, tmp_path_factory):
    """(home, the instance's environment image): built on the Debian image with this host's CA bundle."""
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    st = sandtree.Sandtree(bookworm[0], warm=0)
    try:
        ctx = tmp_path_factory.mktemp("site")
        shutil.copyfile(HOST_BUNDLE, ctx / "ca.crt")
        base = st.recipe(bookworm[1], context=str(ctx)).copy("ca.crt", "/etc/ssl/certs/ca-certificates.crt").build()
        try:
            image = evaluation.environment(st.engine, _instance(), base=base.id, build_network=registry_rules())
        except BuildFailed as exc:               # pragma: no cover - depends on the registry
            pytest.skip(f"the environment did not build (registry unreachable?): {exc.message[-300:]}")
        st.tag(image, "semver-426")
    finally:
        st.engine.egress.stop_daemon()
        st.close()
    return bookworm[0], image


def _script(inst: dict) -> DeterministicModel:
    steps = [f"cat > /tmp/fix.diff <<'SANDTREE_EOF'\n{inst['patch']}SANDTREE_EOF",
             "git apply /tmp/fix.diff && git status --short",
             "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff"]
    return DeterministicModel(outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(steps)])


def _graded(st, inst: dict, submission: str, tmp_path) -> dict:
    pred = {"instance_id": IID, "model_name_or_path": "scripted", "model_patch": submission}
    return st.eval([inst], [pred], base=None, run_id="miniswe", out_dir=str(tmp_path / "eval"), workers=1)


def test_native_environment_in_process(env_image, tmp_path):
    from sandtree.integrations.miniswe import SandtreeEnvironment
    home, image = env_image
    inst = _instance()
    env = SandtreeEnvironment(image=image, home=home, cwd="/testbed")
    try:
        agent = DefaultAgent(_script(inst), env, **AGENT)
        result = agent.run(inst["problem_statement"])
        assert result["exit_status"] == "Submitted", result
        submission = result["submission"]
        assert "diff --git" in submission and "return type(self)" in submission
        # every step that wrote is a commit: the final image descends from the environment's
        assert env.image != image and env.serialize()["info"]["sandtree"] == {"start_image": image, "image": env.image}
        st = env.st
        fixed = st.image(env.image).read("/testbed/src/semver/version.py").decode()
        assert "type(self)(**version)" in fixed
        summary = _graded(st, {**inst, "environment": {"image": image}}, submission, tmp_path)
        assert summary["resolved_ids"] == [IID], summary
    finally:
        env.close()


def test_minisweagent_contree_environment_against_serve(env_image, tmp_path):
    """mini-swe-agent's own ContreeEnvironment (contree-sdk inside), as published, on our /v1."""
    from contree_sdk.auth import JWTAuth
    from contree_sdk.config import ContreeConfig
    from minisweagent.environments import get_environment
    home, image = env_image
    inst = _instance()
    with serve_process(home) as url:
        env = get_environment({"environment_class": "contree", "image": "docker.io/library/unused:latest",
                               "image_tag": "semver-426", "cwd": "/testbed", "timeout": 120,
                               "contree_config": ContreeConfig(auth=JWTAuth(token="fake-token", base_url=url))})
        agent = DefaultAgent(_script(inst), env, **AGENT)
        result = agent.run(inst["problem_statement"])
        assert result["exit_status"] == "Submitted", result
        submission = result["submission"]
        assert "diff --git" in submission and "return type(self)" in submission
        st = sandtree.connect(url)
        try:
            summary = _graded(st, {**inst, "environment": {"image": image}}, submission, tmp_path)
        finally:
            st.close()
        assert summary["resolved_ids"] == [IID], summary


def test_the_swebench_batch_runner_starts_each_instance_from_its_own_image(env_image, tmp_path):
    """mini-swe-agent's own SWE-bench batch runner (`mini-extra swebench`, unchanged, through
    `python -m sandtree.integrations.miniswe`) with image_template "eval/{instance_id}": each instance's
    agent starts from that instance's image (its ID in the trajectory), one whose image does not exist
    fails alone (mini-swe-agent records its exit status), and the submissions show which environment each
    agent ran in. The model is mini-swe-agent's scripted DeterministicModel (no LLM here)."""
    home, image = env_image
    st = sandtree.Sandtree(home, warm=0)
    try:
        variant = st.image(image).run(["/bin/sh", "-c", "echo variant > /etc/which-env"]).image.id
        st.tag(variant, "eval/other__variant-1")
        original = st.engine.resolve(f"eval/{IID}")
    finally:
        st.close()
    inst = _instance()
    data = tmp_path / "dataset"
    data.mkdir()
    rows = [inst, {**inst, "instance_id": "other__variant-1"}, {**inst, "instance_id": "nowhere__missing-1"}]
    (data / "instances.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps = ["cat /etc/which-env 2>/dev/null || echo original",
             "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && (cat /etc/which-env 2>/dev/null || echo original)"]
    config = {"agent": AGENT,
              "environment": {"environment_class": "sandtree.integrations.miniswe.SandtreeEnvironment",
                              "image_template": "eval/{instance_id}", "home": home, "cwd": "/testbed", "timeout": 60},
              "model": {"model_class": "deterministic", "model_name": "scripted",
                        "outputs": [make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(steps)]}}
    (tmp_path / "config.yaml").write_text(json.dumps(config))       # JSON is YAML
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.path.join(root, "src"), "HF_HOME": str(tmp_path / "hf"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, "-m", "sandtree.integrations.miniswe", "--subset", str(data), "--split", "train",
                        "-c", str(tmp_path / "config.yaml"), "-o", str(out), "-w", "2"],
                       capture_output=True, timeout=600, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    preds = json.loads((out / "preds.json").read_text())
    assert preds[IID]["model_patch"] == "original\n" and preds["other__variant-1"]["model_patch"] == "variant\n"
    assert preds["nowhere__missing-1"]["model_patch"] == ""
    for iid, start in ((IID, original), ("other__variant-1", variant)):
        traj = json.loads((out / iid / f"{iid}.traj.json").read_text())
        assert traj["info"]["exit_status"] == "Submitted"
        assert traj["info"]["sandtree"]["start_image"] == start, traj["info"]["sandtree"]
        assert traj["info"]["config"]["environment"]["image"] == f"eval/{iid}"
    [report] = [yaml.safe_load(f.read_text()) for f in out.glob("exit_statuses_*.yaml")]
    by_status = {k: sorted(v) for k, v in report["instances_by_exit_status"].items()}
    assert by_status == {"ImageNotFound": ["nowhere__missing-1"], "Submitted": sorted([IID, "other__variant-1"])}
