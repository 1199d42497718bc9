"""Tenancy: the tokens, tenants, limits, sharing and audit log of one engine's store, and the
views (view.py, admin.py) through which a token's holder uses the engine."""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import time

from ..values import newest_page, parse_size
from .. import defaults as D
from ..errors import Forbidden, ImageNotFound, InvalidInput, NotFound, Unauthorized
from ..network.policy import Grant
from ..store.db import dumps
from . import secrets as stored
from .admin import AdminView
from .tenant import (
    DEFAULT_MAX_SANDBOXES,
    INT_LIMITS,
    LIMIT_KEYS,
    OPERATOR,
    OWNED,
    SIZE_LIMITS,
    TOKEN_RE,
    Tenant,
    check_tenant_name,
    parse_scopes,
    token_hash,
)
from .view import TenantView


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

    def create_token(self, tenant: str, scopes=None, network=None, tier: str | None = None, **limits) -> dict:
        """network: what the token's runs may reach (Grant.parse: off (default), all, any, rules).
        tier: the isolation tier every run, sandbox and build step of the token runs on, whatever
        it asks (e.g. "gvisor": its code never shares the host kernel); asking for another is refused."""
        check_tenant_name(tenant)
        scopes = parse_scopes(scopes)
        grant = Grant.parse(network)
        if tier is not None:
            if tier not in self.engine.TIERS:
                raise InvalidInput(f"unknown tier {tier!r} (one of: {', '.join(self.engine.TIERS)})")
            if "admin" in scopes:
                raise InvalidInput("a tier is forced on a tenant's token, not on an admin's (an admin runs anything)")
        token_id = secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        now = time.time()
        with self.db.tx() as con:
            self._set_limits(con, tenant, limits, now)
            con.execute("INSERT INTO tokens(id, tenant, hash, scopes, created, revoked) VALUES(?,?,?,?,?,NULL)",
                        (token_id, tenant, token_hash(secret), ",".join(scopes), now))
            if grant.to_json() is not None:
                con.execute("INSERT INTO token_network(token, grant_json) VALUES(?,?)",
                            (token_id, dumps(grant.to_json())))
            if tier is not None:
                con.execute("INSERT INTO token_tier(token, tier) VALUES(?,?)", (token_id, tier))
        self.record(OPERATOR, "token create", detail={"subject_token": token_id, "for": tenant,
                                                      "scopes": list(scopes), "network": grant.to_json(),
                                                      **({"tier": tier} if tier else {})})
        return {"token": f"stk_{token_id}_{secret}", "id": token_id, "tenant": tenant, "scopes": list(scopes),
                "limits": self.limits(tenant), "network": grant.to_json(), "tier": tier}

    def _set_limits(self, con, tenant: str, limits: dict, now: float) -> None:
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
        """Every token (ids, never secrets or hashes), with its tenant's limits and its network grant
        (None: off) -- so an operator can see later what a token lets its runs reach."""
        limits = {n: json.loads(v) for n, v in self.db.query("SELECT name, limits FROM tenants")}
        return [{"id": i, "tenant": t, "scopes": s.split(","), "created": c, "revoked": r, "limits": limits.get(t, {}),
                 "network": json.loads(g) if g else None, "tier": tier}
                for i, t, s, c, r, g, tier in self.db.query(
                    "SELECT id, tenant, scopes, created, revoked, grant_json, token_tier.tier FROM tokens "
                    "LEFT JOIN token_network ON token_network.token = tokens.id "
                    "LEFT JOIN token_tier ON token_tier.token = tokens.id ORDER BY created")]

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
        ok = hmac.compare_digest(row[1] if row else "0" * 64, token_hash(m.group(2)) if m else "")
        if not m or row is None or not ok or row[3] is not None:
            raise Unauthorized("invalid or revoked token")
        grant = self.db.one("SELECT grant_json FROM token_network WHERE token=?", (m.group(1),))
        tier = self.db.one("SELECT tier FROM token_tier WHERE token=?", (m.group(1),))
        return Tenant(row[0], tuple(row[2].split(",")), self.limits(row[0]), m.group(1),
                      Grant.parse(json.loads(grant[0])) if grant else Grant(), tier[0] if tier else None)

    def operator_view(self):
        """The whole engine as its operator uses it (a server without tokens): nothing filtered,
        runs and changes audited as "local"."""
        return AdminView(self, OPERATOR)

    def view(self, tenant: Tenant):
        return AdminView(self, tenant) if tenant.admin else TenantView(self, tenant)

    # ---- sharing ------------------------------------------------------------------------------
    # ---- what depends on who asks (the table's `caller` rows): by is the caller, None the operator

    def whoami(self, by: Tenant | None = None) -> dict:
        if by is None or by is OPERATOR:
            return self.engine.whoami()
        if by.admin:
            return {**self.engine.whoami(), "tenant": by.name, "scopes": list(by.scopes), "token": by.token}
        lim, t = self.engine.default_limits, by.limits      # a tenant: the limits that apply to it
        capped_by = {k: min(getattr(lim, k), t.get(f"max_{k}", getattr(lim, k)))
                     for k in ("timeout", "memory", "pids", "disk", "output")}
        return {"tenant": by.name, "scopes": list(by.scopes), "token": by.token, "tier": by.tier,
                "network": by.network.to_json(),       # what its runs may ask for (None: no network)
                "limits": {**capped_by,
                           "concurrent_runs": t.get("max_runs", self.engine.whoami()["limits"]["concurrent_runs"]),
                           "live_sandboxes": t.get("max_sandboxes", DEFAULT_MAX_SANDBOXES)}}

    def share(self, image: str, by: Tenant | None = None) -> dict:
        """Make an image visible (by ID) to every tenant: a tenant only an image it owns. The operator
        (or an admin) becomes its sharer whoever shared it before (annotations: whose others read)."""
        if by is not None and not by.admin and self.db.one(
                f"SELECT 1 FROM images WHERE id=:i AND {OWNED}", {"t": by.name, "i": image}) is None:
            raise Forbidden("only a tenant that owns an image can share it", scope="tag")
        with self.db.tx() as con:
            if con.execute("SELECT 1 FROM images WHERE id=?", (image,)).fetchone() is None:
                raise ImageNotFound(f"no image {image!r}", image=image)
            operator = by is None or by.admin
            con.execute("INSERT OR IGNORE INTO public_images(image, at, by) VALUES(?,?,?)",
                        (image, time.time(), None if operator else by.name))
            if operator:
                # the operator's share is the operator's even when a tenant shared the same ID first
                # (owning the same content, it could): else that tenant's annotations were what every
                # tenant read on the operator's published image, and it could unshare it from all
                con.execute("UPDATE public_images SET by=NULL WHERE image=?", (image,))
        self.record(by or OPERATOR, "share", image=image)
        return {"image": image, "public": True}

    def unshare(self, image: str, by: Tenant | None = None) -> dict:
        """A tenant unshares only what it shared: owning an image is not enough (a no-op run
        "produces" the shared image itself, which would let any tenant hide an operator's image
        from everyone)."""
        if by is not None and not by.admin:
            row = self.db.one("SELECT by FROM public_images WHERE image=?", (image,))
            if row is not None and row[0] != by.name:
                raise Forbidden("only the tenant that shared an image (or an admin) can unshare it", scope="tag")
        with self.db.tx() as con:
            con.execute("DELETE FROM public_images WHERE image=?", (image,))
        self.record(by or OPERATOR, "unshare", image=image)
        return {"image": image, "public": False}

    # ---- stored secrets (secrets.py: who manages and uses which) ---------------------------------
    def secret_set(self, name: str, value: str, hosts, *, tenants=None, tenant: str | None = None,
                   by: Tenant | None = None) -> dict:
        return stored.set_secret(self, name, value, hosts, tenants, tenant, by)

    def secret_list(self, *, tenant: str | None = None, by: Tenant | None = None) -> list[dict]:
        return stored.list_secrets(self, tenant, by)

    def secret_remove(self, name: str, *, tenant: str | None = None, by: Tenant | None = None) -> None:
        stored.remove_secret(self, name, tenant, by)

    # ---- volumes (engine/volumes.py): each tenant's own, by name; the operator's and admins' are one set ----
    @staticmethod
    def volume_owner(by: Tenant | None) -> str | None:
        """Whose volumes a caller's names are: a tenant's own, else (the operator, an admin) None."""
        return None if by is None or by is OPERATOR or by.admin else by.name

    def volume_quota(self, tenant: str | None) -> int:
        """Bytes all of a tenant's volumes may hold (its max_volumes limit, else the default; None:
        the operator's)."""
        cap = self.limits(tenant).get("max_volumes") if tenant else None
        return int(parse_size(cap)) if cap is not None else D.VOLUME_QUOTA

    def volume_list(self, by: Tenant | None = None) -> list[dict]:
        return self.engine.volumes.list(self.volume_owner(by))

    def stored_secret(self, ref: str):
        """The stored secret a run's reference names (the engine's lookup; secrets.lookup)."""
        return stored.lookup(self.engine.secret_store, ref)

    # ---- audit --------------------------------------------------------------------------------
    def record(self, tenant: Tenant, action: str, *, image: str | None = None, result: str | None = None,
               op: str | None = None, detail: dict | None = None) -> None:
        with self.db.tx() as con:
            con.execute("INSERT INTO audit(at, tenant, token, action, image, result, op, detail) "
                        "VALUES(?,?,?,?,?,?,?,?)", (time.time(), tenant.name, tenant.token, action, image, result,
                                                    op, dumps(detail or {})))

    def uploads(self, *, limit: int = 100, offset: int = 0, by: Tenant | None = None) -> list[dict]:
        """Newest first; a tenant (by, not an admin) sees its own uploads only."""
        if by is None or by.admin:
            return self.engine.uploads(limit=limit, offset=offset)
        infos = []
        for (digest,) in self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='upload'", (by.name,)):
            try:
                infos.append(self.engine.upload_info(digest))
            except NotFound:
                pass                                  # collected since
        return newest_page(infos, limit, offset)

    def audit(self, *, tenant: str | None = None, limit: int = D.AUDIT_LIMIT, by: Tenant | None = None) -> list[dict]:
        """Newest first. A run's result image and outcome come from its operation row. A tenant
        (by, not an admin) sees only its own records."""
        if by is not None and not by.admin:
            if tenant not in (None, by.name):
                raise Forbidden("a tenant sees only its own audit records", scope="admin")
            tenant = by.name
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

