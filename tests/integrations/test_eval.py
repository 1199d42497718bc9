"""`sandtree eval` / `st.eval` (issue 17) on the real instance set (data/evalset): gold patches resolve
every instance, empty patches none, a wrong patch is unresolved with its failing test named, a patch
that applies nowhere is an error; report.json and the run summary equal what the `swebench`
package's own functions (get_eval_report, make_run_report) produce from the same logs; a rerun skips
what has a report; bad input is refused before anything runs; the CLI (locally and through a real
`sandtree serve`) and the async twin.

The environments are built in the session's Debian store (conftest.bookworm) from the instances'
Dockerfiles, once: later sessions on the same store get cache hits. Their RUN steps reach the package
registry only through the sandbox's egress path (see test_network_pip.py for why the policy names the
gateway's address and why the base image carries the host's CA bundle); skipped with the reason when
the registry is unreachable. The instances run two at a time."""

from __future__ import annotations

import asyncio
import difflib
import io
import json
import os
import shutil
import subprocess
import sys

import pytest

import sandtree
from conftest import serve_process
from sandtree.cli.main import main as cli_main
from sandtree.errors import BuildFailed, InvalidInput, LimitExceeded
from test_network_pip import HOST_BUNDLE, registry_rules

swebench_grading = pytest.importorskip("swebench.harness.grading")
from swebench.harness.reporting import make_run_report  # noqa: E402
from swebench.harness.utils import make_test_spec  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "evalset")
INSTANCES = os.path.join(DATA, "instances.jsonl")


def _instances() -> list[dict]:
    with open(INSTANCES) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.fixture(scope="module")
def st(bookworm):
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    s = sandtree.Sandtree(bookworm[0], warm=2)
    yield s
    s.engine.egress.stop_daemon()
    s.close()


@pytest.fixture(scope="module")
def site(st, bookworm, tmp_path_factory):
    """(base, build network): the Debian image with this host's CA bundle in place of its own (the
    registry gateway's certificates), and the policy naming the registry (its names and gateway)."""
    rules = registry_rules()
    ctx = tmp_path_factory.mktemp("site")
    shutil.copyfile(HOST_BUNDLE, ctx / "ca.crt")
    base = st.recipe(bookworm[1], context=str(ctx)).copy("ca.crt", "/etc/ssl/certs/ca-certificates.crt").build()
    return base.id, rules


@pytest.fixture(scope="module")
def gold(st, site, tmp_path_factory):
    """Every instance with its gold patch (validate="gold"), environments built on the way."""
    out = tmp_path_factory.mktemp("eval-out")
    events = []
    try:
        summary = st.eval(INSTANCES, validate="gold", base=site[0], run_id="gold", out_dir=str(out), workers=2,
                          build_network=site[1], progress=events.append)
    except BuildFailed as exc:                   # pragma: no cover - depends on the registry
        pytest.skip(f"an environment did not build (registry unreachable?): {exc.message[-300:]}")
    if summary["error_ids"] and all("environment" in summary["errors"][i] for i in summary["error_ids"]):
        msg = next(iter(summary["errors"].values()))
        if "Connection" in msg or "resolution" in msg or "refused" in msg:
            pytest.skip(f"the registry is unreachable through the egress path: {msg[-300:]}")
    return out, summary, events


def test_gold_patches_resolve_every_instance(st, gold):
    out, summary, events = gold
    ids = [i["instance_id"] for i in _instances()]
    assert len(ids) >= 5
    assert summary["validation"] == {"mode": "gold", "ok": True, "failed": [], "why": {}}, summary["errors"]
    assert summary["resolved_ids"] == sorted(ids) and summary["error_ids"] == []
    for iid in ids:
        rep = json.loads((out / "gold" / "gold" / iid / "report.json").read_text())[iid]
        assert rep["resolved"] and rep["patch_successfully_applied"]
        assert rep["tests_status"]["FAIL_TO_PASS"]["failure"] == []
        env, image = rep["sandtree"]["environment"], rep["sandtree"]["image"]
        # the environment is citable by tag; the final state is kept, a descendant of it with the fix in it
        assert st.tags()[f"eval/{iid}"] == env and st.tags()[rep["sandtree"]["tag"]] == image
        assert st.engine.lineage_path(env, image)[-1] == image
        changed = [c["path"] for c in st.diff(env, image)]
        assert any(p.startswith("/testbed/") and not p.endswith(".pyc") for p in changed), changed
        for name in ("test_output.txt", "patch.diff", "eval.sh", "run_instance.log"):
            assert (out / "gold" / "gold" / iid / name).is_file()
    statuses = [e["status"] for e in events]
    assert statuses.count("resolved") == len(ids) and statuses[-1] == "finished"
    assert json.loads((out / "gold" / "gold.gold.json").read_text())["resolved_instances"] == len(ids)


