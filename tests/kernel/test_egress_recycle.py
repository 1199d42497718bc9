"""Recycled links (network/recycle.py, links.py): a released link goes back to the daemon's pool,
instead of being removed, only when it is provably clean, and only to the scope (tenant) that
used it. What must hold: a recycled link holds nothing of its previous user (neighbours, cached
routes, TCP metrics, the router's conntrack entries, usage, policy, placeholders, CA) and looks
as a fresh one does from inside; a dirty link (a socket in any state, TIME_WAIT included; a
process still in it; an address or route not as made) is removed, not recycled; a link never
changes scope (the daemon refuses it); a link is owned by the host's user namespace and a
sandbox on it can change none of what is checked (routes, addresses, rules, neighbours, MTU,
sysctls, nftables).

Real things only: the real egress daemon (root, nft) on a store made here, network namespaces
it made, sandboxes of the namespaces tier on its links, a netlab internet for the engine runs
(tests/netlab.py). No packet leaves namespaces made here. Each daemon is stopped at teardown."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import compile_static, make_rootfs
from netlab import NetLab
from sandtree.engine import Engine
from sandtree.errors import Conflict, InvalidInput
from sandtree.network import netns
from sandtree.network.client import Egress
from sandtree.network.policy import Policy
from sandtree.runtime.base import RunSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
NS_GET_USERNS = 0xB701
POLICY = Policy.from_value(["allowed.test"])

# Tries what a sandbox would to change its link through nftables (and conntrack): one netfilter
# netlink message each, the kernel's answer printed.
NFT_PROBE = r"""
#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
static int ask(int type, int subsys) {
    int s = socket(AF_NETLINK, SOCK_RAW, NETLINK_NETFILTER);
    if (s < 0) return -errno;
    struct { struct nlmsghdr h; struct nfgenmsg g; } m;
    memset(&m, 0, sizeof m);
    m.h.nlmsg_len = sizeof m; m.h.nlmsg_type = (subsys << 8) | type;
    m.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE; m.h.nlmsg_seq = 1;
    m.g.nfgen_family = AF_INET;
    if (send(s, &m, sizeof m, 0) < 0) return -errno;
    char buf[4096];
    int n = recv(s, buf, sizeof buf, 0);
    if (n < 0) return -errno;
    struct nlmsghdr *h = (struct nlmsghdr *)buf;
    if (h->nlmsg_type == NLMSG_ERROR) return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
    return 0;
}
int main(void) {
    printf("nft_newtable %d\n", ask(0, 10));      /* NFT_MSG_NEWTABLE, NFNL_SUBSYS_NFTABLES */
    printf("ct_flush %d\n", ask(2, 1));           /* IPCTNL_MSG_CT_DELETE, NFNL_SUBSYS_CTNETLINK */
    return 0;
}
"""


def start_daemon(home: str) -> None:
    env = dict(os.environ, PYTHONPATH=SRC)
    subprocess.run([sys.executable, "-m", "sandtree.network.daemon", "--home", home, "--grace", "30",
                    "--idle", "600"], env=env, check=True, timeout=30)


@pytest.fixture(scope="module")
def eg(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("recycle"))
    start_daemon(home)
    e = Egress(home)
    yield e
    e.stop_daemon()


def stats(eg) -> dict:
    return eg.ping()["stats"]


def wait_stat(eg, name: str, above: int, timeout: float = 8.0) -> dict:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        s = stats(eg)
        if s.get(name, 0) > above:
            return s
        time.sleep(0.02)
    raise AssertionError(f"stat {name!r} did not pass {above}: {stats(eg)}")


def settled(eg) -> dict:
    """The daemon's stats once the recycler has nothing left from earlier tests (unchanged for
    1.2 s: a link waiting for its processes is looked at again within 1 s)."""
    end = time.monotonic() + 15
    last = stats(eg)
    while time.monotonic() < end:
        time.sleep(1.2)
        now = stats(eg)
        if now == last:
            return now
        last = now
    raise AssertionError(f"the recycler did not settle: {last}")


def reasons(eg) -> dict:
    return {k: v for k, v in stats(eg).items() if k not in ("made", "recycled", "dropped")}


def ino(fd: int) -> int:
    """A namespace's identity: its cookie (SO_NETNS_COOKIE), never reused, unlike its inode
    number, which a namespace made after one is gone may get again."""
    with netns.entered(fd):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)     # (unbound: listed nowhere)
    with s:
        return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), "little")     # SO_NETNS_COOKIE


def ip(fd: int, *args: str) -> str:
    """ip(8) run in namespace `fd` (nsenter through our own fd: nothing named in /run)."""
    r = subprocess.run(["nsenter", f"--net=/proc/self/fd/{fd}", "ip", *args], pass_fds=(fd,),
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    return r.stdout


def looks(link) -> dict:
    """What is inside a link's namespace, by ip(8) and ss(8), with its own addresses and MACs
    written as names: comparable between two links."""
    fd = link.netns_fd

    def norm(text: str) -> str:
        text = text.replace(link.address, "ADDR").replace(link.gateway, "GW")
        base = link.address.rsplit(".", 1)[0]
        text = re.sub(re.escape(base) + r"\.\d+", "NET", text)
        if link.address6:                   # (its IPv6 /126: ::2 the address, ::1 the gateway)
            a6 = ipaddress.ip_address(link.address6)
            for value, name in ((a6, "ADDR6"), (a6 - 1, "GW6"), (a6 - 2, "NET6")):
                text = re.sub(r"(?<![0-9a-f:])" + re.escape(str(value)) + r"(?![0-9a-f:])", name, text)
        return re.sub(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", "MAC", text)

    def strip(items, *drop):
        return [{k: v for k, v in x.items() if k not in drop} for x in items]
    r = subprocess.run(["nsenter", f"--net=/proc/self/fd/{fd}", "ss", "-Htanuxwp0"], pass_fds=(fd,),
                       capture_output=True, text=True, timeout=10)
    return {
        "links": strip(json.loads(norm(ip(fd, "-j", "link"))), "ifindex", "link_index", "link_netnsid"),
        "addrs": strip(json.loads(norm(ip(fd, "-j", "addr"))), "ifindex", "link_index", "link_netnsid"),
        "routes": json.loads(norm(ip(fd, "-j", "route", "show", "table", "all"))),
        "rules": json.loads(ip(fd, "-j", "rule")) + json.loads(ip(fd, "-j", "-6", "rule")),
        "neighbours": json.loads(ip(fd, "-j", "neigh")),
        "cached routes": ip(fd, "route", "show", "cache").strip(),
        "tcp metrics": ip(fd, "tcp_metrics", "show").strip(),
        "sockets": r.stdout.strip(),
    }


def router_fd(eg) -> int:
    """A fd of the daemon's router namespace (the one holding the st* interfaces)."""
    pid = eg.ping()["pid"]
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            if not os.readlink(f"/proc/{pid}/fd/{n}").startswith("net:"):
                continue
            fd = os.open(f"/proc/{pid}/fd/{n}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if re.search(r"^\d+: st\d+", ip(fd, "-o", "link"), re.M):
            return fd
        os.close(fd)
    raise AssertionError("no router namespace found")


def conntrack_from(eg, address: str) -> list[str]:
    fd = router_fd(eg)
    try:
        with netns.entered(fd):
            with open("/proc/thread-self/net/nf_conntrack") as f:
                rows = f.read().splitlines()
    finally:
        os.close(fd)
    return [r for r in rows if f"src={address} " in r]


def use(link) -> None:
    """Traffic as a sandbox makes it: ARP for the gateway, a DNS question, a TCP connection to
    the proxy, which refuses it (the link allows only allowed.test) and closes first, so this
    end is left with nothing (no TIME_WAIT here)."""
    with netns.entered(link.netns_fd):
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        t = socket.create_connection((link.gateway, 80), timeout=5)
    try:
        u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04nope\x04test\x00\x00\x01\x00\x01",
                 (link.gateway, 53))
        u.settimeout(5)
        u.recv(512)
        t.sendall(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        while t.recv(4096):
            pass
    finally:
        u.close()
        t.close()


# ---- the daemon's links ------------------------------------------------------------------------------

def test_a_clean_link_comes_back_only_to_its_scope_and_looks_fresh(eg):
    first = eg.attach("r-a1", POLICY, scope="tenant:a")
    used_ino = ino(first.netns_fd)
    fresh = eg.attach("r-fresh", POLICY)               # unscoped: a fresh link, never recycled
    try:
        use(first)
        before = looks(first)
        assert before["neighbours"], "the test made no neighbour entry"
        assert conntrack_from(eg, first.address), "the test made no conntrack entry in the router"
        assert eg.usage("r-a1")["dns_queries"] == 1 and eg.usage("r-a1")["refused"] == 1
    finally:
        first.close()
    n = settled(eg).get("recycled", 0)
    eg.release("r-a1")
    wait_stat(eg, "recycled", n)
    other = eg.attach("r-b1", POLICY, scope="tenant:b")
    again = eg.attach("r-a2", Policy.from_value(["other.test"]), scope="tenant:a")
    try:
        assert ino(other.netns_fd) != used_ino          # never to another scope
        assert ino(again.netns_fd) == used_ino          # to its own: recycled
        assert again.address == first.address and again.scope == "tenant:a"
        now, new = looks(again), looks(fresh)
        assert now == new, (now, new)                   # as a fresh link, from inside
        assert not now["neighbours"] and not now["sockets"] and not now["tcp metrics"]
        assert conntrack_from(eg, again.address) == []
        usage = eg.usage("r-a2")
        assert usage["connections"] == usage["refused"] == usage["dns_queries"] == usage["bytes_out"] == 0
        assert again.placeholders == {} and again.ca_pem is None
        assert [x["policy"] for x in eg.list() if x["key"] == "r-a2"] == [Policy.from_value(["other.test"]).to_json()]
    finally:
        for link, key in ((other, "r-b1"), (again, "r-a2"), (fresh, "r-fresh")):
            link.close()
            eg.release(key)


def test_a_link_that_had_secrets_comes_back_without_them(eg):
    from sandtree.network.trust import parse_secrets
    secrets = parse_secrets({"API_KEY": {"value": "s3cr3t-recycled", "hosts": ["allowed.test"]}})
    first = eg.attach("r-sec1", POLICY, secrets, scope="tenant:sec")
    used_ino, used_ca = ino(first.netns_fd), first.ca_pem
    assert first.placeholders and used_ca
    first.close()
    n = settled(eg).get("recycled", 0)
    eg.release("r-sec1")
    wait_stat(eg, "recycled", n)
    again = eg.attach("r-sec2", POLICY, scope="tenant:sec")
    try:
        assert ino(again.netns_fd) == used_ino
        assert again.placeholders == {} and again.ca_pem is None
        assert "s3cr3t" not in str(eg.list())
    finally:
        again.close()
        eg.release("r-sec2")
    other = eg.attach("r-sec3", POLICY, parse_secrets({"API_KEY": {"value": "another", "hosts": ["allowed.test"]}}),
                      scope="tenant:sec")
    try:
        assert other.ca_pem and other.ca_pem != used_ca            # a CA of its own, not the last one's
        assert other.placeholders["API_KEY"] != first.placeholders["API_KEY"]
    finally:
        other.close()
        eg.release("r-sec3")


def _released_dirty(eg, key: str, dirty, reason: str, timeout: float = 8.0) -> None:
    link = eg.attach(key, POLICY, scope="tenant:d")
    used_ino = ino(link.netns_fd)
    try:
        undo = dirty(link)
    finally:
        link.close()
    try:
        before = reasons(eg)
        dropped = stats(eg).get("dropped", 0)
        eg.release(key)
        end = time.monotonic() + timeout
        while not any(reason in k and v > before.get(k, 0) for k, v in reasons(eg).items()):
            assert time.monotonic() < end, (reason, reasons(eg))
            time.sleep(0.05)
        wait_stat(eg, "dropped", dropped)
        nxt = eg.attach(key + "-next", POLICY, scope="tenant:d")
        assert ino(nxt.netns_fd) != used_ino
        nxt.close()
        eg.release(key + "-next")
    finally:
        if undo:
            undo()


def test_a_link_with_a_time_wait_socket_is_removed(eg):
    def time_wait(link):
        with netns.entered(link.netns_fd):
            srv = socket.socket()
            cli = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        cli.connect(srv.getsockname())
        conn, _ = srv.accept()
        cli.close()                                    # the active close: TIME_WAIT on this side
        conn.close()
        srv.close()
        time.sleep(0.05)
        assert "TIME-WAIT" in subprocess.run(["nsenter", f"--net=/proc/self/fd/{link.netns_fd}", "ss", "-tan"],
                                             pass_fds=(link.netns_fd,), capture_output=True, text=True).stdout
    _released_dirty(eg, "r-tw", time_wait, "left in /proc/net/tcp (TIME_WAIT)")


def test_a_link_with_a_udp_socket_held_open_is_removed(eg):
    held = []

    def udp(link):
        with netns.entered(link.netns_fd):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("0.0.0.0", 5353))
        held.append(s)
        return s.close
    _released_dirty(eg, "r-udp", udp, "left in /proc/net/udp")


