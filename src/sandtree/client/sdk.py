"""The public Python API, in process: Sandtree, Image, RunResult (and aio.py, their async twins).

A thin face over engine.Engine: names and value shapes that read well to a user; no logic of its
own beyond wrapping IDs in objects.

    st = Sandtree()
    img = st.image("debian:bookworm")
    r = img.run("python3 -V")
    r.stdout, r.exit_code, r.image
"""

from __future__ import annotations

import inspect
import time
from typing import Callable

from .. import config, evaluation
from ..exploration import search, traces
from ..defaults import Limits
from ..errors import InvalidInput, RuntimeUnavailable
from .derive import image_id, method, place_rest, rows_of
from .objects import (Branch, Image, MergeResult, Sandbox, SandboxProcess, as_dicts, as_image, as_none, run_inputs, as_run_results,
                      as_sandbox)
from ..recipe.builder import RecipeBuilder
from .recipes import build_remote
from .remote import RemoteEngine

__all__ = ["Sandtree", "connect"]

_P = inspect.Parameter


def _listed(name: str):
    """adapt: the argument `name` as a list (a tuple or any iterable given)."""
    def adapt(st, args: dict, extra: dict) -> None:
        args[name] = list(args[name])
    return adapt


def _then_image(name: str):
    """call: the operation, then the Image its argument `name` named (st.tag(img, "v1") -> img)."""
    def call(st, target, args: dict, extra: dict) -> Image:
        target(**args)
        return Image(st, args[name])
    return call


def _recipe_of(st, args: dict, extra: dict) -> None:
    r = args["recipe"]
    args["recipe"] = r.recipe() if hasattr(r, "recipe") and callable(r.recipe) else r


def _build_here_or_there(st, target, args: dict, extra: dict):
    """In process, the engine builds the Recipe; through connect() it is sent as the Dockerfile it is, with its
    context (the server cannot read this machine's directory)."""
    if isinstance(st.engine, RemoteEngine):
        recipe = args.pop("recipe")
        return build_remote(st.engine, recipe, **args)
    return target(**args)


def _pool(st, target, args: dict, extra: dict) -> dict:
    """A pool of an image (pool_create, or pool_and_wait with wait=True) or of a recipe (pool_recipe: built first,
    its result pooled under a tag)."""
    image = args.pop("ref")
    if callable(getattr(image, "recipe", None)) or hasattr(image, "stages"):
        recipe = image.recipe() if callable(getattr(image, "recipe", None)) else image
        args.pop("tier")                                  # a recipe's pool is on the engine's tier
        return st.engine.pool_recipe(recipe, **args, **extra)
    if extra["tag"] is not None or extra["build_network"] is not None:
        raise InvalidInput("tag= and build_network= are for a pool of a recipe")
    if extra["wait"]:
        return st.engine.pool_and_wait(st._id(image), **args)
    return target(st._id(image), **args)


def _branch(st, target, args: dict, extra: dict) -> str:
    """Create the branch at `image` (from_), or (None) check that it exists."""
    if args["image"] is None:
        st.engine.branch_head(args["name"])
    else:
        target(**args)
    return args["name"]


def _branch_name(st, args: dict, extra: dict) -> None:
    if isinstance(args["name"], Branch):
        args["name"] = args["name"].name