def test_empty_patches_resolve_none(st, site, gold, tmp_path):
    summary = st.eval(INSTANCES, validate="empty", base=site[0], run_id="empty", out_dir=str(tmp_path), workers=2,
                      build_network=site[1])
    assert summary["validation"]["ok"], summary["validation"]
    assert summary["resolved_ids"] == [] and summary["error_ids"] == []
    for inst in _instances():
        iid = inst["instance_id"]
        rep = json.loads((tmp_path / "empty" / "empty" / iid / "report.json").read_text())[iid]
        # the instance set's own promise: with no fix every FAIL_TO_PASS fails, every PASS_TO_PASS passes
        assert sorted(rep["tests_status"]["FAIL_TO_PASS"]["failure"]) == sorted(inst["FAIL_TO_PASS"])
        assert sorted(rep["tests_status"]["PASS_TO_PASS"]["success"]) == sorted(inst["PASS_TO_PASS"])
        assert not (tmp_path / "empty" / "empty" / iid / "patch.diff").exists()     # no patch step at all


def _wrong_patch(st, inst: dict) -> str:
    """A patch that applies and changes nothing the tests see: a comment appended to the file the
    gold patch fixes (read from the instance's environment image)."""
    path = next(line[6:] for line in inst["patch"].splitlines() if line.startswith("+++ b/"))
    old = st.engine.read(st.engine.resolve(f"eval/{inst['instance_id']}"), f"/testbed/{path}").decode()
    new = old + ("" if old.endswith("\n") else "\n") + "# a fix that fixes nothing\n"
    diff = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{path}", f"b/{path}")
    return f"diff --git a/{path} b/{path}\n" + "".join(diff)


@pytest.fixture(scope="module")
def predicted(st, site, gold, tmp_path_factory):
    """A model's predictions: gold, wrong, empty and one that applies nowhere (and a '/' in its name)."""
    insts = _instances()
    out = tmp_path_factory.mktemp("pred-out")
    preds = [{"instance_id": insts[0]["instance_id"], "model_name_or_path": "org/model-1",
              "model_patch": insts[0]["patch"]},
             {"instance_id": insts[1]["instance_id"], "model_name_or_path": "org/model-1",
              "model_patch": _wrong_patch(st, insts[1])},
             {"instance_id": insts[2]["instance_id"], "model_name_or_path": "org/model-1", "model_patch": ""},
             {"instance_id": insts[3]["instance_id"], "model_name_or_path": "org/model-1",
              "model_patch": ("diff --git a/nowhere.py b/nowhere.py\n--- a/nowhere.py\n+++ b/nowhere.py\n"
                              "@@ -1 +1 @@\n-a\n+b\n")}]
    path = out / "preds.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in preds))
    summary = st.eval(INSTANCES, str(path), base=site[0], run_id="r1", out_dir=str(out), workers=2,
                      build_network=site[1])
    return out, preds, summary


def test_a_wrong_patch_is_unresolved_naming_the_failing_test(predicted):
    out, preds, summary = predicted
    insts = _instances()
    wrong = insts[1]["instance_id"]
    assert summary["resolved_ids"] == [insts[0]["instance_id"]]
    assert summary["unresolved_ids"] == [wrong]
    assert summary["empty_patch_ids"] == [insts[2]["instance_id"]]
    assert summary["error_ids"] == [insts[3]["instance_id"]]
    assert "Patch Apply Failed" in summary["errors"][insts[3]["instance_id"]]
    assert summary["incomplete_ids"] == sorted(i["instance_id"] for i in insts[4:])
    rep = json.loads((out / "r1" / "org__model-1" / wrong / "report.json").read_text())[wrong]
    assert rep["patch_successfully_applied"] and not rep["resolved"]
    assert rep["tests_status"]["FAIL_TO_PASS"]["failure"] == insts[1]["FAIL_TO_PASS"]   # the failing test, named
    assert "# a fix that fixes nothing" in (out / "r1" / "org__model-1" / wrong / "patch.diff").read_text()
    failed = out / "r1" / "org__model-1" / insts[3]["instance_id"]
    assert not (failed / "report.json").exists()
    assert ">>>>> Patch Apply Failed" in (failed / "run_instance.log").read_text()


