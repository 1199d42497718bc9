"""One prediction of one instance, evaluated the way swebench's run_instance does it, as one run
forked from the instance's environment image (an overlay on it: O(1), whatever its size) instead of
a container and its execs: the model patch at /tmp/patch.diff applied with swebench's ordered
fallbacks (each GIT_APPLY_CMDS command in turn, swebench's reset between attempts, then its reverse
check), `git diff` before, the eval script (its stdout and stderr interleaved, as docker's exec
gives them) into test_output.txt, `git diff` after; the run's result is the final state, kept as an
image (tagged when the tag fits); swebench's report goes to report.json with that image's ID beside
its own fields.

The steps run in one process in the sandbox (a driver script: the same commands in the same order,
each attempt's output and the outcome kept in files under /tmp/.sandtree-eval that are read back from
the result image and logged as swebench logs them): one run is one fork, one command and one commit,
where a live sandbox with a command per step cost about 2.5x more here. The engine is any
engine-like object (the in-process Engine or the remote client): only table operations are called
(run, read, tag, annotate). A patch that no command applies, a timeout or an engine error is an error, as in
swebench: logged, no report.json (a rerun tries it again), raised as InstanceError, which says whose
failure it was (outcomes.py: the prediction's or the infrastructure's). With unapplied="zero" a patch
that applies nowhere is graded instead: a report with resolved false (reward 0), the apply output in
test_output.txt. The final image of every report carries its reward as annotations (outcomes.py)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from . import grading
from ..values import network_hint
from .inputs import Instance
from .outcomes import AGENT, INFRA, PREFIX, InstanceError, failure_of, reward_meta

__all__ = ["evaluate_instance", "RUN_LABEL", "EVAL_SCRIPT", "STATE_DIR", "DRIVER", "driver_script",
           "UNAPPLIED_MODES"]

RUN_LABEL = "sandtree.eval"             # label of the eval's runs (their operations carry the instance ID)
EVAL_SCRIPT = "/eval.sh"
STATE_DIR = "/tmp/.sandtree-eval"       # the driver's records: each attempt's output, the outcome, times
DRIVER = f"{STATE_DIR}/driver.sh"
_NOT_APPLIED = 97                       # the driver's exit status when no command applied the patch
_DIFF = "git -c core.fileMode=false diff"
UNAPPLIED_MODES = ("error", "zero")      # a patch that applies nowhere: swebench's error, or graded (reward 0)


def driver_script(skip_patch: bool) -> str:
    """swebench's run_instance steps, in its order, as one bash script run in /testbed."""
    reset = grading.RESET_COMMAND[-1]               # "git checkout -- . ; git clean -fd"
    lines = ["#!/bin/bash", f"D={STATE_DIR}", f"cd {grading.WORKDIR}", 'echo "t0 $(date +%s.%N)" > "$D/times"']
    if not skip_patch:
        lines.append("applied=none")
        for i, argv in enumerate(grading.APPLY_COMMANDS):
            step = f'{shlex.join(argv)} > "$D/apply-{i}" 2>&1 && applied={i}'
            if i:
                step = f'{{ {reset} ; }} > "$D/reset-{i}" 2>&1; {step}'
            lines.append(f'if [ "$applied" = none ]; then {step}; fi')
        lines += [f'if [ "$applied" = none ]; then {shlex.join(grading.REVERSE_CHECK)} > "$D/reverse" 2>&1 '
                  f'&& applied=reverse; fi',
                  'echo "$applied" > "$D/applied"',
                  f'[ "$applied" = none ] && exit {_NOT_APPLIED}']
    lines += ['echo "t1 $(date +%s.%N)" >> "$D/times"',
              f'{_DIFF} > "$D/diff-before" 2>&1',
              'echo "t2 $(date +%s.%N)" >> "$D/times"',
              f"/bin/bash {EVAL_SCRIPT} 2>&1",
              'echo "t3 $(date +%s.%N)" >> "$D/times"',
              f'{_DIFF} > "$D/diff-after" 2>&1',
              "exit 0"]
    return "\n".join(lines) + "\n"


class _Result:
    """The run's result image and the driver's records in it."""

    def __init__(self, engine, image: str | None):
        self.engine, self.image = engine, image

    def read(self, name: str) -> str:
        if self.image is None:
            return ""
        try:
            return self.engine.read(self.image, f"{STATE_DIR}/{name}").decode("utf-8", "replace")
        except Exception:                    # absent: the step did not run
            return ""


