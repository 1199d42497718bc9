"""Links: the network namespaces a networked sandbox joins, and the router namespace at their other end.

A link K is a network namespace of its own (owned by the host's user namespace, so root inside a
sandbox holds no capability over its addresses, routes or sysctls) with `lo` up and `eth0`, one
end of a veth pair: 100.64.0.0/16 cut into /30s, the sandbox's end .2 of the K-th with a default
route via .1, which is `stK` in the router namespace; and the same in IPv6 (NETWORK6, a ULA
prefix cut into /126s: ::2 and ::1 of the K-th), so a sandbox reaches IPv6 destinations through
the same proxy and resolver. Neither end has a link-local address (addr_gen_mode 1) nor does
duplicate address detection: the router's redirect and the proxy know a link by its one
address. The router namespace holds every `stK`; it forwards nothing (ip_forward 0) and its
nftables ruleset (nft.py) sends every TCP connection and DNS packet from a link to the daemon's
proxy and resolver (daemon.py).

Everything is made over netlink (pyroute2), never by ip(8) per link. pyroute2's sync API runs an
event loop of its own, so it cannot be called on the daemon's loop: all calls here go through one
worker thread (`Links.call`), which also owns the netlink sockets. Links are made ahead (a small
pool) so an attach only takes one (well under 2 ms); making one costs about 5-7 ms of CPU and
removing one 2 ms and a kernel namespace teardown. A released link the attacher allowed it for
goes back to the pool instead when recycle.py finds it clean (on a thread of its own, `recycle`),
marked with the scope (tenant) that used it: `take_ready(scope)` gives it only to that scope.
A link's namespace is made from the router's, whose tcp_child_ehash_entries gives it a TCP hash
table of its own (LINK_EHASH buckets): its /proc/net/tcp lists only its sockets (reading the
host's shared 262,144-bucket table took 5-9 ms), and no link shares TCP hash chains with another.

`adopt` gives a RUNNING sandbox with a network namespace of its own a veth into that namespace:
addresses and no default route, so only connections the router opens to it (exposed ports) work
until `route` gives it one (a policy given later).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ipaddress
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

from pyroute2 import IPRoute

from ..errors import Conflict, LimitExceeded, NotFound
from . import netns, nlraw, recycle
from .policy import SANDBOX_NET6

__all__ = ["Links", "Made", "NETWORK", "NETWORK6", "MAX_INDEX", "POOL", "LINK_SYSCTLS", "ROUTER_SYSCTLS",
           "ADOPT_SYSCTLS", "V6_QUIET", "V6_ON", "IPV6", "IFA_F_NODAD", "LINK_EHASH", "EHASH_SCALED", "RECYCLE_TRIES", "ANY", "addresses", "addresses6"]

NETWORK = ipaddress.IPv4Network("100.64.0.0/16")
NETWORK6 = SANDBOX_NET6                          # (policy.py: never a destination)
IFA_F_NODAD = 0x02
IPV6 = os.path.isdir("/proc/sys/net/ipv6/conf")  # (a kernel booted with ipv6.disable=1: links are IPv4 only)
MAX_INDEX = NETWORK.num_addresses // 4 - 1      # K of the last /30 (K = 0 is never used)
POOL = 4                                        # links made ahead
LINK_EHASH = 4096                               # buckets of a link's own TCP hash table (32 KiB)
# Seconds after a release at which a link is looked at again while a process is still in it (its
# sandbox's helper exiting), after which it is removed instead.
RECYCLE_TRIES = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
ANY = object()                                  # take_ready: a link of any scope (told to the taker)
# The sandbox's side. ip_unprivileged_port_start: the sandbox holds no capability in a namespace
# it joined, and dev servers bind 80. tcp_rmem/tcp_wmem: what helper/network.c's loopback_up() sets in a
# sandbox's own namespace (bounded socket buffers, see there); a joined, host-owned namespace
# cannot be written by the sandbox, so the link comes with them. IPv6 (V6_QUIET, set before eth0
# arrives): its one address only (no link-local, no duplicate address detection: usable at once),
# no router advertisements or autoconfiguration taken (nothing on a link may route it elsewhere).
V6_QUIET = (("net.ipv6.conf.default.addr_gen_mode", "1"),
            ("net.ipv6.conf.default.accept_dad", "0"),
            ("net.ipv6.conf.default.dad_transmits", "0"),
            ("net.ipv6.conf.default.accept_ra", "0"),
            ("net.ipv6.conf.default.autoconf", "0"))
V6_ON = (("net.ipv6.conf.all.disable_ipv6", "0"), ("net.ipv6.conf.default.disable_ipv6", "0"), *V6_QUIET) \
    if IPV6 else ()
LINK_SYSCTLS = (("net.ipv4.ip_unprivileged_port_start", "0"),
                ("net.ipv4.tcp_rmem", "4096 65536 262144"),
                ("net.ipv4.tcp_wmem", "4096 16384 65536"),
                *V6_ON)
ROUTER_SYSCTLS = (("net.ipv4.ip_forward", "0"),            # no packet of a sandbox is ever forwarded
                  *((("net.ipv6.conf.all.forwarding", "0"),) if IPV6 else ()),
                  *V6_ON,
                  ("net.ipv4.tcp_child_ehash_entries", str(LINK_EHASH)))
# An adopted namespace (the sandbox's own): its eth0 arrives as a link's does
ADOPT_SYSCTLS = V6_QUIET if IPV6 else ()
# A namespace's own hash table sizes these from its buckets (128 and 2048 for LINK_EHASH): a link
# gets what a namespace on the shared table gets (the router's values, read once).
EHASH_SCALED = ("net.ipv4.tcp_max_syn_backlog", "net.ipv4.tcp_max_tw_buckets")


def addresses(index: int) -> tuple[str, str]:
    """(sandbox address, gateway) of link `index`: .2 and .1 of the index-th /30 of NETWORK."""
    base = NETWORK.network_address + 4 * index
    return str(base + 2), str(base + 1)


def addresses6(index: int) -> tuple[str, str]:
    """The same in IPv6: ::2 and ::1 of the index-th /126 of NETWORK6."""
    base = NETWORK6.network_address + 4 * index
    return str(base + 2), str(base + 1)


@dataclass
class Made:
    index: int
    netns_fd: int | None           # the link's namespace (None for an adopted one: the sandbox's own)
    address: str
    gateway: str
    scope: str | None = None       # who ran in it (a recycled link's tenant); None: nobody yet
    fresh: tuple | None = None     # what it looked like when made (recycle.fingerprint)
    uses: int = 0                  # how many times it was recycled
    router_ifindex: int = 0        # its stK's interface index in the router namespace


def _sysctls(pairs) -> None:
    """Write net.* sysctls of the calling thread's namespace (/proc/sys/net shows the opener's)."""
    for name, value in pairs:
        fd = os.open("/proc/sys/" + name.replace(".", "/"), os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)


class Links:
    """The router namespace and the links in it. `firewall(router_fd)` installs the router's
    ruleset (nft.install) once the namespace exists."""

    def __init__(self, firewall, pool: int = POOL, protect: tuple[int, ...] = ()):
        self.protect = protect              # fds of namespaces never to adopt (the host's)
        self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="links")
        self._pool_size = pool
        self._pool: list[Made] = []
        self._used: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        # Removing a veth waits for the kernel (RCU: 15-35 ms each here): on a thread of its own,
        # with its own netlink socket, so making links for the pool never queues behind removals.
        self._dropper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="links-drop")
        self.stats = collections.Counter()      # made, recycled, dropped, and each reason a link was dirty
        self._waiting: list = []                # [due, tries, made, scope, ns]: released, to be looked at
        self._recycle_cv = threading.Condition(self._lock)
        self._recycler: threading.Thread | None = None
        self.router_fd = netns.new()
        try:
            self._ipr = self.call(self._router, firewall)
            self._drop_ipr = self._dropper.submit(self._router_socket).result()
            with netns.entered(self.router_fd):
                scaled = recycle.sysctls(EHASH_SCALED)
            self.link_sysctls = LINK_SYSCTLS + tuple((n, " ".join(v)) for n, v in scaled)
        except BaseException:
            os.close(self.router_fd)
            self._worker.shutdown()
            self._dropper.shutdown()
            raise
        self.refill()

    # ---- the worker thread --------------------------------------------------------------------
    def call(self, fn, *args):
        """fn(*args) on the links thread, waited for (from any thread but the links thread)."""
        return self._worker.submit(fn, *args).result()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        return self._worker.submit(fn, *args)

    def _router(self, firewall) -> IPRoute:
        with netns.entered(self.router_fd):
            _sysctls(ROUTER_SYSCTLS)
            ipr = IPRoute()                 # a netlink socket stays in the namespace it was made in
        try:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
            firewall(self.router_fd)
        except BaseException:
            ipr.close()
            raise
        return ipr

    def _router_socket(self) -> IPRoute:
        with netns.entered(self.router_fd):
            return IPRoute()

    def _index(self) -> int:
        with self._lock:
            for k in range(1, MAX_INDEX + 1):
                if k not in self._used:
                    self._used.add(k)
                    return k
        raise LimitExceeded(f"all {MAX_INDEX} links of {NETWORK} are in use")

    def _veth(self, index: int, peer_fd: int) -> None:
        """stK in the router (up, gateway addresses) with its peer eth0 moved into `peer_fd`."""
        address, gateway = addresses(index)
        name = f"st{index}"
        self._ipr.link("add", ifname=name, kind="veth", peer={"ifname": "eth0", "net_ns_fd": peer_fd})
        try:
            i = self._ipr.link_lookup(ifname=name)[0]
            self._ipr.addr("add", index=i, address=gateway, prefixlen=30)
            if IPV6:
                self._ipr.addr("add", index=i, address=addresses6(index)[1], prefixlen=126, flags=IFA_F_NODAD)
            self._ipr.link("set", index=i, state="up")
        except BaseException:
            self._drop_veth(index)
            raise

    def _drop_veth(self, index: int, ipr: IPRoute | None = None) -> None:
        ipr = ipr or self._ipr                    # (the socket of the thread this runs on)
        with contextlib.suppress(Exception):      # (gone with its namespace already: nothing to do)
            for i in ipr.link_lookup(ifname=f"st{index}"):
                ipr.link("del", index=i)

    def _configure(self, peer_fd: int, index: int, routed: bool, sysctls) -> None:
        """In the namespace `peer_fd`: sysctls, lo and eth0 up with link `index`'s addresses,
        default routes via its gateways when `routed`."""
        (address, gateway), (address6, gateway6) = addresses(index), addresses6(index)
        with netns.entered(peer_fd):
            _sysctls(sysctls)
            ipl = IPRoute()
        try:
            ipl.link("set", index=ipl.link_lookup(ifname="lo")[0], state="up")
            eth = ipl.link_lookup(ifname="eth0")[0]
            ipl.addr("add", index=eth, address=address, prefixlen=30)
            if IPV6:
                ipl.addr("add", index=eth, address=address6, prefixlen=126, flags=IFA_F_NODAD)
            ipl.link("set", index=eth, state="up")
            if routed:
                ipl.route("add", dst="0.0.0.0/0", gateway=gateway)
                if IPV6:
                    ipl.route("add", dst="::/0", gateway=gateway6, family=socket.AF_INET6)
            # The carrier comes on through the kernel's linkwatch, later than the netlink
            # answer: a sandbox started before it would see eth0 without carrier and its first
            # packets dropped. Links are made ahead, so waiting here costs an attach nothing.
            end = time.monotonic() + 2
            while time.monotonic() < end:
                if ipl.get_links(eth)[0].get_attr("IFLA_OPERSTATE") == "UP":
                    break
                time.sleep(0.002)
        finally:
            ipl.close()

    def _make(self) -> Made:
        index = self._index()
        fd = None
        try:
            fd = netns.new(self.router_fd)      # (its own TCP hash table: see above)
            # Before the veth arrives, so eth0 is born without IPv6 (no link-local address).
            with netns.entered(fd):
                _sysctls(self.link_sysctls)
            self._veth(index, fd)
            address, gateway = addresses(index)
            self._configure(fd, index, True, ())
            # The router may still track connections from this address (an earlier link of this
            # index): a new link starts with none, as a recycled one does.
            for a in (address, addresses6(index)[0]):
                recycle.forget_conntrack(self.router_fd, a)
            fresh = recycle.fingerprint(fd, [n for n, _ in self.link_sysctls])
            with self._lock:
                self.stats["made"] += 1
            return Made(index, fd, address, gateway, fresh=fresh,
                        router_ifindex=self._ipr.link_lookup(ifname=f"st{index}")[0])
        except BaseException:
            self._drop_veth(index)
            if fd is not None:
                os.close(fd)
            with self._lock:
                self._used.discard(index)
            raise

    def _fill(self) -> None:
        while not self._closed:
            with self._lock:              # (fresh ones: recycled links serve only their scope)
                if sum(m.scope is None for m in self._pool) >= self._pool_size:
                    return
            made = self._make()
            with self._lock:
                if self._closed:
                    self._pool_size = 0
                self._pool.append(made)

    # ---- the daemon's calls ---------------------------------------------------------------------
    def refill(self) -> None:
        """Top up the pool in the background (on the links thread)."""
        if not self._closed:
            self.submit(self._fill)

    def take_ready(self, scope=None) -> Made | None:
        """A link from the pool (microseconds), or None when it has none for `scope`; the pool
        refills. scope: a tenant's name (a fresh link, or one only that scope used), None (a fresh
        link only) or ANY (any link: the taker reads made.scope and must keep to it)."""
        with self._lock:
            fits = [m for m in self._pool if scope is ANY or m.scope is None or m.scope == scope]
            # a recycled link first (the fresh ones stay for scopes that have none)
            made = min(fits, key=lambda m: m.scope is None) if fits else None
            if made is not None:
                self._pool.remove(made)
        self.refill()
        return made

    def take(self, scope=None) -> Made:
        """A ready link: from the pool when it has one, else made now (blocks: not on a loop)."""
        return self.take_ready(scope) or self.call(self._make)

    def adopt(self, pid: int) -> Made:
        """A veth into the network namespace of running process `pid` (eth0 there: address, no route)."""
        try:
            fd = os.open(f"/proc/{int(pid)}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            raise NotFound(f"no process {pid} (or no network namespace of its own to adopt)", pid=pid) from None
        try:
            if _shared(fd, (self.router_fd, *self.protect)):
                raise Conflict(f"process {pid} shares a namespace that is not a sandbox's own", pid=pid)
            return self.call(self._adopt, fd)
        finally:
            os.close(fd)                 # the namespace lives as long as the sandbox's processes

    def _adopt(self, fd: int) -> Made:
        with netns.entered(fd):
            with IPRoute() as ipl:
                if ipl.link_lookup(ifname="eth0"):
                    raise Conflict("the sandbox's namespace already has an eth0 (a link)")
            _sysctls(ADOPT_SYSCTLS)                 # (before eth0 arrives: read when it does)
        index = self._index()
        try:
            self._veth(index, fd)
            address, gateway = addresses(index)
            self._configure(fd, index, False, ())
            return Made(index, None, address, gateway)
        except BaseException:
            self._drop_veth(index)
            with self._lock:
                self._used.discard(index)
            raise

    def route(self, pid: int, index: int, on: bool, ns: tuple[int, int]) -> None:
        """Give an adopted namespace (process `pid`'s, whose identity must be `ns`: the one
        adopted, not a namespace a later process of that pid has) its default routes via link
        `index`'s gateways (on), or take them away: a policy given to a sandbox that started
        without one (its egress then goes where a link's does, to the router), or lost again."""
        try:
            fd = os.open(f"/proc/{int(pid)}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            raise NotFound(f"no process {pid}", pid=pid) from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != tuple(ns):
                raise Conflict(f"process {pid} is not in the namespace that link adopted", pid=pid)
            self.call(self._route, fd, index, on)
        finally:
            os.close(fd)

    @staticmethod
    def _route(fd: int, index: int, on: bool) -> None:
        with netns.entered(fd):
            ipl = IPRoute()
        try:
            for family, dst, gateway in ((socket.AF_INET, "0.0.0.0/0", addresses(index)[1]),
                                         (socket.AF_INET6, "::/0", addresses6(index)[1]))[:2 if IPV6 else 1]:
                if on:
                    ipl.route("replace", dst=dst, gateway=gateway, family=family)
                else:
                    for _ in ipl.get_routes(family=family, dst_len=0, table=254):
                        ipl.route("del", dst=dst, family=family)
        finally:
            ipl.close()

    def recycle(self, made: Made, scope, ns: tuple[int, int]) -> None:
        """Give a released link (of namespace identity `ns`) back to the pool for `scope` once
        recycle.py finds it clean, else remove it (drop). Returns at once: the looking is done on
        the recycler thread, again later while a process is still in the namespace."""
        if made.netns_fd is None or made.fresh is None or not isinstance(scope, str):
            self.drop(made)
            return
        with self._lock:
            if self._closed:
                return
            if self._recycler is None:
                self._recycler = threading.Thread(target=self._recycling, name="links-recycle", daemon=True)
                self._recycler.start()
            self._waiting.append([time.monotonic() + RECYCLE_TRIES[0], 0, made, scope, ns])
            self._recycle_cv.notify()

    def _recycling(self) -> None:
        router = ct = None
        try:
            with netns.entered(self.router_fd):
                router, ct = nlraw.Socket(nlraw.ROUTE), nlraw.Socket(nlraw.NETFILTER)
            while True:
                with self._lock:
                    while not self._closed and not self._waiting:
                        self._recycle_cv.wait()
                    if self._closed:
                        return
                    now = time.monotonic()
                    due = [w for w in self._waiting if w[0] <= now]
                    if not due:
                        self._recycle_cv.wait(min(w[0] for w in self._waiting) - now)
                        continue
                    for w in due:
                        self._waiting.remove(w)
                used = recycle.namespaces_in_use()          # one /proc scan for all that are due
                self.stats["scans"] += 1
                for w in due:
                    self._look_at(w, used, router, ct)
        except BaseException as e:          # noqa: BLE001 - a bug here must not leave links behind
            print(f"links: the recycler stopped: {type(e).__name__}: {e}", file=sys.stderr)
            with self._lock:
                left, self._waiting = self._waiting, []
                self._recycler = None
            for w in left:
                self.drop(w[2])
        finally:
            for s in (router, ct):
                if s is not None:
                    s.close()

    def _look_at(self, w: list, used: set, router, ct) -> None:
        _, tries, made, scope, ns = w
        if ns in used:                      # a process is still in it (its helper exiting)
            if tries + 1 < len(RECYCLE_TRIES):
                w[0], w[1] = time.monotonic() + RECYCLE_TRIES[tries + 1], tries + 1
                with self._lock:
                    self._waiting.append(w)
                return
            why = "a process stayed in its namespace"
        else:
            try:
                why = recycle.dirt(made.netns_fd, made.fresh, [n for n, _ in self.link_sysctls])
                if why is None:
                    recycle.reset(made.netns_fd, router, made.router_ifindex)
                    for a in (made.address, addresses6(made.index)[0]):
                        recycle.forget_conntrack(self.router_fd, a, ct)
            except Exception as e:          # noqa: BLE001 - not provably clean: removed
                why = f"looking at it failed: {type(e).__name__}: {e}"
        with self._lock:
            keep = why is None and not self._closed and \
                sum(m.scope is not None for m in self._pool) < 2 * self._pool_size
            if keep:
                made.scope, made.uses = scope, made.uses + 1
                self._pool.append(made)
                self.stats["recycled"] += 1
            else:
                self.stats[why or "the pool was full"] += 1
        if not keep:
            self.drop(made)

    def drop(self, made: Made) -> None:
        """Remove a link: its veth (both ends go) and our hold on its namespace."""
        def go():
            self._drop_veth(made.index, self._drop_ipr)
            if made.netns_fd is not None:
                with contextlib.suppress(OSError):
                    os.close(made.netns_fd)
            with self._lock:
                self._used.discard(made.index)
                self.stats["dropped"] += 1
        if not self._closed:
            self._dropper.submit(go).result()

    def close(self) -> None:
        """Remove every link of the pool and the router namespace (all veths go with it)."""
        if self._closed:
            return
        with self._lock:
            self._closed = True
            self._recycle_cv.notify_all()
        if self._recycler is not None:
            self._recycler.join(timeout=10)
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for w in waiting:                          # (their veths go with the router; their fds here)
            with contextlib.suppress(OSError):
                os.close(w[2].netns_fd)
        self._dropper.shutdown(wait=True)          # removals under way end first
        self._drop_ipr.close()
        def go():
            for made in self._pool:
                self._drop_veth(made.index)
                os.close(made.netns_fd)
            self._pool.clear()
            for index in list(self._used):
                self._drop_veth(index)
            self._ipr.close()
        self.call(go)
        self._worker.shutdown()
        os.close(self.router_fd)


def _shared(fd: int, others) -> bool:
    """Whether namespace `fd` is one no sandbox owns: the router's, the daemon's, the host's."""
    mine = os.fstat(fd)
    own = netns.current()
    try:
        return any((o.st_dev, o.st_ino) == (mine.st_dev, mine.st_ino)
                   for o in (os.fstat(x) for x in (*others, own)))
    finally:
        os.close(own)
