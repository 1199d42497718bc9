"""One prediction of one instance, evaluated the way swebench's run_instance does it, in a live
sandbox forked from the instance's environment image (an overlay on it: O(1), whatever its size)
instead of a container: the model patch written to /tmp/patch.diff and applied with swebench's
ordered fallbacks (a reset between attempts, then the reverse check), `git diff` before, the eval
script (its stdout and stderr interleaved, as docker's exec gives them) into test_output.txt,
`git diff` after, the sandbox's final state committed as an image (tagged when the tag fits), and
swebench's report written to report.json with that image's ID beside its own fields.

The engine is any engine-like object (the in-process Engine or the remote client): only table
operations are called (sandbox_start/write/exec/commit/stop). A patch that no command applies, a
timeout or an engine error is an error, as in swebench: logged, no report.json (a rerun tries it
again), raised as InstanceError."""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import grading
from .inputs import Instance

__all__ = ["InstanceError", "evaluate_instance", "SANDBOX_LABEL", "EVAL_SCRIPT"]

SANDBOX_LABEL = "sandtree.eval"         # label of the eval's sandboxes (sandtree ps --label)
EVAL_SCRIPT = "/eval.sh"
_SLACK = 600                            # seconds a sandbox may outlive its test timeout


class InstanceError(Exception):
    """An instance that could not be evaluated (no report): the reason, for the run's summary."""


def _text(rec) -> str:
    return (rec.stdout + rec.stderr).decode("utf-8", "replace")


class _Sandbox:
    """The instance's live sandbox: its commands, each a fresh process in /testbed."""

    def __init__(self, engine, image: str, iid: str, timeout: float, cancel, files: list[dict]):
        self.engine, self.timeout, self.cancel = engine, timeout, cancel
        # files: the patch and the eval script, put in place as the sandbox starts (no call each)
        self.sid = engine.sandbox_start(image, cwd=grading.WORKDIR, idle_timeout=timeout + _SLACK,
                                        lifetime=timeout * 2 + _SLACK, timeout=timeout, files=files,
                                        labels={SANDBOX_LABEL: iid})["id"]

    def exec(self, argv: list, *, stream: bool = False):
        # stream: the long test command goes over a streamed exec, which has no HTTP read timeout remotely
        return self.engine.sandbox_exec(self.sid, argv, cwd=grading.WORKDIR, timeout=self.timeout,
                                        cancel=self.cancel, on_output=(lambda _s, _b: None) if stream else None)

    def stop(self) -> None:
        try:
            self.engine.sandbox_stop(self.sid)
        except Exception:                    # already gone (lifetime, engine closing): nothing to free
            pass


def _apply(sb: _Sandbox, logger) -> None:
    """swebench's patch step: each command of GIT_APPLY_CMDS in order, a reset between attempts,
    then `git apply --check --reverse` (the chain may leave it applied while each exited non-zero)."""
    rec = None
    for attempt, argv in enumerate(grading.APPLY_COMMANDS):
        if attempt:
            sb.exec(grading.RESET_COMMAND)
        rec = sb.exec(argv)
        if rec.exit_code == 0:
            logger.info(f"{grading.APPLY_PATCH_PASS}:\n{_text(rec)}")
            return
        logger.info(f"Failed to apply patch to sandbox: {' '.join(argv[:-1])}")
    if sb.exec(grading.REVERSE_CHECK).exit_code == 0:
        logger.info(f"{grading.APPLY_PATCH_PASS}: verified already applied")
        return
    logger.info(f"{grading.APPLY_PATCH_FAIL}:\n{_text(rec)}")
    raise InstanceError(f"{grading.APPLY_PATCH_FAIL}:\n{_text(rec)[-2000:]}")


# swebench's `git diff` before and after the eval script, in the same process as the script (two
# fewer commands per instance): each into a file of its own, read back, the script's output untouched.
_DIFF = "git -c core.fileMode=false diff"
_BEFORE, _AFTER = "/tmp/.sandtree-diff-before", "/tmp/.sandtree-diff-after"
_EVAL_COMMAND = ["/bin/bash", "-c", f"{_DIFF} > {_BEFORE} 2>&1; /bin/bash {EVAL_SCRIPT} 2>&1; "
                                    f"{_DIFF} > {_AFTER} 2>&1"]