def test_a_link_a_process_stays_in_is_removed(eg):
    def process(link):
        p = subprocess.Popen(["nsenter", f"--net=/proc/self/fd/{link.netns_fd}", "sleep", "60"],
                             pass_fds=(link.netns_fd,))

        def stop():
            p.kill()
            p.wait()
        return stop
    _released_dirty(eg, "r-proc", process, "a process stayed", timeout=10)


@pytest.mark.parametrize("change", [("addr", "add", "10.9.9.9/32", "dev", "eth0"),
                                    ("route", "add", "10.8.0.0/16", "via", "GW"),
                                    ("link", "set", "eth0", "mtu", "1400"),
                                    ("rule", "add", "from", "10.7.0.0/16", "table", "7")])
def test_a_link_changed_from_how_it_was_made_is_removed(eg, change):
    def changed(link):
        ip(link.netns_fd, *[link.gateway if w == "GW" else w for w in change])
    _released_dirty(eg, f"r-{change[0]}", changed, "differ from a fresh link's")


@pytest.mark.parametrize("traffic", [False, True])
def test_a_link_with_an_nftables_table_or_conntrack_entries_in_it_is_removed(eg, traffic):
    def table(link):
        r = subprocess.run(["nsenter", f"--net=/proc/self/fd/{link.netns_fd}", "nft", "-f", "-"],
                           input="table inet t {\n chain c {\n type filter hook output priority 0;\n"
                                 " ct state new accept\n }\n}\n",
                           pass_fds=(link.netns_fd,), capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        if traffic:
            with netns.entered(link.netns_fd):
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b"x", ("127.0.0.1", 9))          # a conntrack entry in the link's namespace
            u.close()
    _released_dirty(eg, f"r-nft{int(traffic)}", table,
                    "conntrack entries left" if traffic else "an nftables table is in its namespace")


