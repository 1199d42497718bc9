"""The engine: the one Python API every adapter (SDK, CLI, server, MCP) wraps.

It owns a Store and a Runtime and performs the operations that combine them: import, run →
commit → new image, lineage, tags, inspection, fsck and gc. It reads no environment variables and
prints nothing; configuration comes in through its constructor (see sandtree/config.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import threading
import time
import uuid
from typing import Callable

from . import commit as commit_mod
from ..store import refs
from .branching import BranchingOps
from ..errors import InvalidInput, NotFound, PathEscape, RuntimeUnavailable
from ..defaults import Limits
from ..table import RunRecord
from ..runtime.base import InjectedFile, RunOutcome, RunSpec
from ..runtime.namespaces import NamespaceRuntime, validate_spec
from .secrets_mask import mask_env, mask_text, secret_values
from ..store import importers, inspect
from ..store.names import check_tag
from ..store.blobs import BlobStore
from ..store.db import Database, dumps, typed_disk_errors
from ..store.layers import IdMap, remove_tree
from ..store.objects import DIR, Entry
from ..store.scan import scan
from ..store.store import ImageRow, Store
from ..store.maintenance import GC_GRACE, GC_RETENTION

_TENANCY_LOCK = threading.Lock()
DEFAULT_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}


def default_idmap() -> IdMap:
    if os.geteuid() == 0:
        return IdMap(100000, 100000, 65536)
    return IdMap(os.geteuid(), os.getegid(), 1)


class Engine(BranchingOps):
    def __init__(self, home: str, *, idmap: IdMap | None = None, limits: Limits | None = None, warm: int = 2,
                 tier: str = "namespaces", max_runs: int = 4):
        """warm: how many sandboxes to keep started ahead of runs (0: start each run cold; a
        one-shot CLI process has no use for them). tier: the default isolation tier. max_runs:
        operations (submitted runs) running at once; more wait in a queue."""
        self.store = Store(home, idmap or default_idmap())
        self.runtime = NamespaceRuntime(self.store.layers.root, self.store.idmap,
                                        os.path.join(self.store.home, "bin"), warm=warm)
        self._tiers: dict[str, object] = {"namespaces": self.runtime}
        self._operations = None
        self._sandboxes = None
        self._pools = None
        # Parts made on first use: one lock, or threads touching one first at once each build their
        # own (a run waited on through the wrong Operations then reports no result). Reentrant: a
        # part's constructor may reach another part.
        self._parts_lock = threading.RLock()
        self._max_runs = max_runs
        self.default_tier = self._check_tier(tier)
        self.default_limits = limits or Limits()
        self.committer = commit_mod.Committer(self.store)

    @property
    def operations(self):
        """Runs started now, awaited later (created on first use)."""
        if self._operations is None:
            with self._parts_lock:
                if self._operations is None:
                    from .operations import Operations
                    self._operations = Operations(self, workers=self._max_runs)
        return self._operations

    @property
    def sandboxes(self):
        """Live sandboxes (created on first use)."""
        if self._sandboxes is None:
            with self._parts_lock:
                if self._sandboxes is None:
                    from .sandboxes import Sandboxes
                    self._sandboxes = Sandboxes(self)
        return self._sandboxes

    @property
    def pools(self):
        """Warm pools per image (created on first use)."""
        if self._pools is None:
            with self._parts_lock:
                if self._pools is None:
                    from .pools import Pools
                    self._pools = Pools(self)
        return self._pools

    def pool_create(self, ref: str, size: int, **options) -> dict:
        """Keep `size` sandboxes of an image started; runs on it with these limits use them."""
        return self.pools.create(ref, size, **options)

    def pool_list(self) -> list[dict]:
        return self.pools.list() if self._pools is not None else []

    def pool_wait(self, ref: str, timeout: float = 30.0) -> bool:
        return self.pools.wait_ready(ref, timeout)

    def pool_remove(self, ref: str) -> None:
        self.pools.remove(ref)

    # The facade of live sandboxes: what the API objects and every adapter call.
    def sandbox_start(self, ref: str, **options) -> dict:
        return self.sandboxes.start(ref, **options)

    def sandbox_exec(self, sid: str, command, **options) -> RunRecord:
        return self.sandboxes.exec(sid, command, **options)

    def sandbox_popen(self, sid: str, argv, **options):
        return self.sandboxes.popen(sid, argv, **options)

    def sandbox_commit(self, sid: str, *, tag: str | None = None) -> str:
        return self.sandboxes.commit(sid, tag=tag)

    def sandbox_stop(self, sid: str) -> dict:
        return self.sandboxes.stop(sid)

    def sandbox_hibernate(self, sid: str) -> dict:
        return self.sandboxes.hibernate(sid)

    def sandbox_resume(self, sid: str) -> dict:
        return self.sandboxes.resume(sid)

    def sandbox_info(self, sid: str) -> dict:
        return self.sandboxes.info(sid)

    def sandbox_list(self, *, all: bool = False) -> list[dict]:
        return self.sandboxes.list(all=all)

    def sandbox_read(self, sid: str, path: str) -> bytes:
        return self.sandboxes.read(sid, path)

    def sandbox_write(self, sid: str, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0,
                      gid: int = 0) -> None:
        self.sandboxes.write(sid, path, data, mode=mode, uid=uid, gid=gid)

    def close(self) -> None:
        if self._operations is not None:
            self._operations.close()
        if self._pools is not None:
            self._pools.close()
        if self._sandboxes is not None:
            self._sandboxes.close()
        for rt in self._tiers.values():
            rt.close()
        self.store.close()

    # ---- tiers ---------------------------------------------------------------------------------
    TIERS = ("namespaces", "gvisor")

    def _check_tier(self, tier: str) -> str:
        if tier not in self.TIERS:
            raise InvalidInput(f"unknown tier {tier!r} (one of: {', '.join(self.TIERS)})")
        return tier

    def tier(self, name: str | None):
        """The runtime for a tier (RuntimeUnavailable, with the reason, if this host cannot)."""
        name = self._check_tier(name or self.default_tier)
        rt = self._tiers.get(name)
        if rt is None:
            from ..runtime.gvisor import GVisorRuntime
            rt = GVisorRuntime(self.store.layers.root, self.store.idmap, os.path.join(self.store.home, "bin"))
            self._tiers[name] = rt
        ok, why = rt.available()
        if not ok:
            raise RuntimeUnavailable(f"tier {name!r} cannot run here: {why}", tier=name)
        return rt

    SCOPES = ("import", "run", "list", "cancel", "tag")

    def whoami(self) -> dict:
        """Who the caller is and what it may do: an in-process engine is its own single tenant with
        every scope; a tenant's view of the engine (issue 4) narrows all three."""
        lim = self.default_limits
        return {"tenant": "local", "scopes": list(self.SCOPES),
                "limits": {"timeout": lim.timeout, "memory": lim.memory, "pids": lim.pids,
                           "disk": lim.disk, "output": lim.output, "concurrent_runs": self._max_runs}}

    # ---- tenants (issue 4): the rules live in tenants.py ------------------------------------------
    @property
    def tenancy(self):
        """Tokens, tenants, sharing and the audit log of this store (made on first use)."""
        with _TENANCY_LOCK:
            if getattr(self, "_tenancy", None) is None:
                from ..tenancy import Tenancy
                self._tenancy = Tenancy(self)
        return self._tenancy

    def as_tenant(self, tenant):
        """This engine as `tenant` (tenants.Tenant) sees it: the same methods, its things only."""
        return self.tenancy.view(tenant)

    def share(self, image: str) -> dict:
        return self.tenancy.share(image)

    def unshare(self, image: str) -> dict:
        return self.tenancy.unshare(image)

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        return self.tenancy.audit(tenant=tenant, limit=limit)

    def doctor(self) -> list[dict]:
        """Every isolation tier: can this host run it, and if not, why."""
        out = []
        for name in self.TIERS:
            try:
                self.tier(name)
                out.append({"tier": name, "available": True, "reason": ""})
            except RuntimeUnavailable as exc:
                out.append({"tier": name, "available": False, "reason": exc.message.split(": ", 1)[-1]})
        out.append({"tier": "microvm", "available": False, "reason": microvm_reason()})
        return out

    # ---- names ---------------------------------------------------------------------------------
    def resolve(self, ref: str) -> str:
        """Image ID for an ID, prefix, tag, or branch (`branch:NAME` or a bare branch name)."""
        branch = self._branch_of(ref)
        if branch is not None:
            return refs.head(self.store, branch)
        return self.store.resolve(ref)

    def _branch_of(self, ref: str) -> str | None:
        """The branch a reference names, if it names one (tags win over branches)."""
        if not isinstance(ref, str):
            return None
        if ref.startswith("branch:"):
            return ref[7:]
        if self.store.db.one("SELECT 1 FROM refs WHERE kind='tag' AND name=?", (ref,)):
            return None
        if self.store.db.one("SELECT 1 FROM refs WHERE kind='branch' AND name=?", (ref,)):
            return ref
        return None

    # ---- import --------------------------------------------------------------------------------
    def import_path(self, path: str, *, tag: str | None = None, progress=None,
                    limits: importers.ImportLimits | None = None) -> str:
        """A directory, a rootfs tar (plain/gz/zst), an OCI layout (dir or tar) or docker-archive.
        limits: what an archive may expand to (ImportLimits' defaults; a tenant limit may pass less)."""
        if tag is not None:
            check_tag(tag)
        if not os.path.exists(path):
            raise NotFound(f"no such file or directory: {path}")
        if os.path.isdir(path):
            if os.path.exists(os.path.join(path, "index.json")) or os.path.exists(os.path.join(path, "manifest.json")):
                return self._import_layers(path, tag, progress, limits=limits)
            return self._adopt(path, copy=True, tag=tag, progress=progress, source=f"dir:{path}")
        if importers.is_image_archive(path):
            tmp = self.store.layers.stage("oci")
            try:
                outer = importers.ImportBudget(limits)
                outer.source(os.path.getsize(path))
                with open(path, "rb") as raw, importers.open_tar_stream(io.BufferedReader(raw), outer) as t:
                    importers.extract_tar(t, tmp, chown=False, budget=outer)
                return self._import_layers(tmp, tag, progress, source=f"archive:{path}", limits=limits)
            finally:
                remove_tree(tmp)
        staged = self.store.layers.stage("import")
        try:
            budget = importers.ImportBudget(limits)
            budget.source(os.path.getsize(path))
            with open(path, "rb") as raw, importers.open_tar_stream(io.BufferedReader(raw), budget) as t:
                importers.extract_tar(t, staged, chown=not self.store.idmap.rootless, progress=progress,
                                      budget=budget)
            return self._adopt(staged, copy=False, tag=tag, progress=None, source=f"tar:{path}")
        except BaseException:
            remove_tree(staged)
            raise

    def _import_layers(self, layout: str, tag, progress, source: str | None = None,
                       limits: importers.ImportLimits | None = None) -> str:
        staged = self.store.layers.stage("import")
        try:
            importers.apply_layers(importers.oci_layers(layout), staged,
                                   chown=not self.store.idmap.rootless, progress=progress,
                                   budget=importers.ImportBudget(limits))
            return self._adopt(staged, copy=False, tag=tag, source=source or f"oci:{layout}")
        except BaseException:
            remove_tree(staged)
            raise

    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False, progress=None,
             op_id: str | None = None, check_host=None) -> str:
        """Pull docker://HOST/NAME:TAG from an OCI registry (digests verified) and import it.
        check_host("host:port"): called before every connection (redirects, token realms), raises
        to refuse one (tenants.check_public_registry for a tenant's pull)."""
        from ..store import registry
        if tag is not None:
            check_tag(tag)
        ref = registry.parse(reference)
        row = self.store.db.one("SELECT username, secret FROM registry_auth WHERE registry=?", (ref.registry,))
        work = self.store.layers.stage("pull")
        staged = self.store.layers.stage("import")
        try:
            layers = registry.pull_layers(reference, work, credentials=tuple(row) if row else None,
                                          insecure=insecure, progress=progress, check_host=check_host)
            importers.apply_layers(layers, staged, chown=not self.store.idmap.rootless)
            return self._adopt(staged, copy=False, tag=tag, source=f"pull:{ref}", op_id=op_id)
        except BaseException:
            remove_tree(staged)
            raise
        finally:
            remove_tree(work)

    def registry_login(self, registry_url: str, username: str, secret: str, *, insecure: bool = False) -> str:
        """Check credentials against the registry's /v2/ and keep them for pulls (the store is
        0700; the secret never appears in records)."""
        from ..store import registry
        host = registry.registry_host(registry_url)
        registry.check_login(host, username, secret, insecure)
        with self.store.db.tx() as con:
            con.execute("INSERT OR REPLACE INTO registry_auth(registry, username, secret) VALUES(?,?,?)",
                        (host, username, secret))
        return host

    def bootstrap(self, spec: str, *, include: list[str] = (), tag: str | None = None,
                  log: Callable[[str], None] | None = None, mirror: str | None = None) -> str:
        if tag is not None:
            check_tag(tag)
        staged = self.store.layers.stage("bootstrap")
        try:
            importers.bootstrap_debian(spec, staged, list(include), log=log, mirror=mirror)
            return self._adopt(staged, copy=False, tag=tag or spec,
                               source=f"bootstrap:{spec}" + (f" +{','.join(include)}" if include else ""))
        except BaseException:
            remove_tree(staged)
            raise

    def _adopt(self, src: str, *, copy: bool, tag: str | None, source: str, progress=None,
               op_id: str | None = None) -> str:
        with self.store.using():
            return self._adopt_locked(src, copy=copy, tag=tag, source=source, progress=progress, op_id=op_id)

    def _adopt_locked(self, src: str, *, copy: bool, tag: str | None, source: str, progress=None,
                      op_id: str | None = None) -> str:
        started = time.time()
        dest = self.store.layers.stage("import") if copy else None
        try:
            res = scan(src, dest, self.store.idmap, progress=progress)
            layer_dir = dest if copy else src
            with self.store.db.tx() as con:
                exists = con.execute("SELECT 1 FROM images WHERE id=?", (res.root,)).fetchone()
            layers = None
            if not exists:
                layers = [self.store.layers.publish(layer_dir)]
            elif copy:
                remove_tree(dest)
            op = op_id or uuid.uuid4().hex
            with self.store.db.tx() as con:
                Database.put_trees(con, res.trees)
                if layers:
                    if Store.insert_image(con, res.root, layers, res.links, res.size, res.files):
                        BlobStore.record(con, {h: f"layers/{layers[0]}/{p}" for h, p in res.locations.items()})
                    else:
                        layers = None                   # a concurrent import won the race
                # OR REPLACE: a submitted import's queued row is completed here
                con.execute("INSERT OR REPLACE INTO operations(id, kind, source, result, spec, outcome, started, "
                            "finished) VALUES(?,?,?,?,?,?,?,?)", (op, "import", None, res.root,
                                                                dumps({"source": source, "tag": tag}),
                                                         dumps({"files": res.files, "size": res.size}),
                                                         started, time.time()))
                if tag:
                    row = con.execute("SELECT image FROM refs WHERE kind='tag' AND name=?", (tag,)).fetchone()
                    if row is None or row[0] != res.root:
                        Database.record_ref(con, "tag", tag, row[0] if row else None, res.root, "import")
            if exists and not copy:
                remove_tree(src)
            return res.root
        except BaseException:
            if dest is not None:
                remove_tree(dest)
            raise

    # ---- run -----------------------------------------------------------------------------------
    def run(self, ref: str, command, **kw) -> RunRecord | None:
        """Run `command` on image `ref` (see _run for the options); gc waits while it does."""
        with self.store.using():
            return self._run(ref, command, **kw)

    def _run(self, ref: str, command, *, env: dict | None = None, cwd: str = "/",
            stdin: bytes | str | None = None, uid: int = 0, gid: int = 0, hostname: str = "sandtree",
            files=None, disposable: bool = False, on_output=None, tier: str | None = None,
            file_set: str | None = None, op_id: str | None = None, cancel=None, check_only: bool = False,
            **limits) -> RunRecord | None:
        """Run `command` on image `ref`. check_only: validate everything a run would, start
        nothing, return None (how a submitted operation refuses bad input at once)."""
        runtime = self.tier(tier)
        branch = self._branch_of(ref)
        source = self.resolve(ref)
        row = self.store.image(source)
        if isinstance(command, str):
            if not command.strip():
                raise InvalidInput("empty command")
            argv = ["/bin/sh", "-c", command]
        elif isinstance(command, (list, tuple)) and command:
            argv = [str(a) for a in command]
        else:
            raise InvalidInput("command must be a shell string or a non-empty list of arguments")
        lim = self._limits(limits)
        user_env = {str(k): str(v) for k, v in (env or {}).items()}
        full_env = {**DEFAULT_ENV, **user_env}
        if isinstance(stdin, str):
            stdin = stdin.encode()
        injected = [self._file(f) for f in (files or [])]
        if file_set is not None:
            injected = [self._file(f) for f in self.file_set(file_set)] + injected
        self._check_cwd(source, cwd, injected)
        root = self.store.tree(source)["."]
        spec = RunSpec(argv=argv, layers=row.layers, root_meta=(root.mode, root.uid, root.gid),
                       env=full_env, cwd=cwd, stdin=stdin, uid=uid, gid=gid, hostname=hostname,
                       files=injected, limits=lim, on_output=on_output,
                       prepare_changes=(lambda upper: self._inject(source, upper, injected)) if injected else None,
                       cancel=cancel)
        if check_only:
            validate_spec(spec)
            return None
        op = op_id or uuid.uuid4().hex
        secrets = secret_values(user_env)
        record_spec = {"command": mask_text(command if isinstance(command, str) else " ".join(argv), secrets),
                       "argv": [mask_text(a, secrets) for a in argv], "cwd": cwd,
                       "env": mask_env(user_env), "uid": uid, "gid": gid, "hostname": hostname, "disposable": disposable,
                       "files": [f.path for f in injected], "limits": lim.__dict__, "tier": runtime.name}
        started = time.time()
        pool = self._pools.get(source) if self._pools is not None and runtime.name == "namespaces" else None
        try:
            outcome = (pool.run(spec) if pool is not None and pool.fits(spec) else None) or runtime.run(spec)
        except Exception as exc:
            self._record_run(op, source, record_spec, started, None,
                             {"error": getattr(exc, "code", "error"), "message": str(exc)})
            raise
        t_commit = time.perf_counter()
        with outcome:
            try:
                result, write_image = (None, None) if disposable or outcome.cancelled else self._commit(row, outcome)
            except Exception as exc:
                self._record_run(op, source, record_spec, started, None,
                                 {"error": getattr(exc, "code", "error"), "message": f"commit failed: {exc}"})
                raise
            outcome.usage["commit_s"] = round(time.perf_counter() - t_commit, 6)
            rec = RunRecord(op, source, result, outcome.exit_code, outcome.signal, outcome.stdout,
                            outcome.stderr, outcome.stdout_truncated, outcome.stderr_truncated,
                            outcome.timed_out, outcome.oom_killed, outcome.usage, outcome.cancelled)
            summary = {"exit_code": rec.exit_code, "signal": rec.signal, "timed_out": rec.timed_out,
                       "cancelled": rec.cancelled,
                       "oom_killed": rec.oom_killed, "stdout_bytes": len(rec.stdout),
                       "stderr_bytes": len(rec.stderr), "stdout_truncated": rec.stdout_truncated,
                       "stderr_truncated": rec.stderr_truncated, "usage": rec.usage}
            self._record_run(op, source, record_spec, started, result, summary, write_image)
        if branch is not None and result is not None:
            refs.advance(self.store, branch, source, result, f"run {op}")
        return rec

    def _check_cwd(self, source: str, cwd: str, injected: list[InjectedFile]) -> None:
        """The working directory must exist in the image (or be made by an injected file's
        parents): checked here, so every tier refuses it the same way (runsc would create it)."""
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
        try:
            e = inspect.resolve(self.store, source, cwd)[1]
        except (NotFound, PathEscape):
            e = None
        if e is not None and e.kind == DIR:
            return
        norm = "/" + "/".join(inspect._split(cwd))
        if any(("/" + "/".join(inspect._split(f.path))).startswith(norm.rstrip("/") + "/") for f in injected):
            return
        raise InvalidInput(f"working directory {cwd!r} does not exist in the image", cwd=cwd)

    def _limits(self, given: dict) -> Limits:
        unknown = set(given) - set(Limits.__dataclass_fields__)
        if unknown:
            raise InvalidInput(f"unknown option(s): {', '.join(sorted(unknown))}")
        vals = {k: v for k, v in given.items() if v is not None}
        for k in ("memory", "disk", "output"):
            if k in vals:
                vals[k] = parse_size(vals[k])
        for k in ("timeout", "cpus"):
            if k in vals:
                try:
                    vals[k] = float(vals[k])
                except (TypeError, ValueError):
                    raise InvalidInput(f"{k} must be a number") from None
        if "pids" in vals:
            vals["pids"] = int(vals["pids"])
        return Limits(**{**self.default_limits.__dict__, **vals})

    def _commit(self, base: ImageRow, outcome: RunOutcome):
        """(resulting image id, a function writing its rows inside the run's transaction or None).
        The new layer is published (renamed into layers/) before any row names it."""
        if outcome.changes is None:
            return base.id, None
        cr = self.committer.commit(base, outcome.changes, max_file_size=outcome.disk_limit)
        return cr.image, self._image_writer(cr)

    def _image_writer(self, cr):
        """Publish a commit's staged layer; return the function that writes its rows (None: no
        new layer) inside the transaction that records the operation."""
        if cr.staged is None:
            return None
        layer = self.store.layers.publish(cr.staged)

        def write(con):
            if Store.insert_image(con, cr.image, [layer] + cr.below, cr.links, cr.size, cr.files):
                Database.put_trees(con, cr.trees)
                BlobStore.record(con, {h: f"layers/{layer}/{p}" for h, p in cr.locations.items()})
                return True
            return False                                 # a concurrent run made the same image
        write.layer = layer
        return write

    def _record_run(self, op: str, source: str, spec: dict, started: float, result: str | None,
                    outcome: dict, write_image=None, *, kind: str = "run", parent: str | None = None) -> None:
        """One transaction per run: the new image's rows (if any), the operation, the lineage edge
        (from `parent`, by default the source)."""
        parent = parent or source
        used = True
        try:
            with self.store.db.tx() as con:
                if write_image is not None:
                    used = write_image(con)
                # INSERT OR REPLACE: a submitted operation's queued row is completed here
                con.execute("INSERT OR REPLACE INTO operations(id, kind, source, result, spec, outcome, started, "
                            "finished) VALUES(?,?,?,?,?,?,?,?)", (op, kind, source, result, dumps(spec),
                                                                dumps(outcome), started, time.time()))
                if result and result != parent:
                    con.execute("INSERT OR IGNORE INTO edges(parent, child, op, created) VALUES(?,?,?,?)",
                                (parent, result, op, time.time()))
        except BaseException:
            used = False
            raise
        finally:
            if write_image is not None and not used:
                self.store.layers.remove(write_image.layer)

    def _inject(self, source: str, upper: str, files: list[InjectedFile]) -> None:
        """Write injected files into the fresh upper, parents copied from the image's metadata."""
        idmap = self.store.idmap
        for f in files:
            parts = inspect._split(f.path)
            if not parts:
                raise InvalidInput(f"cannot inject a file at {f.path!r}")
            tree = self.store.tree(source)
            host = upper
            for i, part in enumerate(parts[:-1]):
                e = tree.get(part) if tree is not None else None
                host = os.path.join(host, part)
                if e is not None and e.kind != DIR:
                    raise PathEscape(f"cannot inject {f.path!r}: /{'/'.join(parts[:i + 1])} is not a directory")
                if not os.path.isdir(host):
                    os.mkdir(host)
                    if e is not None:
                        os.lchown(host, idmap.host_uid(e.uid), idmap.host_gid(e.gid))
                        os.chmod(host, e.mode)
                    else:
                        os.lchown(host, idmap.host_uid(0), idmap.host_gid(0))
                        os.chmod(host, 0o755)
                tree = self.store.tree(e.ref) if e is not None else None
            target = os.path.join(host, parts[-1])
            e = tree.get(parts[-1]) if tree is not None else None
            if e is not None and e.kind == DIR:
                raise InvalidInput(f"cannot inject {f.path!r}: it is a directory in the image")
            with open(target, "wb") as out:
                if f.source is None:
                    out.write(f.content)
                else:                    # streamed: an upload may be bigger than memory allows
                    with open(f.source, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            os.lchown(target, idmap.host_uid(f.uid), idmap.host_gid(f.gid))
            os.chmod(target, f.mode)

    # ---- uploads and file sets -----------------------------------------------------------------
    def upload(self, data: bytes) -> str:
        """Store bytes once; runs reference them by sha256 (files=[{"path", "sha256"}])."""
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidInput("upload takes bytes")
        return self.store.blobs.put_bytes(bytes(data))

    def upload_file(self, path: str, digest: str | None = None) -> str:
        """Store a file's bytes once (copied; the file stays the caller's). digest: its sha256,
        if the caller computed it while writing the file."""
        from ..store.blobs import hash_file
        if digest is None:
            digest, _ = hash_file(path)
        if not self.store.blobs.has(digest):
            self.store.blobs.put_file(path, digest)
        return digest

    def download(self, digest: str) -> bytes:
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or not self.store.blobs.has(digest):
            raise NotFound(f"no uploaded file {digest!r}")
        with self.store.blobs.open(digest) as f:
            return f.read()

    def upload_info(self, digest: str) -> dict:
        """Size and time of stored content (NotFound if absent), without reading it."""
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or not self.store.blobs.has(digest):
            raise NotFound(f"no uploaded file {digest!r}")
        st = os.stat(self.store.blobs.path(digest))
        return {"sha256": digest, "size": st.st_size, "created": st.st_mtime}

    def find_upload(self, prefix: str) -> str:
        """The sha256 of stored content by a unique prefix of at least 32 hex digits (Contree
        clients name uploads by a UUID, which holds only 128 of the digest's 256 bits)."""
        if not isinstance(prefix, str) or not re.fullmatch(r"[0-9a-f]{32,64}", prefix):
            raise InvalidInput(f"an upload prefix is 32 to 64 hex digits, not {prefix!r}")
        sub = os.path.join(self.store.blobs.root, prefix[:2])
        found = {prefix[:2] + n for n in (os.listdir(sub) if os.path.isdir(sub) else ()) if n.startswith(prefix[2:])}
        found.update(r[0] for r in self.store.db.query("SELECT hash FROM blob_loc WHERE hash >= ? AND hash < ? LIMIT 2",
                                                       (prefix, prefix + "g")))
        found = {d for d in found if self.store.blobs.has(d)}
        if not found:
            raise NotFound(f"no uploaded file {prefix!r}")
        if len(found) > 1:
            raise InvalidInput(f"upload prefix {prefix!r} is ambiguous")
        return found.pop()

    def _file(self, f) -> InjectedFile:
        return _file(f, self._upload_path)

    def _upload_path(self, digest: str) -> str:
        """Where an upload's bytes are (NotFound if absent): runs copy them from there."""
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest) or not self.store.blobs.has(digest):
            raise NotFound(f"no uploaded file {digest!r}")
        return self.store.blobs.path(digest)

    def file_set_create(self, files: list[dict]) -> str:
        """A named, reusable set of files to inject ({"path", "sha256", "mode"}); its ID is the
        hash of its content, so syncing the same tree twice gives the same set."""
        entries = []
        for f in files:
            inj = self._file(f)                    # validates, and that every sha256 exists
            entries.append({"path": inj.path, "sha256": f.get("sha256") or self.upload(inj.content),
                            "mode": inj.mode, "uid": inj.uid, "gid": inj.gid})
        entries.sort(key=lambda e: e["path"])
        data = dumps(entries)
        set_id = hashlib.sha256(data.encode()).hexdigest()
        with self.store.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO file_sets(id, files, created) VALUES(?,?,?)", (set_id, data, time.time()))
        return set_id

    def file_set(self, set_id: str) -> list[dict]:
        row = self.store.db.one("SELECT files FROM file_sets WHERE id=?", (set_id,))
        if row is None:
            raise NotFound(f"no file set {set_id!r}")
        return json.loads(row[0])

    # ---- lineage -------------------------------------------------------------------------------
    def parents(self, image: str) -> list[dict]:
        return [self._edge(r) for r in self.store.db.query(
            "SELECT parent, child, op, created FROM edges WHERE child=? ORDER BY created", (image,))]

    def children(self, image: str) -> list[dict]:
        return [self._edge(r) for r in self.store.db.query(
            "SELECT parent, child, op, created FROM edges WHERE parent=? ORDER BY created", (image,))]

    def _edge(self, row) -> dict:
        parent, child, op, created = row
        return {"parent": parent, "child": child, "op": op, "created": created, **self._op_summary(op)}

    def _op_summary(self, op: str) -> dict:
        r = self.store.db.one("SELECT kind, spec, outcome FROM operations WHERE id=?", (op,))
        if not r:
            return {}
        spec, outcome = json.loads(r[1]), json.loads(r[2]) if r[2] else {}
        return {"kind": r[0], "command": spec.get("command") or spec.get("source"),
                "exit_code": outcome.get("exit_code")}

    def operation(self, op: str) -> dict:
        r = self.store.db.one("SELECT id, kind, source, result, spec, outcome, started, finished "
                              "FROM operations WHERE id=?", (op,))
        if not r:
            raise NotFound(f"no operation {op!r}")
        return {"id": r[0], "kind": r[1], "source": r[2], "result": r[3], "spec": json.loads(r[4]),
                "outcome": json.loads(r[5]) if r[5] else None, "started": r[6], "finished": r[7]}

    def log(self, image: str, limit: int = 1000) -> list[dict]:
        """Ancestry, newest first: each image with the operation that made it from its parent."""
        out, seen, todo = [], set(), [image]
        while todo and len(out) < limit:
            cur = todo.pop(0)
            if cur in seen:
                continue
            seen.add(cur)
            parents = self.parents(cur)
            if not parents:
                made = self.store.db.one("SELECT id, spec FROM operations WHERE result=? AND kind='import' "
                                         "ORDER BY started LIMIT 1", (cur,))
                out.append({"image": cur, "parents": [], "command": json.loads(made[1])["source"] if made else None,
                            "op": made[0] if made else None, "exit_code": None,
                            "tags": sorted(self.store.tags(cur))})
                continue
            first = parents[0]
            out.append({"image": cur, "parents": [p["parent"] for p in parents], "command": first.get("command"),
                        "op": first["op"], "exit_code": first.get("exit_code"),
                        "tags": sorted(self.store.tags(cur))})
            todo.extend(p["parent"] for p in parents)
        return out

    # ---- images and refs (the facade the public API and the remote engine share) ---------------
    @property
    def home(self) -> str:
        return self.store.home

    def images(self) -> list[dict]:
        return self.store.images()

    def tag(self, image: str, name: str) -> None:
        self.store.tag(image, name)

    def untag(self, name: str) -> str:
        return self.store.untag(name)

    def tags(self, image: str | None = None) -> dict[str, str]:
        return self.store.tags(image)

    def image_info(self, image: str) -> dict:
        row = self.store.image(image)
        return {"id": image, "tags": sorted(self.store.tags(image)), "size": row.size, "files": row.files,
                "created": row.created, "parents": [p["parent"] for p in self.parents(image)]}

    def branch_head(self, name: str) -> str:
        return refs.head(self.store, name)

    def fsck(self, verify_content: bool = True) -> dict:
        from ..store.maintenance import fsck
        return fsck(self.store, verify_content=verify_content)

    def gc(self, retention: float = GC_RETENTION, grace: float = GC_GRACE) -> dict:
        from ..store.maintenance import gc
        return gc(self.store, retention=retention, grace=grace)

    def remove_image(self, image: str, *, force: bool = False) -> None:
        with self.store.db.tx() as con:
            tags = [r[0] for r in con.execute("SELECT name FROM refs WHERE image=?", (image,))]
            if tags and not force:
                raise InvalidInput(f"image is referenced by {', '.join(tags)}; untag it or use force",
                                   refs=tags)
            for name in tags:
                kind = con.execute("SELECT kind FROM refs WHERE name=? AND image=?", (name, image)).fetchone()[0]
                Database.record_ref(con, kind, name, image, None, "image rm")
            if con.execute("DELETE FROM images WHERE id=?", (image,)).rowcount == 0:
                raise NotFound(f"no image {image!r}")
        self.store.forget_images()

    # ---- inspection ----------------------------------------------------------------------------
    def ls(self, image: str, path: str = "/") -> list[Entry]:
        return inspect.listdir(self.store, image, path)

    def stat(self, image: str, path: str) -> Entry:
        return inspect.resolve(self.store, image, path, follow=False)[1]

    def read(self, image: str, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        return inspect.read(self.store, image, path, offset=offset, limit=limit)

    def grep(self, image: str, pattern: str, path: str = "/", **kw) -> list[dict]:
        return inspect.grep(self.store, image, pattern, path, **kw)

    def export_tar(self, image: str, fileobj, path: str = "/") -> None:
        inspect.export_tar(self.store, image, fileobj, path)


def microvm_reason() -> str:
    """Why there is no microVM tier here: /dev/kvm alone is not enough (a software hypervisor
    exposes one, and stock guest kernels die in its instruction emulator)."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((l for l in f if l.startswith("flags")), "")
    except OSError:
        pass
    hw = " vmx" in flags or " svm" in flags
    modules = [m for m in ("kvm_intel", "kvm_amd") if os.path.isdir(f"/sys/module/{m}")]
    if not os.path.exists("/dev/kvm"):
        return "no /dev/kvm"
    if not hw or not modules:
        return ("/dev/kvm is present but is not hardware virtualization (no vmx/svm CPU flag, no "
                "kvm_intel/kvm_amd module); and sandtree has no microVM tier yet")
    return "hardware virtualization is present, but sandtree has no microVM tier yet"


# Every public call of the engine (its own and BranchingOps'): a full disk is DiskFull (issue 12
# item 12), wherever in it the ENOSPC came from (commit, import, upload, a SQLite write).
for _name in [n for n in dir(Engine) if not n.startswith("_")]:
    _attr = getattr(Engine, _name)
    if callable(_attr) and not isinstance(getattr(type(Engine), _name, None), property) and \
            not isinstance(Engine.__dict__.get(_name), (staticmethod, classmethod, property)):
        setattr(Engine, _name, typed_disk_errors(_attr))
del _name, _attr


def _file(f, blob_path=None) -> InjectedFile:
    if isinstance(f, InjectedFile):
        return f
    if isinstance(f, dict):
        source = None
        if "sha256" in f and blob_path is not None:
            content, source = b"", blob_path(f["sha256"])
        else:
            content = f.get("content", b"")
        if isinstance(content, str):
            content = content.encode()
        mode = f.get("mode", 0o644)
        if isinstance(mode, str):
            mode = int(mode, 8)
        return InjectedFile(str(f["path"]), content, int(mode), int(f.get("uid", 0)), int(f.get("gid", 0)), source)
    raise InvalidInput("a file to inject is {'path': ..., 'content' or 'sha256': ..., 'mode': ..., 'uid': ..., 'gid': ...}")


UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
         "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40}


def parse_size(v) -> int:
    if isinstance(v, bool):
        raise InvalidInput(f"bad size {v!r}")
    if isinstance(v, (int, float)):
        n = int(v)
    else:
        s = str(v).strip().lower()
        num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = s[len(num):].strip()
        try:
            n = int(float(num) * UNITS[unit])
        except (ValueError, KeyError):
            raise InvalidInput(f"bad size {v!r} (use e.g. 512M, 2G)") from None
    if n <= 0:
        raise InvalidInput(f"size must be positive, not {v!r}")
    return n