def _log_apply(res: _Result, logger, unapplied: str = "error") -> str | None:
    """The patch step as swebench's run_instance logs it: None when a command applied it, else the
    failure's log text (unapplied="zero") or InstanceError (the prediction's failure)."""
    applied = res.read("applied").strip()
    if not applied:                          # the driver never got past the patch step: not the patch's doing
        raise InstanceError("the patch step did not finish (the sandbox's run ended before it)", kind=INFRA,
                            reason="harness_killed")
    last = ""
    for i, argv in enumerate(grading.APPLY_COMMANDS):
        last = res.read(f"apply-{i}")
        if applied == str(i):
            logger.info(f"{grading.APPLY_PATCH_PASS}:\n{last}")
            return None
        logger.info(f"Failed to apply patch to sandbox: {' '.join(argv[:-1])}")
    if applied == "reverse":
        logger.info(f"{grading.APPLY_PATCH_PASS}: verified already applied")
        return None
    logger.info(f"{grading.APPLY_PATCH_FAIL}:\n{last}")
    if unapplied == "zero":
        return f"{grading.APPLY_PATCH_FAIL}:\n{last}"
    raise InstanceError(f"{grading.APPLY_PATCH_FAIL}:\n{last[-2000:]}", kind=AGENT, reason="patch_not_applied")


def _span(times: dict, a: str, b: str) -> float | None:
    try:
        return round(float(times[b]) - float(times[a]), 4)
    except (KeyError, ValueError):
        return None


def _write_report(log_dir: Path, report: dict) -> None:
    tmp = log_dir / f".{grading.LOG_REPORT}.tmp"        # whole or absent: a rerun skips what has one
    tmp.write_text(json.dumps(report, indent=4))
    tmp.replace(log_dir / grading.LOG_REPORT)


def _phase_failure(times: dict) -> tuple[str, str]:
    """Whose failure a run that timed out or was killed is, from the driver's marks: the tests had
    started and not ended (the prediction's code was running: AGENT), or the harness's own steps
    had not finished (INFRA)."""
    if "t2" in times and "t3" not in times:
        return AGENT, "tests"
    return INFRA, "harness"


