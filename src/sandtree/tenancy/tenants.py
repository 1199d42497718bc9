"""Tenants and tokens (issue 4): one engine, many tenants, each seeing only its own things.

A token is `stk_<id>_<secret>`: the id is public (list, revoke, audit), the secret random and
shown once; the store keeps sha256(secret) only (a 256-bit random secret needs no slow hash).
A token belongs to a tenant and carries scopes: import, run, list, cancel, tag (and admin: the
whole store, unfiltered, still audited).

`Tenancy.view(tenant)` (= `Engine.as_tenant`) is the engine's facade as that tenant sees it, so
every adapter (REST, MCP over --url, the Contree API, an in-process caller) gets the same rules:

* Images are content-addressed and stored once; visibility is per tenant: an image is visible if
  the tenant imported/merged/pulled it (tenant_images), if one of its own operations produced it
  (tenant_ops joined with operations, so a queued run's result needs no hook when it finishes),
  or if it is public (public_images; `share`/`unshare` by an owner, or the admin CLI).
* Anything else answers exactly as a nonexistent thing would (same error class, same message):
  prefix resolution, lineage, operations, events, uploads and file sets never reveal it.
* Tags and branches are namespaced: stored as `<tenant>~<name>`; `~` is valid in neither a tag
  nor a branch name, so a tenant's refs never collide with global ones or another tenant's.
  Global tags (made by an operator) resolve for a tenant only when their image is public.
* Limits per tenant: concurrent runs (refused past the limit, LimitExceeded), max timeout and
  max output (a run asking for more is refused; a run asking nothing gets the cap).
* Every call that changes something is appended to the audit table with tenant and token id;
  a run's result and outcome are read from its operation row when the audit is queried.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import secrets
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

from ..branching import lineage
from ..store import refs
from ..store.names import check_tag
from ..errors import (
    Conflict,
    Forbidden,
    ImageNotFound,
    InvalidInput,
    LimitExceeded,
    NotFound,
    SandtreeError,
    Unauthorized,
)
from ..engine.secrets_mask import mask_text, secret_values
from ..store.db import Database, dumps
from ..store.objects import EMPTY_TREE_HASH
from ..store.store import HEX_RE

SCOPES = ("import", "run", "list", "cancel", "tag")
ALL_SCOPES = SCOPES + ("admin",)
TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
SEP = "~"
LIMIT_KEYS = ("max_runs", "max_timeout", "max_output", "max_sandboxes", "max_upload", "max_memory", "max_pids",
              "max_disk", "max_cpus")
SIZE_LIMITS = ("max_output", "max_upload", "max_memory", "max_disk")
INT_LIMITS = ("max_runs", "max_sandboxes", "max_pids")
DEFAULT_MAX_SANDBOXES = 8
TOKEN_RE = re.compile(r"^stk_([0-9a-f]{16})_([A-Za-z0-9_-]{20,200})$")

# Images a tenant may see (named parameter :t is the tenant).
# A run's result is the tenant's unless the run changed nothing: a no-op run on an image someone
# shared "produces" that image, which must not keep it visible after it is unshared.
PRODUCED = ("SELECT o.result FROM tenant_ops w JOIN operations o ON o.id=w.op WHERE w.tenant=:t "
            "AND o.result IS NOT NULL AND (o.source IS NULL OR o.result != o.source)")
VISIBLE = ("(id IN (SELECT image FROM tenant_images WHERE tenant=:t) OR id IN (SELECT image FROM public_images) "
           f"OR id IN ({PRODUCED}))")
# Images a tenant owns (may share): the same without public ones.
OWNED = f"(id IN (SELECT image FROM tenant_images WHERE tenant=:t) OR id IN ({PRODUCED}))"


@dataclass(frozen=True)
class Tenant:
    name: str
    scopes: tuple[str, ...] = SCOPES
    limits: dict = field(default_factory=dict)
    token: str | None = None              # the token id it authenticated with

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_tenant_name(name) -> str:
    if not isinstance(name, str) or not TENANT_RE.match(name):
        raise InvalidInput(f"invalid tenant name {name!r} (lower-case letters, digits and ._-)")
    return name


def parse_scopes(scopes) -> tuple[str, ...]:
    if scopes is None:
        return SCOPES
    if isinstance(scopes, str):
        scopes = [s for s in re.split(r"[,\s]+", scopes) if s]
    bad = [s for s in scopes if s not in ALL_SCOPES]
    if bad or not scopes:
        raise InvalidInput(f"unknown scope(s) {', '.join(bad) or '(none given)'} (from: {', '.join(ALL_SCOPES)})")
    return tuple(s for s in ALL_SCOPES if s in scopes)


# Who the audit names for the store's own operator (CLI on the server, the in-process engine):
# the same name whoami() gives an unscoped engine.
OPERATOR = Tenant("local", ALL_SCOPES)


class Tenancy:
    """Tokens, tenants, sharing and the audit log of one engine's store."""

    def __init__(self, engine):
        self.engine = engine
        self.db = engine.store.db
        self._configured = False
        self._lock = threading.Lock()
        self._tenant_locks: dict[str, threading.Lock] = {}
        self._sync_runs: dict[str, int] = {}          # in-process runs in flight, per tenant

    # ---- tokens -------------------------------------------------------------------------------
    def configured(self) -> bool:
        """Whether tokens were ever created: from then on every request needs one. Revoked rows
        stay, so revoking the last token never reopens the server to anyone."""
        if not self._configured:
            self._configured = self.db.one("SELECT 1 FROM tokens LIMIT 1") is not None
        return self._configured

    def create_token(self, tenant: str, scopes=None, **limits) -> dict:
        check_tenant_name(tenant)
        scopes = parse_scopes(scopes)
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        now = time.time()
        with self.db.tx() as con:
            self._set_limits(con, tenant, limits, now)
            con.execute("INSERT INTO tokens(id, tenant, hash, scopes, created, revoked) VALUES(?,?,?,?,?,NULL)",
                        (token_id, tenant, _hash(secret), ",".join(scopes), now))
        self.record(OPERATOR, "token create", detail={"subject_token": token_id, "for": tenant,
                                                                         "scopes": list(scopes)})
        return {"token": f"stk_{token_id}_{secret}", "id": token_id, "tenant": tenant, "scopes": list(scopes),
                "limits": self.limits(tenant)}

    def _set_limits(self, con, tenant: str, limits: dict, now: float) -> None:
        from ..engine import parse_size
        unknown = set(limits) - set(LIMIT_KEYS)
        if unknown:
            raise InvalidInput(f"unknown limit(s): {', '.join(sorted(unknown))}")
        row = con.execute("SELECT limits FROM tenants WHERE name=?", (tenant,)).fetchone()
        cur = json.loads(row[0]) if row else {}
        for k, v in limits.items():
            if v is None:
                continue
            try:
                v = parse_size(v) if k in SIZE_LIMITS else (int(v) if k in INT_LIMITS else float(v))
            except (TypeError, ValueError):
                raise InvalidInput(f"{k} must be a number, not {v!r}") from None
            if v <= 0:
                raise InvalidInput(f"{k} must be positive")
            cur[k] = v
        con.execute("INSERT OR REPLACE INTO tenants(name, limits, created) VALUES(?,?,?)",
                    (tenant, dumps(cur), now))

    def set_limits(self, tenant: str, **limits) -> dict:
        check_tenant_name(tenant)
        with self.db.tx() as con:
            self._set_limits(con, tenant, limits, time.time())
        return self.limits(tenant)

    def limits(self, tenant: str) -> dict:
        row = self.db.one("SELECT limits FROM tenants WHERE name=?", (tenant,))
        return json.loads(row[0]) if row else {}

    def tokens(self) -> list[dict]:
        """Every token (ids, never secrets or hashes), with its tenant's limits."""
        limits = {n: json.loads(v) for n, v in self.db.query("SELECT name, limits FROM tenants")}
        return [{"id": i, "tenant": t, "scopes": s.split(","), "created": c, "revoked": r, "limits": limits.get(t, {})}
                for i, t, s, c, r in self.db.query(
                    "SELECT id, tenant, scopes, created, revoked FROM tokens ORDER BY created")]

    def revoke(self, token_id: str) -> dict:
        with self.db.tx() as con:
            row = con.execute("SELECT tenant FROM tokens WHERE id=?", (token_id,)).fetchone()
            if row is None:
                raise NotFound(f"no token {token_id!r}")
            con.execute("UPDATE tokens SET revoked=? WHERE id=? AND revoked IS NULL", (time.time(), token_id))
        self.record(OPERATOR, "token revoke", detail={"subject_token": token_id, "for": row[0]})
        return {"id": token_id, "tenant": row[0], "revoked": True}

    def authenticate(self, token: str) -> Tenant:
        """The tenant a presented token stands for; Unauthorized (one message for every reason:
        malformed, unknown, wrong secret, revoked) otherwise."""
        m = TOKEN_RE.match(token or "")
        row = self.db.one("SELECT tenant, hash, scopes, revoked FROM tokens WHERE id=?", (m.group(1),)) if m else None
        # compare even without a row, so an unknown id costs the same as a wrong secret
        ok = hmac.compare_digest(row[1] if row else "0" * 64, _hash(m.group(2)) if m else "")
        if not m or row is None or not ok or row[3] is not None:
            raise Unauthorized("invalid or revoked token")
        return Tenant(row[0], tuple(row[2].split(",")), self.limits(row[0]), m.group(1))

    def operator_view(self):
        """The whole engine as its operator uses it (a server without tokens): nothing filtered,
        runs and changes audited as "local"."""
        return AdminView(self, OPERATOR)

    def view(self, tenant: Tenant):
        return AdminView(self, tenant) if tenant.admin else TenantView(self, tenant)

    # ---- sharing ------------------------------------------------------------------------------
    def share(self, image: str, by: Tenant | None = None) -> dict:
        with self.db.tx() as con:
            if con.execute("SELECT 1 FROM images WHERE id=?", (image,)).fetchone() is None:
                raise ImageNotFound(f"no image {image!r}", image=image)
            con.execute("INSERT OR IGNORE INTO public_images(image, at, by) VALUES(?,?,?)",
                        (image, time.time(), None if by is None or by.admin else by.name))
        self.record(by or OPERATOR, "share", image=image)
        return {"image": image, "public": True}

    def unshare(self, image: str, by: Tenant | None = None) -> dict:
        with self.db.tx() as con:
            con.execute("DELETE FROM public_images WHERE image=?", (image,))
        self.record(by or OPERATOR, "unshare", image=image)
        return {"image": image, "public": False}

    # ---- audit --------------------------------------------------------------------------------
    def record(self, tenant: Tenant, action: str, *, image: str | None = None, result: str | None = None,
               op: str | None = None, detail: dict | None = None) -> None:
        with self.db.tx() as con:
            con.execute("INSERT INTO audit(at, tenant, token, action, image, result, op, detail) "
                        "VALUES(?,?,?,?,?,?,?,?)", (time.time(), tenant.name, tenant.token, action, image, result,
                                                    op, dumps(detail or {})))

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        """Newest first. A run's result image and outcome come from its operation row."""
        limit = max(1, min(int(limit), 10000))
        where, args = ("WHERE a.tenant=?", (tenant,)) if tenant is not None else ("", ())
        rows = self.db.query(
            "SELECT a.seq, a.at, a.tenant, a.token, a.action, a.image, a.result, a.op, a.detail, o.result, o.outcome, "
            f"o.finished, o.id FROM audit a LEFT JOIN operations o ON o.id=a.op {where} ORDER BY a.seq DESC LIMIT ?",
            (*args, limit))
        out = []
        for seq, at, ten, tok, action, image, result, op, detail, op_result, outcome, finished, op_row in rows:
            rec = {**json.loads(detail), "seq": seq, "at": at, "tenant": ten, "token": tok, "action": action,
                   "image": image, "result": result or op_result, "op": op}
            if op is not None:
                o = json.loads(outcome) if outcome else {}
                # no operation row: the engine refused the run before starting it (bad input)
                rec["outcome"] = ("refused" if op_row is None else "running" if finished is None
                                  else "cancelled" if o.get("cancelled")
                                  else "failed" if "error" in o else "done")
                rec["exit_code"] = o.get("exit_code")
            out.append(rec)
        return out

    # ---- limits -------------------------------------------------------------------------------
    def tenant_lock(self, tenant: str) -> threading.Lock:
        with self._lock:
            return self._tenant_locks.setdefault(tenant, threading.Lock())

    def running(self, tenant: str) -> int:
        """Runs of `tenant` not finished: its queued/running operations plus in-process runs."""
        n = self.db.one("SELECT COUNT(*) FROM tenant_ops w JOIN operations o ON o.id=w.op "
                        "WHERE w.tenant=? AND o.finished IS NULL", (tenant,))[0]
        with self._lock:
            return n + self._sync_runs.get(tenant, 0)

    def sync_run(self, tenant: str, delta: int) -> None:
        with self._lock:
            self._sync_runs[tenant] = self._sync_runs.get(tenant, 0) + delta


