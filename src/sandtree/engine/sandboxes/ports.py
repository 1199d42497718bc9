"""Exposed ports of live sandboxes: sandbox_expose, sandbox_unexpose,
sandbox_ports and sandbox_port_url of the operation table.

A port is exposed by the egress daemon (network/daemon.py, through the engine's Egress client):
it listens on 127.0.0.1:<host port> and relays each connection into the sandbox through its link.
A sandbox started without network has no link, so the first expose gives it one (`adopt`: a veth
into its own namespace, no default route, so nothing goes out). What is exposed is a row of
`sandbox_ports` (store/db.py), so it outlives this engine process; the daemon's listeners do not
outlive the daemon nor the sandbox's processes (a resume makes new ones), so every answer that
names a host port first makes sure the daemon has the link and the listeners (`_live`): after a
daemon restart or a resume they are made again, from the rows.

Signed URLs (sandbox_port_url) carry an expiry and an HMAC-SHA256 of sandbox, port, expiry and
when the port was exposed (an unexpose revokes them) under a key of the store's own
($SANDTREE_HOME/ports.key, 0600); the server checks them (verify) for requests that carry no
token. The URL is made here only, for every surface: on the preview's own
origin (engine/sandboxes/previews.py) once a server has said where previews are reached (preview_base);
without one, the port's path under a server, which redirects it to that origin."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time

from ... import defaults as D
from ...errors import Conflict, Forbidden, InvalidInput, LimitExceeded, NotFound, RuntimeUnavailable, SandtreeError
from ...runtime.base import LiveTier
from ...runtime.liveproc import LiveHandle
from ...store.store import Store
from .previews import check_base, preview_url

__all__ = ["SandboxPorts", "MAX_TTL", "KEY_FILE", "port_path", "adopt_namespace"]

MAX_TTL = 30 * 86400          # seconds a signed URL may live
KEY_FILE = "ports.key"


def port_path(sid: str, port: int) -> str:
    """Where an exposed port is served under `sandtree serve`."""
    return f"/api/v1/sandboxes/{sid}/ports/{port}/"


def _check_port(port) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidInput(f"a port is a number from 1 to 65535, not {port!r}", port=port)
    return port


class SandboxPorts:
    """sandboxes: the engine's Sandboxes (info: a sandbox's full id and state); live: the live
    tier (alive); egress: () -> the engine's Egress client (made on first use)."""

    def __init__(self, store: Store, sandboxes, live: LiveTier, egress):
        self.store, self.sandboxes, self.live, self.egress = store, sandboxes, live, egress
        self._lock = threading.Lock()
        self._linked: dict[str, tuple[str, int]] = {}   # sid -> (link key, init pid) this process made live
        self._key: bytes | None = None
        self._base: str | None = None
        self.max_per_sandbox = D.SANDBOX_PORTS     # exposed ports a sandbox may have (a tenant's: its view)

    @property
    def preview_base(self) -> str | None:
        """Where previews are reached (engine/sandboxes/previews.py), set by the server that serves them."""
        return self._base

    @preview_base.setter
    def preview_base(self, base: str | None) -> None:
        self._base = None if base is None else check_base(base)

    # ---- the operations ---------------------------------------------------------------------
    def expose(self, sid: str, port: int) -> dict:
        port = _check_port(port)
        row = self._running(sid)
        with self.store.db.tx() as con:
            have = [r[0] for r in con.execute("SELECT port FROM sandbox_ports WHERE sandbox=?", (row["id"],))]
            if port not in have and len(have) >= self.max_per_sandbox:
                raise LimitExceeded(f"sandbox {row['id'][:12]} has {len(have)} exposed ports, the most one may "
                                    "have: unexpose one first", sandbox=row["id"], limit="sandbox_ports",
                                    max=self.max_per_sandbox)
            con.execute("INSERT OR IGNORE INTO sandbox_ports(sandbox, port, created) VALUES(?,?,?)",
                        (row["id"], port, time.time()))
        try:
            hosts = self._live(row, [port])
        except BaseException:
            if port not in have:                   # not exposed after all: nothing changed
                with self.store.db.tx() as con:
                    con.execute("DELETE FROM sandbox_ports WHERE sandbox=? AND port=?", (row["id"], port))
            raise
        return self._entry(row["id"], port, hosts.get(port))

    def unexpose(self, sid: str, port: int) -> None:
        port = _check_port(port)
        info = self.sandboxes.info(sid)
        if port not in self._recorded(info["id"]):
            raise NotFound(f"port {port} of sandbox {info['id'][:12]} is not exposed", sandbox=info["id"], port=port)
        with self.store.db.tx() as con:
            con.execute("DELETE FROM sandbox_ports WHERE sandbox=? AND port=?", (info["id"], port))
        if info["state"] == "running":
            try:
                self.egress().unexpose(self._link_key(self._row(info["id"])), port)
            except NotFound:
                pass                              # (the daemon had already forgotten it: unreachable all the same)

    def ports(self, sid: str) -> list[dict]:
        info = self.sandboxes.info(sid)
        recorded = self._recorded(info["id"])
        hosts = self._live(self._row(info["id"]), recorded) if recorded and info["state"] == "running" else {}
        return [self._entry(info["id"], p, hosts.get(p)) for p in recorded]

    def port_url(self, sid: str, port: int, *, ttl: float) -> str:
        port = _check_port(port)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_TTL:
            raise InvalidInput(f"ttl is seconds, more than 0 and at most {MAX_TTL}", ttl=ttl)
        info = self.sandboxes.info(sid)
        row = self.store.db.query("SELECT created FROM sandbox_ports WHERE sandbox=? AND port=?", (info["id"], port))
        if not row:
            raise NotFound(f"port {port} of sandbox {info['id'][:12]} is not exposed", sandbox=info["id"], port=port)
        exp = int(time.time() + ttl)
        at = preview_url(self._base, info["id"], port) + "/" if self._base else port_path(info["id"], port)
        return f"{at}?st_exp={exp}&st_sig={self.sign(info['id'], port, exp, row[0][0])}"

    def unlink(self, sid: str) -> None:
        """Before a checkpoint: remove the link this code gave sandbox `sid` (CRIU cannot restore a
        veth whose peer is in another namespace). Its exposed ports stay recorded and are made
        again on the resumed processes when next asked for."""
        row = self._row(sid)
        if not self._recorded(row["id"]) or row["spec"].get("network"):
            return                                 # (no link of ours; a network= link is its start's)
        with self._lock:
            try:
                self.egress().release(self._link_key(row))
            except NotFound:
                pass
            self._linked.pop(row["id"], None)

    # ---- signed URLs -------------------------------------------------------------------------
    def sign(self, sid: str, port: int, exp: int, exposed: float) -> str:
        # `exposed`: when the port was exposed, so an unexpose revokes every URL signed so far (an
        # exposure of the same port later is another one)
        return hmac.new(self._secret(), f"{sid}\n{port}\n{exp}\n{exposed:.6f}".encode(), hashlib.sha256).hexdigest()

    def access_token(self, sid: str, purpose: str) -> str:
        """A secret that grants `purpose` (e.g. "e2b-envd": E2B's envdAccessToken) on sandbox `sid`
        alone: a keyed hash of both, so it needs no row and is the same on every call and server
        restart, and one sandbox's token says nothing about another's."""
        return hmac.new(self._secret(), f"token\n{purpose}\n{sid}".encode(), hashlib.sha256).hexdigest()

    def check_access_token(self, sid: str, purpose: str, token) -> bool:
        return isinstance(token, str) and hmac.compare_digest(self.access_token(sid, purpose), token)

    def verify(self, sid: str, port: int, exp, sig) -> None:
        """A signed URL's grant for port `port` of sandbox `sid` (its full id), or Forbidden with
        the reason (malformed, altered, expired, or for an exposure that ended)."""
        try:
            exp = int(exp)
        except (TypeError, ValueError):
            raise Forbidden("the signed URL is malformed (st_exp)") from None
        row = self.store.db.query("SELECT created FROM sandbox_ports WHERE sandbox=? AND port=?", (sid, port))
        if not row:
            raise Forbidden(f"the signed URL is for port {port} of sandbox {sid[:12]}, which is not exposed")
        if not isinstance(sig, str) or not hmac.compare_digest(self.sign(sid, port, exp, row[0][0]), sig):
            raise Forbidden("the signed URL's signature does not match (altered, for another sandbox or port, "
                            "or made before the port was last unexposed)")
        if exp < time.time():
            raise Forbidden(f"the signed URL expired {int(time.time() - exp)} s ago")

    def _secret(self) -> bytes:
        if self._key is None:
            path = os.path.join(self.store.home, KEY_FILE)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                pass
            else:                                   # first use: 32 random bytes, written once
                with os.fdopen(fd, "wb") as f:
                    f.write(secrets.token_bytes(32).hex().encode())
            with open(path, "rb") as f:
                key = bytes.fromhex(f.read().decode().strip() or "00")
            if len(key) != 32:                      # (a writer that died mid-write: an empty file)
                raise Conflict(f"{path} is not a key of 32 bytes: remove it (signed URLs made so far stop working)")
            self._key = key
        return self._key

    # ---- the daemon's side ---------------------------------------------------------------------
    def _entry(self, sid: str, port: int, host_port: int | None) -> dict:
        return {"port": port, "url": f"http://127.0.0.1:{host_port}" if host_port else None,
                "path": port_path(sid, port)}

    def _recorded(self, sid: str) -> list[int]:
        return [r[0] for r in self.store.db.query("SELECT port FROM sandbox_ports WHERE sandbox=? ORDER BY port",
                                                  (sid,))]

    def _row(self, sid: str) -> dict:
        r = self.store.db.query("SELECT id, state, handle, spec FROM sandboxes WHERE id=?", (sid,))
        if not r:
            raise NotFound(f"no live sandbox {sid!r}", sandbox=sid)
        return {"id": r[0][0], "state": r[0][1], "handle": LiveHandle.from_dict(json.loads(r[0][2])),
                "spec": json.loads(r[0][3])}

    def _running(self, sid: str) -> dict:
        info = self.sandboxes.info(sid)
        if info["state"] != "running":
            hint = " (resume it first)" if info["state"] == "hibernated" else ""
            raise Conflict(f"sandbox {info['id']} is {info['state']}{hint}", sandbox=info["id"], state=info["state"])
        return self._row(info["id"])

    @staticmethod
    def _link_key(row: dict) -> str:
        # a sandbox started with network= has the link its start attached (its record names the
        # key when it is not the sandbox's id); one without gets a link of its own on first expose
        return row["spec"].get("link_key") or row["id"]

    def _live(self, row: dict, ports: list[int]) -> dict[int, int]:
        """port -> host port for `ports` of running sandbox `row`, made now where the daemon has
        no link or listener for them (first expose, a daemon restart, a resume)."""
        h, key = row["handle"], self._link_key(row)
        if not self.live.alive(h):
            raise Conflict(f"sandbox {row['id']} is not running", sandbox=row["id"])
        egress = self.egress()
        with self._lock:
            out = {}
            for port in ports:
                try:
                    if self._linked.get(row["id"]) != (key, h.init_pid):
                        raise NotFound("link not made by this engine for these processes")
                    out[port] = egress.expose(key, port)
                except NotFound:
                    self._relink(egress, row, key)
                    out[port] = egress.expose(key, port)
            return out

    def _relink(self, egress, row: dict, key: str) -> None:
        """Give the sandbox's processes (now) a link, unless the daemon has one for them."""
        h = row["handle"]
        try:
            egress.usage(key)                      # the daemon knows the key: a link exists
            known = True
        except NotFound:
            known = False
        stale = known and not row["spec"].get("network") and self._linked.get(row["id"], (key, h.init_pid))[1] \
            != h.init_pid
        if known and stale:                        # our adopt of processes a hibernation ended
            egress.release(key)
            known = False
        if not known:
            ok, why = self.live.of(h).adopt_available()
            if not ok:
                raise RuntimeUnavailable(why, sandbox=row["id"])
            ok, why = egress.available()
            if not ok:
                raise RuntimeUnavailable(f"exposing a port needs the egress daemon, which cannot run here: {why}")
            adopt_namespace(self.live, egress, key, row)
        self._linked[row["id"]] = (key, h.init_pid)


def adopt_namespace(live, egress, key: str, row: dict, *, adopted_ok: bool = False) -> None:
    """The egress daemon adopts the running sandbox's own network namespace (its init's) as link
    `key` (exposed ports; a policy given after the start). Conflict when the sandbox stopped
    meanwhile: its pid may be another process's by now, so a link made for it is released.
    adopted_ok: the daemon having that link already (a concurrent adopt) is no error."""
    h = row["handle"]
    try:
        egress.adopt(key, h.init_pid)
    except SandtreeError as exc:
        if not (adopted_ok and isinstance(exc, Conflict)):
            if not live.alive(h):
                raise Conflict(f"sandbox {row['id']} stopped", sandbox=row["id"]) from None
            raise
    if not live.alive(h):
        egress.release(key)
        raise Conflict(f"sandbox {row['id']} stopped", sandbox=row["id"])