def evaluate_instance(engine, inst: Instance, prediction: dict, environment: str, log_dir: Path, *,
                      timeout: float, skip_patch: bool = False, tag: str | None = None, cancel=None,
                      limits: dict | None = None, unapplied: str = "error", run_id: str = "",
                      environment_change: dict | None = None) -> dict:
    """Evaluate one prediction ({instance_id, model_name_or_path, model_patch}) on the environment
    image; swebench's report ({instance_id: {...}}), also written to log_dir/report.json, its
    `sandtree` entry holding the environment, the final image and its tag, the status, and seconds
    per phase; the final image annotated with the reward (outcomes.reward_meta). environment_change:
    how this run moved the environment's tag (envtags.moved), logged first."""
    iid = inst.instance_id
    log_dir.mkdir(parents=True, exist_ok=True)
    logger = grading.setup_logger(iid, log_dir / grading.LOG_INSTANCE)
    try:
        if environment_change:
            c = environment_change
            logger.warning(f"Environment tag {c['tag']} moved: {c['old']} -> {c['new']} (the old image kept as "
                           f"{c['kept_as']}): {'; '.join(c['why'])}")
        spec = grading.test_spec(inst, environment)
        eval_file = log_dir / "eval.sh"
        eval_file.write_text(spec.eval_script)
        files = [{"path": EVAL_SCRIPT, "content": spec.eval_script.encode(), "mode": 0o755},
                 {"path": DRIVER, "content": driver_script(skip_patch).encode(), "mode": 0o755}]
        logger.info(f"Eval script for {iid} written to {eval_file}; copying to sandbox...")
        if skip_patch:
            logger.info(f"Skipping model patch for {iid} (--no-patch mode)")
        else:
            patch = prediction["model_patch"] or ""
            patch_file = log_dir / "patch.diff"
            patch_file.write_text(patch)
            files.append({"path": grading.PATCH_FILE, "content": patch.encode(), "mode": 0o644})
            logger.info(f"Intermediate patch for {iid} written to {patch_file}, now applying to sandbox...")
        logger.info(f"Running {iid} in a fork of its environment image {environment}...")
        t = time.monotonic()
        # on_output: the run streams (remotely: no HTTP read timeout however long the tests take)
        rec = engine.run(environment, ["/bin/bash", DRIVER], cwd=grading.WORKDIR, files=files, timeout=timeout,
                         cancel=cancel, on_output=lambda _s, _b: None, labels={RUN_LABEL: iid}, **(limits or {}))
        run_s = time.monotonic() - t
        res = _Result(engine, rec.image)
        times = dict(line.split(" ", 1) for line in res.read("times").splitlines() if " " in line)
        test_output_path = log_dir / grading.LOG_TEST_OUTPUT
        output = (rec.stdout + rec.stderr).decode("utf-8", "replace")
        if rec.timed_out or getattr(rec, "cancelled", False):
            with open(test_output_path, "w") as f:
                f.write(output + (f"\n\nTimeout error: {timeout} seconds exceeded." if rec.timed_out else ""))
            if not rec.timed_out:
                raise InstanceError("cancelled", kind=INFRA, reason="cancelled")
            kind, phase = _phase_failure(times)
            raise InstanceError(f"Test timed out after {timeout} seconds." if kind == AGENT else
                                f"The harness's steps (patch, diff) timed out after {timeout} seconds, "
                                "before the tests started", kind=kind, reason=f"{phase}_timed_out")
        not_applied = None if skip_patch else _log_apply(res, logger, unapplied)
        if rec.image is None or (rec.exit_code != 0 and not not_applied):
            hint = network_hint(rec.stdout, rec.stderr) if "network" not in (limits or {}) else None
            kind, phase = _phase_failure(times) if rec.image is not None else (INFRA, "harness")
            raise InstanceError(f"the eval's run failed: exit {rec.exit_code}, signal {rec.signal}"
                                f"{' (out of memory)' if rec.oom_killed else ''}: {output[-500:]}"
                                + (f"\n{hint}" if hint else ""), kind=kind, reason=f"{phase}_killed")
        if not_applied:
            # graded as swebench grades a log that says so: applied false, resolved false (reward 0)
            test_output_path.write_text(not_applied)
            logger.info(f"Patch applied nowhere: graded as unresolved (reward 0); log in {test_output_path}")
            before = after = ""
        else:
            before, after = res.read("diff-before").strip(), res.read("diff-after").strip()
            logger.info(f"Git diff before:\n{before}")
        tests_s = _span(times, "t2", "t3")
        if not not_applied:
            logger.info(f"Test runtime: {tests_s if tests_s is not None else run_s:_.2f} seconds")
            test_output_path.write_text(output)
            logger.info(f"Test output for {iid} written to {test_output_path}")
            if rec.stdout_truncated:
                logger.info("Test output was cut at the sandbox's output limit")
            logger.info(f"Git diff after:\n{after}")
            if after != before:
                logger.info("Git diff changed after running eval script")
        if tag is not None:
            engine.tag(rec.image, tag)
        logger.info(f"Final state of {iid} kept as image {rec.image}" + (f" (tag {tag})" if tag else ""))
        logger.info(f"Grading answer for {iid}...")
        report = grading.grade(spec, prediction, str(test_output_path))
        entry = report[iid]
        meta = reward_meta(entry, inst, run_id=run_id, model=prediction["model_name_or_path"],
                           environment=environment)
        # the reward in the lineage: trace export and image info read it from the store
        engine.annotate(rec.image, meta[f"{PREFIX}reward"], meta)
        seconds = {"run": round(run_s, 4), "apply": _span(times, "t0", "t1"), "tests": tests_s,
                   "commit": (rec.usage or {}).get("commit_s")}
        entry["sandtree"] = {"environment": environment, "image": rec.image, "tag": tag,
                             "operation": rec.op, "seconds": seconds, "status": meta[f"{PREFIX}status"],
                             "reward": meta[f"{PREFIX}reward"]}
        logger.info(f"report: {report}\nResult for {iid}: resolved: {entry['resolved']}")
        _write_report(log_dir, report)
        return report
    except InstanceError as e:
        logger.error(f"{e.kind} failure ({e.reason}) in evaluating {iid}: {e}")
        raise
    except Exception as e:
        kind, reason = failure_of(e)
        logger.error(f"Error in evaluating model for {iid}: {type(e).__name__}: {e} ({kind} failure: {reason})")
        raise InstanceError(f"{type(e).__name__}: {e}", kind=kind, reason=reason) from e
    finally:
        grading.close_logger(logger)
