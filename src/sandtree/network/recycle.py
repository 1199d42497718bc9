"""Whether a released link is clean enough to serve again, and its reset (links.py recycles it).

Making a link costs about 6 ms of the daemon's CPU (netlink) and removing one another 2 ms and a
kernel namespace teardown; a networked run made one and removed one. A released link may instead
go back to the pool, but only when it is provably what a fresh link is, as far as anything in it
can tell:

- no process in its namespace (a /proc scan: the sandbox's helper may still be exiting) and no
  socket of any kind there (the namespace's own /proc/net tables: TCP in any state, TIME_WAIT and
  listeners included, UDP, raw, ICMP, unix, packet, user netlink sockets, IPv6 flow labels) and no
  conntrack entry there;
- no nftables table in its namespace, and its links, addresses, routes, rules and net sysctls
  exactly those it had when it was made (a
  sandbox holds no capability over a namespace of the host's user namespace, so it cannot change
  them: this is the proof of that, checked every time);
- then its neighbour entries (both ends), cached routes and TCP metrics (destinations it talked
  to: readable by anyone in the namespace) are flushed, and the router's conntrack entries from its
  address deleted.

Anything else found dirties it: the link is removed as before. What cannot be reset and is not
checked: the namespace's identity (its inode, the cookie SO_NETNS_COOKIE reads) and the kernel's
counters (/proc/net/snmp, eth0's byte counts) go on from the previous run. That is why a link is
recycled only within one scope (a tenant: daemon.py), never into another.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import socket
import struct


from . import netns, nlraw

__all__ = ["Fingerprint", "fingerprint", "dirt", "reset", "forget_conntrack", "namespaces_in_use", "sysctls",
           "SOCKET_TABLES"]

# /proc/net tables listing one socket (or flow label, or tracked connection) a line after a header
SOCKET_TABLES = ("tcp", "tcp6", "udp", "udp6", "udplite", "udplite6", "raw", "raw6", "icmp", "icmp6",
                 "unix", "packet", "ip6_flowlabel")

Fingerprint = tuple
_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
           "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}


def namespaces_in_use() -> set[tuple[int, int]]:
    """(dev, inode) of every network namespace some process is in."""
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                st = os.stat(f"/proc/{pid}/ns/net")
                out.add((st.st_dev, st.st_ino))
    return out


def _read_tables() -> dict[str, list[str]]:
    """The calling thread's namespace's socket tables (rows past the header) and netlink rows."""
    out = {}
    for name in (*SOCKET_TABLES, "netlink"):
        try:
            with open(f"/proc/thread-self/net/{name}", "rb") as f:
                rows = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:          # (a protocol this kernel lacks)
            continue
        out[name] = rows[1:]
    # The namespace's conntrack entries: their count (its /proc/net/nf_conntrack walks the host's
    # whole table, 0.3 ms); none without the module.
    try:
        with open("/proc/sys/net/netfilter/nf_conntrack_count", "rb") as f:
            out["nf_conntrack"] = [""] * int(f.read())
    except FileNotFoundError:
        pass
    return out


def _sockets_left(tables: dict[str, list[str]], kernel_netlink: int) -> str | None:
    for name, rows in tables.items():
        if name == "netlink":
            # The kernel's own netlink sockets (port 0) are in every namespace; any bound one is a
            # process's, and more unbound ones than a fresh link has are too.
            if any(r.split()[2] != "0" for r in rows if len(r.split()) > 2) or len(rows) > kernel_netlink:
                return f"a netlink socket is left ({len(rows)} rows)"
        elif name == "nf_conntrack" and rows:
            return f"{len(rows)} conntrack entries left in its namespace"
        elif rows:
            states = sorted({_STATES.get(r.split()[3], r.split()[3]) for r in rows if len(r.split()) > 3}) \
                if name.startswith("tcp") else []
            return f"sockets left in /proc/net/{name}" + (f" ({', '.join(states)})" if states else "")
    return None


def sysctls(names) -> tuple:
    out = []
    for name in names:
        with open("/proc/sys/" + name.replace(".", "/"), "rb") as f:
            out.append((name, f.read().decode().split()))
    return tuple(out)


_RTM_GETLINK, _RTM_GETADDR, _RTM_GETROUTE, _RTM_DELNEIGH, _RTM_GETNEIGH, _RTM_GETRULE = 18, 22, 26, 29, 30, 34
_RTM_F_CLONED = 0x200
_VOLATILE_ROUTE_ATTRS = (12, 23)              # RTA_CACHEINFO, RTA_EXPIRES: counters and clocks


def _dump(nl: nlraw.Socket) -> tuple:
    """Links, addresses, routes (cached ones aside) and rules of the socket's namespace, as
    comparable values (interfaces by name, counters and clocks left out)."""
    names, links = {}, []
    for _, m in nl.request(_RTM_GETLINK, bytes(16), dump=True):
        _, _, kind, index, flags, _ = struct.unpack_from("=BBHiII", m)
        a = nlraw.attrs(m, 16)
        names[index] = a.get(3, b"")                                    # IFLA_IFNAME
        links.append((a.get(3), kind, flags, a.get(4), a.get(1), a.get(13), a.get(2)))   # MTU, ADDRESS, TXQLEN, BROADCAST
    addrs = []
    for _, m in nl.request(_RTM_GETADDR, bytes(8), dump=True):
        family, prefixlen, flags, scope, index = struct.unpack_from("=BBBBI", m)
        a = nlraw.attrs(m, 8)
        addrs.append((names.get(index), family, prefixlen, flags, scope, a.get(1), a.get(2), a.get(3), a.get(8)))
    routes = []
    for _, m in nl.request(_RTM_GETROUTE, bytes(12), dump=True):
        if struct.unpack_from("=I", m, 8)[0] & _RTM_F_CLONED:
            continue
        a = nlraw.attrs(m, 12)
        oif = struct.unpack("=i", a[4])[0] if 4 in a else None           # RTA_OIF
        routes.append((m[:12], names.get(oif), tuple(sorted((k, v) for k, v in a.items()
                                                              if k not in (4, *_VOLATILE_ROUTE_ATTRS)))))
    rules = [m for _, m in nl.request(_RTM_GETRULE, bytes(12), dump=True)]
    return tuple(sorted(links)), tuple(sorted(addrs)), tuple(sorted(routes)), tuple(sorted(rules))


def fingerprint(fd: int, names) -> Fingerprint:
    """What a link looks like from inside (fd: its namespace): links, addresses, routes, rules,
    the net sysctls `names` and how many kernel netlink sockets it has. Taken when a link is made;
    a link is recycled only when it looks the same again."""
    with netns.entered(fd):
        tables = _read_tables()
        values = sysctls(names)
        nl = nlraw.Socket(nlraw.ROUTE)
    with nl:
        return (_dump(nl), values, len(tables.get("netlink", ())))


def dirt(fd: int, fresh: Fingerprint, names) -> str | None:
    """Why the link of namespace `fd` is not as it was made (`fresh`), or None when it is. Reads
    the socket tables before it opens any socket of its own there."""
    with netns.entered(fd):
        tables = _read_tables()
        why = _sockets_left(tables, fresh[2])
        if why:
            return why
        values = sysctls(names)
        nl = nlraw.Socket(nlraw.ROUTE)
        nf = nlraw.Socket(nlraw.NETFILTER)
    with nl, nf:
        if values != fresh[1]:
            return "a net sysctl differs from a fresh link's"
        if nf.request(_NFT_GETTABLE, bytes(4), dump=True):
            return "an nftables table is in its namespace"
        for what, a, b in zip(("links", "addresses", "routes", "rules"), _dump(nl), fresh[0]):
            if a != b:
                return f"its {what} differ from a fresh link's"
    return None


def reset(fd: int, router: nlraw.Socket, router_ifindex: int) -> None:
    """Forget what traffic taught the link (fd: its namespace) and the router's end (its
    interface `router_ifindex` there; router: a ROUTE socket in the router's namespace):
    neighbour entries, cached routes and TCP metrics. Raises OSError when any is left."""
    with netns.entered(fd):
        for name in ("net/ipv4/route/flush", "net/ipv6/route/flush"):
            try:
                with open("/proc/sys/" + name, "w") as f:
                    f.write("1")
            except FileNotFoundError:
                pass
        nl = nlraw.Socket(nlraw.ROUTE)
        genl = nlraw.Socket(nlraw.GENERIC)
    with nl, genl:
        _flush_neighbours(nl, None)
        family = _tcp_metrics_family(genl)
        genl.request(family, struct.pack("=BBH", _TCPM_DEL, 1, 0))      # no address: every entry
        if genl.request(family, struct.pack("=BBH", _TCPM_GET, 1, 0), dump=True):
            raise OSError("TCP metrics are left after a flush")
        cached = struct.pack("=8BI", 0, 0, 0, 0, 0, 0, 0, 0, _RTM_F_CLONED)     # (a dump of the exceptions)
        for _, m in nl.request(_RTM_GETROUTE, cached, dump=True):
            if struct.unpack_from("=I", m, 8)[0] & _RTM_F_CLONED:
                raise OSError("a cached route is left after a flush")
    _flush_neighbours(router, router_ifindex)


def _neighbours(nl: nlraw.Socket, ifindex: int | None) -> list[bytes]:
    out = []
    for _, m in nl.request(_RTM_GETNEIGH, bytes(12), dump=True):
        family, index = struct.unpack_from("=B3xi", m)
        if ifindex is None or index == ifindex:
            out.append(struct.pack("=B3xiHBB", family, index, 0, 0, 0) + nlraw.attr(1, nlraw.attrs(m, 12).get(1, b"")))
    return out


def _flush_neighbours(nl: nlraw.Socket, ifindex: int | None) -> None:
    """Delete the neighbour entries of interface `ifindex` (None: of every interface)."""
    for body in _neighbours(nl, ifindex):
        try:
            nl.request(_RTM_DELNEIGH, body)
        except OSError as e:
            if e.errno != errno.ENOENT:          # (it expired meanwhile)
                raise
    if _neighbours(nl, ifindex):
        raise OSError("neighbour entries are left after a flush")


# ---- the router's conntrack entries of a link's address ------------------------------------------
_CT_GET, _CT_DELETE = 0x101, 0x102          # NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_*
_NFT_GETTABLE = 0xA01                        # NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_GETTABLE
_NESTED = 0x8000
_CTA_TUPLE_ORIG, _CTA_TUPLE_IP, _CTA_TUPLE_PROTO, _CTA_ZONE, _CTA_FILTER = 1, 1, 2, 18, 25
_CTA_IP_V4_SRC, _CTA_IP_V4_DST, _CTA_FILTER_ORIG_FLAGS = 1, 2, 1
_CTA_IP_V6_SRC, _CTA_IP_V6_DST = 3, 4
_CTA_PROTO_NUM, _CTA_PROTO_SRC_PORT, _CTA_PROTO_DST_PORT = 1, 2, 3


def forget_conntrack(router_fd: int, address: str, nl: nlraw.Socket | None = None) -> int:
    """Delete the router's conntrack entries from `address` (a link's, IPv4 or IPv6): the next user
    of that address (a recycled link, or a new one given the same index) starts with none. Their count.
    nl: a NETFILTER socket in the router's namespace (else one is made). The entries are found in
    the namespace's /proc/net/nf_conntrack (0.3 ms: a netlink dump, filtered or not, walks the
    host's 262,144 buckets in 8-9 ms) and deleted one by one by their tuple."""
    with netns.entered(router_fd):
        try:
            with open("/proc/thread-self/net/nf_conntrack", "rb") as f:
                rows = f.read().decode(errors="replace").splitlines()
        except FileNotFoundError:
            rows = None
        own = nl is None
        if own:
            nl = nlraw.Socket(nlraw.NETFILTER)
    ip = ipaddress.ip_address(address)
    family, (src_attr, dst_attr) = (socket.AF_INET, (_CTA_IP_V4_SRC, _CTA_IP_V4_DST)) if ip.version == 4 else \
        (socket.AF_INET6, (_CTA_IP_V6_SRC, _CTA_IP_V6_DST))
    try:
        if rows is None:
            return _forget_by_dump(nl, ip)
        n = 0
        for row in rows:
            words = row.split()
            fields: dict[str, str] = {}
            for w in words:                       # the first of each: the original tuple's
                if "=" in w:
                    k, v = w.split("=", 1)
                    fields.setdefault(k, v)
            try:                                  # (IPv6 is written out in full there)
                if ipaddress.ip_address(fields.get("src", "")) != ip:
                    continue
            except ValueError:
                continue
            if words[0] != f"ipv{ip.version}" or words[2] not in ("tcp", "udp"):
                raise OSError(f"a conntrack entry the link's cannot be: {row}")
            tup = (nlraw.attr(_CTA_TUPLE_IP | _NESTED, nlraw.attr(src_attr, ip.packed)
                              + nlraw.attr(dst_attr, ipaddress.ip_address(fields["dst"]).packed))
                   + nlraw.attr(_CTA_TUPLE_PROTO | _NESTED, nlraw.attr(_CTA_PROTO_NUM, bytes([int(words[3])]))
                                + nlraw.attr(_CTA_PROTO_SRC_PORT, struct.pack("!H", int(fields["sport"])))
                                + nlraw.attr(_CTA_PROTO_DST_PORT, struct.pack("!H", int(fields["dport"])))))
            zone = int(fields.get("zone", "0"))
            n += _delete(nl, tup, struct.pack("!H", zone) if zone else None, family)
        return n
    finally:
        if own:
            nl.close()


