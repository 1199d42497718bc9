"""Runs (a mixin of engine.Engine): a command on an image in a fresh sandbox, its changes
committed as a new image; and fork, many commands from one image at once.

What a RunSpec is built from is spec.py (RunSpecs); where the run's rows go is records.py;
the commit of its writes is commit.py. Runs started now and awaited later are operations.py.
"""

from __future__ import annotations

import contextlib
import time
import uuid

from ... import defaults as D
from ...runtime.base import RunSpec
from ...runtime.validate import check_command, check_env, validate_spec
from ...errors import InvalidInput, SandtreeError, TapeMiss
from ...store import ephemeral, refs
from ...store.store import ImageRow
from ...secrets_mask import mask_env, mask_text, secret_values
from ...branching.fork import fan_out, refuse_fork_options
from .spec import command_argv
from ...defaults import RunRecord
from ...values import check_labels, check_retries
from ..images.rundefaults import default_command, run_defaults
from ...network.client import LOCAL_SCOPE
from .network import attach_link, network_option, require_egress
from ..tapes import tape_option



KEPT, EPHEMERAL, NOTHING = "kept", "ephemeral", "nothing"


def _taped(usage, taped, store, op: str):
    """A released link's usage function, its tape moved into the store first (engine/tapes.py)."""
    def read() -> dict:
        out = usage()
        taped.finish(store, out, op)
        return out
    return read


def keep_mode(disposable) -> str:
    """What a run keeps: disposable=False its end state as an image (KEPT), True nothing (no
    commit), "ephemeral" its end state as a short-lived unlisted image (store/ephemeral.py)."""
    if disposable is False or disposable is None:
        return KEPT
    if disposable is True:
        return NOTHING
    if disposable == EPHEMERAL:
        return EPHEMERAL
    raise InvalidInput(f"disposable must be true, false or 'ephemeral', not {disposable!r}")