def _dataset() -> list[dict]:
    return _instances()


@pytest.mark.parametrize("run", ["gold", "r1"])
def test_reports_equal_swebench_own_functions(gold, predicted, run, monkeypatch, tmp_path):
    """Each report.json (less sandtree's entry) is what swebench's get_eval_report says of the same
    test_output.txt, with a TestSpec built here from the instance and the eval.sh the run used; the
    summary is what make_run_report counts over the same directory."""
    out = gold[0] if run == "gold" else predicted[0]
    model = "gold" if run == "gold" else "org__model-1"
    preds = ({i["instance_id"]: {"instance_id": i["instance_id"], "model_name_or_path": "gold",
                                 "model_patch": i["patch"]} for i in _dataset()} if run == "gold"
             else {p["instance_id"]: p for p in predicted[1]})
    checked = 0
    for inst in _dataset():
        d = out / run / model / inst["instance_id"]
        if not (d / "report.json").exists():
            continue
        spec = make_test_spec({**inst, "image": "unused", "log_parser": "parse_log_pytest",
                               "eval_type": "pass_and_fail", "eval_script": (d / "eval.sh").read_text()})
        theirs = swebench_grading.get_eval_report(spec, preds[inst["instance_id"]], str(d / "test_output.txt"), True)
        ours = json.loads((d / "report.json").read_text())
        assert ours[inst["instance_id"]].pop("sandtree")["image"]
        assert ours == theirs
        checked += 1
    assert checked >= 2
    # make_run_report reads logs/run_evaluation under the working directory
    (tmp_path / "logs").mkdir()
    os.symlink(out, tmp_path / "logs" / "run_evaluation")
    monkeypatch.chdir(tmp_path)
    theirs = json.loads(open(make_run_report(preds, _dataset(), run, None, str(tmp_path / "rep"))).read())
    ours = json.loads((out / run / f"{model}.{run}.json").read_text())
    assert {k: ours[k] for k in theirs} == theirs


def test_a_rerun_skips_instances_with_a_report(st, site, predicted):
    out, _, first = predicted
    insts = _instances()
    before = {i["instance_id"]: os.stat(out / "r1" / "org__model-1" / i["instance_id"] / "report.json").st_mtime_ns
              for i in insts[:2]}
    events = []
    again = st.eval(INSTANCES, str(out / "preds.jsonl"), base=site[0], run_id="r1", out_dir=str(out),
                    build_network=site[1], progress=events.append)
    by = {e.get("instance_id"): e["status"] for e in events if e.get("instance_id")}
    assert by[insts[0]["instance_id"]] == by[insts[1]["instance_id"]] == "skipped"
    assert by[insts[2]["instance_id"]] == "empty_patch"
    assert by[insts[3]["instance_id"]] == "error"               # no report: tried again (swebench's rule)
    assert again["evaluated_instances"] == 1 and again["skipped_ids"] == sorted(before)
    assert {k: again[k] for k in ("resolved_ids", "unresolved_ids", "error_ids")} == \
        {k: first[k] for k in ("resolved_ids", "unresolved_ids", "error_ids")}
    for iid, mtime in before.items():
        assert os.stat(out / "r1" / "org__model-1" / iid / "report.json").st_mtime_ns == mtime