def test_an_unscoped_link_is_removed_after_its_release(eg):
    link = eg.attach("r-plain", POLICY)
    used_ino = ino(link.netns_fd)
    link.close()
    s = stats(eg)
    eg.release("r-plain")
    wait_stat(eg, "dropped", s.get("dropped", 0))
    time.sleep(0.3)                              # (it would have been recycled by now)
    for scope in (None, "tenant:a"):
        nxt = eg.attach("r-plain-next", POLICY, scope=scope)
        assert ino(nxt.netns_fd) != used_ino
        nxt.close()
        eg.release("r-plain-next")


def test_the_daemon_keeps_a_link_to_its_scope(eg):
    link = eg.attach("r-s1", POLICY, scope="tenant:a")
    link.close()
    n = settled(eg).get("recycled", 0)
    eg.release("r-s1")
    wait_stat(eg, "recycled", n)
    # a link for a run not yet known: any link, its scope said; the run must then be of that scope
    waiting = []
    try:
        for i in range(12):                    # (until the pool hands out the recycled one)
            w = eg.attach(f"r-any{i}", None, scope="any")
            w.close()
            waiting.append(w.key)
            if w.scope == "tenant:a":
                break
        assert w.scope == "tenant:a"
        with pytest.raises(Conflict):
            eg.set_policy(w.key, POLICY, scope="tenant:b")
        with pytest.raises(Conflict):
            eg.set_policy(w.key, POLICY)        # whose run it is not said
        eg.set_policy(w.key, POLICY, scope="tenant:a")
    finally:
        for key in waiting:
            eg.release(key)
    with pytest.raises(InvalidInput):
        eg._request({"op": "attach", "key": "r-bad", "policy": POLICY.to_json(), "scope": "any", "recycle": True})
    for bad in ("", 7, "x" * 257):
        with pytest.raises(InvalidInput):
            eg._request({"op": "attach", "key": "r-bad", "policy": None, "scope": bad, "recycle": True})
    with pytest.raises(InvalidInput):
        eg._request({"op": "attach", "key": "r-bad", "policy": None, "scope": "tenant:a", "recycle": "yes"})
    assert "r-bad" not in {x["key"] for x in eg.list()}


