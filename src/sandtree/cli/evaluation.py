"""`sandtree eval INSTANCES.jsonl --predictions P.jsonl --base IMAGE`: the SWE-bench-style harness
(sandtree/evaluation) over this store's engine or, with --server, a `sandtree serve`'s; progress on
stderr (evalprogress.py), the summary on stdout (--json: the whole summary object).

Exit status: 0; 1 when an instance errored (no report: a rerun with the same --run-id retries it)
or, with --validate, when an instance broke the rule (gold: every one resolves; empty: none does),
each named on stderr (an error with whose failure it was: agent or infra). An eval/<id> tag a rebuild
moved is named on stderr too (old -> new, why), without changing the exit status."""

from __future__ import annotations

import sys
import time

from .. import config
from . import exits, options
from .evalprogress import eval_view
from .output import engine_api, out, remote_engine


def _human(summary: dict) -> None:
    s = summary
    print(f"run {s['run_id']}: {s['total_instances']} instances, {s['resolved_instances']} resolved, "
          f"{s['unresolved_instances']} unresolved, {s['error_instances']} errors, {s['empty_patch_instances']} "
          f"empty patches, {len(s['skipped_ids'])} kept from before; {s['seconds']}s")
    for label, key in (("resolved", "resolved_ids"), ("unresolved", "unresolved_ids"),
                       ("patch not applied (reward 0)", "patch_not_applied_ids"),
                       ("errors of the predictions (reward 0)", "agent_error_ids"),
                       ("errors of the infrastructure (no reward: mask them)", "infra_error_ids")):
        if s.get(key):
            print(f"{label}: {' '.join(s[key])}")
    print(f"summary: {s['summary_path']}")


def _complaints(summary: dict) -> list[str]:
    lines = [f"environment changed: {c['tag']} {c['old'][:12]} -> {c['new'][:12]} (old kept as {c['kept_as']}): "
             f"{'; '.join(c['why'])}" for c in summary.get("environment_changes", ())]
    v = summary.get("validation")
    if v is not None and not v["ok"]:
        rule = "the gold patch must resolve" if v["mode"] == "gold" else "with no patch it must not resolve"
        lines += [f"validation failed ({rule}): {iid}: {v['why'][iid].splitlines()[0]}" for iid in v["failed"]]
    elif summary["error_ids"]:
        kinds = summary.get("error_kinds", {})
        lines += [f"error ({kinds.get(iid, {}).get('kind', 'infra')}): {iid}: "
                  f"{(summary['errors'].get(iid) or 'no report').splitlines()[0]}" for iid in summary["error_ids"]]
    return lines


def cmd_eval(args):
    # warm sandboxes ahead of the instances' forks (a one-shot command's engine keeps none)
    # not at the top: the harness is the engine's and more; only `eval` needs it (start-up time)
    from .. import evaluation
    eng = remote_engine(args.server) if args.server else \
        engine_api().Engine(args.home or config.default_home(), warm=min(max(args.workers, 1), 4))
    view = eval_view("quiet" if args.json and args.progress == "auto" else args.progress, sys.stderr)
    try:
        summary = evaluation.evaluate(
            eng, args.instances, args.predictions, base=args.base, workers=args.workers,
            run_id=args.run_id or time.strftime("run-%Y%m%d-%H%M%S"), out_dir=args.out, report_dir=args.report_dir,
            validate=args.validate, instance_ids=args.instance_ids or None, timeout=args.timeout,
            build_network=options.network(args).get("network"), progress=view, limits=options.resources(args),
            unapplied=args.unapplied)
    finally:
        if view is not None:
            view.close()
        eng.close()
    out(args, summary, _human)
    complaints = _complaints(summary)
    for line in complaints:
        print(line, file=sys.stderr)
    failed = summary["error_ids"] or (summary.get("validation") or {}).get("ok") is False
    return exits.NO if failed else exits.OK


def add_eval(sub, common) -> None:
    x = sub.add_parser("eval", parents=[common], help="evaluate predictions on SWE-bench-style instances "
                       "(swebench's harness, each instance in a fork of its environment image)")
    x.add_argument("instances", help="the instances, one JSON object a line (SWE-bench's fields, plus "
                   "environment and test_cmd)")
    x.add_argument("--predictions", "-p", metavar="FILE", help="predictions: JSONL (or a .json list/dict) of "
                   "instance_id, model_name_or_path, model_patch")
    x.add_argument("--validate", choices=("gold", "empty"),
                   help="instead of predictions: gold (each instance's own patch must resolve it) or empty (with "
                        "no patch none may); exit 1 naming those that do not")
    x.add_argument("--base", metavar="IMAGE", help="the image a Dockerfile environment's ARG BASE names "
                   "(Debian with python3, pip, git and patch)")
    x.add_argument("--workers", type=int, default=2, help="instances evaluated at once (default 2)")
    x.add_argument("--run-id", help="the run's name (default run-DATE-TIME); a rerun with the same one skips "
                   "the instances that have a report")
    x.add_argument("--out", default="logs/run_evaluation", metavar="DIR",
                   help="log directory: DIR/RUN_ID/MODEL/INSTANCE_ID/ (default logs/run_evaluation, swebench's)")
    x.add_argument("--report-dir", metavar="DIR", help="where MODEL.RUN_ID.json goes (default DIR/RUN_ID)")
    x.add_argument("--instance-ids", "-i", nargs="+", metavar="ID", help="only these instances")
    x.add_argument("--timeout", type=float, default=1800, help="seconds of one instance's tests (default 1800)")
    x.add_argument("--unapplied", choices=("error", "zero"), default="error",
                   help="a patch that applies nowhere: error (swebench's: no report, a rerun retries it) or zero "
                        "(graded unresolved, reward 0, with a report)")
    options.add_resources(x)                  # each test run's (the environments' builds: the engine's)
    x.add_argument("--network", metavar="off|all|RULES",
                   help="network of the environments' RUN steps without their own --network (default "
                        "pypi.org,files.pythonhosted.org; a Dockerfile's own may only narrow it)")
    x.add_argument("--allow", action="append", default=[], metavar="RULE", help="add RULE to that allow-list")
    x.add_argument("--deny", action="append", default=[], metavar="RULE", help="refuse RULE even when allowed")
    x.add_argument("--progress", choices=("auto", "plain", "json", "quiet"), default="auto",
                   help="auto: a live view on a terminal, else plain lines; json: an event a line")
    x.add_argument("--server", metavar="URL", help="evaluate on a `sandtree serve` at URL (token: $SANDTREE_TOKEN)")
    x.set_defaults(fn=cmd_eval, secret=[])
