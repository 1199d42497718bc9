"""What an RL loop reads of an evaluated instance: its reward, kept on its final image, and, when it
has none, whose failure it was.

The reward goes into the final image's annotations (engine/images/annotations.py: notes in the
store, never part of the image's ID), so the lineage holds it and `trace export` carries it: the
score is the reward (1.0 resolved, else 0.0) and the metadata says why, under `eval.`:

    eval.reward, eval.resolved, eval.status (resolved | unresolved | patch_not_applied),
    eval.patch_applied, eval.fail_to_pass.passed / .failed, eval.pass_to_pass.passed / .failed,
    eval.instance_id, eval.run_id, eval.model, eval.environment

A failure without a report is either the prediction's (AGENT: its patch applied nowhere, the tests it
changed outlived the timeout or were killed) or the harness's (INFRA: the environment did not build or
resolve, the sandbox could not start, a cluster node was lost, the harness's own steps timed out, the
store or server failed). The loop must mask the second kind: it says nothing of the policy. The
harness decides it from where the failure happened, not from log text (swebench's post-hoc
`infra_failure` classifier stays advisory in the summary's infra_failure_ids)."""

from __future__ import annotations

from .. import errors

__all__ = ["AGENT", "INFRA", "InstanceError", "failure_of", "reward_meta", "PREFIX"]

AGENT, INFRA = "agent", "infra"
PREFIX = "eval."


class InstanceError(Exception):
    """An instance that could not be evaluated (no report): the reason, for the run's summary;
    `kind` AGENT or INFRA, `reason` a short word (patch_not_applied, tests_timed_out, environment,
    sandbox, node_lost, harness_timeout, ...)."""

    def __init__(self, message: str, *, kind: str = INFRA, reason: str = "harness"):
        super().__init__(message)
        self.kind, self.reason = kind, reason


def failure_of(exc: BaseException) -> tuple[str, str]:
    """(kind, reason) of an exception the harness met outside the prediction's own steps: always
    the infrastructure's (the prediction only ever runs inside the sandbox's command)."""
    if isinstance(exc, errors.NodeLost):
        return INFRA, "node_lost"
    if isinstance(exc, errors.NotFound):         # the environment image went (removed, never made)
        return INFRA, "environment"
    if isinstance(exc, (errors.SandboxError, errors.RuntimeUnavailable, errors.CommandNotFound,
                        errors.LimitExceeded)):
        return INFRA, "sandbox"
    if isinstance(exc, (errors.StoreUnavailable, errors.DiskFull, errors.StoreCorrupt)):
        return INFRA, "store"
    if isinstance(exc, TimeoutError) or type(exc).__name__.endswith("Timeout"):   # httpx's too
        return INFRA, "harness_timeout"
    if isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("httpx", "httpcore"):
        return INFRA, "connection"
    return INFRA, "harness"


def _counts(entry: dict, key: str, total: int) -> tuple[int, int]:
    """(passed, failed) of FAIL_TO_PASS or PASS_TO_PASS; with no tests status (the tests did not
    run: the patch applied nowhere) every test counts as failed."""
    status = (entry.get("tests_status") or {}).get(key)
    if not isinstance(status, dict):
        return 0, total
    return len(status.get("success") or ()), len(status.get("failure") or ())


def reward_meta(entry: dict, inst, *, run_id: str, model: str, environment: str) -> dict:
    """The annotations of a final image from its report entry (swebench's, one instance)."""
    resolved = bool(entry.get("resolved"))
    applied = bool(entry.get("patch_successfully_applied"))
    f2p = _counts(entry, "FAIL_TO_PASS", len(inst.FAIL_TO_PASS))
    p2p = _counts(entry, "PASS_TO_PASS", len(inst.PASS_TO_PASS))
    return {
        f"{PREFIX}reward": 1.0 if resolved else 0.0,
        f"{PREFIX}resolved": resolved,
        f"{PREFIX}status": "resolved" if resolved else "unresolved" if applied else "patch_not_applied",
        f"{PREFIX}patch_applied": applied,
        f"{PREFIX}fail_to_pass.passed": f2p[0], f"{PREFIX}fail_to_pass.failed": f2p[1],
        f"{PREFIX}pass_to_pass.passed": p2p[0], f"{PREFIX}pass_to_pass.failed": p2p[1],
        f"{PREFIX}instance_id": inst.instance_id, f"{PREFIX}run_id": run_id,
        f"{PREFIX}model": model[:200], f"{PREFIX}environment": environment,
    }