def check_public_registry(hostport: str) -> None:
    """A tenant's pull makes the *server* connect to the registry it names: only to public
    addresses, never to the server's own loopback, its private networks or link-local metadata
    services (Forbidden before any connection). Names are resolved here; the operator (admin)
    may pull from anywhere."""
    host = hostport[1:hostport.index("]")] if hostport.startswith("[") else hostport.rsplit(":", 1)[0]
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise InvalidInput(f"registry host {host!r} does not resolve") from None
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if not ip.is_global or ip.is_multicast:
            raise Forbidden(f"registry {hostport} is not a public address ({ip}): a tenant's pulls reach "
                            "public registries only (the admin may pull from others)", scope="admin")


def _scoped(scope: str):
    """The method needs `scope` on the caller's token (Forbidden, naming it, otherwise)."""
    def deco(fn):
        def wrapper(self, *a, **k):
            self._need(scope)
            return fn(self, *a, **k)
        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper
    return deco


def _admin_only(what: str):
    def method(self, *a, **k):
        raise Forbidden(f"{what} is for the server's administrator (a token with the admin scope)",
                        scope="admin")
    return method


class TenantView:
    """The engine as one tenant sees it: the method set of engine.Engine (and remote.RemoteEngine)."""

    def __init__(self, tenancy: Tenancy, tenant: Tenant):
        self.tenancy, self.tenant = tenancy, tenant
        self.engine = tenancy.engine
        self.db = tenancy.db
        self._p = {"t": tenant.name}
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

    def _need(self, scope: str) -> None:
        if scope not in self.tenant.scopes:
            raise Forbidden(f"this token has no {scope!r} scope (it has: {', '.join(self.tenant.scopes)})",
                            scope=scope)

    def _ns(self, name: str) -> str:
        return f"{self.tenant.name}{SEP}{name}"

    def _visible(self, image) -> bool:
        return isinstance(image, str) and self.db.one(
            f"SELECT 1 FROM images WHERE id=:i AND {VISIBLE}", {**self._p, "i": image}) is not None

    def _see(self, image) -> str:
        """`image` if this tenant may see it, else exactly the store's ImageNotFound."""
        if not self._visible(image):
            raise ImageNotFound(f"no image {image!r}", image=image)
        return image

    def _visible_set(self) -> set[str]:
        return {r[0] for r in self.db.query(f"SELECT id FROM images WHERE {VISIBLE}", self._p)}

    def _own(self, image: str) -> None:
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_images(tenant, image, at) VALUES(?,?,?)",
                        (self.tenant.name, image, time.time()))

    def _claim_op(self, kind: str, result: str) -> str | None:
        """The operation the engine just wrote for this tenant's import or merge (the engine makes
        its id inside), recorded as this tenant's so lineage shows it."""
        row = self.db.one("SELECT id FROM operations WHERE kind=? AND result=? AND id NOT IN "
                          "(SELECT op FROM tenant_ops) ORDER BY started DESC LIMIT 1", (kind, result))
        if row is None:
            return None
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_ops(op, tenant, token) VALUES(?,?,?)",
                        (row[0], self.tenant.name, self.tenant.token))
        return row[0]

    def _audit(self, action: str, **kw) -> None:
        self.tenancy.record(self.tenant, action, **kw)

    def _own_blob(self, kind: str, ident) -> None:
        if not isinstance(ident, str) or self.db.one("SELECT 1 FROM tenant_blobs WHERE tenant=? AND kind=? AND id=?",
                                                     (self.tenant.name, kind, ident)) is None:
            raise NotFound(f"no uploaded file {ident!r}" if kind == "upload" else f"no file set {ident!r}")

    def _plain(self, exc: SandtreeError) -> SandtreeError:
        """An engine error about a namespaced ref, told with the tenant's own name for it."""
        pre = self._ns("")
        exc.message = exc.message.replace(pre, "")
        exc.args = (exc.message,)
        exc.details = {k: (v.replace(pre, "") if isinstance(v, str) else v) for k, v in exc.details.items()}
        return exc

    # ---- names --------------------------------------------------------------------------------
    def _own_ref(self, kind: str, name: str) -> str | None:
        if not isinstance(name, str) or SEP in name:
            return None
        row = self.db.one("SELECT image FROM refs WHERE kind=? AND name=?", (kind, self._ns(name)))
        return row[0] if row else None

    def _tag_image(self, name: str) -> str | None:
        own = self._own_ref("tag", name)
        if own is not None:
            return own if self._visible(own) else None
        if SEP in name:
            return None
        row = self.db.one("SELECT image FROM refs WHERE kind='tag' AND name=? AND image IN "
                          "(SELECT image FROM public_images)", (name,))
        return row[0] if row else None

    def _branch_of(self, ref) -> str | None:
        if not isinstance(ref, str):
            return None
        if ref.startswith("branch:"):
            return ref[7:]
        if self._own_ref("tag", ref) is not None:
            return None
        return ref if self._own_ref("branch", ref) is not None else None

    def _head(self, name: str) -> str:
        image = self._own_ref("branch", name)
        if image is None:
            raise NotFound(f"no branch {name!r}", branch=name)
        return image

    @_scoped("list")
    def resolve(self, ref: str) -> str:
        if not isinstance(ref, str) or not ref:
            raise InvalidInput("an image reference must be a non-empty string")
        branch = self._branch_of(ref)
        if branch is not None:
            return self._head(branch)
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

    def _target(self, ref) -> str:
        """What the engine is given for a run: this tenant's branch by its stored name (the run
        advances it), else a visible image ID."""
        branch = self._branch_of(ref)
        if branch is not None:
            self._head(branch)
            return "branch:" + self._ns(branch)
        return self.resolve(ref)

    # ---- images and refs ----------------------------------------------------------------------
    def _names(self) -> dict[str, list[str]]:
        """image -> the tag names this tenant sees on it (its own, and global ones of public images)."""
        pre = self._ns("")
        out: dict[str, set[str]] = {}
        for name, image in self.db.query("SELECT name, image FROM refs WHERE kind='tag' AND substr(name, 1, ?)=?",
                                         (len(pre), pre)):
            out.setdefault(image, set()).add(name[len(pre):])
        for name, image in self.db.query("SELECT name, image FROM refs WHERE kind='tag' AND instr(name, ?)=0 "
                                         "AND image IN (SELECT image FROM public_images)", (SEP,)):
            out.setdefault(image, set()).add(name)
        return {k: sorted(v) for k, v in out.items()}

    @_scoped("list")
    def images(self) -> list[dict]:
        names = self._names()
        return [{"id": r[0], "created": r[1], "size": r[2], "files": r[3], "tags": names.get(r[0], [])}
                for r in self.db.query(f"SELECT id, created, size, files FROM images WHERE {VISIBLE} "
                                       "ORDER BY created", self._p)]

    @_scoped("list")
    def tags(self, image: str | None = None) -> dict[str, str]:
        vis = self._visible_set()
        out = {}
        for img, names in self._names().items():
            if img in vis and (image is None or img == image):
                for n in names:
                    out.setdefault(n, img)
        return dict(sorted(out.items()))

    @_scoped("tag")
    def tag(self, image: str, name: str) -> None:
        check_tag(name)
        self._see(image)
        with self.db.tx() as con:
            row = con.execute("SELECT image FROM refs WHERE kind='tag' AND name=?", (self._ns(name),)).fetchone()
            if row is None or row[0] != image:
                Database.record_ref(con, "tag", self._ns(name), row[0] if row else None, image, "tag")
        self._audit("tag", image=image, detail={"tag": name})

    @_scoped("tag")
    def untag(self, name: str) -> str:
        with self.db.tx() as con:
            row = con.execute("SELECT image FROM refs WHERE kind='tag' AND name=?", (self._ns(name),)).fetchone() \
                if isinstance(name, str) and SEP not in name else None
            if row is None:
                raise NotFound(f"no tag {name!r}")
            Database.record_ref(con, "tag", self._ns(name), row[0], None, "untag")
        self._audit("untag", image=row[0], detail={"tag": name})
        return row[0]

    @_scoped("list")
    def image_info(self, image: str) -> dict:
        self._see(image)
        row = self.engine.store.image(image)
        return {"id": image, "tags": self._names().get(image, []), "size": row.size, "files": row.files,
                "created": row.created, "parents": [p["parent"] for p in self.parents(image)]}

    @_scoped("tag")
    def share(self, image: str) -> dict:
        """Make an image this tenant owns visible (by ID) to every tenant."""
        if self.db.one(f"SELECT 1 FROM images WHERE id=:i AND {OWNED}", {**self._p, "i": image}) is None:
            self._see(image)                    # not visible: answer as nonexistent
            raise Forbidden("only a tenant that owns an image can share it", scope="tag")
        return self.tenancy.share(image, by=self.tenant)

    @_scoped("tag")
    def unshare(self, image: str) -> dict:
        # Only the tenant that shared it: owning it is not enough (a no-op run "produces" the
        # shared image itself, which would let any tenant hide an operator's image from everyone).
        self._see(image)
        row = self.db.one("SELECT by FROM public_images WHERE image=?", (image,))
        if row is not None and row[0] != self.tenant.name:
            raise Forbidden("only the tenant that shared an image (or an admin) can unshare it", scope="tag")
        return self.tenancy.unshare(image, by=self.tenant)

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        """This tenant's own audit records (an admin token sees everyone's)."""
        if tenant not in (None, self.tenant.name):
            raise Forbidden("a tenant sees only its own audit records", scope="admin")
        return self.tenancy.audit(tenant=self.tenant.name, limit=limit)

    def whoami(self) -> dict:
        lim = self.engine.default_limits
        t = self.tenant.limits
        return {"tenant": self.tenant.name, "scopes": list(self.tenant.scopes), "token": self.tenant.token,
                "limits": {"timeout": min(lim.timeout, t.get("max_timeout", lim.timeout)), "memory": min(lim.memory, t.get("max_memory", lim.memory)),
                           "pids": min(lim.pids, t.get("max_pids", lim.pids)),
                           "disk": min(lim.disk, t.get("max_disk", lim.disk)), "output": min(lim.output, t.get("max_output", lim.output)),
                           "concurrent_runs": t.get("max_runs", self.engine._max_runs),
                           "live_sandboxes": t.get("max_sandboxes", DEFAULT_MAX_SANDBOXES)}}

    def doctor(self) -> list[dict]:
        return self.engine.doctor()

    # ---- live sandboxes -------------------------------------------------------------------------
    # A sandbox is this tenant's if it started it (tenant_blobs, kind "sandbox"); any other id or
    # prefix answers as a nonexistent sandbox. Commits are its images, execs its operations.
    def _sandbox(self, sid) -> str:
        """The full id of this tenant's sandbox `sid` (an id or unique prefix), else NotFound."""
        if not isinstance(sid, str) or not sid:
            raise InvalidInput("a sandbox id must be a non-empty string")
        rows = self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='sandbox' AND id >= ? AND id < ? "
                             "LIMIT 2", (self.tenant.name, sid, sid + "\uffff"))
        if len(rows) > 1:
            raise InvalidInput(f"sandbox id {sid!r} is ambiguous")
        if not rows:
            raise NotFound(f"no live sandbox {sid!r}", sandbox=sid)
        return rows[0][0]

    def _claim(self, op: str) -> None:
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_ops(op, tenant, token) VALUES(?,?,?)",
                        (op, self.tenant.name, self.tenant.token))

    @_scoped("run")
    def sandbox_start(self, ref: str, **options) -> dict:
        opts = self._run_options(options)
        source = self.resolve(ref)
        cap = self.tenant.limits.get("max_sandboxes", DEFAULT_MAX_SANDBOXES)
        with self.tenancy.tenant_lock(self.tenant.name):
            if len(self.sandbox_list()) >= cap:
                raise LimitExceeded(f"this tenant already has {cap} live sandbox(es) (max_sandboxes {cap}); "
                                    "stop one", limit="max_sandboxes", max=cap)
            info = self.engine.sandbox_start(source, **opts)
            with self.db.tx() as con:
                con.execute("INSERT INTO tenant_blobs(tenant, kind, id) VALUES(?,?,?)",
                            (self.tenant.name, "sandbox", info["id"]))
        self._audit("sandbox start", image=source, detail={"sandbox": info["id"]})
        return info

    @_scoped("run")
    def sandbox_exec(self, sid: str, command, **options):
        full = self._sandbox(sid)
        opts = self._run_options(options, resources=False)
        rec = self.engine.sandbox_exec(full, command, **opts)
        self._claim(rec.op)
        self._audit("exec", image=rec.source, op=rec.op,
                    detail={"sandbox": full, "command": _masked(command, opts.get("env"))})
        return rec

    @_scoped("run")
    def sandbox_popen(self, sid: str, argv, **options):
        full = self._sandbox(sid)
        self._audit("exec", detail={"sandbox": full, "command": _masked(argv, options.get("env")),
                                    "interactive": True})
        return self.engine.sandbox_popen(full, argv, **options)

    @_scoped("run")
    def sandbox_commit(self, sid: str, *, tag: str | None = None) -> str:
        full = self._sandbox(sid)
        if tag is not None:
            self._need("tag")
        image = self.engine.sandbox_commit(full)
        self._claim_op("commit", image)
        self._own(image)
        if tag is not None:
            self.tag(image, tag)
        self._audit("sandbox commit", image=image, result=image, detail={"sandbox": full})
        return image

    @_scoped("run")
    def sandbox_stop(self, sid: str) -> dict:
        full = self._sandbox(sid)
        self._audit("sandbox stop", detail={"sandbox": full})
        return self.engine.sandbox_stop(full)

    @_scoped("run")
    def sandbox_hibernate(self, sid: str) -> dict:
        full = self._sandbox(sid)
        info = self.engine.sandbox_hibernate(full)
        self._claim_op("commit", info["head"])        # the hibernation's commit is the tenant's
        self._own(info["head"])
        self._audit("sandbox hibernate", image=info["head"], detail={"sandbox": full})
        return info

    @_scoped("run")
    def sandbox_resume(self, sid: str) -> dict:
        full = self._sandbox(sid)
        self._audit("sandbox resume", detail={"sandbox": full})
        return self.engine.sandbox_resume(full)

    @_scoped("list")
    def sandbox_info(self, sid: str) -> dict:
        return self.engine.sandbox_info(self._sandbox(sid))

    @_scoped("list")
    def sandbox_list(self, *, all: bool = False) -> list[dict]:
        mine = {r[0] for r in self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='sandbox'",
                                            (self.tenant.name,))}
        return [s for s in self.engine.sandbox_list(all=all) if s["id"] in mine]

    @_scoped("list")
    def sandbox_read(self, sid: str, path: str) -> bytes:
        return self.engine.sandbox_read(self._sandbox(sid), path)

    @_scoped("run")
    def sandbox_write(self, sid: str, path: str, data: bytes, **options) -> None:
        self.engine.sandbox_write(self._sandbox(sid), path, data, **options)

    pool_create = _admin_only("a warm pool")
    pool_remove = _admin_only("a warm pool")
    pool_wait = _admin_only("a warm pool")

    def pool_list(self) -> list[dict]:
        return []                           # pools are the operator's (runs of any tenant use them)

    # ---- imports ------------------------------------------------------------------------------
    def _imported(self, kind: str, image: str, tag: str | None, detail: dict) -> str:
        self._own(image)
        op = self._claim_op(kind, image)
        if tag is not None:
            with self.db.tx() as con:
                row = con.execute("SELECT image FROM refs WHERE kind='tag' AND name=?", (self._ns(tag),)).fetchone()
                if row is None or row[0] != image:
                    Database.record_ref(con, "tag", self._ns(tag), row[0] if row else None, image, kind)
        self._audit(kind, result=image, op=op, detail={**detail, **({"tag": tag} if tag else {})})
        return image

    @_scoped("import")
    def import_path(self, path: str, *, tag: str | None = None, progress=None) -> str:
        if tag is not None:
            check_tag(tag)
        image = self.engine.import_path(path, tag=None, progress=progress)
        return self._imported("import", image, tag, {})

    @_scoped("import")
    def pull(self, reference: str, *, tag: str | None = None, insecure: bool = False, progress=None) -> str:
        from ..store import registry
        if tag is not None:
            check_tag(tag)
        ref = registry.parse(reference)
        check_public_registry(ref.registry)
        # stored registry credentials are the operator's: a tenant must not pull with them
        if self.db.one("SELECT 1 FROM registry_auth WHERE registry=?", (ref.registry,)):
            raise Forbidden(f"pulling from {ref.registry} uses the operator's stored credentials: admin only",
                            scope="admin")
        image = self.engine.pull_operation(reference, tag=None, insecure=insecure, progress=progress,
                                 check_host=check_public_registry)         # redirects and realms too
        return self._imported("pull", image, tag, {"reference": str(ref)})

    registry_login = _admin_only("storing registry credentials")
    bootstrap = _admin_only("bootstrap")
    fsck = _admin_only("fsck")
    gc = _admin_only("gc")
    remove_image = _admin_only("removing images (they may be shared by content with other tenants)")
    bundle_create = _admin_only("writing bundles on the server")
    bundle_import = _admin_only("importing bundles on the server")

    # ---- uploads ------------------------------------------------------------------------------
    @_scoped("run")
    def upload(self, data: bytes) -> str:
        digest = self.engine.upload(data)
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_blobs(tenant, kind, id) VALUES(?,?,?)",
                        (self.tenant.name, "upload", digest))
        return digest

    @_scoped("run")
    def upload_file(self, path: str, digest: str | None = None) -> str:
        """What the server spooled of this tenant's upload (server.py; never a path a tenant names)."""
        digest = self.engine.upload_file(path, digest)
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_blobs(tenant, kind, id) VALUES(?,?,?)",
                        (self.tenant.name, "upload", digest))
        return digest

    @_scoped("list")
    def upload_info(self, digest: str) -> dict:
        self._own_blob("upload", digest)
        return self.engine.upload_info(digest)

    @_scoped("list")
    def find_upload(self, prefix: str) -> str:
        """This tenant's upload by a unique prefix (another tenant's answers as absent)."""
        import re as _re
        if not isinstance(prefix, str) or not _re.fullmatch(r"[0-9a-f]{32,64}", prefix):
            raise InvalidInput(f"an upload prefix is 32 to 64 hex digits, not {prefix!r}")
        rows = self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='upload' AND id >= ? AND id < ? "
                             "LIMIT 2", (self.tenant.name, prefix, prefix + "g"))
        if not rows:
            raise NotFound(f"no uploaded file {prefix!r}")
        if len(rows) > 1:
            raise InvalidInput(f"upload prefix {prefix!r} is ambiguous")
        return rows[0][0]

    @_scoped("list")
    def download(self, digest: str) -> bytes:
        self._own_blob("upload", digest)
        return self.engine.download(digest)

    def _check_files(self, files) -> None:
        for f in files or []:
            if isinstance(f, dict) and f.get("sha256") is not None:
                self._own_blob("upload", f["sha256"])

    @_scoped("run")
    def file_set_create(self, files: list[dict]) -> str:
        self._check_files(files)
        set_id = self.engine.file_set_create(files)
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_blobs(tenant, kind, id) VALUES(?,?,?)",
                        (self.tenant.name, "file_set", set_id))
        return set_id

    @_scoped("list")
    def file_set(self, set_id: str) -> list[dict]:
        self._own_blob("file_set", set_id)
        return self.engine.file_set(set_id)

    # ---- inspection ---------------------------------------------------------------------------
    @_scoped("list")
    def ls(self, image: str, path: str = "/"):
        return self.engine.ls(self._see(image), path)

    @_scoped("list")
    def stat(self, image: str, path: str):
        return self.engine.stat(self._see(image), path)

    @_scoped("list")
    def read(self, image: str, path: str, offset: int = 0, limit: int | None = None) -> bytes:
        return self.engine.read(self._see(image), path, offset, limit)

    @_scoped("list")
    def grep(self, image: str, pattern: str, path: str = "/", **kw) -> list[dict]:
        return self.engine.grep(self._see(image), pattern, path, **kw)

    @_scoped("list")
    def export_tar(self, image: str, fileobj, path: str = "/") -> None:
        self.engine.export_tar(self._see(image), fileobj, path)

    @_scoped("list")
    def diff(self, a: str, b: str) -> list:
        return self.engine.diff(self._see(a), self._see(b))

    @_scoped("list")
    def patch(self, a: str, b: str) -> str:
        return self.engine.patch(self._see(a), self._see(b))

    # ---- runs ---------------------------------------------------------------------------------
    def _run_options(self, options: dict, resources: bool = True) -> dict:
        """Uploads and file sets must be this tenant's; timeout, output, memory, pids, disk and CPUs
        within its limits. resources=False: an exec in a live sandbox (its memory, pids and disk
        were the sandbox's, checked at its start)."""
        from ..engine import parse_size
        if "op_id" in options:
            raise InvalidInput("unknown option(s): op_id")   # an operation's id is the engine's to choose
        opts = dict(options)
        self._check_files(opts.get("files"))
        if opts.get("file_set") is not None:
            self._own_blob("file_set", opts["file_set"])
        lim, default = self.tenant.limits, self.engine.default_limits
        # What a run may take of the host. Memory, pids, disk and output are capped by the tenant's
        # limit or, where the operator set none, by the engine's defaults: a token without limits
        # must not ask for 64G of memory, 500000 pids (pid_max is 32768) or 4G of output held in the
        # server (review of issue 12). Timeout and CPUs only take time and a slot of max_runs, so
        # they are capped only where the operator said so.
        for key, cap_key, conv, dflt, fallback in (
                ("timeout", "max_timeout", float, default.timeout, None),
                ("output", "max_output", parse_size, default.output, default.output),
                ("memory", "max_memory", parse_size, default.memory, default.memory),
                ("pids", "max_pids", int, default.pids, default.pids),
                ("disk", "max_disk", parse_size, default.disk, default.disk),
                ("cpus", "max_cpus", float, default.cpus, None)):
            if not resources and key not in ("timeout", "output"):
                continue
            cap = lim.get(cap_key, fallback)
            if cap is None:
                continue
            if opts.get(key) is None:
                opts[key] = cap if dflt is None else min(dflt, cap)
                continue
            try:
                asked = conv(opts[key])
            except (TypeError, ValueError):
                continue                                   # the engine refuses it with its own message
            if asked > cap:
                where = cap_key if cap_key in lim else f"the server's default; an operator raises it with {cap_key}"
                raise LimitExceeded(f"{key} {opts[key]} is over this tenant's limit ({where}: {cap:g})",
                                    limit=cap_key, max=cap)
        return opts

    def _check_slots(self) -> None:
        cap = self.tenant.limits.get("max_runs")
        if cap is not None and self.tenancy.running(self.tenant.name) >= cap:
            raise LimitExceeded(f"this tenant already has {cap} run(s) going (max_runs {cap}); wait for one",
                                limit="max_runs", max=cap)

    def _audit_run(self, source: str, command, op: str, env, branch: str | None) -> None:
        self._audit("run", image=source, op=op,
                    detail={"command": _masked(command, env), **({"branch": branch} if branch else {})})

    @_scoped("run")
    def run(self, ref: str, command, **options):
        opts = self._run_options(options)
        target = self._target(ref)
        branch = self._branch_of(ref)
        source = self._head(branch) if branch is not None else target
        op = uuid.uuid4().hex
        with self.tenancy.tenant_lock(self.tenant.name):
            self._check_slots()
            self.tenancy.sync_run(self.tenant.name, +1)
        try:
            with self.db.tx() as con:
                con.execute("INSERT INTO tenant_ops(op, tenant, token) VALUES(?,?,?)",
                            (op, self.tenant.name, self.tenant.token))
            self._audit_run(source, command, op, opts.get("env"), branch)
            try:
                return self.engine.run_operation(target, command, op_id=op, **opts)
            except SandtreeError as exc:
                raise self._plain(exc) from None
        finally:
            self.tenancy.sync_run(self.tenant.name, -1)

    @_scoped("list")
    def operation(self, op: str) -> dict:
        self._ops._check(op)
        return self.engine.operation(op)

    # ---- lineage ------------------------------------------------------------------------------
    def _op_visible(self, op: str) -> bool:
        """An operation's record (command, exit code) shows if it is this tenant's, or an
        operator's (no tenant); never another tenant's."""
        row = self.db.one("SELECT tenant FROM tenant_ops WHERE op=?", (op,))
        return row is None or row[0] == self.tenant.name

    def _edges(self, image: str, up: bool, vis: set[str]) -> list[tuple]:
        col = "child" if up else "parent"
        rows = self.db.query(f"SELECT parent, child, op, created FROM edges WHERE {col}=? ORDER BY created", (image,))
        return [r for r in rows if r[0] in vis and r[1] in vis and self._op_visible(r[2])]

    def _dist(self, image: str, up: bool) -> dict[str, int]:
        vis = self._visible_set()
        dist, q = {image: 0}, deque([image])
        while q:
            cur = q.popleft()
            for e in self._edges(cur, up, vis):
                nxt = e[0] if up else e[1]
                if nxt not in dist:
                    dist[nxt] = dist[cur] + 1
                    q.append(nxt)
        return dist

    @_scoped("list")
    def parents(self, image: str) -> list[dict]:
        self._see(image)
        return [self.engine._edge(r) for r in self._edges(image, True, self._visible_set())]

    @_scoped("list")
    def children(self, image: str) -> list[dict]:
        self._see(image)
        return [self.engine._edge(r) for r in self._edges(image, False, self._visible_set())]

    @_scoped("list")
    def ancestors(self, image: str) -> dict[str, int]:
        return self._dist(self._see(image), True)

    @_scoped("list")
    def descendants(self, image: str) -> dict[str, int]:
        return self._dist(self._see(image), False)

    @_scoped("list")
    def common_ancestor(self, a: str, b: str) -> str | None:
        da, db = self._dist(self._see(a), True), self._dist(self._see(b), True)
        common = set(da) & set(db)
        if not common:
            return None
        created = {i: self.engine.store.image(i).created for i in common}
        return min(common, key=lambda x: (da[x] + db[x], -created[x]))

    @_scoped("list")
    def lineage_path(self, a: str, b: str) -> list[str]:
        self._see(a), self._see(b)
        vis = self._visible_set()

        def chain(frm: str, to: str) -> list[str] | None:
            prev, q = {frm: None}, deque([frm])
            while q:
                cur = q.popleft()
                if cur == to:
                    out = []
                    while cur is not None:
                        out.append(cur)
                        cur = prev[cur]
                    return out[::-1]
                for e in self._edges(cur, False, vis):
                    if e[1] not in prev:
                        prev[e[1]] = cur
                        q.append(e[1])
            return None
        down = chain(a, b)
        if down:
            return down
        up = chain(b, a)
        if up:
            return up[::-1]
        base = self.common_ancestor(a, b)
        if base is None:
            raise NotFound("the two images share no ancestor")
        return chain(base, a)[::-1] + chain(base, b)[1:]

    @_scoped("list")
    def produced_by(self, image: str) -> list[dict]:
        return [r for r in lineage.produced_by(self.engine.store, self._see(image)) if self._op_visible(r["op"])]

    @_scoped("list")
    def log(self, image: str, limit: int = 1000) -> list[dict]:
        self._see(image)
        vis, names = self._visible_set(), self._names()
        out, seen, todo = [], set(), [image]
        while todo and len(out) < limit:
            cur = todo.pop(0)
            if cur in seen:
                continue
            seen.add(cur)
            parents = [self.engine._edge(r) for r in self._edges(cur, True, vis)]
            if not parents:
                made = next((r for r in self.db.query("SELECT id, spec FROM operations WHERE result=? AND "
                                                      "kind='import' ORDER BY started", (cur,))
                             if self._op_visible(r[0])), None)
                out.append({"image": cur, "parents": [], "command": json.loads(made[1])["source"] if made else None,
                            "op": made[0] if made else None, "exit_code": None, "tags": names.get(cur, [])})
                continue
            first = parents[0]
            out.append({"image": cur, "parents": [p["parent"] for p in parents], "command": first.get("command"),
                        "op": first["op"], "exit_code": first.get("exit_code"), "tags": names.get(cur, [])})
            todo.extend(p["parent"] for p in parents)
        return out

    @_scoped("list")
    def lineage_tree(self, root: str, *, max_nodes: int = lineage.MAX_TREE_NODES) -> dict:
        """branching/lineage.tree with this tenant's edges and names."""
        self._see(root)
        vis, names = self._visible_set(), {k: list(v) for k, v in self._names().items()}
        pre = self._ns("")
        for name, image in self.db.query("SELECT name, image FROM refs WHERE kind='branch' AND substr(name, 1, ?)=?",
                                         (len(pre), pre)):
            names.setdefault(image, []).append("branch:" + name[len(pre):])

        def via(op: str) -> dict:
            s = self.engine._op_summary(op)
            return {"command": s.get("command") or s.get("kind"), "exit_code": s.get("exit_code")}
        return lineage.tree(self.engine.store, root, max_nodes=max_nodes, names=names, via=via,
                            children=lambda image: [(r[1], r[2]) for r in self._edges(image, False, vis)])

    # ---- merge and branches -------------------------------------------------------------------
    @_scoped("run")
    def merge(self, base: str | None, ours: str, theirs: str, *, strategy: str | None = None,
              ignore: list[str] | None = None, on_conflict: str = "raise") -> dict:
        from ..engine.branching import check_on_conflict, conflict_outcome
        check_on_conflict(on_conflict)
        self._see(ours), self._see(theirs)
        if base is None:
            # the engine would look over everyone's lineage; only this tenant's may choose the base
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

    @_scoped("tag")
    def branch_create(self, name: str, image: str, *, force: bool = False) -> None:
        refs._check(name)
        self._see(image)
        with self.db.tx() as con:
            row = con.execute("SELECT image FROM refs WHERE kind='branch' AND name=?", (self._ns(name),)).fetchone()
            if row is not None and not force:
                raise Conflict(f"branch {name!r} exists (at {row[0][:12]})", branch=name, image=row[0])
            Database.record_ref(con, "branch", self._ns(name), row[0] if row else None, image, "create")
        self._audit("branch create", image=image, detail={"branch": name})

    @_scoped("tag")
    def branch_delete(self, name: str) -> str:
        self._head(name)
        try:
            image = refs.delete(self.engine.store, self._ns(name))
        except SandtreeError as exc:
            raise self._plain(exc) from None
        self._audit("branch delete", image=image, detail={"branch": name})
        return image

    @_scoped("list")
    def branches(self) -> dict[str, str]:
        pre = self._ns("")
        return {n[len(pre):]: i for n, i in self.db.query(
            "SELECT name, image FROM refs WHERE kind='branch' AND substr(name, 1, ?)=? ORDER BY name",
            (len(pre), pre))}

    @_scoped("list")
    def branch_head(self, name: str) -> str:
        return self._head(name)

    @_scoped("list")
    def branch_log(self, name: str) -> list[dict]:
        self._head(name)
        return refs.reflog(self.engine.store, self._ns(name))

    @_scoped("tag")
    def rollback(self, name: str, *, to: str | None = None, steps: int | None = None) -> str:
        cur = self._head(name)
        if to is not None:
            self._see(to)
        try:
            target = refs.rollback_target(self.engine.store, self._ns(name), steps=steps, to=to,
                                          is_ancestor=lambda a, b: a in self._dist(b, True))
            refs.advance(self.engine.store, self._ns(name), cur, target, "rollback")
        except SandtreeError as exc:
            raise self._plain(exc) from None
        self._audit("rollback", image=cur, result=target, detail={"branch": name})
        return target


