"""The engine's end of the egress daemon (daemon.py): `Egress` starts the store's daemon when it is
not running, and turns its answers into values and its errors into the errors.py classes they
name. One request and one answer a SOCK_SEQPACKET message; a link's namespace arrives as an fd
(SCM_RIGHTS), which the caller owns (it passes it to the runtime, RunSpec.netns_fd, then closes it)."""

from __future__ import annotations

import array
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from .. import config, errors
from ..errors import NotFound, RuntimeUnavailable, SandtreeError
from ..runtime.runfiles import RESOLV_CONF
from . import trust
from .policy import Policy
from .state import Secret

__all__ = ["Egress", "Link", "START_TIMEOUT", "MAX_MESSAGE", "LOCAL_SCOPE", "socket_path", "lock_path", "tenant_scope"]

START_TIMEOUT = 30.0       # seconds for a daemon to come up
MAX_MESSAGE = 4 << 20      # bytes of one request or answer (64 secrets of 16 KiB fit many times over)


# Scopes (whose runs a recycled link may serve again: Egress.attach): the in-process engine's own
# caller, and each tenant of a server. The two kinds never meet.
LOCAL_SCOPE = "engine"


def tenant_scope(name: str) -> str:
    return "tenant:" + name


def socket_path(home: str) -> str:
    """The store's daemon's control socket (daemon.py)."""
    return os.path.join(home, "network", "egress.sock")


def lock_path(home: str) -> str:
    """The flock one daemon per store holds while it runs."""
    return os.path.join(home, "network", "daemon.lock")


@dataclass
class Link:
    key: str
    netns_fd: int | None       # the link's namespace (ours to close); None for an adopted link
    address: str               # the sandbox's address (eth0)
    gateway: str               # the router's end: the sandbox's default route and DNS server
    placeholders: dict[str, str]   # secret NAME -> what the sandbox's env gets instead of the value
    ca_pem: bytes | None       # the link's CA (links with secrets): what the sandbox must trust
    scope: str | None = None   # whose runs the link served (a recycled link's); None: nobody's yet
    address6: str | None = None    # the sandbox's IPv6 address (eth0)

    def close(self) -> None:
        if self.netns_fd is not None:
            os.close(self.netns_fd)
            self.netns_fd = None

    def runtime_files(self, image_bundle: bytes | None = None) -> dict[str, bytes]:
        """What a run on this link is shown (RunSpec.runtime_files): a resolv.conf naming the
        gateway (the daemon's resolver), and with secrets the image's CA bundle + the link's CA
        at trust.RUNTIME_PATH."""
        files = {RESOLV_CONF: f"nameserver {self.gateway}\n".encode()}
        if self.ca_pem:
            files[trust.RUNTIME_PATH] = trust.bundle(self.ca_pem, image_bundle)
        return files

    def env(self) -> dict[str, str]:
        """The run's environment additions: each secret's placeholder, and with secrets the
        variables that make TLS clients trust the bundle."""
        return {**self.placeholders, **(trust.sandbox_env(trust.RUNTIME_PATH) if self.ca_pem else {})}


def _policy_request(key: str, policy: Policy | None, scope: str | None) -> dict:
    req = {"op": "set_policy", "key": key, "policy": policy.to_json() if policy else None}
    if scope is not None:
        req["scope"] = scope
    return req


def _error(answer: dict) -> SandtreeError:
    cls = getattr(errors, str(answer.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, SandtreeError)):
        cls = SandtreeError
    return cls(answer.get("message") or "the egress daemon refused")


