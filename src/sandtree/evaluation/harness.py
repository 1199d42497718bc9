"""`sandtree eval` / `st.eval(...)`: predictions evaluated on instances, in parallel, resumable.

For each instance with a prediction: its environment image (built from `environment.dockerfile`
with `ARG BASE` set to the base image, or `environment.image` resolved), once per distinct
environment in a run and cached on the image DAG across runs (an unchanged Dockerfile costs a
lookup per step), tagged `eval/<instance_id>`; then runner.evaluate_instance in a fork of it. An
instance whose report.json exists is skipped (a rerun finishes what is missing: errors have none);
an empty or null model_patch is not run (swebench counts it an empty patch). The summary is
summary.summarize's. Validation mode: `validate="gold"` evaluates each instance's own patch (model
"gold") and every one must resolve; `validate="empty"` runs each with no patch (swebench's no-patch
mode, model "empty") and none may resolve; the summary's `validation` says which did not.

Progress: progress(event) with {"instance_id", "status", "done", "total"} and, by status: building
("step": the build's step event), environment_changed ("change": envtags.moved's), running,
resolved | unresolved ("seconds", "image", "reward"), error ("message", "kind": agent | infra,
"reason"), skipped (a report exists), empty_patch; finally {"status": "finished", "summary"}.

For RL: every report's final image carries its reward (outcomes.py); unapplied="zero" grades a patch
that applies nowhere as unresolved (reward 0, with a report) instead of swebench's error; the summary's
`rewards` maps each submitted instance to 1.0, 0.0 or None (an infrastructure failure: mask it), and
`infra_error_ids` / `agent_error_ids` split the errors by whose failure they were."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..errors import InvalidInput
from . import envtags, grading
from .inputs import Instance, Prediction, check_limits, check_name, load_instances, load_predictions, model_dir
from .outcomes import INFRA, InstanceError, failure_of
from .runner import UNAPPLIED_MODES, evaluate_instance
from .summary import Layout, read_report, summarize, write_summary

__all__ = ["evaluate", "environment", "environment_tag", "DEFAULT_BUILD_NETWORK", "DEFAULT_TIMEOUT", "VALIDATE_MODES"]

DEFAULT_BUILD_NETWORK = ("pypi.org", "files.pythonhosted.org")    # RUN steps' policy unless told
DEFAULT_TIMEOUT = 1800.0              # seconds of one instance's tests (swebench's default)
VALIDATE_MODES = ("gold", "empty")
_TAG_MAX = 200                        # store/names.py TAG_RE


def environment_tag(instance_id: str) -> str:
    return f"eval/{instance_id}"


class _Environments:
    """Each distinct environment built (or resolved) once per run, whichever worker needs it first;
    the others wait for it. A failure is remembered: every instance of that environment errors (an
    infrastructure failure: not the prediction's). Each instance's tag is moved loudly (envtags.py):
    `changes` lists the moves."""

    def __init__(self, engine, base: str | None, network, emit):
        self.engine, self.base, self.network, self.emit = engine, base, network, emit
        self.lock = threading.Lock()
        self.slots: dict[tuple, dict] = {}
        self.changes: list[dict] = []

    def get(self, inst: Instance) -> tuple[str, float, dict | None]:
        """(the environment's image ID, seconds it took, the tag's change or None)."""
        with self.lock:
            slot = self.slots.setdefault(inst.environment_key(), {"lock": threading.Lock()})
        with slot["lock"]:
            if "image" not in slot and "error" not in slot:
                t = time.monotonic()
                try:
                    slot["image"] = self._make(inst)
                except Exception as e:
                    slot["error"] = e
                slot["seconds"] = time.monotonic() - t
            if "error" in slot:
                raise InstanceError(f"environment: {type(slot['error']).__name__}: {slot['error']}", kind=INFRA,
                                    reason="environment")
        inputs = envtags.inputs_of(inst.environment, self.base, self.network)
        with slot["lock"]:
            record, slot["recorded"] = not slot.get("recorded"), True
        try:
            change = envtags.moved(self.engine, environment_tag(inst.instance_id), slot["image"], inputs,
                                   record=record)
        except Exception as e:
            raise InstanceError(f"environment tag: {type(e).__name__}: {e}", kind=INFRA,
                                reason=failure_of(e)[1]) from e
        if change is not None:
            change = {"instance_id": inst.instance_id, **change}
            with self.lock:
                self.changes.append(change)
            self.emit(inst.instance_id, "environment_changed", change=change)
        return slot["image"], slot["seconds"], change

    def _make(self, inst: Instance) -> str:
        if "image" in inst.environment:
            return self.engine.resolve(inst.environment["image"])
        if self.base is None:
            raise InvalidInput(f"{inst.instance_id}: its environment is a Dockerfile: give base= (the image ARG "
                               "BASE names)")

        def step(ev):
            if ev.get("status") != "running":       # step boundaries only: outputs stay in the build's records
                self.emit(inst.instance_id, "building", step={k: v for k, v in ev.items() if k != "output"})
        return self.engine.build_context(None, text=inst.environment["dockerfile"], build_args={"BASE": self.base},
                                         network=self.network, progress=step).image


def environment(engine, instance, *, base: str | None = None, build_network=None, progress=None) -> str:
    """One instance's environment image, as the eval makes it (built from its Dockerfile on `base`,
    or its image resolved), tagged eval/<instance_id>; its ID. instance: a dict in the instances'
    schema (checked as the eval checks it) or an Instance. For others that start from the same
    image (an agent's sandbox, a tree search): the same call gives the same ID, cached. When the
    tag named another image, progress gets {"status": "environment_changed", "change": ...} (and
    the `sandtree.evaluation` log a warning); the old image stays, tagged (envtags.py). A failure
    raises what the build or resolve raised."""
    inst = instance if isinstance(instance, Instance) else load_instances([instance])[0]
    net = list(DEFAULT_BUILD_NETWORK) if build_network is None else build_network

    def emit(_iid, status, **info):
        if progress is not None:
            progress(info["step"] if status == "building" else {"status": status, **info})
    envs = _Environments(engine, engine.resolve(base) if base is not None else None, net, emit)
    try:
        return envs.get(inst)[0]
    except InstanceError as e:
        cause = e.__cause__ or next((s["error"] for s in envs.slots.values() if "error" in s), None)
        if cause is not None:
            raise cause from None
        raise


def _predictions(insts: list[Instance], predictions, validate: str | None) -> tuple[list[Prediction], bool]:
    """The predictions to evaluate, and whether patches are skipped (validate="empty")."""
    if validate is None:
        if predictions is None:
            raise InvalidInput("give predictions (a JSONL path or a list), or validate='gold'|'empty'")
        preds = load_predictions(predictions)
        known = {i.instance_id for i in insts}
        unknown = sorted(p.instance_id for p in preds if p.instance_id not in known)
        if unknown:
            raise InvalidInput(f"predictions for instances not in the set: {' '.join(unknown[:20])}",
                               instance_ids=unknown[:20])
        return preds, False
    if validate not in VALIDATE_MODES:
        raise InvalidInput(f"validate is one of {', '.join(VALIDATE_MODES)}, not {validate!r}")
    if predictions is not None:
        raise InvalidInput("validate= evaluates the instances' own patches: give no predictions")
    if validate == "gold":
        missing = [i.instance_id for i in insts if not i.patch]
        if missing:
            raise InvalidInput(f"validate='gold': instances without a gold patch: {' '.join(missing[:20])}")
        return [Prediction(i.instance_id, "gold", i.patch) for i in insts], False
    return [Prediction(i.instance_id, "empty", "") for i in insts], True


def _final_tag(iid: str, run_id: str, model: str) -> str | None:
    tag = f"eval/{iid}/{run_id}/{model_dir(model)}"
    return tag if len(tag) <= _TAG_MAX else None


def evaluate(engine, instances, predictions=None, *, base: str | None = None, workers: int = 2,
             run_id: str, out_dir="logs/run_evaluation", report_dir=None, validate: str | None = None,
             instance_ids=None, timeout: float = DEFAULT_TIMEOUT, build_network=None, progress=None,
             cancel=None, limits: dict | None = None, unapplied: str = "error") -> dict:
    """Evaluate predictions on instances (see the module docstring); the summary, also written to
    REPORT_DIR/MODEL.RUN_ID.json. Every input is checked before anything is built or run.
    build_network: the policy of the environments' RUN steps (a Dockerfile's own --network may only
    narrow it); None: DEFAULT_BUILD_NETWORK, "off": none. limits: the test runs' resources
    (memory, cpus, pids, disk; as for a run; default: the engine's). unapplied: "error" (swebench's:
    a patch that applies nowhere has no report) or "zero" (graded: unresolved, reward 0)."""
    check_name(run_id, "run_id")
    if unapplied not in UNAPPLIED_MODES:
        raise InvalidInput(f"unapplied is one of {', '.join(UNAPPLIED_MODES)}, not {unapplied!r}", field="unapplied")
    build_network = list(DEFAULT_BUILD_NETWORK) if build_network is None else build_network
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 256:
        raise InvalidInput("workers is a whole number from 1 to 256")
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise InvalidInput("timeout is a positive number of seconds")
    limits = check_limits(limits)
    insts = load_instances(instances)
    if instance_ids is not None:
        wanted = set(instance_ids)
        unknown = sorted(wanted - {i.instance_id for i in insts})
        if unknown:
            raise InvalidInput(f"instance_ids not in the set: {' '.join(unknown[:20])}")
        insts = [i for i in insts if i.instance_id in wanted]
    for inst in insts:
        grading.check(inst)
    preds, skip_patch = _predictions(insts, predictions, validate)
    by_id = {p.instance_id: p for p in preds}
    for p in preds:
        model_dir(p.model_name_or_path)
    layout = Layout(out_dir, run_id, report_dir)
    base_id = engine.resolve(base) if base is not None else None

    started = time.monotonic()
    lock = threading.Lock()
    state = {"done": 0}
    todo, skipped, errors, kinds = [], [], {}, {}
    for inst in insts:
        pred = by_id.get(inst.instance_id)
        if pred is None:
            continue
        if pred.model_patch in ("", None) and not skip_patch:
            skipped.append((inst.instance_id, "empty_patch"))
        elif read_report(layout.report(pred), inst.instance_id) is not None:
            skipped.append((inst.instance_id, "skipped"))
        else:
            todo.append(inst)
    total = len(todo) + len(skipped)

    def emit(iid, status, finished=False, **info):
        if progress is None:
            return
        with lock:
            state["done"] += 1 if finished else 0
            ev = {"instance_id": iid, "status": status, "done": state["done"], "total": total, **info}
        progress(ev)

    for iid, status in skipped:
        emit(iid, status, finished=True)
    envs = _Environments(engine, base_id, build_network, emit)

    def one(inst: Instance) -> None:
        iid, pred = inst.instance_id, by_id[inst.instance_id]
        if cancel is not None and cancel.is_set():
            errors[iid], kinds[iid] = "cancelled", {"kind": INFRA, "reason": "cancelled"}
            emit(iid, "error", finished=True, message="cancelled", kind=INFRA, reason="cancelled")
            return
        t = time.monotonic()
        try:
            emit(iid, "building")
            env, _, change = envs.get(inst)
            emit(iid, "running", image=env)
            rep = evaluate_instance(engine, inst, pred.to_dict(), env, layout.instance_dir(pred), timeout=timeout,
                                    skip_patch=skip_patch, tag=_final_tag(iid, run_id, pred.model_name_or_path),
                                    cancel=cancel, limits=limits, unapplied=unapplied, run_id=run_id,
                                    environment_change=change)[iid]
        except InstanceError as e:
            errors[iid], kinds[iid] = str(e), {"kind": e.kind, "reason": e.reason}
            emit(iid, "error", finished=True, message=str(e), seconds=time.monotonic() - t, kind=e.kind,
                 reason=e.reason)
            return
        emit(iid, "resolved" if rep["resolved"] else "unresolved", finished=True,
             seconds=time.monotonic() - t, image=rep["sandtree"]["image"], reward=rep["sandtree"]["reward"])

    cancel = cancel if cancel is not None else threading.Event()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandtree-eval") as pool:
        futures = [pool.submit(one, inst) for inst in todo]
        try:
            for f in futures:
                f.result()
        except BaseException:                # ^C or a failing progress callback: stop the others' tests
            cancel.set()
            pool.shutdown(cancel_futures=True)
            raise
    seconds = time.monotonic() - started
    extra = {"skip_patch": skip_patch} if skip_patch else {}
    summary = summarize(insts, by_id, layout, errors=errors, skipped=[i for i, s in skipped if s == "skipped"],
                        seconds=seconds, extra=extra, error_kinds=kinds)
    summary["unapplied"] = unapplied
    summary["environment_changes"] = sorted(envs.changes, key=lambda c: c["instance_id"])
    summary["evaluated_instances"] = len(todo)
    summary["instances_per_minute"] = round(len(todo) / seconds * 60, 2) if todo and seconds > 0 else None
    if validate is not None:
        summary["validation"] = _validation(validate, insts, summary)
    summary["summary_path"] = str(write_summary(summary, layout, preds[0].model_name_or_path if preds else "none"))
    if progress is not None:
        progress({"status": "finished", "summary": summary, "done": state["done"], "total": total})
    return summary


def _validation(mode: str, insts: list[Instance], summary: dict) -> dict:
    """gold: every instance resolved; empty: none resolved (and each evaluated: an error fails too)."""
    resolved, errored = set(summary["resolved_ids"]), set(summary["error_ids"])
    ids = [i.instance_id for i in insts]
    if mode == "gold":
        failed = [i for i in ids if i not in resolved]
        why = {i: ("error: " + summary["errors"].get(i, "no report")) if i in errored else "not resolved"
               for i in failed}
    else:
        failed = [i for i in ids if i in resolved or i in errored]
        why = {i: ("error: " + summary["errors"].get(i, "no report")) if i in errored else "resolved with no patch"
               for i in failed}
    return {"mode": mode, "ok": not failed, "failed": failed, "why": why}
