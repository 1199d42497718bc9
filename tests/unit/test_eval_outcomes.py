"""The eval's RL outcomes without a sandbox: a report entry's reward annotations (evaluation/outcomes.py),
whose failure an exception is, why an eval/<id> tag moved (evaluation/envtags.py), and the per-instance
image template of mini-swe-agent's batch runner (integrations/miniswe.py). The same code on real runs:
tests/integrations/test_eval.py and test_miniswe.py."""

from __future__ import annotations

import json

import pytest

from sandtree import errors
from sandtree.engine.images.annotations import check_meta
from sandtree.evaluation import envtags, outcomes
from sandtree.evaluation.inputs import Instance


def _inst(f2p=("t::a", "t::b"), p2p=("t::c",)) -> Instance:
    return Instance("x__y-1", "x/y", "1", None, None, "diff", tuple(f2p), tuple(p2p), "pytest", {"image": "i"})


def test_a_report_entry_becomes_valid_reward_annotations():
    entry = {"resolved": False, "patch_successfully_applied": True,
             "tests_status": {"FAIL_TO_PASS": {"success": ["t::a"], "failure": ["t::b"]},
                              "PASS_TO_PASS": {"success": ["t::c"], "failure": []}}}
    meta = outcomes.reward_meta(entry, _inst(), run_id="r", model="org/m", environment="e" * 64)
    assert check_meta(meta) == meta                      # the store takes them as they are
    assert meta["eval.reward"] == 0.0 and meta["eval.resolved"] is False and meta["eval.status"] == "unresolved"
    assert (meta["eval.fail_to_pass.passed"], meta["eval.fail_to_pass.failed"]) == (1, 1)
    assert (meta["eval.pass_to_pass.passed"], meta["eval.pass_to_pass.failed"]) == (1, 0)
    resolved = outcomes.reward_meta({**entry, "resolved": True}, _inst(), run_id="r", model="m", environment="e")
    assert resolved["eval.reward"] == 1.0 and resolved["eval.status"] == "resolved"
    # a patch that applied nowhere (graded under unapplied="zero"): no tests ran, every one counts failed
    none = outcomes.reward_meta({"resolved": False, "patch_successfully_applied": False, "patch_exists": True},
                                _inst(), run_id="r", model="m", environment="e")
    assert none["eval.status"] == "patch_not_applied" and none["eval.reward"] == 0.0
    assert (none["eval.fail_to_pass.failed"], none["eval.pass_to_pass.failed"]) == (2, 1)


@pytest.mark.parametrize("exc, reason", [
    (errors.NodeLost("gone"), "node_lost"), (errors.ImageNotFound("no"), "environment"),
    (errors.SandboxError("no"), "sandbox"), (errors.CommandNotFound("no"), "sandbox"),
    (errors.StoreUnavailable("no"), "store"), (TimeoutError(), "harness_timeout"),
    (ConnectionResetError(), "connection"), (RuntimeError("bug"), "harness")])
def test_failures_outside_the_prediction_are_the_infrastructure(exc, reason):
    assert outcomes.failure_of(exc) == (outcomes.INFRA, reason)


def test_a_moved_tag_says_which_input_differed():
    net = ["pypi.org", "files.pythonhosted.org"]
    old = envtags.inputs_of({"dockerfile": "FROM x"}, "b" * 64, net)
    assert check_meta(old) == old
    same = envtags.inputs_of({"dockerfile": "FROM x"}, "b" * 64, net)
    assert envtags.explain(old, same) == [envtags.explain(old, same)[0]]
    assert "not reproducible" in envtags.explain(old, same)[0]
    why = envtags.explain(old, envtags.inputs_of({"dockerfile": "FROM y"}, "b" * 64, net))
    assert len(why) == 1 and why[0].startswith("dockerfile_sha256: ")
    why = envtags.explain(old, envtags.inputs_of({"dockerfile": "FROM x"}, "b" * 64, net[::-1]))
    assert len(why) == 1 and why[0].startswith("network: ") and "the same rules in another order" in why[0]
    why = envtags.explain(old, envtags.inputs_of({"dockerfile": "FROM x"}, "c" * 64, ["pypi.org"]))
    assert [w.split(":")[0] for w in why] == ["base", "network"] and "another order" not in why[1]
    assert "no recorded eval inputs" in envtags.explain({"score": 1}, same)[0]
    # an image that served as an {"image": REF} environment too: only the inputs of the new kind compare
    both = {**old, **envtags.inputs_of({"image": "x" * 64}, None, None)}
    assert envtags.explain(both, envtags.inputs_of({"dockerfile": "FROM y"}, "b" * 64, net))[0].startswith(
        "dockerfile_sha256: ")
    assert "other inputs" in envtags.explain(envtags.inputs_of({"image": "x"}, None, None), same)[0]
    # a long input is recorded by its digest (an annotation's value holds at most 4096 characters)
    long = envtags.inputs_of({"dockerfile": "FROM x"}, None, [f"host{i}.example" for i in range(400)])
    assert long["eval.env.network"].startswith("sha256:") and check_meta(long) == long
    assert envtags.kept_tag("eval/a__b-1", "0123456789abcdef") == "eval/a__b-1:0123456789ab"
    assert json.loads(old["eval.env.network"]) == net
    # the CLI's spelling of the same rules ("a,b") is the SDK's list
    assert envtags.inputs_of({"dockerfile": "FROM x"}, "b" * 64, ",".join(net)) == old


def test_the_batch_runners_image_template():
    pytest.importorskip("minisweagent")
    from sandtree.integrations.miniswe import SandtreeEnvironment, get_sb_environment, instance_image
    inst = {"instance_id": "python-semver__python-semver-426", "repo": "python-semver/python-semver", "n": 3}
    assert instance_image("eval/{instance_id}", inst) == "eval/python-semver__python-semver-426"
    assert instance_image("{repo}:{instance_id}", inst).startswith("python-semver/python-semver:")
    for bad in ("eval/{missing}", "eval/{n}", "eval/{instance_id!r}", "eval/{instance_id:>9}", "eval/x",
                "eval/{0}", "eval/{instance_id", ""):
        with pytest.raises(errors.InvalidInput):
            instance_image(bad, inst)
    with pytest.raises(errors.InvalidInput, match="image_template"):
        SandtreeEnvironment(home="/nonexistent")         # neither image nor a batch runner's template
    # only this module's class gets the template; another class is mini-swe-agent's business
    seen = []
    get_sb_environment({"environment": {"environment_class": "sandtree.integrations.miniswe.SandtreeEnvironment",
                                        "image_template": "eval/{instance_id}"}}, inst,
                       _theirs=lambda config, instance: seen.append(config["environment"].get("image")))
    get_sb_environment({"environment": {"environment_class": "docker", "image_template": "eval/{instance_id}"}},
                       inst, _theirs=lambda config, instance: seen.append(config["environment"].get("image")))
    assert seen == ["eval/python-semver__python-semver-426", None]
