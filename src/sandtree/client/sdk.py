"""The public Python API, in process: Sandtree, Image, RunResult (and aio.py, their async twins).

A thin face over engine.Engine: names and value shapes that read well to a user; no logic of its
own beyond wrapping IDs in objects.

    st = Sandtree()
    img = st.image("debian:bookworm")
    r = img.run("python3 -V")
    r.stdout, r.exit_code, r.image
"""

from __future__ import annotations

import time
from typing import Callable

from .. import config, evaluation
from ..exploration import search, traces
from .. import defaults as D
from ..defaults import GC_GRACE, GC_RETENTION, Limits
from ..errors import InvalidInput, RuntimeUnavailable
from .inputs import files_arg
from .objects import Branch, Image, MergeResult, RunResult, Sandbox
from ..recipe.builder import RecipeBuilder
from .recipes import build_remote
from .remote import RemoteEngine

__all__ = ["Sandtree", "connect"]

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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # images
    def image(self, ref: "str | Image") -> "Image":
        """An image by ID, unique ID prefix, tag or branch (ImageNotFound if none)."""
        return Image(self, self._id(ref))

    def images(self) -> list["Image"]:
        return [Image(self, r["id"]) for r in self._engine.images()]

    def import_image(self, path: str, *, tag: str | None = None,
                     progress: Callable[[int], None] | None = None) -> "Image":
        """Import a directory, a tar (gz/zst), an OCI layout or a docker-archive tar."""
        return Image(self, self._engine.import_path(path, tag=tag, progress=progress))

    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False) -> "Image":
        """Pull docker://HOST/NAME:TAG from an OCI registry (digests verified); plain HTTP only for
        loopback registries or insecure=True."""
        return Image(self, self._engine.pull(reference, tag=tag, insecure=insecure))

    def bootstrap(self, spec: str = "debian:bookworm", *, include: list[str] = (), tag: str | None = None,
                  log: Callable[[str], None] | None = None) -> "Image":
        """Build a Debian base image with debootstrap (root only); tagged `spec` unless `tag`."""
        return Image(self, self._engine.bootstrap(spec, include=list(include), tag=tag, log=log))

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

    def build(self, recipe, *, tag: str | None = None, no_cache: bool = False, no_cache_filter=(), network=None,
              progress: Callable[[dict], None] | None = None):
        """Build a Recipe (or a RecipeBuilder) step by step, each step cached on the image DAG;
        the BuildResult: .image (the ID) and .steps (index, stage, text, line, cached, image,
        seconds, operation). progress(event) gets {step, total, text, status, output?}."""
        recipe = recipe.recipe() if hasattr(recipe, "recipe") and callable(recipe.recipe) else recipe
        if isinstance(self._engine, RemoteEngine):      # sent as the Dockerfile it is, with its context
            return build_remote(self._engine, recipe, tag=tag, no_cache=no_cache, no_cache_filter=no_cache_filter,
                                network=network, progress=progress)
        return self._engine.build(recipe, tag=tag, no_cache=no_cache, no_cache_filter=no_cache_filter,
                                  network=network, progress=progress)

    def build_context(self, context: str | None = ".", *, dockerfile: str = "Dockerfile", text: str | None = None,
                      tag: str | None = None, build_args: dict | None = None, target: str | None = None,
                      network=None, no_cache: bool = False, no_cache_filter=(),
                      progress: Callable[[dict], None] | None = None):
        """Build a Dockerfile (`text`, or the file `dockerfile` in the context) with a build
        context (a directory or a tar; through connect() it is sent to the server as a tar); the
        BuildResult. progress(event) as for build."""
        return self._engine.build_context(context, dockerfile=dockerfile, text=text, tag=tag, build_args=build_args,
                                          target=target, network=network, no_cache=no_cache,
                                          no_cache_filter=no_cache_filter, progress=progress)

    def tag(self, image: "Image | str", name: str) -> "Image":
        image_id = self._id(image)
        self._engine.tag(image_id, name)
        return Image(self, image_id)

    def annotate(self, image: "Image | str", score: float | None = None, **meta) -> dict:
        """Merge a score and metadata (key=JSON scalar; None removes a key) into an image's annotations, like
        git notes (the image's ID does not change); returns {"score": ..., "meta": {...}}. On a server each
        tenant has its own annotations (the operator and admin tokens one set)."""
        return self._engine.annotate(self._id(image), score, meta or None)

    def annotations(self, image: "Image | str") -> dict:
        """An image's annotations: {"score": float | None, "meta": {...}}."""
        return self._engine.image_info(self._id(image))["annotations"]

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

    def untag(self, name: str) -> None:
        self._engine.untag(name)

    def tags(self) -> dict[str, str]:
        return self._engine.tags()

    def operation(self, op: str) -> dict:
        return self._engine.operation(op)

    # operations: runs started now, awaited later
    def submit(self, image: "Image | str", command, **run_options) -> str:
        """Start a run in the background; returns its operation ID (see wait, cancel, operation)."""
        return self._engine.operations.submit_run(self._id(image), command, **run_options)

    def wait(self, operations: list[str], timeout: float | None = None) -> list[dict]:
        """Wait for operations; their records with a `status` (queued, running, done, failed,
        cancelled) and, once done, `result` (the new image) and `outcome`."""
        return self._engine.operations.wait(list(operations), timeout)

    def cancel(self, operation: str) -> dict:
        """Cancel a queued or running operation; a running sandbox is killed, nothing committed."""
        return self._engine.operations.cancel(operation)

    # live sandboxes
    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A live sandbox by id (or unique id prefix), started by this or any other process."""
        return Sandbox(self, self._engine.sandbox_info(sandbox_id))

    def sandboxes(self, *, all: bool = False, labels: dict | None = None) -> list["Sandbox"]:
        """Running live sandboxes (all=True: stopped and expired ones too; labels: only those
        carrying every one of these)."""
        return [Sandbox(self, d) for d in self._engine.sandbox_list(all=all, labels=labels)]

    def pool(self, image: "Image | str", size: int = 4, *, timeout: float | None = None, memory=None,
             pids: int | None = None, cpus: float | None = None, disk=None, output=None,
             hostname: str = D.HOSTNAME, wait: bool = False, network=None, tag: str | None = None,
             build_network=None, tier: str | None = None) -> dict:
        """Keep `size` sandboxes of `image` started (a golden environment): runs on it with the
        same memory/pids/cpus/disk use one and skip setup; refilled in the background. Calling
        it again resizes; size=0 empties it. wait: until it is full. network: the policy of its
        sandboxes (only runs asking for the same one use them). tier: its sandboxes' (default the
        engine's; only runs on that tier use them). Returns its stats.
        `image` may be a recipe (st.recipe(...) or a Recipe): it is built (unchanged: cache hits),
        its result tagged `tag` (default pool/<hash of its steps>) and pooled; called again after a
        change that gives another ID, the pool rolls over: the new one fills while runs on the tag
        keep using the old, then the tag moves and the old pool drains (stats: previous,
        rolled_over seconds). build_network: the policy of the recipe's RUN steps naming none."""
        if callable(getattr(image, "recipe", None)) or hasattr(image, "stages"):
            recipe = image.recipe() if callable(getattr(image, "recipe", None)) else image
            return self._engine.pool_recipe(recipe, size, tag=tag, wait=wait, build_network=build_network,
                                            timeout=timeout, memory=memory, pids=pids, cpus=cpus, disk=disk,
                                            output=output, hostname=hostname, network=network)
        if tag is not None or build_network is not None:
            raise InvalidInput("tag= and build_network= are for a pool of a recipe")
        stats = self._engine.pool_create(self._id(image), size, timeout=timeout, memory=memory, pids=pids,
                                         cpus=cpus, disk=disk, output=output, hostname=hostname, network=network,
                                         **({"tier": tier} if tier is not None else {}))
        if wait:
            self._engine.pool_wait(stats["image"])
            stats = next(p for p in self._engine.pool_list() if p["image"] == stats["image"])
        return stats

    def pools(self) -> list[dict]:
        """The warm pools: image, size, ready, served, misses."""
        return self._engine.pool_list()

    def whoami(self) -> dict:
        """The caller's tenant, scopes and run limits (in-process: "local", every scope)."""
        return self._engine.whoami()

    def share(self, image) -> dict:
        """Make an image this tenant owns visible to every tenant (by its ID); unshare undoes it."""
        return self._engine.share(self._id(image))

    def unshare(self, image) -> dict:
        return self._engine.unshare(self._id(image))

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        """Who ran what on which image, newest first (a tenant sees its own records)."""
        return self._engine.audit(tenant=tenant, limit=limit)

    # stored secrets: runs name them (secrets=["NAME"]) and never carry the value
    def set_secret(self, name: str, value: str, *, hosts: list[str] | str, tenants: list[str] | None = None,
                   tenant: str | None = None) -> dict:
        """Store a secret once; runs, sandboxes and `secrets=["NAME"]` then use it by name (the
        sandbox sees a placeholder; the egress path sends the value to `hosts` only). The value is
        kept outside the store's database and never shown again. tenants: (the operator's) which
        tenants may use it ("*": all); tenant: (an admin) store it for that tenant."""
        return self._engine.secret_set(name, value, hosts, tenants=tenants, tenant=tenant)

    def secrets(self, *, tenant: str | None = None) -> list[dict]:
        """The stored secrets this caller may use: name, hosts, owner, times (never a value)."""
        return self._engine.secret_list(tenant=tenant)

    def remove_secret(self, name: str, *, tenant: str | None = None) -> None:
        self._engine.secret_remove(name, tenant=tenant)

    def doctor(self) -> list[dict]:
        """The isolation tiers this host can run, and why not the others."""
        return self._engine.doctor()

    def cluster_status(self) -> dict:
        """Where runs go: mode "local" (this process) or "cluster" (each Ray node: CPUs, runs in flight, sandboxes)."""
        return self._engine.cluster_status()

    def fsck(self, *, verify_content: bool = True) -> dict:
        return self._engine.fsck(verify_content=verify_content)

    def gc(self, *, retention: float = GC_RETENTION, grace: float = GC_GRACE) -> dict:
        """Remove untagged images older than `retention` seconds (and what only they used)."""
        return self._engine.gc(retention=retention, grace=grace)

    def remove(self, image: "Image | str", *, force: bool = False) -> None:
        self._engine.remove_image(self._id(image), force=force)

    def _id(self, image: "Image | str") -> str:
        return image.id if isinstance(image, Image) else self._engine.resolve(image)

    # evaluation
    def eval(self, instances, predictions=None, *, base: "Image | str | None" = None, workers: int = 2,
             run_id: str | None = None, out_dir: str = "logs/run_evaluation", report_dir: str | None = None,
             validate: str | None = None, instance_ids: list[str] | None = None, timeout: float = 1800,
             build_network=None, progress: Callable[[dict], None] | None = None, cancel=None,
             memory=None, cpus: float | None = None, pids: int | None = None, disk=None) -> dict:
        """Evaluate predictions on SWE-bench-style instances, the way swebench's harness does,
        each in a fork of its environment image (built from the instance's Dockerfile on `base`
        once, tagged eval/<instance_id>); instances and predictions are JSONL paths or lists of
        dicts (predictions: also a .json list/dict). Writes OUT_DIR/RUN_ID/MODEL/ID/report.json
        (swebench's, plus the final image), test_output.txt, patch.diff, and the summary
        MODEL.RUN_ID.json; returns the summary. A rerun with the same run_id skips instances
        with a report. validate="gold": the instances' own patches, all must resolve;
        "empty": no patch, none may (summary["validation"]["ok"], ["failed"]). progress(event)
        per instance step. build_network: the RUN steps' policy (default PyPI's two names).
        memory, cpus, pids, disk: each test run's resources (default: the engine's, as a run's)."""
        return evaluation.evaluate(
            self._engine, instances, predictions, base=self._id(base) if base is not None else None,
            workers=workers, run_id=run_id or time.strftime("run-%Y%m%d-%H%M%S"), out_dir=out_dir,
            report_dir=report_dir, validate=validate, instance_ids=instance_ids, timeout=timeout,
            build_network=build_network, progress=progress, cancel=cancel,
            limits={"memory": memory, "cpus": cpus, "pids": pids, "disk": disk})

    # diff and merge
    def diff(self, a: "Image | str", b: "Image | str") -> list[dict]:
        """What changed from a to b: added, removed, modified, type_changed, metadata_changed."""
        return [c.to_dict() for c in self._engine.diff(self._id(a), self._id(b))]

    def patch(self, a: "Image | str", b: "Image | str") -> str:
        """The unified text patch from a to b (binary files are named, not shown)."""
        return self._engine.patch(self._id(a), self._id(b))

    def merge(self, base: "Image | str | None", ours: "Image | str", theirs: "Image | str", *,
              strategy: str | None = None, ignore: list[str] | None = None,
              on_conflict: str = "raise") -> "MergeResult":
        """Three-way merge. base=None: the nearest common ancestor from lineage. Conflicts make no
        image unless strategy is "ours", "theirs" or "markers": then MergeConflict is raised (its
        .details["conflicts"] lists them), or with on_conflict="return" a result with image None.
        ignore: globs that never conflict, ours taken there (None: __pycache__/, *.pyc,
        .pytest_cache/; [] for none)."""
        res = self._engine.merge(self._id(base) if base is not None else None, self._id(ours),
                                 self._id(theirs), strategy=strategy, ignore=ignore, on_conflict=on_conflict)
        return MergeResult(Image(self, res["image"]) if res["image"] else None,
                           Image(self, res["base"]) if res["base"] else None, res["conflicts"],
                           res.get("ignored", []))

    # branches
    def branch(self, name: str, from_: "Image | str | None" = None, *, force: bool = False) -> "Branch":
        """The branch `name`; with from_, create it there (force: move an existing one)."""
        if from_ is not None:
            self._engine.branch_create(name, self._id(from_), force=force)
        else:
            self._engine.branch_head(name)
        return Branch(self, name)

    def branches(self) -> dict[str, "Branch"]:
        return {name: Branch(self, name) for name in self._engine.branches()}

    def rollback(self, branch: "Branch | str", *, to: "Image | str | None" = None,
                 steps: int | None = None) -> "Image":
        """Move a branch back to an ancestor (to=) or N moves back in its history (steps=)."""
        name = branch.name if isinstance(branch, Branch) else branch
        target = self._engine.rollback(name, to=self._id(to) if to is not None else None, steps=steps)
        return Image(self, target)

    # many runs from one image
    def map(self, image: "Image | str", commands: list, *, parallel: int = 4, **run_options) -> list["RunResult"]:
        """Run each command from the same image concurrently (Engine.fork: one operation each,
        every command checked before any runs); results in the commands' order. The options
        are Image.run's, less the per-run callbacks."""
        if "files" in run_options:
            run_options["files"] = files_arg(run_options["files"])
        recs = self._engine.fork(self._id(image), commands, parallel=parallel, **run_options)
        return [RunResult.from_record(self, r) for r in recs]

    # lineage
    def common_ancestor(self, a: "Image | str", b: "Image | str") -> "Image | None":
        found = self._engine.common_ancestor(self._id(a), self._id(b))
        return Image(self, found) if found else None

    def path(self, a: "Image | str", b: "Image | str") -> list["Image"]:
        """The images from a to b along lineage edges."""
        return [Image(self, i) for i in self._engine.lineage_path(self._id(a), self._id(b))]

    # bundles
    def bundle(self, path: str, images: list, *, with_ancestry: bool = False) -> dict:
        """Write images (and, with_ancestry, every ancestor) into one verifiable file."""
        return self._engine.bundle_create(path, [self._id(i) for i in images], with_ancestry=with_ancestry)

    def import_bundle(self, path: str) -> dict:
        """Import a bundle: same image IDs and lineage as where it was made; verified first."""
        return self._engine.bundle_import(path)


def connect(url: str, *, token: str | None = None) -> Sandtree:
    """The same API, served by a `sandtree serve` at `url` instead of an in-process engine."""
    st = Sandtree.__new__(Sandtree)
    st._engine = RemoteEngine(url, token)
    return st