class TenantOperations:
    """engine.operations as one tenant sees it: only its own operations exist."""

    # Process-wide counters /metrics reads: no tenant's data in them.
    _SHARED = ("lock", "counts", "latency_buckets", "latency", "latency_sum", "queue_depth")

    def __init__(self, view: TenantView):
        self.view = view

    @property
    def inner(self):
        return self.view.engine.operations

    def __getattr__(self, name):
        if name in self._SHARED:
            return getattr(self.inner, name)
        raise AttributeError(name)

    def _check(self, op) -> None:
        if not isinstance(op, str) or self.view.db.one("SELECT 1 FROM tenant_ops WHERE op=? AND tenant=?",
                                                      (op, self.view.tenant.name)) is None:
            raise NotFound(f"no operation {op!r}")

    def submit_pull(self, reference: str, *, tag: str | None = None,
                    credentials: tuple[str, str] | None = None) -> str:
        """An import operation of this tenant: the image becomes its own, the tag its own name."""
        from ..store import registry
        v = self.view
        v._need("import")
        if tag is not None:
            check_tag(tag)
        ref = registry.parse(reference)
        check_public_registry(ref.registry)
        if credentials is not None or v.db.one("SELECT 1 FROM registry_auth WHERE registry=?", (ref.registry,)):
            # registry credentials are stored server-wide (the operator's): not a tenant's to set or use
            raise Forbidden(f"pulling from {ref.registry} with stored or given credentials: admin only",
                            scope="admin")
        op = self.inner.submit_pull(reference, then=lambda image: v._imported("pull", image, tag,
                                                                             {"reference": str(ref)}),
                                    check_host=check_public_registry)     # redirects and realms too
        with v.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_ops(op, tenant, token) VALUES(?,?,?)",
                        (op, v.tenant.name, v.tenant.token))
        return op

    def submit_run(self, ref: str, command, **options) -> str:
        v = self.view
        v._need("run")
        opts = v._run_options(options)
        target = v._target(ref)
        branch = v._branch_of(ref)
        source = v._head(branch) if branch is not None else target
        # one tenant's submissions are counted and recorded one at a time, so two cannot both
        # take the last free slot
        with v.tenancy.tenant_lock(v.tenant.name):
            v._check_slots()
            try:
                op = self.inner.submit_run(target, command, **opts)
            except SandtreeError as exc:
                raise v._plain(exc) from None
            with v.db.tx() as con:
                con.execute("INSERT INTO tenant_ops(op, tenant, token) VALUES(?,?,?)",
                            (op, v.tenant.name, v.tenant.token))
        v._audit_run(source, command, op, opts.get("env"), branch)
        return op

    def get(self, op: str) -> dict:
        self.view._need("list")
        self._check(op)
        return self._plain_rec(self.inner.get(op))

    def _plain_rec(self, rec: dict) -> dict:
        """An operation record with the tenant's own name for a branch it ran on."""
        o = rec.get("outcome")
        if isinstance(o, dict) and isinstance(o.get("message"), str):
            rec["outcome"] = {**o, "message": o["message"].replace(self.view._ns(""), "")}
        return rec

    def wait(self, ops: list[str], timeout: float | None = None) -> list[dict]:
        self.view._need("list")
        for op in ops:
            self._check(op)
        return [self._plain_rec(r) for r in self.inner.wait(ops, timeout)]

    def result(self, op: str):
        self._check(op)
        return self.inner.result(op)

    def events_after(self, op: str, after: int, timeout: float):
        self._check(op)
        return self.inner.events_after(op, after, timeout)

    def cancel(self, op: str) -> dict:
        self.view._need("cancel")
        self._check(op)
        rec = self.inner.cancel(op)
        self.view._audit("cancel", op=op)
        return rec

    def list(self, *, status: str | None = None, limit: int = 50) -> list[dict]:
        self.view._need("list")
        rows = self.view.db.query("SELECT o.id FROM operations o JOIN tenant_ops w ON w.op=o.id WHERE w.tenant=? "
                                  "AND o.kind='run' ORDER BY o.started DESC LIMIT ?",
                                  (self.view.tenant.name, max(1, min(limit, 1000)) * (4 if status else 1)))
        out = [self.get(r[0]) for r in rows]
        if status:
            out = [o for o in out if o["status"] == status]
        return out[:limit]

    def close(self) -> None:
        pass


