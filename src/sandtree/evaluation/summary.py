"""Where a run's files go (swebench's layout) and its summary (swebench's make_run_report, computed
from the reports on disk the same way, so instances a rerun skipped count as well).

    OUT/RUN_ID/MODEL/INSTANCE_ID/report.json, test_output.txt, patch.diff, eval.sh, run_instance.log
    REPORT_DIR/MODEL.RUN_ID.json       the summary (REPORT_DIR defaults to OUT/RUN_ID)

MODEL is the prediction's model_name_or_path with `/` written `__` (swebench's rule). make_run_report
itself reads a fixed relative directory (logs/run_evaluation) and asks Docker about leftover
containers, so its counting is done here over OUT; tests/integrations/test_eval.py checks that both agree on the
same logs. The summary keeps swebench's keys (schema_version 2) and adds sandtree's: the run, each
instance's environment and final image, why each errored instance has no report and whose failure it
was (infra_error_ids, agent_error_ids, error_kinds: outcomes.py), each submitted instance's reward
(`rewards`: 1.0, 0.0, or None for an infrastructure failure an RL loop masks), the patches graded as
not applied (patch_not_applied_ids, unapplied="zero"), and times."""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import grading
from .inputs import Instance, Prediction, model_dir
from .outcomes import AGENT, INFRA

__all__ = ["Layout", "read_report", "summarize", "write_summary"]


class Layout:
    def __init__(self, out_dir, run_id: str, report_dir=None):
        self.out = Path(out_dir)
        self.run_id = run_id
        self.report_dir = Path(report_dir) if report_dir is not None else self.out / run_id

    def instance_dir(self, pred: Prediction) -> Path:
        return self.out / self.run_id / model_dir(pred.model_name_or_path) / pred.instance_id

    def report(self, pred: Prediction) -> Path:
        return self.instance_dir(pred) / grading.LOG_REPORT

    def summary(self, model: str) -> Path:
        return self.report_dir / f"{model_dir(model)}.{self.run_id}.json"


def read_report(path: Path, iid: str) -> dict | None:
    """A finished instance's report entry, or None (absent, empty or not swebench's shape: an error)."""
    try:
        entry = json.loads(path.read_text().strip())[iid]
        entry["resolved"]
        return entry
    except (OSError, ValueError, KeyError, TypeError):
        return None


def summarize(instances: list[Instance], preds: dict[str, Prediction], layout: Layout, *,
              errors: dict[str, str] | None = None, skipped=(), seconds: float | None = None,
              extra: dict | None = None, error_kinds: dict[str, dict] | None = None) -> dict:
    """make_run_report's counts over `instances` (the full set) and `preds` (by instance ID).
    error_kinds: instance ID -> {"kind": AGENT | INFRA, "reason"} of this run's errors."""
    completed, resolved, unresolved, error, incomplete, empty = set(), set(), set(), set(), set(), set()
    not_applied = set()
    images: dict[str, dict] = {}
    for inst in instances:
        iid = inst.instance_id
        pred = preds.get(iid)
        if pred is None:
            incomplete.add(iid)
            continue
        if pred.model_patch in ("", None) and not (extra or {}).get("skip_patch"):
            empty.add(iid)
            continue
        path = layout.report(pred)
        if not path.exists():
            error.add(iid)
            continue
        completed.add(iid)
        entry = read_report(path, iid)
        if entry is None:
            error.add(iid)
        elif entry["resolved"]:
            resolved.add(iid)
        else:
            unresolved.add(iid)
            if not entry.get("patch_successfully_applied") and entry.get("patch_exists"):
                not_applied.add(iid)
        if entry is not None and isinstance(entry.get("sandtree"), dict):
            images[iid] = {k: entry["sandtree"].get(k) for k in ("environment", "image", "tag")}
    reasons, infra, ambiguous = {}, set(), set()
    for iid in unresolved | error:
        d = layout.instance_dir(preds[iid])
        found = grading.classify(d / grading.LOG_TEST_OUTPUT, d / grading.LOG_INSTANCE)
        if found:
            reasons[iid] = found[0]
            (infra if found[1] == grading.TIER_ENVIRONMENT else ambiguous).add(iid)
    ids = {i.instance_id for i in instances}
    kinds = {k: v for k, v in (error_kinds or {}).items() if k in error}
    rewards: dict[str, float | None] = {}
    for iid in sorted(set(preds) & ids):
        if iid in resolved:
            rewards[iid] = 1.0
        elif iid in unresolved or iid in empty or kinds.get(iid, {}).get("kind") == AGENT:
            rewards[iid] = 0.0
        elif iid in error:
            rewards[iid] = None             # the infrastructure's failure (or unknown): says nothing of the policy
    report = {
        "total_instances": len(instances),
        "submitted_instances": len(preds),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(unresolved),
        "infra_failure_instances": len(infra),
        "ambiguous_failure_instances": len(ambiguous),
        "empty_patch_instances": len(empty),
        "error_instances": len(error),
        "completed_ids": sorted(completed),
        "incomplete_ids": sorted(incomplete),
        "empty_patch_ids": sorted(empty),
        "submitted_ids": sorted(preds),
        "resolved_ids": sorted(resolved),
        "unresolved_ids": sorted(unresolved),
        "infra_failure_ids": sorted(infra),
        "ambiguous_failure_ids": sorted(ambiguous),
        "failure_reasons": dict(sorted(reasons.items())),
        "error_ids": sorted(error),
        "schema_version": 2,
        # sandtree's own
        "run_id": layout.run_id,
        "log_dir": str(layout.out / layout.run_id),
        "images": dict(sorted(images.items())),
        "errors": {k: v for k, v in sorted((errors or {}).items()) if k in ids},
        "skipped_ids": sorted(skipped),
        "infra_error_ids": sorted(i for i in error if kinds.get(i, {}).get("kind", INFRA) == INFRA),
        "agent_error_ids": sorted(i for i in error if kinds.get(i, {}).get("kind") == AGENT),
        "error_kinds": dict(sorted(kinds.items())),
        "patch_not_applied_ids": sorted(not_applied),
        "rewards": rewards,
        "seconds": round(seconds, 3) if seconds is not None else None,
    }
    report.update(extra or {})
    return report


def write_summary(summary: dict, layout: Layout, model: str) -> Path:
    path = layout.summary(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(summary, indent=4) + "\n")
    os.replace(tmp, path)
    return path