# ---- a sandbox on a link -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    e = Engine(str(tmp_path_factory.mktemp("recycle-engine") / "st"), warm=0)
    yield e
    e.close()


@pytest.fixture(scope="module")
def img(eng, tmp_path_factory):
    root = make_rootfs(str(tmp_path_factory.mktemp("recycle-root") / "root"))
    probe = compile_static(tmp_path_factory.mktemp("nftprobe"), "nftprobe", NFT_PROBE)
    os.makedirs(os.path.join(root, "usr", "local", "bin"), exist_ok=True)
    with open(os.path.join(root, "usr", "local", "bin", "nftprobe"), "wb") as f:
        f.write(probe)
    os.chmod(os.path.join(root, "usr", "local", "bin", "nftprobe"), 0o755)
    return eng.import_path(root)


def test_a_link_is_the_hosts_and_a_sandbox_on_it_changes_nothing_checked(eg, eng, img):
    link = eg.attach("r-sb", POLICY, scope="tenant:sb")
    used_ino = ino(link.netns_fd)
    try:
        owner = fcntl.ioctl(link.netns_fd, NS_GET_USERNS)           # the namespace's owning user namespace
        try:
            assert os.fstat(owner).st_ino == os.stat("/proc/self/ns/user").st_ino
        finally:
            os.close(owner)
        script = ("readlink /proc/self/ns/user; "
                  "ip rule add from 10.7.0.0/16 table 7; echo rule=$?; "
                  f"ip neigh add 100.64.9.9 lladdr 02:00:00:00:00:01 dev eth0; echo neigh=$?; "
                  "ip link set eth0 mtu 1400; echo mtu=$?; ip link add d0 type dummy; echo dummy=$?; "
                  "ip route add 10.8.0.0/16 dev eth0; echo route=$?; ip addr add 10.9.9.9/32 dev lo; echo addr=$?; "
                  "echo 4096 > /proc/sys/net/ipv4/tcp_rmem; echo rmem=$?; "
                  "echo 0 > /proc/sys/net/ipv6/conf/eth0/disable_ipv6; echo v6=$?; "
                  "echo 1 > /proc/sys/net/ipv4/route/flush; echo flush=$?; "
                  "/usr/local/bin/nftprobe")
        row = eng.store.image(img)
        root = eng.store.tree(img)["."]
        spec = RunSpec(argv=["/bin/sh", "-c", script], layers=row.layers, root_meta=(root.mode, root.uid, root.gid),
                       env={"PATH": "/bin:/usr/bin"}, netns_fd=link.netns_fd)
        with eng.tier("namespaces").run(spec) as out:
            text = out.stdout.decode()
        assert out.exit_code == 0, out.stderr
        sandbox_userns = text.splitlines()[0]
        assert sandbox_userns != os.readlink("/proc/self/ns/user")     # the sandbox is in a user namespace of its own
        for what in ("rule", "neigh", "mtu", "dummy", "route", "addr", "rmem", "v6", "flush"):
            assert re.search(rf"^{what}=[1-9]", text, re.M), (what, text)
        assert "nft_newtable -1\n" in text and "ct_flush -1\n" in text, text      # EPERM
    finally:
        link.close()
    n = settled(eg).get("recycled", 0)
    eg.release("r-sb")
    wait_stat(eg, "recycled", n)                  # found as it was made: nothing was changed
    nxt = eg.attach("r-sb2", POLICY, scope="tenant:sb")
    try:
        assert ino(nxt.netns_fd) == used_ino
    finally:
        nxt.close()
        eg.release("r-sb2")


