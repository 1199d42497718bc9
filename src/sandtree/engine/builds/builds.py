"""Builds (a mixin of engine.Engine): a Recipe executed as a chain of engine operations,
each step one operation on the previous step's image, cached on the image DAG.

From resolves a ref, pulls docker:// (cached by reference: no pull again unless no_cache), or is
scratch (the empty image); Run is a run (the image's config gives env/cwd/user; ARG variables the
config's ENV does not set are added); Copy writes context files or another stage's files and commits
them (builds/copies.py); Configure writes the image's config (images/rundefaults.py reads it). Every step's
result is an image whose lineage edge is labelled by the step's text; a step's key (builds/cache.py)
finds a result made before, and then nothing runs. Only the stages the target needs are built. A
failed RUN raises BuildFailed naming its line, with its stderr's tail, and tags nothing.

Reproducible by default (docs/builds.md): a RUN sees SOURCE_DATE_EPOCH (the image's ENV, the step's
ARG, the build's argument, else D.BUILD_SOURCE_DATE_EPOCH; "" turns it off) and every step's commit
clamps the mtimes it wrote to it (runs/commit.clamp_mtimes). IDs never cover times; what a later
step writes of them, and what tools write when told the epoch (hash-based .pyc), they do.

Who builds is a guard (build_as): the operator's (OperatorGuard: every image, every hit, any
network) or a tenant's view (tenancy/view.py), which resolves and pulls as that tenant, says which
cache hits it may use (build_hit), checks each RUN's network against its grant before anything
runs, caps RUN steps by its limits and claims the operations the build makes (so their results
are its own).
"""

from __future__ import annotations

import posixpath
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ... import defaults as D
from ...errors import BuildFailed, InvalidInput, SandtreeError
from ...network.policy import Policy
from ...recipe.texts import config_text
from ...store.imageconfig import CONFIG_PATH, ImageConfig
from ...store.names import check_tag
from ...store.objects import DIR
from . import cache as buildcache
from .. import parts             # the recipe's steps and the copies: loaded on a build's first use (parts.py)
from ..images.edits import commit_edit
from ..images.rundefaults import image_config, resolve_user
from ...values import network_hint
from ..images.scratch import scratch_image

if TYPE_CHECKING:
    from ...recipe.steps import Configure, Copy, From, Recipe, Run

__all__ = ["BuildOps", "BuildResult", "StepResult", "STDERR_TAIL", "EPOCH", "OperatorGuard"]

STDERR_TAIL = 2000         # bytes of a failed RUN's stderr in its error
EPOCH = "SOURCE_DATE_EPOCH"   # the reproducible-builds convention: what a step's tools and commit take as "now"


@dataclass(frozen=True)
class StepResult:
    index: int                 # 1-based over the whole build (what progress shows)
    stage: str                 # the stage's name, or its index as text
    text: str
    line: int
    cached: bool
    image: str
    seconds: float
    operation: str | None      # the operation that made it (None: cached, or a From)


@dataclass(frozen=True)
class BuildResult:
    image: str
    steps: tuple[StepResult, ...]

    def to_dict(self) -> dict:
        return {"image": self.image, "steps": [s.__dict__ for s in self.steps]}


def _needed(recipe: Recipe, target: int) -> set[int]:
    """The stages the target depends on (FROM stage:X, COPY --from=X), the target included."""
    names = {s.name: i for i, s in enumerate(recipe.stages) if s.name}
    need, todo = set(), [target]
    while todo:
        i = todo.pop()
        if i in need:
            continue
        need.add(i)
        for step in recipe.stages[i].steps:
            ref = step.base[6:] if isinstance(step, parts.steps.From) and step.base.startswith("stage:") else \
                step.from_stage if isinstance(step, parts.steps.Copy) else None
            try:
                j = _stage_index(ref, names, i) if ref is not None else None
            except InvalidInput as exc:
                raise InvalidInput(f"{_at(step)}: {exc.message}", line=step.line) from None
            if j is not None:
                todo.append(j)
    return need


def _at(step) -> str:
    """How an error names a step: its Dockerfile line and instruction (a builder's step: no line)."""
    return f"line {step.line}: {step.text}" if step.line else step.text