def test_bad_input_is_refused_before_anything_runs(st, tmp_path):
    inst = _instances()[0]
    out = tmp_path / "out"

    def refused(instances, preds=None, exc=InvalidInput, **kw):
        path = tmp_path / "i.jsonl"
        path.write_text("".join(json.dumps(i) + "\n" for i in instances) if isinstance(instances, list) else instances)
        args = dict(base="debian:bookworm", run_id="bad", out_dir=str(out))
        args.update(kw)
        with pytest.raises(exc) as e:
            st.eval(str(path), preds, **args)
        assert not out.exists()                     # nothing written, nothing built
        return e.value.message

    for bad_id in ("../x", "a/b", ".hidden", "", "x" * 101, 7, "a b"):
        assert "instance_id" in refused([{**inst, "instance_id": bad_id}], validate="gold")
    assert "FAIL_TO_PASS" in refused([{**inst, "FAIL_TO_PASS": "tests/x.py::t"}], validate="gold")
    assert "PASS_TO_PASS" in refused([{**inst, "PASS_TO_PASS": [1]}], validate="gold")
    assert "environment" in refused([{**inst, "environment": {"dockerfile": "x", "image": "y"}}], validate="gold")
    assert "test_cmd" in refused([{k: v for k, v in inst.items() if k != "test_cmd"}], validate="gold")
    assert "appears twice" in refused([inst, inst], validate="gold")
    assert "not JSON" in refused("{nope\n", validate="gold")
    assert "log_parser" in refused([{**inst, "log_parser": "os.system"}], validate="gold")
    assert "base_commit" in refused([{**inst, "base_commit": "HEAD; rm -rf /"}], validate="gold")
    assert "over" in refused([{**inst, "patch": "+" * (9 << 20)}], exc=LimitExceeded, validate="gold")
    assert "run_id" in refused([inst], validate="gold", run_id="../up")
    assert "memory" in refused([inst], validate="gold", memory="lots")       # the test runs' resources
    assert "pids" in refused([inst], validate="gold", pids=2.5)
    assert "cpus" in refused([inst], validate="gold", cpus=0)
    preds = tmp_path / "p.jsonl"
    for pred, word in (({"instance_id": inst["instance_id"], "model_name_or_path": "../../x", "model_patch": ""},
                        "model_name_or_path"),
                       ({"instance_id": inst["instance_id"], "model_name_or_path": "m", "model_patch": 5}, "model_patch"),
                       ({"instance_id": "other__x-1", "model_name_or_path": "m", "model_patch": "x"}, "not in the set")):
        preds.write_text(json.dumps(pred) + "\n")
        assert word in refused([inst], str(preds))
    assert "no predictions" in refused([inst], str(preds), validate="gold")
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(300 << 20)                       # sparse: the size is checked before reading
    with pytest.raises(LimitExceeded):
        st.eval(str(big), validate="gold", base="debian:bookworm", run_id="bad", out_dir=str(out))
    assert not out.exists()


def test_cli_validates_and_names_what_fails(st, site, gold, tmp_path, capsys, bookworm):
    insts = _instances()[:2]
    good = tmp_path / "two.jsonl"
    good.write_text("".join(json.dumps(i) + "\n" for i in insts))
    net = ["--network", ",".join(site[1])]
    common = ["--home", bookworm[0], "--base", site[0], "--out", str(tmp_path / "out"), "--progress", "plain", *net]
    # the CLI opens its own engine on the same store
    assert cli_main(["eval", str(good), "--validate", "gold", "--run-id", "c1", *common]) == 0
    cap = capsys.readouterr()
    assert f"resolved: {' '.join(sorted(i['instance_id'] for i in insts))}" in cap.out
    assert f"[2/2] " in cap.err and " resolved " in cap.err
    # a "gold" patch that fixes nothing: validation fails, naming the instance
    broken = [{**insts[0], "patch": _wrong_patch(st, insts[0])}, insts[1]]
    bad = tmp_path / "broken.jsonl"
    bad.write_text("".join(json.dumps(i) + "\n" for i in broken))
    assert cli_main(["eval", str(bad), "--validate", "gold", "--run-id", "c2", "--json", *common]) == 1
    cap = capsys.readouterr()
    assert json.loads(cap.out)["validation"]["failed"] == [insts[0]["instance_id"]]
    assert f"validation failed (the gold patch must resolve): {insts[0]['instance_id']}: not resolved" in cap.err