def _delete(nl: nlraw.Socket, tup: bytes, zone: bytes | None, family: int = socket.AF_INET) -> int:
    body = struct.pack("=BBH", family, 0, 0) + nlraw.attr(_CTA_TUPLE_ORIG | _NESTED, tup)
    if zone is not None:
        body += nlraw.attr(_CTA_ZONE, zone)
    try:
        nl.request(_CT_DELETE, body)
        return 1
    except OSError as e:
        if e.errno != errno.ENOENT:       # (it timed out meanwhile)
            raise
        return 0


def _forget_by_dump(nl: nlraw.Socket, ip) -> int:
    src = ip.packed
    family, attr = (socket.AF_INET, _CTA_IP_V4_SRC) if ip.version == 4 else (socket.AF_INET6, _CTA_IP_V6_SRC)
    match = nlraw.attr(_CTA_TUPLE_ORIG | _NESTED, nlraw.attr(_CTA_TUPLE_IP | _NESTED, nlraw.attr(attr, src)))
    ask = struct.pack("=BBH", family, 0, 0) + match + \
        nlraw.attr(_CTA_FILTER | _NESTED, nlraw.attr(_CTA_FILTER_ORIG_FLAGS, struct.pack("=I", 1)))
    n = 0
    for _, m in nl.request(_CT_GET, ask, dump=True):
        a = nlraw.attrs(m, 4)
        tup = a.get(_CTA_TUPLE_ORIG, b"")
        if nlraw.attrs(nlraw.attrs(tup).get(_CTA_TUPLE_IP, b"")).get(attr) == src:
            n += _delete(nl, tup, a.get(_CTA_ZONE), family)
    return n


# ---- TCP metrics (generic netlink family "tcp_metrics") -------------------------------------------
_TCPM_GET, _TCPM_DEL = 1, 2
_family: list[int] = []


def _tcp_metrics_family(genl: nlraw.Socket) -> int:
    if not _family:
        body = struct.pack("=BBH", 3, 1, 0) + nlraw.attr(2, b"tcp_metrics\0")   # CTRL_CMD_GETFAMILY, _NAME
        for _, m in genl.request(0x10, body):                                   # GENL_ID_CTRL
            _family.append(struct.unpack("=H", nlraw.attrs(m, 4)[1][:2])[0])    # CTRL_ATTR_FAMILY_ID
    return _family[0]
