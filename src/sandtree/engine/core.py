"""The engine: the one Python API every adapter (SDK, CLI, server, MCP) wraps.

It owns a Store and a Runtime and the parts that combine them, each given what it needs when it
is made and none importing this module: the run-spec builder (spec.py), the records of what ran
(records.py), the committer (commit.py), runs started now and awaited later (operations.py),
live sandboxes (sandboxes.py), warm pools (pools.py). Its methods come from small mixins named
after their concept: imports.py, runs.py (run, fork), uploads.py, inspection.py, branching.py;
this module holds the construction, tiers, names, refs and maintenance. It reads no environment
variables and prints nothing; configuration comes in through its constructor (sandtree/config.py).
"""

from __future__ import annotations

import json
import os
import threading
from typing import TYPE_CHECKING

from .. import config
from .. import defaults as D
from . import parts
from .runs import commit as commit_mod
from ..errors import InvalidInput, NotFound, RuntimeUnavailable
from ..runtime.base import Limits
from ..runtime import leftovers
from ..runtime.livetiers import LiveTiers
from ..runtime.namespaces import NamespaceRuntime
from ..store import refs
from ..store.db import typed_disk_errors
from ..store.layers import IdMap
from ..store.maintenance import GC_GRACE, GC_RETENTION, fsck, gc
from ..store.store import Store
from .images.annotations import AnnotationOps, shown_annotations
from .images.branching import BranchingOps
from .builds.contexts import ContextBuildOps
from .builds.builds import BuildOps
from .images.imports import ImportOps
from .images.inspection import InspectionOps
from .images.oci import OciOps
from .runs.records import Records
from .runs.runs import RunOps
from .runs.spec import RunSpecs, default_idmap
from .passthrough import through
from ..table import ENGINE_OPS
from ..table.imagerefs import resolve_image_arguments
from ..defaults import RunRecord
from .images.uploads import UploadOps
from .tapes import TapeOps

from ..network.client import Egress

if TYPE_CHECKING:
    from ..network.secretstore import SecretStore
    from .volumes import Volumes
    from .warm.rollover import RecipePools

_TENANCY_LOCK = threading.Lock()