def test_eval_through_a_server_and_the_async_twin(st, site, gold, tmp_path, bookworm):
    """`sandtree eval --server URL` and AsyncSandtree.connect(url).eval: the same harness over HTTP,
    on a real `sandtree serve` of the same store (environments: cache hits there too)."""
    inst = _instances()[0]
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps(inst) + "\n")
    with serve_process(bookworm[0]) as url:
        rc = cli_main(["eval", str(one), "--validate", "gold", "--server", url, "--base", site[0],
                       "--run-id", "remote", "--out", str(tmp_path / "out"), "--progress", "quiet",
                       "--network", ",".join(site[1]), "--memory", "1G", "--pids", "400"])
        assert rc == 0
        rep = json.loads((tmp_path / "out" / "remote" / "gold" / inst["instance_id"] / "report.json").read_text())
        assert rep[inst["instance_id"]]["resolved"]
        with sandtree.connect(url) as remote:               # the test run had the resources asked for
            made = remote.image(rep[inst["instance_id"]]["sandtree"]["image"]).produced_by()
            limits = remote.operation(next(o["op"] for o in made if o["kind"] == "run"))["spec"]["limits"]
        assert limits["memory"] == 1 << 30 and limits["pids"] == 400

        async def go():
            ast = sandtree.AsyncSandtree.connect(url)
            return await ast.eval(str(one), validate="empty", base=site[0], run_id="aio", out_dir=str(tmp_path / "out"),
                                  build_network=site[1])
        summary = asyncio.run(go())
    assert summary["validation"]["ok"] and summary["unresolved_ids"] == [inst["instance_id"]]


def test_an_image_environment_and_the_live_view(st, site, gold, tmp_path):
    """environment {"image": REF}: resolved and tagged, no build; the terminal view draws the run."""
    from sandtree.cli.evalprogress import LiveEval
    inst = _instances()[0]
    env = st.tags()[f"eval/{inst['instance_id']}"]
    again = {**inst, "instance_id": "by-image__x-1", "environment": {"image": env}}
    screen = io.StringIO()
    view = LiveEval(screen)
    try:
        summary = st.eval([again], validate="gold", run_id="img", out_dir=str(tmp_path), progress=view)
    finally:
        view.close()
    assert summary["resolved_ids"] == ["by-image__x-1"] and summary["images"]["by-image__x-1"]["environment"] == env
    assert st.tags()["eval/by-image__x-1"] == env
    # the same environment by the call others use (an agent's sandbox, a tree search): the same ID, cached
    from sandtree import evaluation
    assert evaluation.environment(st.engine, inst, base=site[0], build_network=site[1]) == env
    text = screen.getvalue()
    assert "Evaluating" in text and "(1/1): 1 resolved" in text and "by-image__x-1 resolved" in text