def _stage_index(ref: str, names: dict, before: int) -> int | None:
    """The earlier stage `ref` names (a name or an index), None if it names none (an image)."""
    j = names.get(ref)
    if j is None and ref.isdigit():
        j = int(ref)
    if j is not None and j >= before:
        raise InvalidInput(f"stage {ref!r} is not an earlier stage")
    return j


def _epoch(step, cfg: ImageConfig, recipe: Recipe) -> int | None:
    """The step's SOURCE_DATE_EPOCH (seconds; None: not reproducible): the image's ENV, else the
    step's ARG, else the build's argument, else D.BUILD_SOURCE_DATE_EPOCH. Set to "" it is off."""
    for pairs in (cfg.env, getattr(step, "env", ()), recipe.args):
        value = dict(pairs).get(EPOCH)
        if value is not None:
            return _epoch_value(value, _at(step), step.line)
    return D.BUILD_SOURCE_DATE_EPOCH


def _epoch_value(value: str | None, where: str, line: int = 0) -> int | None:
    """A SOURCE_DATE_EPOCH value as seconds (None: not given, or "" for off); InvalidInput else."""
    if value is None or not value.strip():
        return None
    try:
        epoch = int(value)
    except ValueError:
        epoch = -1
    if not 0 <= epoch < 1 << 40:
        raise InvalidInput(f"{where}: {EPOCH} must be seconds since 1970 (an integer), not {value[:40]!r}",
                           **({"line": line} if line else {}))
    return epoch


def _with_epoch(env: tuple, recipe: Recipe) -> tuple:
    """A RUN's build-time variables with SOURCE_DATE_EPOCH added when its ARGs do not give it:
    the build's argument, else the default; none when that is "" (off). The image's ENV, when it
    sets one, wins in the run (tools that honour it: py_compile's hash-based .pyc, wheel and zip
    times, gzip/tar when asked, compilers' __DATE__)."""
    if EPOCH in dict(env):
        return env
    given = dict(recipe.args).get(EPOCH)
    if given is not None and not given.strip():
        return env
    return tuple(env) + ((EPOCH, given.strip() if given is not None else str(D.BUILD_SOURCE_DATE_EPOCH)),)


class OperatorGuard:
    """The operator's build (in process, an admin token): every image and cache hit, any network.
    A tenant's view has the same methods with its own rules (tenancy/view.py)."""

    build_principal = buildcache.OPERATOR    # whose build cache rows it hits and writes (a tenant: its name)

    def __init__(self, resolve, pull):
        self.resolve, self.pull = resolve, pull          # the engine's own (every image, any pull)

    def build_hit(self, image: str, kind: str) -> bool:
        """May the build use this cached result of a step of `kind` (from, run, copy, configure)?"""
        return True

    def check_network(self, value, image) -> None:
        """Refuse (Forbidden) a RUN step's network policy beyond what the builder may ask."""

    def build_run_options(self) -> dict:
        """A RUN step's resource options (a tenant: within its limits)."""
        return {}

    def claim(self, op: str) -> None:
        """An operation the build is about to make (a tenant: its result is then its own)."""


@dataclass
class _Build:
    recipe: Recipe
    guard: object
    names: dict
    network: object
    progress: object
    results: dict