# ---- the engine's runs ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab():
    lab = NetLab()
    yield lab
    lab.close()


@pytest.fixture(scope="module")
def warm_eng(tmp_path_factory, lab):
    e = Engine(str(tmp_path_factory.mktemp("recycle-warm") / "st"), warm=2)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    yield e
    e._egress.stop_daemon()
    e.close()


# The run's namespace, what it finds there, and how many TCP connections that namespace opened
# before (/proc/net/snmp's ActiveOpens: a kernel counter no reset touches; above 0 only on a
# namespace some earlier run used, since namespace inode numbers are reused once one is gone).
SEE = ("readlink /proc/self/ns/net; grep '^Tcp:' /proc/net/snmp | tail -1 | awk '{print \"opens=\" $6}'; "
       "echo neigh=$(ip neigh | wc -l); "
       "echo sockets=$(cat /proc/net/tcp /proc/net/udp /proc/net/unix /proc/net/raw | grep -vc -e sl -e Num); "
       "nslookup allowed.test >/dev/null 2>&1; (printf 'GET /hello HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n'; "
       "sleep 0.5) | nc -w 5 11.1.1.10 80 > /tmp/got; head -1 /tmp/got")
# (nc's input stays open until the server has closed: it closes first, no TIME_WAIT here; a run
# whose client closes first leaves one, and its link is removed: test_a_link_with_a_time_wait_socket...)