def test_without_swebench_the_eval_says_what_to_install():
    """The SDK imports without swebench; the eval itself raises RuntimeUnavailable naming the extra."""
    code = ("import sys; sys.modules['swebench'] = None\n"
            "import sandtree, sandtree.client.sdk\n"
            "from sandtree import evaluation\n"
            "try:\n    evaluation.evaluate\nexcept sandtree.RuntimeUnavailable as e:\n    print(e.message)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert r.returncode == 0, r.stderr
    assert "pip install 'sandtree[swebench]'" in r.stdout


def test_the_tree_search_example_repairs_a_failing_test(site, gold, bookworm, tmp_path):
    """examples/tree_search.py end to end on the session's store (the instance's environment is built by
    the gold run above): the beam search picks the gold fix of python-semver-426 among wrong candidates by
    running the instance's real tests, and the winner passes them; its trace has a row per candidate."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "trace.jsonl"
    argv = [sys.executable, os.path.join(root, "examples", "tree_search.py"), "--home", bookworm[0],
            "--base", site[0], "-o", str(out)] + [a for rule in site[1] for a in ("--network", rule)]
    p = subprocess.run(argv, capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": os.path.join(root, "src")})
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    text = p.stdout.decode()
    assert "best: gold" in text and "score 1.00" in text and "pytest exit 0" in text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # the environment's other children (the eval runs above) are in the trace too: the candidates are the
    # runs that applied one of the example's /tmp/<name>.diff
    names = ("returns-self", "base-class", "gold", "copy-then-replace")
    scored = {n: r["score"] for r in rows if r["depth"] == 1 for n in names if f"/tmp/{n}.diff" in (r["command"] or "")}
    assert scored["gold"] == 1.0 and all(s < 1.0 for k, s in scored.items() if k != "gold") and len(scored) == 4


# --- for RL: rewards in the lineage, a patch that does not apply scored 0, infrastructure failures apart,
# --- environment tags that never move silently


def test_rewards_are_on_the_final_images_and_in_the_trace_export(st, gold, predicted, tmp_path):
    """Each report's final image carries its reward (score) and its FAIL_TO_PASS / PASS_TO_PASS counts
    (annotations: in the store, not a side file); `trace export` of an environment's subtree carries them,
    read back with Hugging Face `datasets`."""
    datasets = pytest.importorskip("datasets")
    insts = {i["instance_id"]: i for i in _instances()}
    out, summary, _ = gold
    for iid, inst in insts.items():
        rep = json.loads((out / "gold" / "gold" / iid / "report.json").read_text())[iid]
        ann = st.annotations(rep["sandtree"]["image"])
        assert ann["score"] == 1.0 and rep["sandtree"]["reward"] == 1.0
        meta = ann["meta"]
        assert meta["eval.resolved"] is True and meta["eval.status"] == "resolved"
        assert meta["eval.fail_to_pass.passed"] == len(inst["FAIL_TO_PASS"]) and meta["eval.fail_to_pass.failed"] == 0
        assert meta["eval.pass_to_pass.passed"] == len(inst["PASS_TO_PASS"]) and meta["eval.pass_to_pass.failed"] == 0
        assert meta["eval.run_id"] == "gold" and meta["eval.model"] == "gold" and meta["eval.instance_id"] == iid
        assert meta["eval.environment"] == rep["sandtree"]["environment"]
    assert summary["rewards"] == {iid: 1.0 for iid in insts}
    pout, preds, psummary = predicted
    wrong = _instances()[1]
    rep = json.loads((pout / "r1" / "org__model-1" / wrong["instance_id"] / "report.json").read_text())
    final = rep[wrong["instance_id"]]["sandtree"]["image"]
    ann = st.annotations(final)
    assert ann["score"] == 0.0 and ann["meta"]["eval.resolved"] is False
    assert ann["meta"]["eval.fail_to_pass.failed"] == len(wrong["FAIL_TO_PASS"]) == \
        len(rep[wrong["instance_id"]]["tests_status"]["FAIL_TO_PASS"]["failure"])
    assert ann["meta"]["eval.model"] == "org/model-1"
    # the trace of the wrong patch's environment: the gold run's and r1's final images, with their rewards
    env = rep[wrong["instance_id"]]["sandtree"]["environment"]
    gold_final = json.loads((out / "gold" / "gold" / wrong["instance_id"] / "report.json").read_text())[
        wrong["instance_id"]]["sandtree"]["image"]
    path = tmp_path / "trace.parquet"
    st.trace_export(env, "parquet", str(path))
    ds = datasets.load_dataset("parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    rows = {r["image"]: r for r in ds}
    assert rows[final]["score"] == 0.0 and rows[gold_final]["score"] == 1.0
    got = json.loads(rows[final]["meta"])
    assert got["eval.resolved"] is False and got["eval.fail_to_pass.failed"] == len(wrong["FAIL_TO_PASS"])
    assert json.loads(rows[gold_final]["meta"])["eval.status"] == "resolved"
    # the environment's own row says what it was built from (the inputs a moved tag is explained by)
    assert json.loads(rows[env]["meta"])["eval.env.dockerfile_sha256"]


def test_a_patch_that_does_not_apply_is_an_agent_error_or_under_the_option_reward_0(st, site, predicted, tmp_path,
                                                                                   bookworm, capsys):
    """By default (swebench's rule) a patch that applies nowhere is an error, counted as the prediction's
    (agent_error_ids, reward 0), never the infrastructure's; with --unapplied zero it is graded: a
    report with resolved false, the apply log as its test output, reward 0 on its final image."""
    out, preds, summary = predicted
    insts = _instances()
    nowhere = insts[3]["instance_id"]
    assert summary["agent_error_ids"] == [nowhere] and summary["infra_error_ids"] == []
    assert summary["error_kinds"][nowhere] == {"kind": "agent", "reason": "patch_not_applied"}
    assert summary["rewards"] == {insts[0]["instance_id"]: 1.0, insts[1]["instance_id"]: 0.0,
                                  insts[2]["instance_id"]: 0.0, nowhere: 0.0}
    one = tmp_path / "nowhere.jsonl"
    one.write_text("".join(json.dumps(p) + "\n" for p in preds if p["instance_id"] == nowhere))
    rc = cli_main(["eval", INSTANCES, "-p", str(one), "-i", nowhere, "--unapplied", "zero",
                   "--home", bookworm[0], "--base", site[0], "--network", ",".join(site[1]), "--run-id", "zero",
                   "--out", str(tmp_path), "--progress", "quiet", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    zero = json.loads(cap.out)
    assert zero["unresolved_ids"] == zero["patch_not_applied_ids"] == [nowhere] and zero["error_ids"] == []
    assert zero["rewards"] == {nowhere: 0.0} and zero["unapplied"] == "zero"
    d = tmp_path / "zero" / "org__model-1" / nowhere
    rep = json.loads((d / "report.json").read_text())[nowhere]
    assert rep["patch_exists"] and not rep["patch_successfully_applied"] and not rep["resolved"]
    assert ">>>>> Patch Apply Failed" in (d / "test_output.txt").read_text()
    ann = st.annotations(rep["sandtree"]["image"])
    assert ann["score"] == 0.0 and ann["meta"]["eval.status"] == "patch_not_applied"
    assert ann["meta"]["eval.fail_to_pass.failed"] == len(insts[3]["FAIL_TO_PASS"])
    assert st.tags()[f"eval/{nowhere}/zero/org__model-1"] == rep["sandtree"]["image"]
    with pytest.raises(InvalidInput, match="unapplied"):
        st.eval(INSTANCES, str(out / "preds.jsonl"), base=site[0], run_id="bad", out_dir=str(tmp_path / "no"),
                unapplied="ignore")
    assert not (tmp_path / "no").exists()


def _variant(st, env: str, script: str) -> str:
    """The environment image changed by one shell script (a broken environment, made for real)."""
    r = st.image(env).run(["/bin/sh", "-c", script])
    assert r.exit_code == 0, r.stderr
    return r.image.id


def test_infrastructure_failures_are_reported_apart_from_the_agents(st, gold, tmp_path):
    """Failures an RL loop must mask, each provoked for real, are infra_error_ids with reward None; the
    prediction's own (its tests outliving the timeout) is an agent error with reward 0:
    - an environment image that does not exist (it cannot be resolved);
    - a sandbox that cannot start the harness (its environment has no /bin/bash);
    - the harness's own steps timing out (a `git` that hangs before the tests start);
    - the tests timing out (a test command that sleeps): the agent's."""
    inst = _instances()[0]
    env = st.tags()[f"eval/{inst['instance_id']}"]
    no_bash = _variant(st, env, "rm -f /usr/bin/bash /bin/bash")
    slow_git = _variant(st, env, "printf '#!/bin/sh\\nsleep 300\\nexec /usr/bin/git \"$@\"\\n' > /usr/local/bin/git"
                                 " && chmod 755 /usr/local/bin/git")
    cases = [{**inst, "instance_id": "infra__missing-1", "environment": {"image": "no-such-image/anywhere"}},
             {**inst, "instance_id": "infra__nobash-1", "environment": {"image": no_bash}},
             {**inst, "instance_id": "infra__slowgit-1", "environment": {"image": slow_git}},
             {**inst, "instance_id": "agent__sleeps-1", "environment": {"image": env}, "test_cmd": "sleep 300"}]
    events = []
    summary = st.eval(cases, validate="gold", run_id="infra", out_dir=str(tmp_path), workers=2, timeout=15,
                      progress=events.append)
    kinds = summary["error_kinds"]
    assert summary["error_ids"] == sorted(c["instance_id"] for c in cases)
    assert summary["infra_error_ids"] == ["infra__missing-1", "infra__nobash-1", "infra__slowgit-1"], kinds
    assert summary["agent_error_ids"] == ["agent__sleeps-1"], kinds
    assert kinds["infra__missing-1"] == {"kind": "infra", "reason": "environment"}
    assert kinds["infra__nobash-1"] == {"kind": "infra", "reason": "sandbox"}, summary["errors"]["infra__nobash-1"]
    assert kinds["infra__slowgit-1"] == {"kind": "infra", "reason": "harness_timed_out"}
    assert kinds["agent__sleeps-1"] == {"kind": "agent", "reason": "tests_timed_out"}
    assert summary["rewards"] == {"agent__sleeps-1": 0.0, "infra__missing-1": None, "infra__nobash-1": None,
                                  "infra__slowgit-1": None}
    by = {e["instance_id"]: e for e in events if e.get("status") == "error"}
    assert by["infra__slowgit-1"]["kind"] == "infra" and by["agent__sleeps-1"]["kind"] == "agent"
    log = (tmp_path / "infra" / "gold" / "infra__slowgit-1" / "run_instance.log").read_text()
    assert "infra failure (harness_timed_out)" in log


def test_an_environment_tag_never_moves_silently(st, site, gold, tmp_path, bookworm, capsys):
    """A rebuild that gives eval/<id> another image: the tag moves, the old image stays usable (a run in
    progress holds its ID and finishes on it; it is kept under eval/<id>:<old12>), and the eval says
    old -> new and which input differed (summary, progress event, CLI stderr, log)."""
    import threading
    from sandtree import evaluation
    inst = {**_instances()[0], "instance_id": "moving__env-1"}
    old = evaluation.environment(st.engine, inst, base=site[0], build_network=site[1])
    assert st.tags()["eval/moving__env-1"] == old
    # the same inputs again: the same image, the tag stays, nothing said
    events = []
    assert evaluation.environment(st.engine, inst, base=site[0], build_network=site[1], progress=events.append) == old
    assert not [e for e in events if e.get("status") == "environment_changed"]
    # a run in progress on the old environment (it holds the ID, as the harness's runs do)
    held = {}

    def in_progress():
        held["rec"] = st.engine.run(old, ["/bin/sh", "-c", "sleep 4; cat /testbed/.git/HEAD"])
    worker = threading.Thread(target=in_progress)
    worker.start()
    changed = {**inst, "environment": {"dockerfile": inst["environment"]["dockerfile"]
                                       + "\nRUN echo 'another environment' > /etc/eval-variant\n"}}
    one = tmp_path / "changed.jsonl"
    one.write_text(json.dumps(changed) + "\n")
    rc = cli_main(["eval", str(one), "--validate", "gold", "--home", bookworm[0], "--base", site[0], "--network",
                   ",".join(site[1]), "--run-id", "moved", "--out", str(tmp_path / "out"), "--progress", "plain",
                   "--json"])
    worker.join(60)
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    summary = json.loads(cap.out)
    new = st.tags()["eval/moving__env-1"]
    assert new != old and summary["images"]["moving__env-1"]["environment"] == new
    [change] = summary["environment_changes"]
    assert change["old"] == old and change["new"] == new and change["kept_as"] == f"eval/moving__env-1:{old[:12]}"
    assert len(change["why"]) == 1 and change["why"][0].startswith("dockerfile_sha256: "), change
    assert st.tags()[change["kept_as"]] == old                       # the old environment stays, citable
    assert f"environment changed: eval/moving__env-1 {old[:12]} -> {new[:12]}" in cap.err
    log = (tmp_path / "out" / "moved" / "gold" / "moving__env-1" / "run_instance.log").read_text()
    assert f"Environment tag eval/moving__env-1 moved: {old} -> {new}" in log and "dockerfile_sha256" in log
    rec = held["rec"]                                                # the run in progress finished on it
    assert rec.exit_code == 0 and rec.stdout and st.engine.lineage_path(old, rec.image)[0] == old
    assert st.image(old).run(["/bin/sh", "-c", "test ! -e /etc/eval-variant"]).exit_code == 0
    # the same Dockerfile with its network rules in another order: the same image (the cache key does not see
    # the order), or, if a build made another one, the eval says it was only the order
    events = []
    again = evaluation.environment(st.engine, changed, base=site[0], build_network=list(reversed(site[1])),
                                   progress=events.append)
    moves = [e["change"] for e in events if e.get("status") == "environment_changed"]
    if again == new:
        assert moves == []
    else:
        assert [m["old"] for m in moves] == [new] and "another order" in " ".join(moves[0]["why"]), moves
