"""What one tenant sees of the store: visible images, its namespaced tags and branches, its own
sandboxes, uploads, file sets and operations. Everything else answers exactly as a nonexistent
thing would (same error class, same message). TenantView (view.py) is built on these."""

from __future__ import annotations

import contextlib
import time

from ..branching.lineage import Visible
from ..errors import Forbidden, ImageNotFound, InvalidInput, NotFound, SandtreeError
from ..store import refs, tapes
from ..store.names import check_tag
from ..defaults import RunRecord
from ..table import Op
from . import auditing
from .derive import AS_PRINCIPAL, KEEPS, LINEAGE, MAKES, REFS, call
from .limits import COUNTED, capped
from .tenant import SEP, VISIBLE, Tenant


class TenantSight:
    """The tenant's side of every rule: one query each, shared by the generated and the
    hand-written methods of TenantView; and the generic call the generated methods make."""

    def __init__(self, tenancy, tenant: Tenant):
        self.tenancy, self.tenant = tenancy, tenant
        self.engine = tenancy.engine
        self.db = tenancy.db
        self._p = {"t": tenant.name}

    def need_scope(self, scope: str) -> None:
        if scope not in self.tenant.scopes:
            raise Forbidden(f"this token has no {scope!r} scope (it has: {', '.join(self.tenant.scopes)})",
                            scope=scope)

    def ns_name(self, name: str) -> str:
        return f"{self.tenant.name}{SEP}{name}"

    # ---- images -------------------------------------------------------------------------------
    def _visible(self, image) -> bool:
        return isinstance(image, str) and self.db.one(
            f"SELECT 1 FROM images WHERE id=:i AND {VISIBLE}", {**self._p, "i": image}) is not None

    def _resolve(self, ref: str) -> str:
        """An image reference as this tenant resolves it (the view's resolve: what it sees, its names)."""
        return self.resolve(ref)

    def _see(self, image) -> str:
        """`image` if this tenant may see it, else exactly the store's ImageNotFound."""
        if not self._visible(image):
            raise ImageNotFound(f"no image {image!r}", image=image)
        return image

    def _visible_set(self) -> set[str]:
        return {r[0] for r in self.db.query(f"SELECT id FROM images WHERE {VISIBLE}", self._p)}

    # ---- names --------------------------------------------------------------------------------
    def _own_ref(self, kind: str, name: str) -> str | None:
        if not isinstance(name, str) or SEP in name:
            return None
        row = self.db.one("SELECT image FROM refs WHERE kind=? AND name=?", (kind, self.ns_name(name)))
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

    def branch_of(self, ref) -> str | None:
        if not isinstance(ref, str):
            return None
        if ref.startswith("branch:"):
            return ref[7:]
        if self._own_ref("tag", ref) is not None:
            return None
        return ref if self._own_ref("branch", ref) is not None else None

    def head_of(self, name: str) -> str:
        image = self._own_ref("branch", name)
        if image is None:
            raise NotFound(f"no branch {name!r}", branch=name)
        return image

    def _write_tag(self, name: str, image: str, reason: str) -> None:
        """Point this tenant's tag `name` at `image` (its stored, namespaced name)."""
        with self.db.tx() as con:
            refs.set_tag(con, self.ns_name(name), image, reason)

    def _ref_name(self, kind: str, name) -> str:
        """The stored name of this tenant's existing tag or branch `name` (NotFound, told with
        the tenant's own name, when it has none)."""
        if isinstance(name, str) and SEP not in name and self._own_ref(kind, name) is not None:
            return self.ns_name(name)
        if kind == "branch":
            raise NotFound(f"no branch {name!r}", branch=name)
        raise NotFound(f"no tag {name!r}")

    def _names(self) -> dict[str, list[str]]:
        """image -> the tag names this tenant sees on it (its own, and global ones of public images)."""
        pre = self.ns_name("")
        out: dict[str, set[str]] = {}
        for name, image in self.db.query("SELECT name, image FROM refs WHERE kind='tag' AND substr(name, 1, ?)=?",
                                         (len(pre), pre)):
            out.setdefault(image, set()).add(name[len(pre):])
        for name, image in self.db.query("SELECT name, image FROM refs WHERE kind='tag' AND instr(name, ?)=0 "
                                         "AND image IN (SELECT image FROM public_images)", (SEP,)):
            out.setdefault(image, set()).add(name)
        return {k: sorted(v) for k, v in out.items()}

    def _branch_names(self) -> dict[str, str]:
        """This tenant's branches: name -> head."""
        pre = self.ns_name("")
        return {n[len(pre):]: i for n, i in self.db.query(
            "SELECT name, image FROM refs WHERE kind='branch' AND substr(name, 1, ?)=? ORDER BY name",
            (len(pre), pre))}

    # ---- lineage ------------------------------------------------------------------------------
    def _op_visible(self, op: str) -> bool:
        """An operation's record (command, exit code) shows if it is this tenant's, or an
        operator's (no tenant); never another tenant's."""
        row = self.db.one("SELECT tenant FROM tenant_ops WHERE op=?", (op,))
        return row is None or row[0] == self.tenant.name

    def _visibility(self) -> Visible:
        """The filter branching/lineage's queries take: this tenant's images, operations and names."""
        heads: dict[str, list[str]] = {}
        for name, image in self._branch_names().items():
            heads.setdefault(image, []).append(name)
        # the live states it may start (fork_from): those of its own images
        live = {r[0] for r in self.db.query("SELECT image FROM live_states WHERE image IN "
                                            "(SELECT image FROM tenant_images WHERE tenant=?)", (self.tenant.name,))}
        return Visible(self._visible_set(), self._op_visible, self._names(), heads,
                       lambda image: self.engine.annotations_as(self.tenant.name, image), live)

    # ---- things of its own --------------------------------------------------------------------
    def _own_blob(self, kind: str, ident) -> str:
        if not isinstance(ident, str) or self.db.one("SELECT 1 FROM tenant_blobs WHERE tenant=? AND kind=? AND id=?",
                                                     (self.tenant.name, kind, ident)) is None:
            raise NotFound(f"no uploaded file {ident!r}" if kind == "upload" else f"no file set {ident!r}")
        return ident

    def _keep_blob(self, kind: str, ident: str) -> str:
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_blobs(tenant, kind, id) VALUES(?,?,?)",
                        (self.tenant.name, kind, ident))
        return ident

    def _check_files(self, files) -> None:
        for f in files or []:
            if isinstance(f, dict) and f.get("sha256") is not None:
                self._own_blob("upload", f["sha256"])

    def own_op(self, op) -> str:
        if not isinstance(op, str) or self.db.one("SELECT 1 FROM tenant_ops WHERE op=? AND tenant=?",
                                                  (op, self.tenant.name)) is None:
            raise NotFound(f"no operation {op!r}")
        return op

    def _own(self, image: str) -> None:
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_images(tenant, image, at) VALUES(?,?,?)",
                        (self.tenant.name, image, time.time()))

    def claim(self, op: str) -> None:
        with self.db.tx() as con:
            con.execute("INSERT OR IGNORE INTO tenant_ops(op, tenant, token) VALUES(?,?,?)",
                        (op, self.tenant.name, self.tenant.token))

    def _claim_op(self, kind: str, result: str) -> str | None:
        """The operation the engine just wrote for this tenant's import, commit or merge (the
        engine makes its id inside), recorded as this tenant's so lineage shows it."""
        row = self.db.one("SELECT id FROM operations WHERE kind=? AND result=? AND id NOT IN "
                          "(SELECT op FROM tenant_ops) ORDER BY started DESC LIMIT 1", (kind, result))
        if row is None:
            return None
        self.claim(row[0])
        return row[0]

    # A sandbox is this tenant's if it started it (tenant_blobs, kind "sandbox"), or if it is the
    # live sandbox of its own live run, named by the run's operation ID (the process rows); any
    # other id or prefix answers as a nonexistent sandbox. Commits are its images, execs its operations.
    def _sandbox(self, sid) -> str:
        """The full id of this tenant's sandbox `sid` (an id or unique prefix), else NotFound."""
        if not isinstance(sid, str) or not sid:
            raise InvalidInput("a sandbox id must be a non-empty string")
        rows = self.db.query("SELECT id FROM tenant_blobs WHERE tenant=? AND kind='sandbox' AND id >= ? AND id < ? "
                             "LIMIT 2", (self.tenant.name, sid, sid + "\uffff"))
        if len(rows) > 1:
            raise InvalidInput(f"sandbox id {sid!r} is ambiguous")
        if not rows and self.db.one("SELECT 1 FROM tenant_ops WHERE op=? AND tenant=?", (sid, self.tenant.name)):
            return sid                                  # its own run's operation ID (the engine tells if live)
        if not rows:
            raise NotFound(f"no live sandbox {sid!r}", sandbox=sid)
        return rows[0][0]

    def _audit(self, action: str, **kw) -> None:
        self.tenancy.record(self.tenant, action, **kw)

    def plain_error(self, exc: SandtreeError) -> SandtreeError:
        """An engine error about a namespaced ref, told with the tenant's own name for it, and
        without the server's paths (a missing layer's StoreCorrupt names where it looked: the
        operator's to know, not a tenant's; `<store>` stands for the store's directory)."""
        pre, home = self.ns_name(""), self.engine.store.home

        def plain(v: str) -> str:
            return v.replace(home, "<store>").replace(pre, "")
        exc.message = plain(exc.message)
        exc.args = (exc.message,)
        exc.details = {k: (plain(v) if isinstance(v, str) else v) for k, v in exc.details.items()}
        return exc

    def _allow(self, row: Op) -> None:
        """A row's admin and scope, checked on this token."""
        if row.admin:
            raise Forbidden(f"{row.name.replace('_', ' ')} is for the server's administrator "
                            "(a token with the admin scope)", scope="admin")
        if row.scope is not None:
            self.need_scope(row.scope)

    @contextlib.contextmanager
    def _counted(self, row: Op, args: dict):
        """Around a row whose answer a tenant limit counts (limits.COUNTED): the check and the call
        under the tenant's lock, so two calls at once cannot both pass it."""
        check = COUNTED.get(row.name)
        if check is None:
            yield
            return
        with self.tenancy.tenant_lock(self.tenant.name):
            check(self.db, self.tenant, args)
            yield

    def _call_row(self, row: Op, args: dict, target=None):
        """One tenant call of a row that needs no rule written by hand (derive.py says the steps),
        on `target`: the engine (None) or its operations."""
        shown = dict(args)                                  # what the audit records: the tenant's names
        for a in row.images:
            if args.get(a) is not None:
                args[a] = shown[a] = self._see(args[a])
        for a, own in self._OWN_ARGS.items():
            if a in args and not (a == "digest" and row.name in KEEPS):
                args[a] = own(self, args[a])
        if "sid" in args:
            shown["sid"] = args["sid"]
        if row.name in REFS:
            args["name"] = self._ref_name(REFS[row.name], args["name"])
        tag = args.get("tag")
        if tag is not None:                     # the engine makes it untagged; the tenant's tag names it
            check_tag(tag)
            args["tag"] = None
        if row.scope == "run":
            args = capped(self.tenant.limits, self.engine.default_limits, args, set(args))
        try:
            query = LINEAGE.get(row.name)
            if query is not None:
                answer = query(self.engine.store, args, self._visibility())
            elif row.caller:                    # the tenancy answers, and records, with the caller
                answer = call(self.tenancy, row, {**args, "by": self.tenant})
            else:
                with self._counted(row, args):
                    answer = call(self.engine if target is None else target, row, dict(args),
                                  self.tenant.name if row.name in AS_PRINCIPAL else None)
        except SandtreeError as exc:
            raise self.plain_error(exc) from None
        if row.name in KEEPS:
            self._keep_blob(KEEPS[row.name], answer)
        if isinstance(answer, RunRecord):               # an exec's operation is the tenant's
            self.claim(answer.op)
        rec = auditing.entry(row, shown, answer)
        if row.name in MAKES and rec["result"]:
            self._own(rec["result"])
            rec["op"] = self._claim_op(MAKES[row.name], rec["result"]) or rec["op"]
            if tag is not None:
                self._write_tag(tag, rec["result"], row.audit)
        if row.audit is not None and not row.caller:
            self._audit(row.audit, **rec)
        return answer

    def _own_file_set(self, set_id):
        return set_id if set_id is None else self._own_blob("file_set", set_id)

    def _own_files(self, files):
        self._check_files(files)
        return files

    def _own_upload(self, digest):
        return self._own_blob("upload", digest)

    def _own_volume(self, volume):
        return self.engine.volumes.name_of(self.tenant.name, volume)     # its own volumes, by its names

    def _own_set(self, set_id):
        return self._own_blob("file_set", set_id)

    def own_tape(self, ref) -> str:
        """The full id of a tape this tenant recorded (its run's or live sandbox's); any other answers as a
        tape that does not exist."""
        tid = tapes.resolve(self.db, ref)
        if self.tenant.admin:
            return tid
        row = self.db.one("SELECT op FROM tapes WHERE id=?", (tid,))
        op = row[0] if row else None
        if op is None or (self.db.one("SELECT 1 FROM tenant_ops WHERE op=? AND tenant=?", (op, self.tenant.name)) is None
                          and self.db.one("SELECT 1 FROM tenant_blobs WHERE tenant=? AND kind='sandbox' AND id=?",
                                          (self.tenant.name, op)) is None):
            raise NotFound(f"no tape {ref!r}", tape=ref)
        return tid

    # Arguments that name something a tenant owns, by parameter name: what the engine is given
    # instead (NotFound, as for a thing that does not exist, when it is another's).
    _OWN_ARGS = {"sid": _sandbox, "digest": _own_upload, "set_id": _own_set,
                 "op": own_op, "files": _own_files, "file_set": _own_file_set, "volume": _own_volume,
                 "tape": own_tape}