class Engine(ImportOps, OciOps, RunOps, UploadOps, InspectionOps, BranchingOps, BuildOps, ContextBuildOps,
             AnnotationOps, TapeOps):
    def __init__(self, home: str, *, idmap: IdMap | None = None, limits: Limits | None = None, warm: int = 2,
                 tier: str = "namespaces", max_runs: int = 4, database: str | None = None,
                 objects: str | None = None, cache_max: int | None = None, cluster: str | None = None,
                 durability: str | None = None):
        """warm: how many sandboxes to keep started ahead of runs (0: start each run cold; a
        one-shot CLI process has no use for them). tier: the default isolation tier. max_runs:
        operations (submitted runs) running at once; more wait in a queue. database: the metadata
        database's URL (postgresql://...; None: --database / SANDTREE_DATABASE_URL, else SQLite).
        objects: s3://bucket/prefix (None: --objects / SANDTREE_OBJECTS_URL, else `home` only);
        cache_max: the layer cache's cap in bytes (store/layercache.py). durability: "strict" (an
        image ID returned survives a power cut) or "relaxed" (store/durable.py; None:
        SANDTREE_DURABILITY, else strict)."""
        self.store = Store(home, idmap or default_idmap(), database, objects, cache_max, durability)
        self.runtime = NamespaceRuntime(self.store.layers.root, self.store.idmap,
                                        os.path.join(self.store.home, "bin"), warm=warm)
        self._tiers: dict[str, object] = {"namespaces": self.runtime}
        self._warm = warm                          # > 0: live sandboxes are started ahead too (warm/sandboxes.py)
        self._operations = None
        self._sandboxes = None
        self._pools = None
        self._recipe_pools = None
        self.node_id: str | None = None     # a cluster node's engine: its ID (cluster/node.py), in its runs' rows
        self._ports = None
        self._interpreter = None
        self._volumes = None
        self._egress = None
        # Parts made on first use: one lock, or threads touching one first at once each build their
        # own (a run waited on through the wrong Operations then reports no result). Reentrant: a
        # part's constructor may reach another part.
        self._parts_lock = threading.RLock()
        self._max_runs = max_runs
        self.default_tier = self._check_tier(tier)
        self.default_limits = limits or Limits()
        self.committer = commit_mod.Committer(self.store)
        self.records = Records(self.store)
        self.specs = RunSpecs(self.store, self.default_limits, self._upload_path, self.file_set)
        # every tier's live sandboxes: sandboxes, pools and ports share them
        self._live = LiveTiers(lambda name: self.tier(name).live(), lambda: self.default_tier)
        self.drain_elsewhere = None               # a cluster engine's: a rolled-over recipe pool drains on its nodes
        self.live_elsewhere = None                # a cluster engine's: live runs run on its nodes (processes/instances.py)
        address = cluster if cluster is not None else config.cluster_address()
        self.fabric = parts.attach(self, address, warm=warm, tier=tier) if address else None
        if self.fabric is not None:               # the API side's workers wait on the nodes' runs
            self._max_runs = max(max_runs, self.fabric.slots())

    @property
    def operations(self):
        """Runs started now, awaited later (created on first use)."""
        if self._operations is None:
            with self._parts_lock:
                if self._operations is None:
                    self._operations = parts.Operations(self, workers=self._max_runs)
        return self._operations

    @property
    def sandboxes(self):
        """Live sandboxes (created on first use)."""
        if self._sandboxes is None:
            with self._parts_lock:
                if self._sandboxes is None:
                    self._sandboxes = parts.Sandboxes(self.store, self.specs, self.records, self.committer, self._live,
                                                self.resolve, lambda: self.default_tier, ahead_starts=self._warm > 0)
                    self._sandboxes.unlink = lambda sid: self.ports.unlink(sid)
                    # (no operations yet: no process spawned here to let go of)
                    self._sandboxes.release = lambda sid: self._operations and self._operations.instances.release(sid)
                    self._sandboxes.reattach = lambda sid: self._operations and self._operations.instances.reattach(sid)
                    self._sandboxes.egress = lambda: self.egress
                    self._sandboxes.read_image = self.read
                    self._sandboxes.stored_secret = self.tenancy.stored_secret
                    self._sandboxes.volumes = self.volumes
        return self._sandboxes

    @property
    def volumes(self) -> Volumes:
        """Named volumes of each tenant (engine/volumes.py), made on first use."""
        if self._volumes is None:
            with self._parts_lock:
                if self._volumes is None:
                    self._volumes = parts.Volumes(self.store, self.committer, self.records,
                                            lambda qualified: self.sandboxes.volume_users(qualified))
        return self._volumes

    # Volumes by the engine's names: a tenant's are "<tenant>~<name>" (its view names them so), listed by the
    # tenancy (whose they are depends on who asks); the quota is the volume's tenant's.
    def volume_create(self, volume: str) -> dict:
        return self.volumes.create(volume, self.tenancy.volume_quota(parts.split(volume)[0]))

    volume_list = through("tenancy")
    volume_info = through("volumes", "info")
    volume_delete = through("volumes", "delete")
    volume_read = through("volumes", "read")
    volume_write = through("volumes", "write")
    volume_ls = through("volumes", "ls")
    volume_stat = through("volumes", "stat")
    volume_mkdir = through("volumes", "mkdir")
    volume_remove = through("volumes", "remove")

    def volume_snapshot(self, volume: str, *, tag: str | None = None) -> str:
        image = self.volumes.snapshot(volume)
        if tag:
            self.store.tag(image, tag)
        return image

    @property
    def ports(self):
        """Exposed ports of live sandboxes and their signed URLs (created on first use)."""
        if self._ports is None:
            with self._parts_lock:
                if self._ports is None:
                    self._ports = parts.SandboxPorts(self.store, self.sandboxes, self._live, lambda: self.egress)
        return self._ports

    @property
    def interpreter(self):
        """The code contexts of live sandboxes (created on first use)."""
        if self._interpreter is None:
            with self._parts_lock:
                if self._interpreter is None:
                    self._interpreter = parts.Interpreter(self.sandboxes)
        return self._interpreter

    @property
    def egress(self):
        """The egress daemon's client (network/client.py), made on first use."""
        if self._egress is None:
            with self._parts_lock:
                if self._egress is None:
                    self._egress = Egress(self.store.home)
        return self._egress

    @property
    def pools(self):
        """Warm pools per image (created on first use)."""
        if self._pools is None:
            with self._parts_lock:
                if self._pools is None:
                    self._pools = parts.Pools(self.store, self.specs, self._live, self.resolve,
                                              lambda: self.default_tier)
                    self._pools.egress = lambda: self.egress
        return self._pools

    def pool_create(self, ref: str, size: int, *, hostname: str = D.HOSTNAME, timeout: float | None = None,
                    memory=None, pids: int | None = None, cpus: float | None = None, disk=None, output=None,
                    network=None, tier: str | None = None) -> dict:
        """Keep `size` sandboxes of an image started; runs on it with these limits (and this
        network policy: each pooled sandbox has its own link; this tier, default the engine's) use them."""
        return self.pools.create(ref, size, hostname=hostname, timeout=timeout, memory=memory, pids=pids, cpus=cpus,
                                 disk=disk, output=output, network=network,
                                 tier=self._check_tier(tier) if tier is not None else None)

    def pool_and_wait(self, ref: str, size: int, *, wait_timeout: float = D.POOL_WAIT, hostname: str = D.HOSTNAME,
                      timeout: float | None = None, memory=None, pids: int | None = None, cpus: float | None = None,
                      disk=None, output=None, network=None, tier: str | None = None) -> dict:
        """pool_create, then until it is full (or `timeout` seconds): its stats then."""
        stats = self.pool_create(ref, size, hostname=hostname, timeout=timeout, memory=memory, pids=pids, cpus=cpus,
                                 disk=disk, output=output, network=network, tier=tier)
        self.pools.wait_ready(stats["image"], wait_timeout)
        return next((p for p in self.pools.list() if p["image"] == stats["image"]), stats)

    def pool_list(self) -> list[dict]:
        if self._pools is None:
            return []
        tags = {i: t for t, i in self._recipe_pools.by_tag.items()} if self._recipe_pools is not None else {}
        return [{**p, "tag": tags[p["image"]]} if p["image"] in tags else p for p in self.pools.list()]

    pool_wait = through("pools", "wait_ready")

    def pool_remove(self, ref: str) -> None:
        image = self.resolve(ref)
        self.pools.remove(image)
        self.recipe_pools.forget(image)

    @property
    def recipe_pools(self) -> RecipePools:
        """Pools kept of recipes' results under their tags (warm/rollover.py)."""
        if self._recipe_pools is None:
            with self._parts_lock:
                if self._recipe_pools is None:
                    # the engine's pool calls (a cluster engine's go to its nodes: clustered.py)
                    drain = self.drain_elsewhere or (lambda image: self.pools.remove(image, wait=False))
                    self._recipe_pools = parts.RecipePools(self.build, self.pool_create, self.pool_wait, drain,
                                                     self.pool_list, self.store)
        return self._recipe_pools

    def pool_recipe(self, recipe, size: int = 4, *, tag: str | None = None, wait: bool = False,
                    wait_timeout: float = D.POOL_WAIT, build_network=None, progress=None,
                    hostname: str = D.HOSTNAME, timeout: float | None = None, memory=None, pids: int | None = None,
                    cpus: float | None = None, disk=None, output=None, network=None) -> dict:
        """Build `recipe` (cache hits when unchanged) and keep a pool of `size` sandboxes of the
        result, tagged `tag`; when the result differs from the image this tag's pool is of, the pool
        rolls over (the new one filled, the tag moved, the old one drained)."""
        return self.recipe_pools.roll(recipe, size, tag=tag, wait=wait, wait_timeout=wait_timeout,
                                      build_network=build_network, progress=progress, hostname=hostname,
                                      timeout=timeout, memory=memory, pids=pids, cpus=cpus, disk=disk, output=output,
                                      network=network)

    # The facade of live sandboxes: what the API objects and every adapter call.
    sandbox_start = through("sandboxes", "start")
    sandbox_exec = through("sandboxes", "exec")
    sandbox_popen = through("sandboxes", "popen")

    # the processes of a live sandbox, or of a live run (sid: its operation ID): engine/processes/instances.py
    sandbox_spawn = through("operations.instances", "spawn")
    sandbox_stdin = through("operations.instances", "write")
    sandbox_signal = through("operations.instances", "signal")
    sandbox_resize = through("operations.instances", "resize")
    sandbox_processes = through("operations.instances", "processes")
    sandbox_follow = through("operations.instances", "follow")
    sandbox_ps = through("sandboxes", "ps")

    def sandbox_process(self, sid: str, pid: int) -> dict:
        now = self.operations.instances.process(sid, pid)
        return now if now is not None else self.operations.folded_process(sid, pid)

    sandbox_commit = through("sandboxes", "commit")
    sandbox_stop = through("sandboxes", "stop")
    sandbox_hibernate = through("sandboxes", "hibernate")
    sandbox_resume = through("sandboxes", "resume")
    sandbox_fork = through("sandboxes", "fork_live")
    fork_from = through("sandboxes", "fork_from")
    sandbox_info = through("sandboxes", "info")
    sandbox_list = through("sandboxes", "list")
    sandbox_read = through("sandboxes", "read")
    sandbox_write = through("sandboxes", "write")
    sandbox_set_timeout = through("sandboxes", "set_timeout")
    sandbox_set_network = through("sandboxes", "set_network")
    sandbox_metrics = through("sandboxes", "metrics")
    sandbox_ls = through("sandboxes", "ls")
    sandbox_exists = through("sandboxes", "exists")
    sandbox_remove = through("sandboxes", "remove")
    sandbox_mkdir = through("sandboxes", "mkdir")
    sandbox_stat = through("sandboxes", "stat")
    sandbox_rename = through("sandboxes", "rename")
    sandbox_watch = through("sandboxes", "watch")
    sandbox_watch_events = through("sandboxes", "watch_events")
    sandbox_unwatch = through("sandboxes", "unwatch")
    sandbox_expose = through("ports", "expose")
    sandbox_unexpose = through("ports", "unexpose")
    sandbox_ports = through("ports", "ports")
    sandbox_port_url = through("ports", "port_url")

    # the code interpreter: contexts of a live sandbox (engine/sandboxes/interpreter.py)
    sandbox_run_code = through("interpreter", "run_code")
    sandbox_code_context_create = through("interpreter", "create_context")
    sandbox_code_contexts = through("interpreter", "contexts")
    sandbox_code_context_restart = through("interpreter", "restart_context")
    sandbox_code_context_remove = through("interpreter", "remove_context")

    def wait_live_state(self, image: str) -> None:
        """Until image `image`'s live state, which a live fork here may still be keeping after
        its call returned (engine/sandboxes/livestates.py keep_live_state_later), is kept: what
        a cluster's fork waits for on the source's node before other nodes start it."""
        if self._sandboxes is not None:
            self._sandboxes.wait_live_state(image)

    def close(self) -> None:
        if self._operations is not None:
            self._operations.close()
        if self._pools is not None:
            self._pools.close()
        if self._sandboxes is not None:
            self._sandboxes.close()
        if self._volumes is not None:
            self._volumes.close()           # the host's mounts (live sandboxes keep their binds)
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
            rt = parts.GVisorRuntime(self.store.layers.root, self.store.idmap, os.path.join(self.store.home, "bin"))
            self._tiers[name] = rt
        ok, why = rt.available()
        if not ok:
            raise RuntimeUnavailable(f"tier {name!r} cannot run here: {why}", tier=name)
        return rt

    def cluster_status(self) -> dict:
        """Where runs go: without a cluster, this process (one node, its runs and live sandboxes);
        a clustered engine's is the Fabric's (clustered.py binds it)."""
        running = len(self._operations.live) if self._operations is not None else 0
        sandboxes = [s["id"] for s in self.sandbox_list()] if self._sandboxes is not None else []
        return {"mode": "local", "address": None, "objects": None,
                "database": "postgresql" if (self.store.database_url or "").startswith("postgres") else "sqlite",
                "nodes": [{"node": "local", "alive": True, "pid": os.getpid(), "cpus": float(os.cpu_count() or 1),
                           "running": running, "in_flight": running, "sandboxes": len(sandboxes),
                           "sandbox_ids": sandboxes, "home": self.store.home}]}

    SCOPES = ("import", "run", "list", "cancel", "tag")

    def whoami(self) -> dict:
        """Who the caller is and what it may do: an in-process engine is its own single tenant with
        every scope; a tenant's view of the engine narrows all three."""
        lim = self.default_limits
        return {"tenant": "local", "scopes": list(self.SCOPES),
                "limits": {"timeout": lim.timeout, "memory": lim.memory, "pids": lim.pids,
                           "disk": lim.disk, "output": lim.output, "concurrent_runs": self._max_runs}}

    # ---- tenants: the rules live in tenancy/ (a layer below: it wraps this engine, never imports it)
    @property
    def tenancy(self):
        """Tokens, tenants, sharing and the audit log of this store (made on first use)."""
        with _TENANCY_LOCK:
            if getattr(self, "_tenancy", None) is None:
                self._tenancy = parts.Tenancy(self)
        return self._tenancy

    def as_tenant(self, tenant):
        """This engine as `tenant` (tenants.Tenant) sees it: the same methods, its things only."""
        return self.tenancy.view(tenant)

    share = through("tenancy")
    unshare = through("tenancy")
    audit = through("tenancy")

    @property
    def secret_store(self) -> SecretStore:
        """Stored secrets' values, outside the database: $SANDTREE_HOME/secrets (network/secretstore.py)."""
        return parts.SecretStore(os.path.join(self.store.home, "secrets"))

    secret_set = through("tenancy")
    secret_list = through("tenancy")
    secret_remove = through("tenancy")

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
        branch = refs.branch_named(self.store, ref)
        if branch is not None:
            return refs.head(self.store, branch)
        return self.store.resolve(ref)

    # ---- images and refs (the facade the public API and the remote engine share) ---------------
    @property
    def home(self) -> str:
        return self.store.home

    images = through("store")
    tag = through("store")
    untag = through("store")
    tags = through("store")

    def image_info(self, image: str) -> dict:
        row = self.store.image(image)
        return {"id": image, "tags": sorted(self.store.tags(image)), "size": row.size, "files": row.files,
                "created": row.created, "parents": [p["parent"] for p in self.parents(image)],
                "annotations": shown_annotations(self.store.db, image),
                "live": self.has_live_state(image)}

    def has_live_state(self, image: str) -> bool:
        """Whether fork_from can start image `image`'s live state: one that a live fork here is
        still keeping after its call returned counts once it is kept (wait_live_state)."""
        if self._sandboxes is not None:
            self._sandboxes.wait_live_state(image)
        return self.store.db.one("SELECT 1 FROM live_states WHERE image=?", (image,)) is not None

    def branch_head(self, name: str) -> str:
        return refs.head(self.store, name)

    def fsck(self, verify_content: bool = True) -> dict:
        return fsck(self.store, verify_content=verify_content)

    def gc(self, retention: float = GC_RETENTION, grace: float = GC_GRACE) -> dict:
        out = gc(self.store, retention=retention, grace=grace)
        # and the deadline files / agent sockets of sandboxes whose engine was killed
        rows = self.store.db.query("SELECT handle FROM sandboxes WHERE handle IS NOT NULL")
        out["removed_runtime_files"] = leftovers.sweep(self.store.home, leftovers.named(map(json.loads, (h for (h,) in rows))),
                                                       grace)
        out["removed_lock_files"] = self.sandboxes.sweep_locks()   # of ended sandboxes
        out["removed_fork_checkpoints"] = self.sandboxes.sweep_forks()     # of forks whose engine was killed
        out["removed_live_states"] = len(self.sandboxes.sweep_live_states())   # of removed images, or old
        return out

    def remove_image(self, image: str, *, force: bool = False) -> None:
        with self.store.db.tx() as con:
            names = refs.naming(con, image)
            if names and not force:
                raise InvalidInput(f"image is referenced by {', '.join(names)}; untag it or use force",
                                   refs=names)
            refs.release_image(con, image, "image rm")
            if con.execute("DELETE FROM images WHERE id=?", (image,)).rowcount == 0:
                raise NotFound(f"no image {image!r}")
        self.store.forget_images()

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


# An image argument may be any reference (ID, prefix, tag, branch): resolved here, once (imagerefs.py).
resolve_image_arguments(Engine, ENGINE_OPS)

# Every public call of the engine (its own and BranchingOps'): a full disk is DiskFull,
# wherever in it the ENOSPC came from (commit, import, upload, a SQLite write).
for _name in [n for n in dir(Engine) if not n.startswith("_")]:
    _attr = getattr(Engine, _name)
    if callable(_attr) and not isinstance(getattr(type(Engine), _name, None), property) and \
            not isinstance(Engine.__dict__.get(_name), (staticmethod, classmethod, property)):
        setattr(Engine, _name, typed_disk_errors(_attr))
del _name, _attr