class Egress:
    def __init__(self, home: str, upstream_netns: str | None = None, upstream_dns: str | None = None,
                 upstream_ca: str | None = None):
        netns_, dns, ca = config.egress_upstream()
        self.home = home
        self.upstream_netns = upstream_netns or netns_
        self.upstream_dns = upstream_dns or dns
        self.upstream_ca = upstream_ca or ca
        self._available = False
        self.recycle = True                  # attach links that may go back to the daemon's pool (tests, bench: off)
        self._local = threading.local()
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()

    # ---- availability and the daemon ----------------------------------------------------------------
    def available(self) -> tuple[bool, str]:
        if self._available:                  # (asked before every networked run: a yes is kept)
            return True, ""
        ok, why = self._check()
        self._available = ok
        return ok, why

    def _check(self) -> tuple[bool, str]:
        if os.geteuid() != 0:
            return False, "network egress needs root (the daemon makes namespaces, veths and nftables rules)"
        if not shutil.which("nft"):
            return False, "nft (nftables) is not installed"
        if not os.path.exists("/proc/self/ns/net"):
            return False, "the kernel has no network namespaces"
        if self.upstream_netns and not os.path.exists(self.upstream_netns):
            return False, f"the upstream namespace {self.upstream_netns} does not exist"
        return True, ""

    def _start(self) -> None:
        ok, why = self.available()
        if not ok:
            raise RuntimeUnavailable(f"the egress daemon cannot run here: {why}")
        cmd = [sys.executable, "-m", "sandtree.network.daemon", "--home", self.home]
        for flag, value in (("--upstream-netns", self.upstream_netns), ("--upstream-dns", self.upstream_dns),
                            ("--upstream-ca", self.upstream_ca)):
            if value:
                cmd += [flag, value]
        cmd += ["--relay", config.egress_relay()]
        env = config.inherited_environment()
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__ + "/..")))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        # The daemon forks: this child returns once the socket is there (or says why not).
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, timeout=START_TIMEOUT, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise RuntimeUnavailable("the egress daemon did not come up in time") from None
        if r.returncode != 0:
            raise RuntimeUnavailable(f"the egress daemon did not start: {r.stderr.decode(errors='replace').strip()}")

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.connect(socket_path(self.home))
        except OSError:
            s.close()
            raise
        return s

    # One connection a thread, one request in flight on it: concurrent runs do not queue behind
    # each other's answers, and a thread may send a request and read its answer later (begin):
    # a run's release then overlaps its commit.
    def _thread_sock(self) -> socket.socket:
        s = getattr(self._local, "sock", None)
        if s is None or s.fileno() < 0:          # (close() closed it)
            s = self._local.sock = self._connect()
            with self._lock:
                self._socks.add(s)
        return s

    def _drop_thread_sock(self) -> None:
        s = getattr(self._local, "sock", None)
        if s is not None:
            self._local.sock = None
            with self._lock:
                self._socks.discard(s)
            s.close()

    def _send(self, data: bytes, start: bool) -> None:
        for attempt in (0, 1):
            try:
                self._thread_sock().sendmsg([data])
                return
            except (FileNotFoundError, ConnectionError, BrokenPipeError) as e:
                self._drop_thread_sock()
                if not start:
                    raise NotFound("no egress daemon runs for this store") from None
                if attempt:
                    raise RuntimeUnavailable(f"the egress daemon does not answer: {e}") from None
                self._start()

    def _receive(self) -> tuple[dict, list[int]]:
        try:
            msg, anc, _, _ = self._thread_sock().recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(4 * 4))
        except OSError as e:
            self._drop_thread_sock()
            raise RuntimeUnavailable(f"the egress daemon does not answer: {e}") from None
        if not msg:
            self._drop_thread_sock()
            raise RuntimeUnavailable("the egress daemon went away")
        fds = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                a = array.array("i")
                a.frombytes(payload[:len(payload) - len(payload) % 4])
                fds.extend(a)
        answer = json.loads(msg)
        if not answer.get("ok"):
            for fd in fds:
                os.close(fd)
            raise _error(answer)
        return answer, fds

    def _request(self, req: dict, start: bool = True) -> tuple[dict, list[int]]:
        data = json.dumps(req).encode()
        for attempt in (0, 1):
            self._send(data, start)
            try:
                return self._receive()
            except RuntimeUnavailable:           # the daemon went between the send and the answer
                if attempt or not start:
                    raise
        raise AssertionError("unreachable")

    # ---- the operations -------------------------------------------------------------------------------
    def ping(self) -> dict:
        return self._request({"op": "ping"})[0]

    def attach(self, key: str, policy: Policy | None, secrets: list[Secret] | None = None,
               owner: int | None = None, scope: str | None = None, tape: dict | None = None) -> Link:
        """A link for `key` with `policy` (None: nothing goes out); `secrets` get placeholders (the
        daemon's: the values stay in its memory) and the link a CA. scope: whose run it is (a
        tenant): the link is a fresh one or one only that scope used, and after its release it
        may serve that scope again (the daemon recycles it when it finds it clean); "any" (only
        with no policy: a link made ready for a run not yet known) any, Link.scope saying whose
        it was; None: a fresh link, removed after its release. tape: {"record", "replay", "rules"}
        (tape.py; engine/tapes.py makes it): the release's usage then says where the tape is."""
        wire = {s.name: {"value": s.value, "hosts": list(s.hosts)} for s in secrets or ()}
        req = {"op": "attach", "key": key, "policy": policy.to_json() if policy else None,
               "secrets": wire or None, "owner": owner if owner is not None else os.getpid()}
        if tape is not None:
            req["tape"] = tape
        if scope is not None and self.recycle:
            req.update(scope=scope, recycle=True)
        answer, fds = self._request(req)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandtreeError("the egress daemon's attach answer carried no namespace")
        return self._link(key, answer, fds[0])

    def attach_like(self, key: str, of: str, owner: int | None = None) -> Link:
        """A link for `key` with link `of`'s policy, secrets and CA (the same placeholders, the
        values staying in the daemon) on a namespace and address of its own, held until
        hold(key, False) (a live fork's child, restored into it). NotFound when the daemon has no
        link `of`; it is not started for this (a new daemon would not have it either)."""
        answer, fds = self._request({"op": "attach_like", "key": key, "of": of,
                                     "owner": owner if owner is not None else os.getpid()}, start=False)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandtreeError("the egress daemon's attach_like answer carried no namespace")
        return self._link(key, answer, fds[0])

    def hold(self, key: str, held: bool = True) -> None:
        """Keep `key`'s link while no process is in it (its sandbox hibernated: the daemon's GC
        would release it), or let GC judge it again (held=False). NotFound when the daemon has no
        such link; it is not started for this."""
        self._request({"op": "hold", "key": key, "held": held}, start=False)

    def rejoin(self, key: str) -> Link:
        """`key`'s existing link with its namespace fd (the caller's to close): the same address,
        placeholders and CA attach gave. NotFound when the daemon has no such link (it was
        restarted, or the link released)."""
        answer, fds = self._request({"op": "rejoin", "key": key}, start=False)
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise SandtreeError("the egress daemon's rejoin answer carried no namespace")
        return self._link(key, answer, fds[0])

    def adopt(self, key: str, pid: int) -> Link:
        answer, _ = self._request({"op": "adopt", "key": key, "pid": pid, "owner": os.getpid()})
        return self._link(key, answer, None)

    def route(self, key: str, pid: int, on: bool = True) -> None:
        """An adopted link's default route to the router on or off (a policy given to a sandbox
        after it started, or taken away); pid: a process in that namespace. NotFound when the
        daemon has no such link, Conflict when `pid` is no longer in the namespace adopted."""
        self._request({"op": "route", "key": key, "pid": pid, "on": on}, start=False)

    @staticmethod
    def _link(key: str, answer: dict, fd: int | None) -> Link:
        ca = answer.get("ca_pem")
        return Link(key=key, netns_fd=fd, address=answer["address"], gateway=answer["gateway"],
                    placeholders=dict(answer.get("placeholders") or {}), ca_pem=ca.encode() if ca else None,
                    scope=answer.get("scope"), address6=answer.get("address6"))

    def set_policy(self, key: str, policy: Policy | None, scope: str | None = None) -> None:
        """Replace `key`'s policy. scope: whose run it now is (a link attached with scope "any"
        must be given the scope it served, or a fresh one any scope; None: the link is removed
        after its release)."""
        self._request(_policy_request(key, policy, scope), start=False)

    def usage(self, key: str) -> dict:
        return self._request({"op": "usage", "key": key}, start=False)[0]["usage"]

    def release(self, key: str) -> dict:
        """The link's final usage; {} when the daemon has no such link (or runs no more)."""
        return self.release_begin(key)()

    def release_begin(self, key: str):
        """Send a release now, read its answer later: a function returning what release() does."""
        finish = self._begin({"op": "release", "key": key})

        def usage() -> dict:
            try:
                return finish()["usage"]
            except (NotFound, RuntimeUnavailable):
                return {}
        return usage

    def set_policy_begin(self, key: str, policy: Policy | None, scope: str | None = None):
        """Send a set_policy now; the function returned waits for the daemon's yes (and raises
        what set_policy would)."""
        return self._begin(_policy_request(key, policy, scope))

    def _begin(self, req: dict):
        """Send `req` now (no daemon started for it); finish() reads its answer once (later calls
        return it again, or raise the same error). The thread must call finish() before it asks
        the daemon anything else: its connection has one request in flight at a time."""
        box: list = []
        try:
            self._send(json.dumps(req).encode(), start=False)
        except SandtreeError as e:
            box.append(e)

        def finish() -> dict:
            if not box:
                try:
                    box.append(self._receive()[0])
                except SandtreeError as e:
                    box.append(e)
            if isinstance(box[0], SandtreeError):
                raise box[0]
            return box[0]
        return finish

    def expose(self, key: str, port: int) -> int:
        return self._request({"op": "expose", "key": key, "port": port}, start=False)[0]["host_port"]

    def unexpose(self, key: str, port: int) -> None:
        self._request({"op": "unexpose", "key": key, "port": port}, start=False)

    def list(self) -> list[dict]:
        return self._request({"op": "list"}, start=False)[0]["links"]

    def stop_daemon(self) -> None:
        """Stop the store's daemon (tests): its links and listeners go; waits until it has exited."""
        try:
            self._request({"op": "stop"}, start=False)
        except (NotFound, RuntimeUnavailable):
            pass
        self.close()
        try:
            fd = os.open(lock_path(self.home), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:                                   # the daemon holds the lock until it is gone
            end = time.monotonic() + 15
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return
                except BlockingIOError:
                    if time.monotonic() > end:
                        raise RuntimeUnavailable("the egress daemon did not stop") from None
                    time.sleep(0.02)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close every thread's connection (a thread asking again reconnects)."""
        with self._lock:
            socks, self._socks = self._socks, set()
        for s in socks:
            s.close()