def test_networked_runs_reuse_links_of_their_scope_and_each_finds_one_clean(warm_eng, lab):
    root = make_rootfs(os.path.join(warm_eng.store.home, "..", "root"))
    image = warm_eng.import_path(root)
    runs = []                                        # (scope, namespace, connections it opened before)
    for i in range(15):
        scope = "tenant:x" if i % 3 == 2 else "engine"
        if scope == "engine":                        # (the in-process caller's scope)
            rec = warm_eng.run(image, SEE, network=["allowed.test"], disposable=True)
        else:                                        # (as a tenant's view runs it)
            rec = warm_eng.run_operation(image, SEE, network=["allowed.test"], disposable=True, scope=scope)
        out = rec.stdout.decode()
        assert "neigh=0" in out and "sockets=0" in out and "200 OK" in out, out
        runs.append((scope, out.split()[0], int(re.search(r"opens=(\d+)", out).group(1))))
        time.sleep(0.15)                             # (the released link is looked at meanwhile)
    st = warm_eng.egress.ping()["stats"]
    assert st.get("recycled", 0) > 0, st
    recycled = [i for i, r in enumerate(runs) if r[2] > 0]
    assert recycled, runs                            # some run had a namespace an earlier run had
    for i in recycled:                               # and only ever one of its own scope
        before = [r for r in runs[:i] if r[1] == runs[i][1]]
        assert before and before[-1][0] == runs[i][0], (i, runs)
    assert lab.trap_hits() == {}


def test_a_tenants_runs_are_of_its_own_scope_and_it_cannot_name_one(eng, tmp_path, monkeypatch):
    from sandtree.tenancy import Tenant
    view = eng.as_tenant(Tenant("recycler"))
    image = view.import_path(make_rootfs(str(tmp_path / "root")))
    with pytest.raises(InvalidInput):
        view.run(image, "true", scope="engine")            # whose run it is is the engine's to say
    with pytest.raises(InvalidInput):
        view.run(image, "true", scope="tenant:recycler")
    for name, value in (("step", "RUN pretend"), ("in_tx", print), ("op_id", "x" * 32), ("check_only", True)):
        with pytest.raises(InvalidInput):                 # nor forge what the lineage records
            view.run(image, "true", **{name: value})
    asked = []
    real = eng.run_operation

    def spy(*a, **kw):
        asked.append(kw.get("scope"))
        return real(*a, **kw)
    monkeypatch.setattr(eng, "run_operation", spy)
    view.run(image, "true")
    assert asked == ["tenant:recycler"]
