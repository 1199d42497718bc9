"""The egress daemon: one per store, root, detached (its own session, no parent-death signal: live
sandboxes outlive the engine that started it). It holds the router namespace and the links
(links.py), runs the transparent proxy and the resolver there (proxy.py, resolver.py) and the
exposed ports' listeners (expose.py), and answers the engine's requests on a unix SOCK_SEQPACKET
socket, `$SANDTREE_HOME/network/egress.sock` (0600): one JSON request and one JSON answer a
message, a link's namespace fd passed by SCM_RIGHTS (client.py is the other end; design.md,
"Network egress").

    python -m sandtree.network.daemon --home H [--upstream-netns P] [--upstream-dns IP[:PORT]]
        [--upstream-ca F] [--relay splice|kernel]

The process sits in the upstream namespace (the host's unless --upstream-netns names another):
every outbound connection the proxy dials is made there; router-side sockets are made through
netns.entered(). A link is released by its owner, or once no process has been in its namespace
for GRACE seconds after attach (a killed engine leaves nothing), unless it is held (`hold`: its
sandbox hibernated; `rejoin` hands its namespace out again at resume); the daemon exits after
IDLE seconds with no link and no exposed port. `attach_like` makes a link that is a copy of
another's policy, secrets and CA (a live fork's child: the engine never sees a value)."""

from __future__ import annotations

import argparse
import array
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import socket
import sys
import time

from .. import errors
from ..errors import InvalidInput, NotFound, SandtreeError
from . import expose as exposing
from . import descriptors, fastpath, netns, nft, proxy, recycle, resolver, tape, trust, upstream
from .client import MAX_MESSAGE, lock_path, socket_path
from .links import ANY, Links, Made, addresses6
from .policy import Policy
from .state import LinkState

__all__ = ["Daemon", "Entry", "main", "GRACE", "IDLE", "SWEEP"]

GRACE = 30.0             # seconds after attach before a link nobody is in is released
IDLE = 60.0              # seconds without links or exposures before the daemon exits
SWEEP = 2.0              # seconds between GC sweeps


class Entry:
    """A link as the daemon holds it: its state (what the proxy reads), how it was made, its
    namespace's identity (for GC), exposed ports and owner."""

    def __init__(self, state: LinkState, made: Made, ns: tuple[int, int], owner):
        self.state, self.made, self.ns, self.owner = state, made, ns, owner
        self.exposures: dict[int, exposing.Exposure] = {}
        self.held = False       # kept with no process in it (its sandbox hibernated): GC leaves it
        self.scope = made.scope     # the tenant whose sandbox runs (ran) in it; None: none yet
        self.recycle = False        # its attacher lets it go back to the pool after its release