class BuildOps:
    """Mixed into engine.Engine (store, committer, records, resolve, pull, run_operation, tag)."""

    def image_config(self, ref: str) -> ImageConfig:
        return image_config(self.store, self.resolve(ref))

    def configure(self, ref: str, config: ImageConfig, *, tag: str | None = None) -> str:
        if not isinstance(config, ImageConfig):
            raise InvalidInput("config must be an ImageConfig (sandtree.ImageConfig)")
        if tag is not None:
            check_tag(tag)
        source = self.resolve(ref)
        old = image_config(self.store, source)
        text = "; ".join(config_text(f, getattr(config, f)) for f in ("env", "cwd", "user", "entrypoint", "cmd",
                                                                       "expose", "labels")
                         if getattr(config, f) != getattr(old, f) and getattr(config, f) not in (None, ()))
        image = self._configure(source, config, text or "CONFIG")
        if tag is not None:
            self.store.tag(image, tag)
        return image

    def _configure(self, source: str, config: ImageConfig, text: str, also=None, op: str | None = None,
                   mtime_clamp: int | None = None) -> str:
        def fill(up):
            if config.is_empty():
                if up.find(CONFIG_PATH) is not None:
                    up.remove(CONFIG_PATH)
            else:
                up.dir("/.sandtree", mode=0o755, uid=0, gid=0, meta=True)
                up.file(CONFIG_PATH, lambda out: out.write(config.to_json()), mode=0o644, uid=0, gid=0)
            found = up.find(config.cwd) if config.cwd else None
            if config.cwd and (found is None or found[1].kind != DIR):
                up.dir(config.cwd)                 # WORKDIR makes its directory (as Docker)
        return commit_edit(self, source, fill, {"command": text, "config": True}, kind="configure", also=also,
                           op=op, mtime_clamp=mtime_clamp)[0]

    # ---- the build ------------------------------------------------------------------------------
    def build(self, recipe: Recipe, *, tag: str | None = None, no_cache: bool = False, no_cache_filter=(),
              network=None, progress=None) -> BuildResult:
        return self.build_as(recipe, None, tag=tag, no_cache=no_cache, no_cache_filter=no_cache_filter,
                             network=network, progress=progress)

    def build_as(self, recipe: Recipe, guard, *, tag: str | None = None, no_cache: bool = False,
                 no_cache_filter=(), network=None, progress=None) -> BuildResult:
        """Build `recipe` as `guard` builds (None: the operator); tag its target's image. Not an
        operation of the table: build's and the tenant view's way in. no_cache: every step runs
        again (a deterministic step then gives the same ID); no_cache_filter: stage names (or
        indexes as text) and step numbers (ints, 1-based as progress counts) that run again. network: the policy of RUN
        steps that name none (default: no network). progress(event): see the module doc."""
        if not isinstance(recipe, parts.steps.Recipe) or not recipe.stages:
            raise InvalidInput("build takes a Recipe with at least one stage")
        if tag is not None:
            check_tag(tag)
        target = recipe.target % len(recipe.stages) if -len(recipe.stages) <= recipe.target < len(recipe.stages) \
            else None
        if target is None:
            raise InvalidInput(f"no stage {recipe.target} to build")
        need = _needed(recipe, target)
        guard = guard if guard is not None else OperatorGuard(self.resolve, self.pull)
        _epoch_value(dict(recipe.args).get(EPOCH), "the build argument")
        for i in sorted(need):               # every RUN's network (and epoch), before anything runs
            for step in recipe.stages[i].steps:
                given = dict(step.env).get(EPOCH) if isinstance(step, parts.steps.Run) else \
                    dict(dict(step.changes).get("env", ())).get(EPOCH) if isinstance(step, parts.steps.Configure) \
                    else None
                _epoch_value(given, _at(step), step.line)
                if isinstance(step, parts.steps.Run):
                    try:
                        guard.check_network(step.network if step.network is not None else network, None)
                    except SandtreeError as exc:
                        raise type(exc)(f"{_at(step)}: {exc.message}", **{**exc.details, "line": step.line}) \
                            from None
        b = _Build(recipe, guard, {s.name: i for i, s in enumerate(recipe.stages) if s.name}, network, progress, {})
        filt = set(no_cache_filter or ())
        total = sum(len(s.steps) for i, s in enumerate(recipe.stages) if i in need)
        results = b.results
        done: list[StepResult] = []
        with self.store.using():
            for si, stage in enumerate(recipe.stages):
                if si not in need:
                    continue
                label = stage.name or str(si)
                if not stage.steps or not isinstance(stage.steps[0], parts.steps.From):
                    raise InvalidInput(f"stage {label} does not start with FROM")
                image = None
                for step in stage.steps:
                    n = len(done) + 1
                    fresh = no_cache or label in filt or str(si) in filt or n in filt
                    done.append(self._step(b, step, n, total, label, image, si, fresh))
                    image = done[-1].image
                results[si] = image
        image = results[target]
        if tag is not None:
            self.store.tag(image, tag)
        return BuildResult(image, tuple(done))

    def _step(self, b: _Build, step, n, total, label, image, si, fresh) -> StepResult:
        t0 = time.perf_counter()

        def emit(status, **more):
            if b.progress is not None:
                b.progress({"step": n, "total": total, "stage": label, "text": step.text, "line": step.line,
                            "status": status, **more})

        def finish(img, cached, op):
            r = StepResult(n, label, step.text, step.line, cached, img, round(time.perf_counter() - t0, 6), op)
            emit("cached" if cached else "done", image=img, seconds=r.seconds)
            return r

        try:
            if isinstance(step, parts.steps.From):
                return self._from(b, step, si, fresh, finish, emit)
            if image is None:
                raise InvalidInput("no FROM before it")
            key, hermetic, run = self._plan(b, step, image, si)
            kind = "run" if isinstance(step, parts.steps.Run) else \
                "copy" if isinstance(step, parts.steps.Copy) else "configure"
            who = b.guard.build_principal
            hit = None if fresh else buildcache.lookup(self.store, key, principal=who,
                                                       visible=lambda img: b.guard.build_hit(img, kind))
            if hit is not None:
                return finish(hit, True, None)
            emit("running")
            op = uuid.uuid4().hex
            b.guard.claim(op)
            img = run(buildcache.Entry(key, op, hermetic, who), op, emit)
        except BuildFailed:
            emit("failed")
            raise
        except SandtreeError as exc:
            emit("failed", error=exc.message)
            if "line" in exc.details:
                raise
            # every error of a step names its line and instruction (the recipe's, not the engine's words)
            details = {**exc.details, "line": step.line}
            raise type(exc)(f"{_at(step)}: {exc.message}", **details) from None
        except Exception as exc:
            emit("failed", error=str(exc))
            raise
        return finish(img, False, op)

    def _from(self, b: _Build, step: From, si, fresh, finish, emit) -> StepResult:
        base = step.base
        if base.startswith("stage:"):
            j = _stage_index(base[6:], b.names, si)
            if j is None or j not in b.results:
                raise InvalidInput(f"{_at(step)}: no stage {base[6:]!r} before it", line=step.line)
            return finish(b.results[j], True, None)
        if base == "scratch":
            return finish(scratch_image(self.store, self._adopt), True, None)
        if base.startswith("docker://"):
            key = buildcache.step_key("", f"FROM {base}")
            who = b.guard.build_principal
            hit = None if fresh else buildcache.lookup(self.store, key, principal=who,
                                                       visible=lambda img: b.guard.build_hit(img, "from"))
            if hit is not None:
                return finish(hit, True, None)
            emit("running")
            img = b.guard.pull(base)
            with self.store.db.tx() as con:
                buildcache.put(con, key, img, None, False, who)
            return finish(img, False, None)
        return finish(b.guard.resolve(base), True, None)

    def _plan(self, b: _Build, step, image: str, si):
        """(cache key, hermetic, run(put, box, emit) -> (image, op)) of a non-FROM step."""
        opts = b.guard.build_run_options()          # (a tenant's caps; its token's tier, if one is forced)
        tier = opts.get("tier") or self.default_tier
        # (the image's config, which may set the epoch too, is read only when the step runs: a hit
        # costs a lookup; the parent's ID in the key covers its config)
        recipe = b.recipe
        if isinstance(step, parts.steps.Run):
            policy = Policy.from_value(step.network if step.network is not None else b.network)
            env = _with_epoch(step.env, recipe)
            key = buildcache.step_key(image, step.text, network=policy, tier=tier, env=env)
            return key, policy is None, lambda put, op, emit: self._run_step(step, image, policy, put, op, emit, opts,
                                                                          env, recipe)
        if isinstance(step, parts.steps.Copy):
            src = None
            if step.from_stage is not None:
                j = _stage_index(step.from_stage, b.names, si)
                src = b.results[j] if j is not None else b.guard.resolve(step.from_stage)
            extra = {"from": src, "paths": list(step.paths), "chown": step.chown, "chmod": step.chmod,
                     "unpack": step.unpack, "dir": step.dest_is_dir}
            key = buildcache.step_key(image, step.text, files=step.sources, tier=tier, extra=extra)
            return key, True, lambda put, op, emit: self._copy_step(recipe, step, image, src, put, op)
        if isinstance(step, parts.steps.Configure):
            key = buildcache.step_key(image, step.text, extra={"changes": [[k, v] for k, v in step.changes]})
            return key, True, lambda put, op, emit: self._configure(
                image, self._configured(image, step), step.text, also=put, op=op,
                mtime_clamp=_epoch(step, image_config(self.store, image), recipe))
        raise InvalidInput(f"unknown step {type(step).__name__}")

    def _run_step(self, step: Run, image: str, policy, put, op: str, emit, opts: dict, env: tuple,
                  recipe: Recipe) -> str:
        cfg = image_config(self.store, image)
        env = {k: v for k, v in env if k not in dict(cfg.env)}   # ENV wins over ARG (Docker)
        rec = self.run_operation(image, step.command, op_id=op, env=env, network=policy, step=step.text, in_tx=put,
                                 on_output=lambda s, b: emit("running", stream=s, output=b),
                                 mtime_clamp=_epoch(step, cfg, recipe), **opts)
        if rec.exit_code != 0 or rec.signal is not None or rec.timed_out:
            # the step's own words: the tail of its stdout and of its stderr (a build's log is what users read)
            tail = rec.stderr[-STDERR_TAIL:].decode("utf-8", "replace")
            out_tail = rec.stdout[-STDERR_TAIL:].decode("utf-8", "replace")
            why = "timed out" if rec.timed_out else f"exit code {rec.exit_code}" if rec.signal is None \
                else f"signal {rec.signal}"
            hint = network_hint(rec.stdout, rec.stderr) if policy is None else None
            text = f"{_at(step)}: {why}" + (f"\n--- stdout (end)\n{out_tail.rstrip()}" if out_tail else "") \
                + (f"\n--- stderr (end)\n{tail.rstrip()}" if tail else "") + (f"\n{hint}" if hint else "")
            raise BuildFailed(text, line=step.line, text=step.text, exit_code=rec.exit_code, operation=op,
                              stdout=out_tail, stderr=tail, hint=hint)
        return rec.image

    def _copy_step(self, recipe: Recipe, step: Copy, image: str, src: str | None, put, op: str) -> str:
        cfg = image_config(self.store, image)
        dest = parts.copies.dest_path(step.dest, cfg.cwd)
        uid, gid = resolve_user(self.store, image, step.chown) if step.chown else (0, 0)

        def fill(up):
            if src is not None:
                parts.copies.copy_image(up, self.store, src, step, dest, uid, gid)
            else:
                parts.copies.copy_context(up, recipe.context, step, dest, uid, gid)
        return commit_edit(self, image, fill, {"command": step.text, "copy": True}, kind="copy", also=put, op=op,
                           mtime_clamp=_epoch(step, cfg, recipe))[0]

    def _configured(self, image: str, step: Configure) -> ImageConfig:
        """The image's config with a Configure step's changes: env and labels merged, ports
        added, a relative WORKDIR joined to the current one, the rest replaced."""
        cfg = image_config(self.store, image)
        changes = {}
        for name, value in step.changes:
            if name in ("env", "labels"):
                changes[name] = tuple({**dict(changes.get(name, getattr(cfg, name))), **dict(value)}.items())
            elif name == "expose":
                changes[name] = tuple(set(changes.get(name, cfg.expose)) | {str(p) for p in value})
            elif name == "cwd" and isinstance(value, str) and value:
                base = changes.get("cwd", cfg.cwd) or "/"      # cleaned, as Docker's NormalizeWorkdir
                changes[name] = posixpath.normpath(posixpath.join(base, value)).replace("//", "/")
            else:
                changes[name] = value
        try:
            return cfg.replace(**changes)
        except TypeError as exc:
            raise InvalidInput(f"{_at(step)}: {exc}", line=step.line) from None