class AdminView:
    """An admin token: the whole engine, unfiltered, with its runs and changes audited."""

    _AUDITED = ("import_path", "pull", "tag", "untag", "merge", "branch_create", "branch_delete", "rollback",
                "remove_image", "registry_login", "bundle_import", "gc")

    def __init__(self, tenancy: Tenancy, tenant: Tenant):
        self.tenancy, self.tenant, self.engine = tenancy, tenant, tenancy.engine
        self._ops = _AdminOperations(self)

    _SANDBOX = ("sandbox_start", "sandbox_exec", "sandbox_popen", "sandbox_commit", "sandbox_stop",
                "sandbox_hibernate", "sandbox_resume", "sandbox_write")

    def __getattr__(self, name):
        attr = getattr(self.engine, name)
        if name in self._SANDBOX:
            def audited_sandbox(*a, **k):        # recorded as a tenant's are (TenantView.sandbox_*)
                res = attr(*a, **k)
                action, kw = name.replace("_", " "), {}
                if name == "sandbox_start":
                    kw = {"image": res["image"], "detail": {"sandbox": res["id"]}}
                elif name in ("sandbox_exec", "sandbox_popen"):
                    command = a[1] if len(a) > 1 else k.get("command", k.get("argv"))
                    detail = {"sandbox": a[0], "command": _masked(command, k.get("env"))}
                    if name == "sandbox_popen":
                        detail["interactive"] = True
                    action = "exec"
                    kw = {"image": getattr(res, "source", None), "op": getattr(res, "op", None), "detail": detail}
                else:
                    image = res if isinstance(res, str) else (res.get("head") if name == "sandbox_hibernate" else None)
                    kw = {"image": image, "result": image if name != "sandbox_write" else None,
                          "detail": {"sandbox": a[0]}}
                self.tenancy.record(self.tenant, action, **kw)
                return res
            return audited_sandbox
        if name in self._AUDITED:
            def audited(*a, **k):
                res = attr(*a, **k)
                image = next((x for x in a if isinstance(x, str) and HEX_RE.match(x)), None)
                self.tenancy.record(self.tenant, name.replace("_", " "), image=image,
                                    result=res if isinstance(res, str) and HEX_RE.match(res) else None)
                return res
            return audited
        return attr

    @property
    def operations(self):
        return self._ops

    def close(self) -> None:
        pass

    def whoami(self) -> dict:
        if self.tenant is OPERATOR:
            return self.engine.whoami()
        return {**self.engine.whoami(), "tenant": self.tenant.name, "scopes": list(self.tenant.scopes),
                "token": self.tenant.token}

    def share(self, image: str) -> dict:
        return self.tenancy.share(image, by=self.tenant)

    def unshare(self, image: str) -> dict:
        return self.tenancy.unshare(image, by=self.tenant)

    def audit(self, *, tenant: str | None = None, limit: int = 100) -> list[dict]:
        return self.tenancy.audit(tenant=tenant, limit=limit)

    def run(self, ref: str, command, **options):
        rec = self.engine.run(ref, command, **options)
        self.tenancy.record(self.tenant, "run", image=rec.source, result=rec.image, op=rec.op,
                            detail={"command": _masked(command, options.get("env"))})
        return rec


class _AdminOperations:
    def __init__(self, view: AdminView):
        self.view = view

    def __getattr__(self, name):
        return getattr(self.view.engine.operations, name)

    def submit_run(self, ref: str, command, **options) -> str:
        source = self.view.engine.resolve(ref)        # before: a run on a branch moves it
        op = self.view.engine.operations.submit_run(ref, command, **options)
        self.view.tenancy.record(self.view.tenant, "run", image=source, op=op,
                                 detail={"command": _masked(command, options.get("env"))})
        return op

    def close(self) -> None:
        pass


def _masked(command, env) -> str:
    text = command if isinstance(command, str) else " ".join(map(str, command or []))
    return mask_text(text, secret_values({str(k): str(v) for k, v in (env or {}).items()}))
