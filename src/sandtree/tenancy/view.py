"""TenantView: the engine as one tenant sees it, the operation table's method set.

Every method comes from the table (derive.py): scope, admin-only, image visibility, ownership of
sandboxes, uploads, file sets and operations, namespaced ref names, lineage through the tenant's
filter and the audit are the row's and the generic call's. Written here by hand are only the
methods whose tenant rule the table cannot say; each names its rule in a comment.
"""

from __future__ import annotations

import re
import uuid

from .. import table
from ..branching import lineage
from ..branching.fork import fan_out, refuse_fork_options
from ..branching.merge import check_on_conflict, conflict_outcome
from ..network.client import tenant_scope
from ..network.policy import Policy
from ..errors import Forbidden, ImageNotFound, InvalidInput, LimitExceeded, NotFound, SandtreeError
from ..store import refs, registry
from ..store.names import check_tag
from ..store.ephemeral import UNLISTED
from ..store.objects import EMPTY_TREE_HASH
from ..store.store import HEX_RE
from . import auditing
from . import secrets as stored
from .derive import install
from .limits import capped, check_slots
from .operations import TenantOperations
from .sight import TenantSight
from .tenant import DEFAULT_MAX_SANDBOXES, VISIBLE, check_public_registry


class TenantView(TenantSight):
    """The engine as one tenant sees it: the method set of engine.Engine (and remote.RemoteEngine)."""

    def __init__(self, tenancy, tenant):
        super().__init__(tenancy, tenant)
        self._ops = TenantOperations(self)

    # ---- plumbing -----------------------------------------------------------------------------
    @property
    def home(self) -> str:
        return self.engine.home

    @property
    def default_limits(self):
        return self.engine.default_limits

    @property
    def operations(self):
        return self._ops

    def close(self) -> None:
        pass                                # the engine is the server's, not this view's

    def target_of(self, ref) -> str:
        """What the engine is given for a run: this tenant's branch by its stored name (the run
        advances it), else a visible image ID."""
        branch = self.branch_of(ref)
        if branch is not None:
            self.head_of(branch)
            return "branch:" + self.ns_name(branch)
        return self.resolve(ref)

    def run_options(self, options: dict, keys=None, image: str | None = None) -> dict:
        """Uploads and file sets must be this tenant's; resources within its limits; a network
        policy (on `image`, for inherit) within its token's grant; stored secrets in its namespace."""
        # The engine's own options, never a caller's: an operation's id, whose run it is (scope), what the
        # lineage records as the command (step: a build's text) and the build cache's hook (in_tx) --
        # a tenant naming them would forge records or take another's link.
        for name in ("op_id", "scope", "step", "in_tx", "check_only"):
            if name in options:
                raise InvalidInput(f"unknown option(s): {name}")
        opts = self.forced_tier(dict(options))
        self.check_network(opts.get("network"), image)
        if opts.get("secrets") is not None:       # rule: stored secrets by name are its own or shared with it
            opts["secrets"] = stored.qualify(self.tenant.name, opts["secrets"])
        self._check_files(opts.get("files"))
        if opts.get("replay") is not None:         # rule: only a tape of its own runs or sandboxes is replayed
            given = opts["replay"]
            ref = given.get("tape") if isinstance(given, dict) else given
            full = self.own_tape(ref)
            opts["replay"] = {**given, "tape": full} if isinstance(given, dict) else full
        if opts.get("file_set") is not None:
            self._own_blob("file_set", opts["file_set"])
        return capped(self.tenant.limits, self.engine.default_limits, opts, keys)

    def forced_tier(self, opts: dict) -> dict:
        """The token's tier on every run, sandbox and build step (token create --tier): a caller
        that names another is refused (Forbidden), one that names none gets it, never the default."""
        forced = self.tenant.tier
        if forced is None:
            return opts
        asked = opts.get("tier")
        if asked is not None and asked != forced:
            raise Forbidden(f"this token runs only on the {forced} tier, not {asked}", tier=forced)
        return {**opts, "tier": forced}

    def check_network(self, value, image: str | None) -> None:
        """Forbidden (naming the rule) for a policy beyond the token's grant; admin: any."""
        if value is None or value is False or self.tenant.admin:
            return
        if isinstance(value, str) and value.strip().lower() == "inherit":
            value = lineage.recorded_network(self.db, image) if image else None
        policy = Policy.from_value(value)
        why = policy.within(self.tenant.network) if policy is not None else None
        if why:
            raise Forbidden(why, grant=self.tenant.network.to_json())

    def audit_run(self, source: str, command, op: str, env, branch: str | None, network=None) -> None:
        policy = Policy.from_value(network) if network not in (None, False, "inherit") else None
        self._audit("run", image=source, op=op,
                    detail={"command": auditing.masked(command, env), **({"branch": branch} if branch else {}),
                            **({"network": policy.to_json()} if policy else {})})

    # ---- names: a tenant's tags and branches are its own (stored as <tenant>~<name>) ----------
    def resolve(self, ref: str) -> str:             # rule: only visible images, own names, public tags
        if not isinstance(ref, str) or not ref:
            raise InvalidInput("an image reference must be a non-empty string")
        branch = self.branch_of(ref)
        if branch is not None:
            return self.head_of(branch)
        if len(ref) == 64 and HEX_RE.match(ref) and self._visible(ref):
            return ref
        image = self._tag_image(ref.removeprefix("tag:"))
        if image is not None:
            return image
        if HEX_RE.match(ref):
            rows = self.db.query(f"SELECT id FROM images WHERE id >= :p AND id < :q AND {VISIBLE} LIMIT 2",
                                 {**self._p, "p": ref, "q": ref + "g"})
            if len(rows) == 1:
                return rows[0][0]
            if len(rows) > 1:
                raise InvalidInput(f"image prefix {ref!r} is ambiguous")
        raise ImageNotFound(f"no image or tag {ref!r}", image=ref)

    def images(self) -> list[dict]:                 # rule: visible images, with the names it sees
        names = self._names()
        return [{"id": r[0], "created": r[1], "size": r[2], "files": r[3], "tags": names.get(r[0], [])}
                for r in self.db.query(f"SELECT id, created, size, files FROM images WHERE {VISIBLE} "
                                       f"AND id NOT IN ({UNLISTED}) ORDER BY created", self._p)]

    def tags(self, image: str | None = None) -> dict[str, str]:     # rule: the tags it sees
        vis = self._visible_set()
        out = {}
        for img, names in self._names().items():
            if img in vis and (image is None or img == image):
                for n in names:
                    out.setdefault(n, img)
        return dict(sorted(out.items()))

    def tag(self, image: str, name: str) -> None:   # rule: a new tag is written in its namespace
        check_tag(name)
        self._see(image)
        self._write_tag(name, image, "tag")
        self._audit("tag", image=image, detail={"tag": name})

    def image_info(self, image: str) -> dict:       # rule: its names, its visible parents
        self._see(image)
        row = self.engine.store.image(image)
        return {"id": image, "tags": self._names().get(image, []), "size": row.size, "files": row.files,
                "created": row.created, "parents": [p["parent"] for p in self.parents(image)],
                "annotations": self.engine.annotations_as(self.tenant.name, image),     # its own, else the sharer's
                "live": self._owns(image) and self.engine.has_live_state(image)}

    def branch_create(self, name: str, image: str, *, force: bool = False) -> None:   # rule: in its namespace
        refs.check_branch(name)
        self._see(image)
        with self.db.tx() as con:
            refs.set_branch(con, self.ns_name(name), image, force=force, shown=name)
        self._audit("branch create", image=image, detail={"branch": name})

    def branches(self) -> dict[str, str]:           # rule: only its own branches
        return self._branch_names()

    def rollback(self, name: str, *, to: str | None = None, steps: int | None = None) -> str:
        # rule: back only to an ancestor it can see (a walk through hidden images would tell of them)
        cur = self.head_of(name)
        if to is not None:
            self._see(to)
        visible = self._visibility()
        try:
            target = refs.rollback_target(self.engine.store, self.ns_name(name), steps=steps, to=to,
                                          is_ancestor=lambda a, b: a in lineage.ancestors(
                                              self.engine.store, b, visible))
            refs.advance(self.engine.store, self.ns_name(name), cur, target, "rollback")
        except SandtreeError as exc:
            raise self.plain_error(exc) from None
        self._audit("rollback", image=cur, result=target, detail={"branch": name})
        return target

    # ---- sharing ------------------------------------------------------------------------------
    # ---- the caller ---------------------------------------------------------------------------
    # ---- imports and uploads ------------------------------------------------------------------
    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False, progress=None) -> str:
        # rule: a tenant's pull reaches public registries only, never with the operator's credentials
        ref = self.check_pull(reference, tag)
        image = self.engine.pull_operation(reference, tag=None, insecure=insecure, progress=progress,
                                 check_host=check_public_registry)         # redirects and realms too
        return self.imported("pull", image, tag, {"reference": str(ref)})

    def check_pull(self, reference: str, tag: str | None, credentials=None):
        """The parsed reference of a pull this tenant may make: to a public registry, with no
        credentials (registry credentials are stored server-wide: the operator's, not a tenant's
        to set or use)."""
        if tag is not None:
            check_tag(tag)
        ref = registry.parse(reference)
        check_public_registry(ref.registry)
        if credentials is not None or self.db.one("SELECT 1 FROM registry_auth WHERE registry=?", (ref.registry,)):
            raise Forbidden(f"pulling from {ref.registry} uses stored or given credentials: admin only",
                            scope="admin")
        return ref

    def imported(self, kind: str, image: str, tag: str | None, detail: dict) -> str:
        self._own(image)
        op = self._claim_op(kind, image)
        if tag is not None:
            self._write_tag(tag, image, kind)
        self._audit(kind, result=image, op=op, detail={**detail, **({"tag": tag} if tag else {})})
        return image

    def find_upload(self, prefix: str) -> str:      # rule: a prefix matches only its own uploads
        """This tenant's upload by a unique prefix (another tenant's answers as absent)."""
        if not isinstance(prefix, str) or not re.fullmatch(r"[0-9a-f]{32,64}", prefix):
            raise InvalidInput(f"an upload prefix is 32 to 64 hex digits, not {prefix!r}")
        rows = self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='upload' AND id >= ? AND id < ? "
                             "LIMIT 2", (self.tenant.name, prefix, prefix + "g"))
        if not rows:
            raise NotFound(f"no uploaded file {prefix!r}")
        if len(rows) > 1:
            raise InvalidInput(f"upload prefix {prefix!r} is ambiguous")
        return rows[0][0]

    # ---- runs and sandboxes -------------------------------------------------------------------
    def run(self, ref: str, command, **options):    # rule: run slots (max_runs), its branch advances
        target = self.target_of(ref)
        opts = self.run_options(options, image=target)
        branch = self.branch_of(ref)
        source = self.head_of(branch) if branch is not None else target
        op = uuid.uuid4().hex
        with self.tenancy.tenant_lock(self.tenant.name):
            check_slots(self.tenancy, self.tenant)
            self.tenancy.sync_run(self.tenant.name, +1)
        try:
            self.claim(op)
            self.audit_run(source, command, op, opts.get("env"), branch, opts.get("network"))
            try:
                rec = self.engine.run_operation(target, command, op_id=op, scope=tenant_scope(self.tenant.name), **opts)
            except SandtreeError as exc:
                raise self.plain_error(exc) from None
            if rec.usage.get("network") is not None:       # what a networked run sent and was refused
                self._audit("run network", image=source, op=op, detail={"usage": rec.usage["network"]})
            return rec
        finally:
            self.tenancy.sync_run(self.tenant.name, -1)

    def fork(self, ref: str, commands, *, parallel: int | None = None, **options):
        # rule: the fan-out is the engine's, its runs go through this tenant's operations (slots,
        # claims, audit, branch names), each checked first within the tenant's limits
        refuse_fork_options(options)
        source = self.resolve(ref)
        opts = self.run_options(options, image=source)
        return fan_out(self.operations, commands, parallel,
                       check=lambda c: self.engine.run_operation(source, c, check_only=True, **opts),
                       submit=lambda c: self.operations.submit_run(source, c, **options))

    def sandbox_start(self, ref: str, **options) -> dict:     # rule: max_sandboxes; the sandbox is its own
        source = self.resolve(ref)
        volumes = options.pop("volumes", None)                # rule: only its own volumes, by its names
        opts = self.run_options(options, image=source)
        if volumes is not None:
            opts["volumes"] = self.engine.volumes.mounts_of(self.tenant.name, volumes)
        cap = self.tenant.limits.get("max_sandboxes", DEFAULT_MAX_SANDBOXES)
        with self.tenancy.tenant_lock(self.tenant.name):
            if len(self.sandbox_list()) >= cap:
                raise LimitExceeded(f"this tenant already has {cap} live sandbox(es) (max_sandboxes {cap}); "
                                    "stop one", limit="max_sandboxes", max=cap)
            info = self.engine.sandbox_start(source, **opts)
            self._keep_blob("sandbox", info["id"])
        self._audit("sandbox start", image=source, detail={"sandbox": info["id"]})
        return info

    def sandbox_fork(self, sid: str, n: int = 1, **options) -> list[dict]:
        # rule: its own sandbox; max_sandboxes counts the children; their limits within the tenant's;
        # the fork's commit and the children are the tenant's
        full = self._sandbox(sid)
        children = self._children(n, options, lambda given: self.engine.sandbox_fork(full, n, **given))
        image = children[0]["forked_from"]["image"]
        self._claim_op("commit", image)
        self._own(image)
        self._audit("sandbox fork", image=image, detail={"sandbox": full, "children": [c["id"] for c in children]})
        return children

    def fork_from(self, ref: str, n: int = 1, **options) -> list[dict]:
        # rule: the image (its live state: the processes' memory of a sandbox of the tenant) must be its
        # own, not only visible (a shared image's state is its owner's); max_sandboxes counts the children;
        # their limits within the tenant's
        image = self.resolve(ref)
        if not self._owns(image):
            raise ImageNotFound(f"no image {ref!r}", image=ref)
        children = self._children(n, options, lambda given: self.engine.fork_from(image, n, **given))
        self._audit("fork from", image=image, detail={"children": [c["id"] for c in children]})
        return children

    def _children(self, n, options: dict, start) -> list[dict]:
        """A live fork's (or a live state's) n children, started by start(limits) under the tenant's
        lock, within max_sandboxes; they become the tenant's. Only the limits given are capped: the
        others are the source's, capped at its start."""
        given = {k: v for k, v in options.items() if v is not None}
        given = capped(self.tenant.limits, self.engine.default_limits, given, tuple(given))
        cap = self.tenant.limits.get("max_sandboxes", DEFAULT_MAX_SANDBOXES)
        with self.tenancy.tenant_lock(self.tenant.name):
            have = len(self.sandbox_list())
            if isinstance(n, int) and not isinstance(n, bool) and have + n > cap:
                raise LimitExceeded(f"this tenant has {have} live sandbox(es) and may have {cap} (max_sandboxes): "
                                    f"{n} more would pass it", limit="max_sandboxes", max=cap)
            children = start(given)
            for c in children:
                self._keep_blob("sandbox", c["id"])
        return children

    def _owns(self, image: str) -> bool:
        return self.tenant.admin or self.db.one("SELECT 1 FROM tenant_images WHERE tenant=? AND image=?",
                           (self.tenant.name, image)) is not None

    def sandbox_commit(self, sid: str, *, tag: str | None = None) -> str:
        # rule: naming the commit takes the tag scope too; the image and its tag are the tenant's
        full = self._sandbox(sid)
        if tag is not None:
            self.need_scope("tag")
        image = self.engine.sandbox_commit(full)
        self._claim_op("commit", image)
        self._own(image)
        if tag is not None:
            self.tag(image, tag)
        self._audit("sandbox commit", image=image, result=image, detail={"sandbox": full})
        return image

    def sandbox_set_network(self, sid: str, network) -> dict:     # rule: its own sandbox, within its grant
        full = self._sandbox(sid)
        self.check_network(network, self.engine.sandbox_info(full)["image"])
        info = self.engine.sandbox_set_network(full, network)
        self._audit("sandbox set network", detail={"sandbox": full, "network": info["network"]})
        return info

    def sandbox_list(self, *, all: bool = False, labels: dict | None = None) -> list[dict]:   # rule: its own
        mine = {r[0] for r in self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='sandbox'",
                                            (self.tenant.name,))}
        return [s for s in self.engine.sandbox_list(all=all, labels=labels) if s["id"] in mine]

    # ---- builds: the view is the build's guard (engine/builds/builds.py OperatorGuard's methods) ----
    def build(self, recipe, *, tag: str | None = None, no_cache: bool = False, no_cache_filter=(), network=None,
              progress=None):
        # rule: a build is a run (a slot of max_runs, RUN steps within its limits and grant), resolves
        # and pulls as this tenant, uses only the cache hits build_hit allows; the tag is its own
        return self._building(tag, lambda: self.engine.build_as(
            recipe, self, no_cache=no_cache, no_cache_filter=no_cache_filter, network=network, progress=progress))

    def build_context(self, context, **options):     # rule: as build's (signature: the table's row)
        # (the context is what the adapter was sent: a server never takes a path from a tenant)
        tag = options.pop("tag", None)
        return self._building(tag, lambda: self.engine.build_context_as(self, context, **options))

    def _building(self, tag, go):
        if tag is not None:
            check_tag(tag)
        with self.tenancy.tenant_lock(self.tenant.name):
            check_slots(self.tenancy, self.tenant)
            self.tenancy.sync_run(self.tenant.name, +1)
        try:
            try:
                res = go()
            except SandtreeError as exc:
                self._audit("build", detail={"tag": tag, "error": exc.code, "message": exc.message[:500]})
                raise self.plain_error(exc) from None
            if tag is not None:
                self._write_tag(tag, res.image, "build")
            self._audit("build", result=res.image, detail={"tag": tag, "steps": len(res.steps),
                                                           "cached": sum(1 for s in res.steps if s.cached)})
            return res
        finally:
            self.tenancy.sync_run(self.tenant.name, -1)

    def build_hit(self, image: str, kind: str) -> bool:
        """Whether this tenant's build may use a cached step result. Rule: only one it sees (its
        own, or shared). Not one it merely could have made (a COPY of bytes it sent onto a parent it
        sees): the hit itself would tell it that another tenant built exactly those bytes there, an
        oracle for guessed file contents, as deduplication side channels are; and a RUN's result
        may hold what that run generated (a key, a token). The step runs again for this tenant
        instead: a deterministic step converges on the same image ID, now its own too."""
        return self._visible(image)

    @property
    def build_principal(self) -> str:
        """Whose build cache rows this tenant's builds hit and write: its own only (engine/builds/cache.py).
        Not the operator's: its result is one the tenant cannot see (build_hit would refuse it anyway)."""
        return self.tenant.name

    def build_run_options(self) -> dict:
        """A RUN step's resources: this tenant's caps (a build asks none of its own)."""
        return capped(self.tenant.limits, self.engine.default_limits, self.forced_tier({}))

    def pool_list(self) -> list[dict]:              # rule: pools are the operator's (any tenant's runs use them)
        return []

    def merge(self, base: str | None, ours: str, theirs: str, *, strategy: str | None = None,
              ignore: list[str] | None = None, on_conflict: str = "raise") -> dict:
        # rule: only this tenant's lineage may choose the base; the merged image is its own
        check_on_conflict(on_conflict)
        self._see(ours), self._see(theirs)
        if base is None:
            base = self.common_ancestor(ours, theirs) or EMPTY_TREE_HASH
        elif base != EMPTY_TREE_HASH:
            self._see(base)
        res = self.engine.merge(base, ours, theirs, strategy=strategy, ignore=ignore, on_conflict="return")
        op = None
        if res.get("image"):
            self._own(res["image"])
            op = self._claim_op("merge", res["image"])
        self._audit("merge", image=ours, result=res.get("image"), op=op,
                    detail={"theirs": theirs, "base": base, "strategy": strategy, "conflicts": len(res["conflicts"])})
        return conflict_outcome(res, on_conflict)          # audited first: a refused merge is recorded too


install(TenantView, table.ENGINE_OPS)