def _read(sb: _Sandbox, path: str) -> str:
    try:
        return sb.engine.sandbox_read(sb.sid, path).decode("utf-8", "replace").strip()
    except Exception as e:                   # informational only (swebench logs it, grades nothing on it)
        return f"(unreadable: {e})"


def evaluate_instance(engine, inst: Instance, prediction: dict, environment: str, log_dir: Path, *,
                      timeout: float, skip_patch: bool = False, tag: str | None = None, cancel=None) -> dict:
    """Evaluate one prediction ({instance_id, model_name_or_path, model_patch}) on the environment
    image; swebench's report ({instance_id: {...}}), also written to log_dir/report.json, its
    `sandtree` entry holding the environment, the final image and its tag, and seconds per phase."""
    iid = inst.instance_id
    log_dir.mkdir(parents=True, exist_ok=True)
    logger = grading.setup_logger(iid, log_dir / grading.LOG_INSTANCE)
    sb = None
    times: dict[str, float] = {}
    try:
        spec = grading.test_spec(inst, environment)
        eval_file = log_dir / "eval.sh"
        eval_file.write_text(spec.eval_script)
        files = [{"path": EVAL_SCRIPT, "content": spec.eval_script.encode(), "mode": 0o755}]
        logger.info(f"Eval script for {iid} written to {eval_file}; copying to sandbox...")
        if not skip_patch:
            patch = prediction["model_patch"] or ""
            patch_file = log_dir / "patch.diff"
            patch_file.write_text(patch)
            files.append({"path": grading.PATCH_FILE, "content": patch.encode(), "mode": 0o644})
            logger.info(f"Intermediate patch for {iid} written to {patch_file}, now applying to sandbox...")
        t = time.monotonic()
        logger.info(f"Creating sandbox for {iid} from environment image {environment}...")
        sb = _Sandbox(engine, environment, iid, timeout, cancel, files)
        logger.info(f"Sandbox for {iid} started: {sb.sid}")
        times["start"] = time.monotonic() - t
        t = time.monotonic()
        if skip_patch:
            logger.info(f"Skipping model patch for {iid} (--no-patch mode)")
        else:
            _apply(sb, logger)
        times["apply"] = time.monotonic() - t
        t = time.monotonic()
        rec = sb.exec(_EVAL_COMMAND, stream=True)
        times["tests"] = time.monotonic() - t
        test_output_path = log_dir / grading.LOG_TEST_OUTPUT
        before = _read(sb, _BEFORE)
        logger.info(f"Git diff before:\n{before}")
        logger.info(f"Test runtime: {times['tests']:_.2f} seconds")
        with open(test_output_path, "w") as f:
            f.write(_text(rec))
            logger.info(f"Test output for {iid} written to {test_output_path}")
            if rec.stdout_truncated:
                logger.info("Test output was cut at the sandbox's output limit")
            if rec.timed_out:
                f.write(f"\n\nTimeout error: {timeout} seconds exceeded.")
                raise InstanceError(f"Test timed out after {timeout} seconds.")
            if getattr(rec, "cancelled", False):
                raise InstanceError("cancelled")
        after = _read(sb, _AFTER)
        logger.info(f"Git diff after:\n{after}")
        if after != before:
            logger.info("Git diff changed after running eval script")

        t = time.monotonic()
        image = engine.sandbox_commit(sb.sid, tag=tag)
        times["commit"] = time.monotonic() - t
        logger.info(f"Final state of {iid} kept as image {image}" + (f" (tag {tag})" if tag else ""))
        logger.info(f"Grading answer for {iid}...")
        t = time.monotonic()
        report = grading.grade(spec, prediction, str(test_output_path))
        times["grade"] = time.monotonic() - t
        report[iid]["sandtree"] = {"environment": environment, "image": image, "tag": tag,
                                   "seconds": {k: round(v, 4) for k, v in times.items()}}
        logger.info(f"report: {report}\nResult for {iid}: resolved: {report[iid]['resolved']}")
        tmp = log_dir / f".{grading.LOG_REPORT}.tmp"        # whole or absent: a rerun skips what has one
        tmp.write_text(json.dumps(report, indent=4))
        tmp.replace(log_dir / grading.LOG_REPORT)
        return report
    except InstanceError:
        raise
    except Exception as e:
        logger.error(f"Error in evaluating model for {iid}: {type(e).__name__}: {e}")
        raise InstanceError(f"{type(e).__name__}: {e}") from e
    finally:
        if sb is not None:
            sb.stop()
        grading.close_logger(logger)