@rows_of
class Sandtree:
    """An image store plus the default sandbox runtime. `home` defaults to $SANDTREE_HOME or
    ~/.local/share/sandtree."""

    def __init__(self, home: str | None = None, *, limits: Limits | None = None, warm: int = 2,
                 tier: str = "namespaces", database: str | None = None, objects: str | None = None,
                 cache_max: int | None = None, cluster: str | None = None):
        """warm: sandboxes kept started ahead of runs (namespaces and cgroups ready; a run then
        pays for its overlay, command and commit only). 0 starts every run cold. database: where
        the store's metadata lives: postgresql://... (default $SANDTREE_DATABASE_URL, else SQLite
        in `home`). objects: s3://bucket/prefix to keep layers, blobs and checkpoints in
        S3-compatible storage (default $SANDTREE_OBJECTS_URL, else only in `home`); `home` is then
        this node's layer cache, capped at cache_max bytes ($SANDTREE_CACHE_MAX, default 20 GiB).
        cluster: a Ray cluster (`auto`, HOST:PORT or ray://HOST:PORT; default $SANDTREE_CLUSTER)
        whose nodes run the runs and live sandboxes."""
        # The in-process engine loads the store and the runtime (seccomp, cgroups...); imported
        # here so that `import sandtree` and a connect()ed client never load them.
        from ..engine import Engine, dockerfile_recipe
        self._engine = Engine(home or config.default_home(), limits=limits, warm=warm, tier=tier,
                              database=database, objects=objects, cache_max=cache_max, cluster=cluster)
        self._dockerfile = dockerfile_recipe

    @property
    def engine(self):
        """The engine this API speaks to: the in-process Engine, or the RemoteEngine of connect()
        (the same operations either way: sandtree/table/)."""
        return self._engine

    @property
    def home(self) -> str:
        return self._engine.home

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> "Sandtree":
        return self

    def __exit__(self, *exc):
        self.close()

    # images
    image = method("resolve", call=lambda self, target, args, _: self._id(args["ref"]), wrap=as_image,
                   note="ref: an image ID, a unique ID prefix, a tag or a branch (ImageNotFound if none), or an Image.")
    images = method("images", wrap=lambda self, rows, _: [Image(self, r["id"]) for r in rows])
    import_image = method("import_path", wrap=as_image)
    pull = method("pull", wrap=as_image, note="Plain HTTP only for loopback registries or insecure=True.")
    bootstrap = method("bootstrap", adapt=_listed("include"), wrap=as_image,
                       note="Root only; tagged `spec` unless `tag`.")

    # builds
    def recipe(self, base: "Image | str" = "scratch", context: str | None = "."):
        """A Python recipe on `base` ("scratch", an image or ref, "docker://REF"): immutable,
        chainable, lazy; `.build(tag=...)` builds it here and returns the Image. Each method is one
        step with the text the same Dockerfile instruction has (same steps, same ID, same cache)."""
        ref = base.id if isinstance(base, Image) else base
        return RecipeBuilder(ref, context, build=lambda recipe, **kw: Image(self, self.build(recipe, **kw).image))

    def dockerfile(self, context: str | None = ".", *, file: str | None = None, text: str | None = None,
                   build_args: dict | None = None, target: str | None = None, network=None):
        """A Dockerfile as a Recipe for st.build or st.pool: `file` (default CONTEXT/Dockerfile) or
        `text`, read and its context listed and hashed now (call it again after a change)."""
        parse = getattr(self, "_dockerfile", None)
        if parse is None:
            raise RuntimeUnavailable("st.dockerfile reads a context of this machine for an in-process engine; "
                                     "through connect() use st.build_context(context, ...), which sends it")
        return parse(self._engine, context, dockerfile=file, text=text, build_args=build_args, target=target,
                     network=network)

    build = method("build", adapt=_recipe_of, call=_build_here_or_there,
                   note="recipe: a Recipe or a RecipeBuilder (st.recipe(...)); the BuildResult: .image (the ID) and "
                        ".steps (index, stage, text, line, cached, image, seconds, operation).")
    build_context = method("build_context", note="Through connect() the context is sent to the server as a tar.")

    tag = method("tag", call=_then_image("image"))
    annotate = method("annotate", note="On a server each tenant has its own annotations (the operator and admin "
                                       "tokens one set); the image's ID does not change.")

    def annotations(self, image: "Image | str") -> dict:
        """An image's annotations: {"score": float | None, "meta": {...}}."""
        return Image(self, self._id(image)).annotations()

    def beam_search(self, root: "Image | str", expand, score, beam: int = 2, depth: int = 2, *,
                    stop: float | None = None, **run_options) -> dict:
        """Beam search from `root` (exploration/search.py): expand(image_id) -> commands, each run in a fork,
        score(record) -> float annotated on its image; the best {"image", "score", "path", "nodes"}."""
        return search.beam_search(self._engine, self._id(root), expand, score, beam, depth, stop=stop,
                                  **run_options)

    def trace_export(self, root: "Image | str", fmt: str = "jsonl", out: str = "trace.jsonl",
                     max_output: int = 4096) -> dict:
        """Write the subtree under `root` as a dataset (one row per image: parent, command, exit code, outputs
        cut to max_output bytes, usage, tags, score, meta): fmt "jsonl" or "parquet"; {"file", "rows", ...}."""
        return traces.export_trace(self._engine, self._id(root), fmt, out, max_output)

    untag = method("untag", wrap=as_none)
    tags = method("tags")
    operation = method("operation")

    # operations: runs started now, awaited later
    submit = method("operations.submit_run", rename={"ref": "image"}, kwargs="run_options", adapt=run_inputs,
                    note="Returns its operation ID (see wait, cancel, operation); the options are Image.run's.")
    wait = method("operations.wait", rename={"ops": "operations"}, adapt=_listed("ops"),
                  note="Each record has a `status` (queued, running, done, failed, cancelled) and, once done, "
                       "`result` (the new image) and `outcome`.")
    cancel = method("operations.cancel", rename={"op": "operation"},
                    note="A running sandbox is killed, nothing committed.")

    # live sandboxes
    sandbox = method("sandbox_info", rename={"sid": "sandbox_id"}, wrap=as_sandbox,
                     note="A Sandbox (by ID or unique ID prefix), started by this or any other process.")
    sandboxes = method("sandbox_list", wrap=lambda self, infos, _: [Sandbox(self, d) for d in infos])
    pool = method("pool_create", rename={"ref": "image"}, extras=(
        _P("wait", _P.KEYWORD_ONLY, default=False, annotation="bool"),
        _P("tag", _P.KEYWORD_ONLY, default=None, annotation="str | None"),
        _P("build_network", _P.KEYWORD_ONLY, default=None)), ids=(), call=_pool, note=(
        "Calling it again resizes; size=0 empties it. wait: until it is full. network: the policy of its "
        "sandboxes (only runs asking for the same one use them). Returns its stats. `image` may be a recipe "
        "(st.recipe(...) or a Recipe): it is built (unchanged: cache hits), its result tagged `tag` (default "
        "pool/<hash of its steps>) and pooled; called again after a change that gives another ID, the pool rolls "
        "over: the new one fills while runs on the tag keep using the old, then the tag moves and the old pool "
        "drains. build_network: the policy of the recipe's RUN steps naming none."))

    pools = method("pool_list")
    whoami = method("whoami")
    share = method("share")
    unshare = method("unshare")
    audit = method("audit")

    # stored secrets: runs name them (secrets=["NAME"]) and never carry the value
    set_secret = method("secret_set", note="Runs, sandboxes and `secrets=[\"NAME\"]` then use it by name (the "
                                           "sandbox sees a placeholder; the egress path sends the value to `hosts` "
                                           "only). tenants: (the operator's) which tenants may use it (\"*\": all); "
                                           "tenant: (an admin) store it for that tenant.")
    secrets = method("secret_list")
    remove_secret = method("secret_remove", wrap=as_none)
    # egress tapes: a run with record=True keeps one (its ID: result.usage["tape"]); replay=ID answers from it
    tape = method("tape_show")
    # volumes: named directories that live sandboxes mount (st.start(image, volumes={"name": "/path"}))
    create_volume = method("volume_create", note="Mount it with image.start(volumes={name: \"/path\"}) "
                                                 "(\"/path:ro\" read-only); it outlives every sandbox.")
    volumes = method("volume_list")
    volume = method("volume_info")
    remove_volume = method("volume_delete", wrap=as_none, note="Refused (Conflict) while live sandboxes mount it.")
    snapshot_volume = method("volume_snapshot", wrap=as_image)
    read_volume = method("volume_read")
    write_volume = method("volume_write", wrap=as_none)
    volume_ls = method("volume_ls")
    volume_stat = method("volume_stat")
    volume_mkdir = method("volume_mkdir", wrap=as_none)
    volume_remove = method("volume_remove", wrap=as_none)
    doctor = method("doctor")
    cluster_status = method("cluster_status")
    fsck = method("fsck")
    gc = method("gc")
    remove = method("remove_image", wrap=as_none)

    def _id(self, image: "Image | str") -> str:
        return image_id(self, image)

    # evaluation
    def eval(self, instances, predictions=None, *, base: "Image | str | None" = None, workers: int = 2,
             run_id: str | None = None, out_dir: str = "logs/run_evaluation", report_dir: str | None = None,
             validate: str | None = None, instance_ids: list[str] | None = None, timeout: float = 1800,
             build_network=None, progress: Callable[[dict], None] | None = None, cancel=None,
             memory=None, cpus: float | None = None, pids: int | None = None, disk=None,
             unapplied: str = "error") -> dict:
        """Evaluate predictions on SWE-bench-style instances, the way swebench's harness does,
        each in a fork of its environment image (built from the instance's Dockerfile on `base`
        once, tagged eval/<instance_id>); instances and predictions are JSONL paths or lists of
        dicts (predictions: also a .json list/dict). Writes OUT_DIR/RUN_ID/MODEL/ID/report.json
        (swebench's, plus the final image), test_output.txt, patch.diff, and the summary
        MODEL.RUN_ID.json; returns the summary. A rerun with the same run_id skips instances
        with a report. validate="gold": the instances' own patches, all must resolve;
        "empty": no patch, none may (summary["validation"]["ok"], ["failed"]). progress(event)
        per instance step. build_network: the RUN steps' policy (default PyPI's two names).
        memory, cpus, pids, disk: each test run's resources (default: the engine's, as a run's).
        For RL: each final image is annotated with its reward (score 1.0/0.0; meta eval.resolved,
        eval.fail_to_pass.passed/failed, eval.pass_to_pass.passed/failed, ...), so trace_export
        carries it; summary["rewards"] maps instances to 1.0, 0.0 or None (an infrastructure failure,
        listed in infra_error_ids apart from agent_error_ids: mask it). unapplied="zero": a patch that
        applies nowhere is graded unresolved (reward 0, with a report) instead of an error.
        summary["environment_changes"]: eval/<id> tags a rebuild moved (old -> new, why)."""
        return evaluation.evaluate(
            self._engine, instances, predictions, base=self._id(base) if base is not None else None,
            workers=workers, run_id=run_id or time.strftime("run-%Y%m%d-%H%M%S"), out_dir=out_dir,
            report_dir=report_dir, validate=validate, instance_ids=instance_ids, timeout=timeout,
            build_network=build_network, progress=progress, cancel=cancel,
            limits={"memory": memory, "cpus": cpus, "pids": pids, "disk": disk}, unapplied=unapplied)

    # diff and merge
    diff = method("diff", wrap=as_dicts)
    patch = method("patch")
    merge = method("merge", wrap=lambda self, res, _: MergeResult(
        Image(self, res["image"]) if res["image"] else None, Image(self, res["base"]) if res["base"] else None,
        res["conflicts"], res.get("ignored", [])), note=(
        "base=None: the nearest common ancestor from lineage. Conflicts make no image unless strategy is \"ours\", "
        "\"theirs\" or \"markers\": then MergeConflict is raised (its .details[\"conflicts\"] lists them), or with "
        "on_conflict=\"return\" a MergeResult with image None. ignore: globs that never conflict, ours taken there "
        "(None: __pycache__/, *.pyc, .pytest_cache/; [] for none)."))
    merge_preview = method("merge_preview")

    # branches
    branch = method("branch_create", rename={"image": "from_"}, call=_branch, wrap=lambda self, name, _: Branch(self, name),
                    note="A Branch; from_ None: the existing branch `name` (force: move an existing one).")
    branches = method("branches", wrap=lambda self, heads, _: {name: Branch(self, name) for name in heads})
    rollback = method("rollback", rename={"name": "branch"}, ids=("to",), adapt=_branch_name, wrap=as_image)

    # many runs from one image
    map = method("fork", rename={"ref": "image"}, kwargs="run_options", adapt=run_inputs, wrap=as_run_results,
                 note="Every command is checked before any runs; the options are Image.run's, less the per-run "
                      "callbacks.")

    # live sandboxes from an image's live state (Image.fork_live)
    fork_from = method("fork_from", rename={"ref": "image"}, wrap=lambda self, infos, _: [Sandbox(self, i) for i in infos],
                       note="image: one whose info()['live'] is true (a live fork's or resumed hibernation's commit).")

    # lineage
    common_ancestor = method("common_ancestor", wrap=lambda self, found, _: Image(self, found) if found else None)
    path = method("lineage_path", wrap=lambda self, ids, _: [Image(self, i) for i in ids])

    # bundles
    bundle = method("bundle_create", adapt=lambda self, args, _: args.update(images=[self._id(i) for i in args["images"]]))
    import_bundle = method("bundle_import")


# a row on the SDK that no method above (or of Image, Sandbox, SandboxProcess, Branch) stands for: Sandtree's, as it is
place_rest(Sandtree, (Sandtree, Image, Sandbox, SandboxProcess, Branch))


def connect(url: str, *, token: str | None = None) -> Sandtree:
    """The same API, served by a `sandtree serve` at `url` instead of an in-process engine."""
    st = Sandtree.__new__(Sandtree)
    st._engine = RemoteEngine(url, token)
    return st