class RunOps:
    """Mixed into engine.Engine, which provides store, specs, records, committer, tier(),
    resolve() and its pools."""

    def run(self, ref: str, command, *, env: dict | None = None, cwd: str | None = None,
            stdin: bytes | str | None = None, uid: int | None = None, gid: int | None = None,
            hostname: str = D.HOSTNAME, files=None, file_set: str | None = None,
            disposable: bool | str = False, on_output=None, tier: str | None = None, cancel=None,
            timeout: float | None = None, memory=None, pids: int | None = None, cpus: float | None = None,
            disk=None, output=None, labels: dict | None = None, network=None,
            secrets: dict | None = None, record: bool = False, replay=None, retries: int = 0) -> RunRecord:
        """Run `command` on image `ref` (None: the image's ENTRYPOINT + CMD); its writes become a new image.
        gc waits while it runs.
        disposable: True keeps nothing (no commit); "ephemeral" keeps the end state as a short-lived
        unlisted image (store/ephemeral.py: the Contree adapter's mode; sandtree's own surfaces
        offer only True and False). retries: on a cluster, how many times a run whose node was
        lost before it committed is run again on another node (engine/clustered.py); here, where
        no node can be lost apart from this process, it is only checked."""
        return self.run_operation(ref, command, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid, hostname=hostname,
                                  files=files, file_set=file_set, disposable=disposable, on_output=on_output,
                                  tier=tier, cancel=cancel, timeout=timeout, memory=memory, pids=pids, cpus=cpus,
                                  disk=disk, output=output, labels=labels, network=network, secrets=secrets,
                                  record=record, replay=replay, scope=LOCAL_SCOPE, retries=retries)

    def run_operation(self, ref: str, command, *, op_id: str | None = None, check_only: bool = False,
                      **options) -> RunRecord | None:
        """run as operation `op_id` (a submitted run's, or a new one). check_only: validate
        everything a run would, start nothing, return None (how a submitted operation refuses
        bad input at once). Not an operation of the table: Operations' and fork's way in."""
        check_retries(options.pop("retries", 0))      # (a cluster engine's Dispatch acts on it)
        after: list = []
        try:
            with self.store.using():
                return self._run(ref, command, op_id=op_id, check_only=check_only, after=after, **options)
        finally:
            # a pool's sandbox is retired once the run is done, lock and all: retiring wakes the
            # pool's filler thread, which would otherwise take the GIL from the run's last steps
            for f in after:
                f()

    def _run(self, ref: str, command, *, env: dict | None = None, cwd: str | None = None,
             stdin: bytes | str | None = None, uid: int | None = None, gid: int | None = None,
             hostname: str = D.HOSTNAME,
             files=None, disposable: bool | str = False, on_output=None, tier: str | None = None,
             file_set: str | None = None, op_id: str | None = None, cancel=None, check_only: bool = False,
             labels: dict | None = None, network=None, secrets: dict | None = None,
             record: bool = False, replay=None, step: str | None = None, in_tx=None, scope: str | None = None, after: list | None = None,
             mtime_clamp: int | None = None, **limits) -> RunRecord | None:
        """step: a build step's text, recorded as the command (the lineage edge's label);
        mtime_clamp: a build step's SOURCE_DATE_EPOCH, the latest mtime its commit keeps (commit.clamp_mtimes);
        in_tx(con, result): called in the transaction that records the run (the build cache's row).
        scope: whose run this is (a tenant; LOCAL_SCOPE: the engine's own caller): a networked run
        may get a link only runs of the same scope used (the egress daemon recycles links within
        a scope); None: a fresh link, removed after. after: what to call once the run is over
        (appended here; the caller calls it), else called before returning."""
        runtime = self.tier(tier)
        keep = keep_mode(disposable)
        labels = check_labels(labels)
        branch = refs.branch_named(self.store, ref)
        source = self.resolve(ref)
        row = self.store.image(source)
        if not check_only:
            self.store.ensure_layers(row.layers)     # S3 objects: cached here, pinned until the run ends
        # (the tenancy made only for a run whose secrets name stored ones: a run's start-up)
        net = network_option(self.store.db, source, network, secrets,
                             stored=lambda ref: self.tenancy.stored_secret(ref))
        if net.policy is not None:
            require_egress(self.egress)
        taped = tape_option(self.store, record, replay)
        if taped is not None and net.policy is None:
            taped.discard()
            raise InvalidInput("record and replay need a network policy (network=...): a tape is what went "
                               "through it")
        net.tape = taped
        # A run that will take a linked helper takes it now and sends its link's policy: the
        # daemon answers while the spec is built (the gate awaits the answer before the command).
        pool = self.pools.get(source) if self._pools is not None else None
        pool = pool if pool is not None and pool.tier == runtime.name else None
        early = None
        if not check_only and net.policy is not None and (pool is None or pool.policy != net.policy):
            early = self._take_linked(runtime, net, scope, row.layers)
        try:
            # None: the image's own ENTRYPOINT + CMD (a Dockerfile's, a pulled image's)
            argv = command_argv(command) if command is not None else default_command(self.store, source)
            check_command(argv)                  # (a 30 MB command goes no further)
            lim = self.specs.limits(limits)
            user_env = {str(k): str(v) for k, v in (env or {}).items()}
            dflt = run_defaults(self.store, source, env=user_env, cwd=cwd, uid=uid, gid=gid)
            cwd, uid, gid = dflt.cwd, dflt.uid, dflt.gid
            if isinstance(stdin, str):
                stdin = stdin.encode()
            injected = self.specs.files(files, file_set)
            self.specs.check_cwd(source, cwd, injected)
            spec = RunSpec(argv=argv, layers=row.layers, root_meta=self.specs.root_meta(source),
                           env=dflt.env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                           hostname=hostname, files=injected, limits=lim, on_output=on_output,
                           prepare_changes=self.specs.injector(source, injected), cancel=cancel)
            check_env(spec.env)                  # the image's and the caller's, before an egress link adds its own
            validate_spec(spec)                  # before anything starts or is recorded
            if check_only:
                if net.tape is not None:
                    net.tape.discard()
                return None
            op = op_id or uuid.uuid4().hex
            masked = secret_values(user_env)
            record_spec = {"command": step if step is not None else
                           mask_text(command if isinstance(command, str) else " ".join(argv), masked),
                           "argv": [mask_text(a, masked) for a in argv], "cwd": cwd,
                           "env": mask_env(user_env), "uid": uid, "gid": gid, "hostname": hostname, "disposable": disposable,
                           "files": [f.path for f in injected], "limits": lim.__dict__, "tier": runtime.name,
                           **({"labels": labels} if labels else {}), **net.record(),
                           **(net.tape.spec() if net.tape is not None else {})}
        except BaseException:
            if early is not None:
                early.discard()                  # (its policy's answer read, its link given back)
            if net.tape is not None:
                net.tape.discard()
            raise
        started = time.time()
        link = link_key = gate = None
        release = None
        try:
            # a pooled sandbox only of a pool with the same policy (its link then is the run's)
            served = pool.run(spec) if pool is not None and pool.fits(spec, net.policy, runtime.name) and not net.secrets \
                and net.tape is None else None
            if served is None and net.policy is not None:   # a link of its own
                spec.prestarted = early if early is not None else self._take_linked(runtime, net, scope, row.layers)
                early = None
                if spec.prestarted is not None:      # a helper waiting in a link: now with the policy
                    link_key, gate = spec.prestarted.key, spec.prestarted.gate
                else:                                # a new link (key: the operation), cold start
                    link, spec.runtime_files, extra = attach_link(self.egress, op, net,
                                                                  lambda p: self.read(source, p), scope)
                    link_key, spec.netns_fd = op, link.netns_fd
                    spec.env = {**spec.env, **extra}
            outcome, release = served if served is not None else (runtime.run(spec), None)
        except Exception as exc:
            if early is not None:
                early.discard()
            if gate is not None:
                with contextlib.suppress(SandtreeError):
                    gate()                       # (the answer is read whatever happened)
            usage = self._unlink(link_key, link)
            if net.tape is not None:
                net.tape.finish(self.store, usage, op)
            self.records.record(op, source, record_spec, started, None,
                                {"error": getattr(exc, "code", "error"), "message": str(exc),
                                 **({"usage": {"network": usage}} if link_key is not None else {})})
            raise
        network_usage = None
        if link_key is not None:               # released while the commit runs; read before the record
            if link is not None:
                link.close()
            network_usage = self.egress.release_begin(link_key)
            if net.tape is not None:
                network_usage = _taped(network_usage, net.tape, self.store, op)
        try:
            rec, result = self._commit_run(op, source, row, outcome, record_spec, started, keep,
                                           network_usage, in_tx, masked, mtime_clamp, net.tape)
        finally:
            if network_usage is not None:
                network_usage()                # (the answer is read whatever happened)
            if release is not None:            # the pool's sandbox: retired once its upper is read
                after.append(release) if after is not None else release()
        if branch is not None and result is not None and keep == KEPT:     # an ephemeral end moves no branch
            refs.advance(self.store, branch, source, result, f"run {op}")
        return rec

    def _unlink(self, key: str | None, link) -> dict:
        """Release a run's link: its final usage counters ({} without one)."""
        if link is not None:
            link.close()
        return self.egress.release(key) if key is not None else {}

    def _take_linked(self, runtime, net, scope: str | None, layers=()):
        """A helper the runtime started ahead in a link with nothing allowed, given the run's
        policy (one round trip to the daemon), or None: the run attaches a link and starts cold.
        Not for secrets (their placeholders and CA are the link's from its start). Only a helper
        whose link is fresh or served this scope before (a recycled link never changes scope)."""
        if net.secrets or net.tape is not None:       # (a tape is the attach's: the link's from its start)
            return None
        pre = runtime.take_linked(self._provide_link, self.egress.release,
                                  fits=lambda link_scope: link_scope is None or link_scope == scope, layers=layers)
        if pre is None:
            return None
        # The daemon's yes is awaited just before the command is handed over (the runtime calls
        # the gate): the round trip overlaps the run's own preparation.
        pre.gate = self.egress.set_policy_begin(pre.key, net.policy, scope)
        return pre

    def _provide_link(self):
        """A link for a linked warm helper: no policy until a run takes the helper; a fresh one or
        one a scope used before (link.scope: then only that scope's runs take the helper)."""
        link = self.egress.attach(f"warm-{uuid.uuid4().hex}", None, scope="any")
        return link.key, link.netns_fd, link.runtime_files(), link.scope

    def _commit_run(self, op: str, source: str, row: ImageRow, outcome, record_spec: dict, started: float,
                    keep: str, network_usage=None, in_tx=None, masked=(),
                    mtime_clamp: int | None = None, taped=None) -> tuple[RunRecord, str | None]:
        """keep: KEPT, EPHEMERAL or NOTHING (keep_mode). network_usage: None, or a function giving
        the released link's usage (read after the commit, before the record). in_tx: see run_operation."""
        t_commit = time.perf_counter()
        with outcome:
            try:
                result, write_image = (None, None) if keep == NOTHING or outcome.cancelled else \
                    self._commit(row, outcome, mtime_clamp)
                if keep == EPHEMERAL and write_image is not None:
                    write_image = ephemeral.mark_writer(write_image, result)
            except Exception as exc:
                self.records.record(op, source, record_spec, started, None,
                                    {"error": getattr(exc, "code", "error"), "message": f"commit failed: {exc}",
                                     **({"usage": {"network": network_usage()}} if network_usage else {})})
                raise
            outcome.usage["commit_s"] = round(time.perf_counter() - t_commit, 6)
            if self.node_id is not None:         # where it ran, in its row (a build step's too)
                outcome.usage["node"] = self.node_id
            if network_usage is not None:
                outcome.usage["network"] = network_usage()
            if taped is not None:               # the new tape's id in the record; a replay's misses fail it
                tid = outcome.usage["network"].pop("tape", None)
                misses = outcome.usage["network"].pop("tape_misses", [])
                if tid is not None:
                    outcome.usage["tape"] = tid
                try:
                    taped.check(misses, op)
                except TapeMiss as exc:
                    self.records.record(op, source, record_spec, started, None,
                                        {"error": exc.code, "message": exc.message, "usage": outcome.usage})
                    raise
            rec = RunRecord(op, source, result, outcome.exit_code, outcome.signal, outcome.stdout,
                            outcome.stderr, outcome.stdout_truncated, outcome.stderr_truncated,
                            outcome.timed_out, outcome.oom_killed, outcome.usage, outcome.cancelled)
            summary = {"exit_code": rec.exit_code, "signal": rec.signal, "timed_out": rec.timed_out,
                       "cancelled": rec.cancelled,
                       "oom_killed": rec.oom_killed, "stdout_bytes": len(rec.stdout),
                       "stderr_bytes": len(rec.stderr), "stdout_truncated": rec.stdout_truncated,
                       "stderr_truncated": rec.stderr_truncated, "usage": rec.usage,
                       # the head of each output, secrets masked as in the command (trace export's rows)
                       **{f"{k}_head": mask_text(getattr(rec, k)[:D.OUTPUT_HEAD].decode("utf-8", "replace"), masked)
                          for k in ("stdout", "stderr")}}
            also = (lambda con: ephemeral.keep(con, result)) if keep == KEPT and result is not None else None
            if in_tx is not None and result is not None and not rec.exit_code and rec.signal is None \
                    and not rec.timed_out:
                also = lambda con: (ephemeral.keep(con, result), in_tx(con, result))  # noqa: E731 - a successful step only
            self.records.record(op, source, record_spec, started, result, summary, write_image, also=also)
        return rec, result

    def _commit(self, base: ImageRow, outcome, mtime_clamp: int | None = None):
        """(resulting image id, a function writing its rows inside the run's transaction or None).
        The new layer is published (renamed into layers/) before any row names it."""
        if outcome.changes is None:
            return base.id, None
        cr = self.committer.commit(base, outcome.changes, max_file_size=outcome.disk_limit, mtime_clamp=mtime_clamp)
        return cr.image, self.committer.image_writer(cr)

    def fork(self, ref: str, commands: list, *, parallel: int | None = None, **options) -> list[RunRecord]:
        """Run each command on the same image concurrently (one branch each: a branch ref is
        resolved once, and no run moves it); the records in the commands' order. The runs are
        operations (queued on the engine's workers, listed, cancellable); parallel: at most this
        many submitted at once (default: all). See fan_out."""
        refuse_fork_options(options)
        source = self.resolve(ref)
        return fan_out(self.operations, commands, parallel,
                       check=lambda c: self.run_operation(source, c, check_only=True, **options),
                       submit=lambda c: self.operations.submit_run(source, c, **options))