class Daemon:
    def __init__(self, home: str, upstream_fd: int | None, dns: tuple[str, int] | None, ca: str | None,
                 grace: float = GRACE, idle: float = IDLE):
        self.home, self.grace, self.idle = home, grace, idle
        self.host_fd = netns.current()          # where exposed ports listen (the host's loopback)
        if upstream_fd is not None:
            netns.join(upstream_fd)             # before any thread: they inherit it
        self.upstream_fd = upstream_fd
        self.entries: dict[str, Entry] = {}
        self.pending: set[str] = set()          # keys of attaches/adopts under way (awaiting a link)
        self.by_gateway: dict[str, LinkState] = {}
        self.links = Links(nft.install, protect=(self.host_fd,))
        self.upstream = upstream.Upstream(upstream_fd, dns, ca)
        self.services: list = []
        self.dropping: set = set()              # link removals under way (after their release)
        self.idle_since = time.monotonic()
        self.stopping: asyncio.Event | None = None

    # ---- serving ---------------------------------------------------------------------------------
    async def run(self, listener: socket.socket, ready) -> None:
        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        # large intercepted bodies are spooled beside the daemon's socket (0700, root), not in memory
        self.services.append(await proxy.serve_proxy(self.links.router_fd, self.by_gateway.get, self.upstream,
                                                     spool_dir=os.path.join(self.home, "network")))
        self.services.append(await resolver.serve_resolver(self.links.router_fd, self.by_gateway.get, self.upstream))
        listener.setblocking(False)
        loop.add_reader(listener.fileno(), self._accept, listener)
        ready()
        sweeper = asyncio.ensure_future(self._sweep())
        try:
            await self.stopping.wait()
        finally:
            sweeper.cancel()
            loop.remove_reader(listener.fileno())
            self.shutdown()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(False)
        asyncio.get_running_loop().add_reader(conn.fileno(), self._readable, conn)

    def _readable(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            data, _, flags, _ = conn.recvmsg(MAX_MESSAGE)
        except BlockingIOError:
            return
        except OSError:
            data, flags = b"", 0
        if not data:
            loop.remove_reader(conn.fileno())
            conn.close()
            return
        asyncio.ensure_future(self._answer(conn, data, flags))

    async def _answer(self, conn: socket.socket, data: bytes, flags: int) -> None:
        fds: list[int] = []
        try:
            if flags & socket.MSG_TRUNC:
                raise InvalidInput(f"request over {MAX_MESSAGE} bytes")
            try:
                req = json.loads(data)
                op = req["op"]
                assert isinstance(req, dict) and isinstance(op, str)
            except (ValueError, KeyError, TypeError, AssertionError):
                raise InvalidInput("a request is a JSON object with an 'op'") from None
            handler = getattr(self, "op_" + op, None)
            if handler is None:
                raise InvalidInput(f"unknown request {op!r}")
            answer = await handler(req, fds)
            answer["ok"] = True
        except SandtreeError as e:
            answer = {"ok": False, "error": type(e).__name__, "message": e.message}
        except Exception as e:          # a bug of ours: said, not hidden, and the daemon goes on
            answer = {"ok": False, "error": "SandtreeError", "message": f"egress daemon: {type(e).__name__}: {e}"}
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds and answer["ok"] else []
        with contextlib.suppress(OSError):
            conn.sendmsg([json.dumps(answer).encode()], anc)
        if answer.get("stopping") is True:
            self.stopping.set()

    def _entry(self, req) -> Entry:
        key = req.get("key")
        if not isinstance(key, str) or key not in self.entries:
            raise NotFound(f"no link {key!r}", key=key)
        return self.entries[key]

    def _new_key(self, req) -> str:
        key = req.get("key")
        if not isinstance(key, str) or not key or len(key) > 256:
            raise InvalidInput("a link's key is a non-empty string (at most 256 characters)")
        if key in self.entries or key in self.pending:
            raise errors.Conflict(f"link {key!r} exists already", key=key)
        return key

    @contextlib.contextmanager
    def _claim(self, req):
        """A new link's key, held against a concurrent request for the same key until it is added."""
        key = self._new_key(req)
        self.pending.add(key)
        try:
            yield key
        finally:
            self.pending.discard(key)

    def _add(self, key: str, made: Made, ns, policy, secrets, owner, ca=None, taped=None) -> Entry:
        """ca: another link's CA to present (a copy's: op_attach_like); None: a new one with secrets
        or a tape (`taped`: the attach's tape option, tape.py)."""
        address6, gateway6 = addresses6(made.index)
        state = LinkState(key=key, index=made.index, address=made.address, gateway=made.gateway,
                          policy=policy, secrets=secrets, address6=address6, gateway6=gateway6)
        state.tape = tape.parse_option(taped, key, self.home, trust.placeholders(secrets))
        state.ca = ca if ca is not None else trust.link_ca(key, secrets, every_host=state.tape is not None)
        entry = Entry(state, made, ns, owner)
        self.entries[key] = entry
        self.by_gateway[made.gateway] = state
        self.by_gateway[gateway6] = state           # (its IPv6 connections and DNS)
        return entry

    async def _keep(self, key: str, made: Made, ns, policy, secrets, owner, ca=None, taped=None) -> Entry:
        """_add, or the link removed again when that fails (nothing half-made stays)."""
        try:
            return self._add(key, made, ns, policy, secrets, owner, ca, taped)
        except BaseException:
            await asyncio.get_running_loop().run_in_executor(None, self.links.drop, made)
            raise

    # ---- requests ----------------------------------------------------------------------------------
    async def op_ping(self, req, fds) -> dict:
        return {"pid": os.getpid(), "links": len(self.entries), "proxy": True, "stats": dict(self.links.stats),
                "relay": {"kernel_off": fastpath.reason(), **fastpath.STATS}}     # fastpath.py

    async def op_attach(self, req, fds) -> dict:
        with self._claim(req) as key:
            return await self._attach(key, req, fds)

    async def _attach(self, key: str, req, fds) -> dict:
        policy = Policy.from_json(req.get("policy"))
        secrets = trust.parse_secrets(req.get("secrets"))
        owner = _owner(req)
        recycle = req.get("recycle", False)
        if not isinstance(recycle, bool):
            raise InvalidInput(f"recycle is true or false, not {recycle!r}")
        if secrets and policy is None:
            raise InvalidInput("secrets need a network policy (nothing goes out without one)")
        taped = req.get("tape")
        if taped is not None and (policy is None or req.get("scope") == "any"):
            raise InvalidInput("a tape needs a network policy (nothing goes out without one)")
        # A fresh link, or one only the same scope used; "any" (a link to wait for a run, nothing
        # allowed) any, and the answer says whose it was: set_policy keeps to that.
        scope = None if req.get("scope") == "any" else _scope(req)
        if scope is None and req.get("scope") == "any" and (policy is not None or secrets):
            raise InvalidInput("scope 'any' is for a link with nothing allowed (set_policy names the scope)")
        want = ANY if req.get("scope") == "any" else scope
        made = self.links.take_ready(want) or await asyncio.get_running_loop().run_in_executor(
            None, self.links.take, want)
        st = os.fstat(made.netns_fd)
        entry = await self._keep(key, made, (st.st_dev, st.st_ino), policy, secrets, owner, taped=taped)
        if want is not ANY and scope is not None:
            entry.scope = scope
        entry.recycle = recycle
        fds.append(made.netns_fd)
        return self._described(entry)

    async def op_attach_like(self, req, fds) -> dict:
        """A new link `key` like link `of`: the same policy, secrets (placeholders and values) and
        CA, on a namespace and address of its own; held (GC leaves it) until its attacher says
        (hold false) that processes are in it. A live fork's child: its processes, restored from
        a checkpoint of `of`'s sandbox, hold `of`'s placeholders and trust `of`'s CA, so its link
        must put the same values in place of the same placeholders and present certificates from
        the same CA. The values never leave the daemon."""
        with self._claim(req) as key:
            of = req.get("of")
            src = self._entry({"key": of})
            if src.made.netns_fd is None:
                raise errors.Conflict(f"link {of!r} is adopted (the sandbox's own namespace): a copy of it is "
                                      "an adopt of the copy's own", key=of)
            owner = _owner(req)
            st = src.state
            made = self.links.take_ready(None) or await asyncio.get_running_loop().run_in_executor(
                None, self.links.take, None)
            ns = os.fstat(made.netns_fd)
            entry = await self._keep(key, made, (ns.st_dev, ns.st_ino), st.policy, list(st.secrets), owner, st.ca)
            entry.scope, entry.held = src.scope, True       # (never recycled: its secrets are another's too)
            fds.append(made.netns_fd)
            return self._described(entry)

    async def op_adopt(self, req, fds) -> dict:
        with self._claim(req) as key:
            return await self._adopt(key, req)

    async def _adopt(self, key: str, req) -> dict:
        owner = _owner(req)
        pid = req.get("pid")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidInput(f"pid must be a positive integer, not {pid!r}")
        try:
            st = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            raise NotFound(f"no process {pid}", pid=pid) from None
        made = await asyncio.get_running_loop().run_in_executor(None, self.links.adopt, pid)
        await self._keep(key, made, (st.st_dev, st.st_ino), None, [], owner)
        return {"address": made.address, "gateway": made.gateway, "address6": addresses6(made.index)[0],
                "placeholders": {}, "ca_pem": None}

    async def op_route(self, req, fds) -> dict:
        """An adopted link's default route on (its sandbox was given a policy after it started:
        its egress reaches the proxy and resolver as a joined link's does) or off (nothing but
        connections the router opens to it). `pid`: a process in the adopted namespace."""
        entry = self._entry(req)
        if entry.made.netns_fd is not None:
            raise errors.Conflict(f"link {entry.state.key!r} is not adopted: its route came with it",
                                  key=entry.state.key)
        pid, on = req.get("pid"), req.get("on", True)
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidInput(f"pid must be a positive integer, not {pid!r}")
        if not isinstance(on, bool):
            raise InvalidInput(f"on is true or false, not {on!r}")
        await asyncio.get_running_loop().run_in_executor(
            None, self.links.route, pid, entry.made.index, on, entry.ns)
        return {}

    async def op_set_policy(self, req, fds) -> dict:
        entry = self._entry(req)
        policy = Policy.from_json(req.get("policy"))
        scope = _scope(req)
        if entry.scope is not None and scope != entry.scope:
            raise errors.Conflict(f"link {entry.state.key!r} served another scope: not for "
                                  f"{scope or 'a caller naming none'}", key=entry.state.key)
        if scope is not None:
            entry.scope = scope
        elif entry.recycle:              # whose run this is is not said: the link goes after it
            entry.recycle = False
        entry.state.policy = policy
        cut = proxy.recheck(entry.state)
        return {"cut": cut}

    async def op_hold(self, req, fds) -> dict:
        """Keep a link while no process is in its namespace (its sandbox hibernated), or (held:
        false) let GC judge it again from now. Only a link the daemon made can be held: an
        adopted one is the sandbox's own namespace, which ends with its processes."""
        entry = self._entry(req)
        held = req.get("held", True)
        if not isinstance(held, bool):
            raise InvalidInput(f"held is true or false, not {held!r}")
        if held and entry.made.netns_fd is None:
            raise errors.Conflict(f"link {entry.state.key!r} is adopted (the sandbox's own namespace): "
                                  "it cannot outlive the sandbox's processes", key=entry.state.key)
        entry.held = held
        if not held:
            entry.state.attached = time.time()      # (the grace for a process to be in it again)
        return {}

    async def op_rejoin(self, req, fds) -> dict:
        """An existing link again, its namespace fd included: what attach gave (the same address,
        placeholders and CA), for a sandbox resumed into it."""
        entry = self._entry(req)
        if entry.made.netns_fd is None:
            raise errors.Conflict(f"link {entry.state.key!r} is adopted: it has no namespace of the daemon's",
                                  key=entry.state.key)
        fds.append(entry.made.netns_fd)            # (SCM_RIGHTS gives the caller its own copy)
        return self._described(entry)

    @staticmethod
    def _described(entry: Entry) -> dict:
        st = entry.state
        return {"address": st.address, "gateway": st.gateway, "address6": st.address6,
                "placeholders": trust.placeholders(st.secrets),
                "ca_pem": st.ca.pem().decode() if st.ca else None, "scope": entry.scope}

    async def op_usage(self, req, fds) -> dict:
        return {"usage": proxy.synced(self._entry(req).state).to_json()}

    async def op_release(self, req, fds) -> dict:
        entry = self._entry(req)
        await self._release(entry)
        usage = entry.state.usage.to_json()
        if entry.state.tape is not None:          # where the tape is, what a replay missed (engine/tapes.py)
            usage["tape"] = entry.state.tape.finish()
        return {"usage": usage}

    async def op_expose(self, req, fds) -> dict:
        entry = self._entry(req)
        port = req.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise InvalidInput(f"a port is a number from 1 to 65535, not {port!r}", port=port)
        if port not in entry.exposures:
            with descriptors.one_more(len(self.entries)):      # (never the links' connections' reserve)
                entry.exposures[port] = await exposing.expose(entry.state, port, self.links.router_fd, self.host_fd)
        return {"host_port": entry.exposures[port].host_port}

    async def op_unexpose(self, req, fds) -> dict:
        entry = self._entry(req)
        ex = entry.exposures.pop(req.get("port"), None)
        if ex is None:
            raise NotFound(f"port {req.get('port')!r} of link {entry.state.key!r} is not exposed")
        ex.close()
        return {}

    async def op_list(self, req, fds) -> dict:
        return {"links": [{"key": k, "address": e.state.address, "gateway": e.state.gateway,
                           "address6": e.state.address6,
                           "adopted": e.made.netns_fd is None, "owner": e.owner, "held": e.held,
                           "policy": e.state.policy.to_json() if e.state.policy else None,
                           "ports": {str(p): x.host_port for p, x in e.exposures.items()}}
                          for k, e in self.entries.items()]}

    async def op_stop(self, req, fds) -> dict:
        return {"stopping": True}

    # ---- releasing and collecting ---------------------------------------------------------------
    async def _release(self, entry: Entry) -> None:
        key = entry.state.key
        if self.entries.get(key) is not entry:
            return
        del self.entries[key]
        self.by_gateway.pop(entry.state.gateway, None)
        self.by_gateway.pop(entry.state.gateway6, None)
        for ex in entry.exposures.values():
            ex.close()
        entry.exposures.clear()
        for c in list(entry.state.conns):
            with contextlib.suppress(Exception):
                c.close()
        # The link is unknown from here on; its removal (netlink, a few ms) need not delay the
        # answer: a run's release is on its caller's path (it was 24 ms of a networked run's 58).
        # A link its attacher let go back to the pool goes there once found clean (links.py):
        # only to the scope that used it.
        if entry.recycle and entry.scope is not None:
            self.links.recycle(entry.made, entry.scope, entry.ns)
            if not self.entries:
                self.idle_since = time.monotonic()
            return
        drop = asyncio.get_running_loop().run_in_executor(None, self.links.drop, entry.made)
        self.dropping.add(drop)
        drop.add_done_callback(self.dropping.discard)
        if not self.entries:
            self.idle_since = time.monotonic()
        if entry.made.netns_fd is None:
            # an adopted link's veth is in the sandbox's own namespace, released before a
            # checkpoint (CRIU restores no veth whose peer is elsewhere): gone when this answers
            await asyncio.shield(drop)

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(SWEEP)
            if self.entries:
                used = await loop.run_in_executor(None, recycle.namespaces_in_use)
                now = time.time()
                for entry in list(self.entries.values()):
                    if not entry.held and now - entry.state.attached >= self.grace and entry.ns not in used:
                        await self._release(entry)
            elif time.monotonic() - self.idle_since >= self.idle:
                self.stopping.set()
                return

    def shutdown(self) -> None:
        for s in self.services:
            with contextlib.suppress(Exception):
                s.close()
        for entry in list(self.entries.values()):
            for ex in entry.exposures.values():
                ex.close()
        self.entries.clear()
        self.links.close()


def _scope(req) -> str | None:
    """Whose runs a link serves (a tenant; links.py recycles a link only within one)."""
    scope = req.get("scope")
    if scope is not None and (not isinstance(scope, str) or not scope or len(scope) > 256 or scope == "any"):
        raise InvalidInput(f"a scope is a name of 1 to 256 characters (not 'any'), not {scope!r}")
    return scope


def _owner(req) -> int | None:
    """Who attached a link (the engine's pid; shown by `list`)."""
    owner = req.get("owner")
    if owner is not None and (isinstance(owner, bool) or not isinstance(owner, int)):
        raise InvalidInput(f"owner is a process id, not {owner!r}")
    return owner


def _answers(path: str) -> bool:
    """Whether a daemon answers a ping on `path`."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as s:
            s.settimeout(2)
            s.connect(path)
            s.send(b'{"op": "ping"}')
            return b'"ok": true' in s.recv(65536)
    except OSError:
        return False


def _dns(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    host, _, port = text.rpartition(":") if text.count(":") == 1 else (text, "", "")
    return (host, int(port)) if port else (text, 53)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sandtree.network.daemon")
    p.add_argument("--home", required=True)
    p.add_argument("--upstream-netns")
    p.add_argument("--upstream-dns")
    p.add_argument("--upstream-ca")
    p.add_argument("--relay", choices=("splice", "kernel"), default="splice")   # fastpath.py
    p.add_argument("--grace", type=float, default=GRACE, help=argparse.SUPPRESS)    # tests
    p.add_argument("--idle", type=float, default=IDLE, help=argparse.SUPPRESS)      # tests
    a = p.parse_args(argv)
    if os.geteuid() != 0:
        print("the egress daemon needs root", file=sys.stderr)
        return 2
    base = os.path.join(a.home, "network")
    os.makedirs(base, mode=0o700, exist_ok=True)
    r, w = os.pipe()
    if os.fork():                     # the starter waits until the socket is there, then leaves
        os.close(w)
        with os.fdopen(r, "rb") as f:
            said = f.read()
        if said == b"ok":
            return 0
        sys.stderr.write(said.decode(errors="replace") or "the egress daemon died starting\n")
        return 1
    os.close(r)
    os.setsid()
    code = 0
    try:
        code = _serve(a, base, w)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.write(w, f"egress daemon: {type(e).__name__}: {e}\n".encode())
        code = 1
    os._exit(code)


def _serve(a, base: str, w: int) -> int:
    lock = os.open(lock_path(a.home), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    # One daemon per store. When another holds the lock it either answers (then we are not
    # needed) or is on its way out (idle exit, stop): then we wait for the lock and take over.
    end = time.monotonic() + 15
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if _answers(socket_path(a.home)) or time.monotonic() > end:
                os.write(w, b"ok")
                os.close(w)
                return 0
            time.sleep(0.05)
    descriptors.raise_limit()           # (the soft limit inherited is a shell's)
    null = os.open(os.devnull, os.O_RDWR)
    log = os.open(os.path.join(base, "daemon.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.dup2(log, 2)
    up = os.open(a.upstream_netns, os.O_RDONLY | os.O_CLOEXEC) if a.upstream_netns else None
    # The links' threads (making, looking at released ones) run Python for milliseconds at a time:
    # the loop, which answers a run's set_policy and release, gets the GIL back within 0.5 ms
    # instead of the default 5 (measured: a networked run waited 0.6 ms p50, 2.6 p90 for its set_policy).
    sys.setswitchinterval(0.0005)
    fastpath.choose(a.relay)          # the log says if the kernel relay was asked for and can not be
    daemon = Daemon(a.home, up, _dns(a.upstream_dns), a.upstream_ca, a.grace, a.idle)
    path = socket_path(a.home)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(64)

    def ready():
        os.write(w, b"ok")
        os.close(w)
    try:
        asyncio.run(daemon.run(listener, ready))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)                # (ours: we hold the store's lock)
        listener.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
