"""Egress links (network/links.py), the egress daemon (network/daemon.py) and its client
(network/client.py), and the runtime's side (RunSpec.netns_fd, RunSpec.runtime_files).

Everything real: the daemon runs as root on a temporary store, makes its router namespace, veths and
nftables rules there; sandboxes run on the busybox image through the real tiers. Every packet stays
in namespaces these tests (or their daemon) made. Each daemon is stopped at teardown, and the tests
check it leaves no process, namespace or veth."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import make_rootfs
from sandtree.engine import Engine
from sandtree.errors import Conflict, InvalidInput, NotFound
from sandtree.network import netns
from sandtree.network.client import Egress, socket_path
from sandtree.network.policy import Policy
from sandtree.network.trust import parse_secrets
from sandtree.runtime.base import RunSpec

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


GRACE = 5.0
PAST_GRACE = GRACE + 2 * 2.0 + 0.5          # the grace and two of the daemon's GC sweeps (daemon.SWEEP)


def start_daemon(home: str, *extra: str) -> None:
    """Start the store's daemon ourselves (short GC and idle times); Egress then only connects."""
    env = dict(os.environ, PYTHONPATH=SRC)
    subprocess.run([sys.executable, "-m", "sandtree.network.daemon", "--home", home, *extra],
                   env=env, check=True, timeout=30)


def daemon_pid(eg: Egress) -> int:
    return eg.ping()["pid"]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:        # a zombie is gone too (nothing of it runs)
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def host_veths() -> set[str]:
    return {n for n in os.listdir("/sys/class/net") if n.startswith("st")}


@pytest.fixture(scope="module")
def eg(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("egress"))
    veths = host_veths()
    # GRACE (the time a link nobody is in yet is kept) short for the GC tests, yet longer than an
    # attach-then-start takes on a loaded machine: at 1.5 s a sandbox started late found its link
    # collected (no eth0) in two loaded CI runs
    start_daemon(home, "--grace", str(GRACE), "--idle", "600")
    e = Egress(home)
    pid = daemon_pid(e)
    yield e
    e.stop_daemon()
    assert gone(pid) and not os.path.exists(socket_path(home))
    assert host_veths() == veths


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    home = str(tmp_path_factory.mktemp("egress-engine"))
    e = Engine(os.path.join(home, "st"), warm=0)
    yield e
    e.close()


@pytest.fixture(scope="module")
def img(eng, tmp_path_factory):
    root = make_rootfs(str(tmp_path_factory.mktemp("egress-root") / "root"))
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")          # the image's own (never used on a link)
    image = eng.import_path(root)
    # A first run builds the store's helpers (a compiler, seconds on a loaded machine): done here, not
    # between a test's attach and its sandbox's start, where it outlasted the daemon's grace and the
    # link was collected before the sandbox was in it (no eth0, in CI's fresh clones)
    assert eng.run(image, "true").exit_code == 0
    return image


def spec_for(eng, img: str, script: str, **kw) -> RunSpec:
    row = eng.store.image(img)
    root = eng.store.tree(img)["."]
    return RunSpec(argv=["/bin/sh", "-c", script], layers=row.layers, root_meta=(root.mode, root.uid, root.gid),
                   env={"PATH": "/bin"}, **kw)


def run(eng, tier: str, spec: RunSpec):
    try:
        rt = eng.tier(tier)
    except Exception as exc:
        pytest.skip(f"tier {tier} unavailable: {exc}")
    return rt.run(spec)


def in_ns(fd: int, fn):
    with netns.entered(fd):
        return fn()


def read_sysctl(name: str) -> str:
    with open("/proc/sys/" + name.replace(".", "/")) as f:
        return f.read().split("\n")[0]


# ---- links ------------------------------------------------------------------------------------------

def test_an_attached_link_is_a_namespace_with_eth0_and_a_route(eg):
    link = eg.attach("shape", Policy.from_value(True))
    try:
        assert link.address.startswith("100.64.") and link.gateway.startswith("100.64.")
        from pyroute2 import IPRoute
        with netns.entered(link.netns_fd):
            ipr = IPRoute()
            sysctls = {n: read_sysctl(n) for n in ("net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_rmem",
                                                   "net.ipv4.tcp_wmem", "net.ipv6.conf.eth0.disable_ipv6")}
        try:
            names = {l.get_attr("IFLA_IFNAME"): l for l in ipr.get_links()}
            assert set(names) == {"lo", "eth0"}
            assert names["eth0"].get_attr("IFLA_OPERSTATE") == "UP"
            addrs = [(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(family=socket.AF_INET)]
            assert (link.address, 30) in addrs
            # IPv6: ::1 on lo (as without network), and on eth0 its one address (no link-local: the
            # router knows a link by it), with the default route to the router's end
            v6 = sorted((a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(family=socket.AF_INET6))
            assert v6 == sorted([("::1", 128), (link.address6, 126)]), v6
            assert link.address6.startswith("fd5a:6e64:7472:")
            gws = [r.get_attr("RTA_GATEWAY") for r in ipr.get_routes(family=socket.AF_INET) if r["dst_len"] == 0]
            assert gws == [link.gateway]
            gws6 = [r.get_attr("RTA_GATEWAY") for r in ipr.get_routes(family=socket.AF_INET6)
                    if r["dst_len"] == 0 and r.get_attr("RTA_OIF") == names["eth0"]["index"]]
            assert gws6 == [str(ipaddress.ip_address(link.address6) - 1)]          # (::1 of its /126)
        finally:
            ipr.close()
        assert sysctls == {"net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.tcp_rmem": "4096\t65536\t262144",
                           "net.ipv4.tcp_wmem": "4096\t16384\t65536", "net.ipv6.conf.eth0.disable_ipv6": "0"}
        assert link.key in {l["key"] for l in eg.list()}
    finally:
        link.close()
        assert eg.release("shape") is not None
    assert "shape" not in {l["key"] for l in eg.list()}
    assert eg.release("shape") == {}                  # unknown: nothing to release


def test_bad_requests_get_typed_errors_and_change_nothing(eg):
    before = eg.list()
    with pytest.raises(InvalidInput):
        eg.attach("", Policy.from_value(True))
    with pytest.raises(NotFound):
        eg.usage("nope")
    with pytest.raises(NotFound):
        eg.set_policy("nope", None)
    with pytest.raises(NotFound):
        eg.expose("nope", 80)
    with pytest.raises(InvalidInput):
        eg._request({"op": "attach", "key": "k", "policy": {"allow_out": ["not a rule!"]}})
    with pytest.raises(InvalidInput):
        eg._request({"op": "attach", "key": "k", "policy": True, "secrets": {"1BAD": {"value": "xxxxx"}}})
    with pytest.raises(InvalidInput):
        eg._request({"op": "no-such-op"})
    with pytest.raises(InvalidInput):
        eg.adopt("k", -4)
    link = eg.attach("dup", None)
    try:
        with pytest.raises(Conflict):
            eg.attach("dup", None)
        with pytest.raises(InvalidInput):
            eg.expose("dup", 0)
    finally:
        link.close()
        eg.release("dup")
    assert eg.list() == before


def test_secrets_get_placeholders_and_a_ca(eg):
    secrets = parse_secrets({"API_KEY": {"value": "s3cr3t-value", "hosts": ["api.example.org"]}})
    link = eg.attach("sec", Policy.from_value(["api.example.org"]), secrets)
    try:
        ph = link.placeholders["API_KEY"]
        assert ph.startswith("sandtree-secret-API_KEY-") and "s3cr3t" not in ph
        assert link.ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
        assert "s3cr3t" not in str(eg.list())
    finally:
        link.close()
        eg.release("sec")


# ---- a sandbox on a link ---------------------------------------------------------------------------------

def test_a_sandbox_sees_its_link_and_cannot_change_it(eg, eng, img):
    link = eg.attach("run1", Policy.from_value(True))
    try:
        spec = spec_for(eng, img, "ip -4 -o addr show eth0; ip route; "
                                  "ip addr add 10.9.9.9/32 dev eth0; echo addr=$?; "
                                  "ip route del default; echo route=$?; ip link set eth0 down; echo link=$?; "
                                  "echo 1024 > /proc/sys/net/ipv4/ip_unprivileged_port_start; echo sysctl=$?; "
                                  "nc -l -p 80 -w 1 </dev/null & sleep 0.2; netstat -ltn | grep -c ':80 '",
                        netns_fd=link.netns_fd)
        with run(eng, "namespaces", spec) as out:
            text = out.stdout.decode()
            assert out.exit_code == 0, out.stderr
        assert f"inet {link.address}/30" in text and f"default via {link.gateway} dev eth0" in text
        assert "addr=2" in text and "route=2" in text and "link=2" in text and "sysctl=1" in text
        assert out.stderr.decode().count("Operation not permitted") == 3
        assert text.rstrip().endswith("1")          # an unprivileged bind of port 80 worked
    finally:
        link.close()
        eg.release("run1")


def test_a_gvisor_sandbox_on_a_link_uses_it_and_cannot_change_it(eg, eng, img):
    link = eg.attach("gv1", Policy.from_value(True))
    try:
        spec = spec_for(eng, img, "ip -4 -o addr show eth0; ip route; "
                                  "ip addr add 10.9.9.9/32 dev eth0; echo addr=$?; "
                                  "ip route del default; echo route=$?; "
                                  "nc -l -p 80 -w 1 </dev/null & sleep 0.5; netstat -ltn | grep -c ':80 '",
                        netns_fd=link.netns_fd)
        with run(eng, "gvisor", spec) as out:
            text = out.stdout.decode()
            assert out.exit_code == 0, out.stderr
        assert f"inet {link.address}/30" in text and f"default via {link.gateway} dev eth0" in text
        assert "addr=2" in text and "route=2" in text, (text, out.stderr)
        assert text.rstrip().endswith("1")          # port 80 bound by the sandbox (a socket in the link)
        # the listener was a socket of the link's namespace: nothing of it is left on the host
    finally:
        link.close()
        eg.release("gv1")


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_a_link_cannot_reach_another_link(eg, eng, img, tier):
    a = eg.attach(f"la-{tier}", Policy.from_value(True))
    b = eg.attach(f"lb-{tier}", Policy.from_value(True))
    with netns.entered(b.netns_fd):
        srv = socket.socket()
    try:
        srv.bind(("0.0.0.0", 8080))
        srv.listen(8)
        srv.settimeout(5)
        # the listener is there: the router reaches it (an exposed port) ...
        host_port = eg.expose(f"lb-{tier}", 8080)
        c = socket.create_connection(("127.0.0.1", host_port), timeout=5)
        srv.accept()[0].close()
        c.close()
        # ... but a sandbox on link a does not, by b's address nor by its gateway
        spec = spec_for(eng, img, f"nc -w 2 {b.address} 8080 </dev/null; echo first=$?; "
                                  f"nc -w 2 {b.gateway} 8080 </dev/null; echo second=$?",
                        netns_fd=a.netns_fd)
        srv.settimeout(0.1)
        with run(eng, tier, spec) as out:
            assert "first=" in out.stdout.decode() and "second=" in out.stdout.decode(), out.stderr
        with pytest.raises(socket.timeout):           # nothing reached b's listener
            srv.accept()
        # every TCP connection from a went to the router's proxy, which refused both (not public)
        refused = eg.usage(f"la-{tier}")["refused_hosts"]
        assert {(r["host"], r["port"]) for r in refused} >= {(b.address, 8080), (b.gateway, 8080)}
    finally:
        srv.close()
        a.close(), b.close()
        eg.release(f"la-{tier}"), eg.release(f"lb-{tier}")


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_resolv_conf_and_runtime_files_are_shown_read_only_and_never_committed(eg, eng, img, tier):
    link = eg.attach(f"rf-{tier}", Policy.from_value(True))
    try:
        files = {"/etc/resolv.conf": f"nameserver {link.gateway}\n".encode(),
                 "/dev/sandtree/ca.pem": b"-----BEGIN CERTIFICATE-----\nx\n"}
        spec = spec_for(eng, img, "cat /etc/resolv.conf; cat /dev/sandtree/ca.pem; "
                                  "echo nameserver 1.1.1.1 > /etc/resolv.conf; echo w=$?; "
                                  "rm -f /etc/resolv.conf; echo rm=$?; touch /dev/sandtree/new; echo t=$?; "
                                  "echo changed > /etc/greeting",
                        netns_fd=link.netns_fd, runtime_files=files)
        with run(eng, tier, spec) as out:
            text = out.stdout.decode()
            assert text.startswith(f"nameserver {link.gateway}\n-----BEGIN CERTIFICATE-----\nx\n"), \
                (text, out.stderr)
            for word in ("w=0", "rm=0", "t=0"):
                assert word not in text
            seen = {os.path.relpath(os.path.join(d, n), out.changes) for d, ds, fs in os.walk(out.changes)
                    for n in ds + fs}
            assert "etc/greeting" in seen              # the run's own change is in the upper ...
            assert not any(p.startswith(("dev", "etc/resolv.conf")) for p in seen)   # ... the runtime's are not
            base = eng.store.image(img)
            cr = eng.committer.commit(base, out.changes, max_file_size=out.disk_limit)
            write = eng.committer.image_writer(cr)    # (None: the other tier committed the same image)
            if write is not None:
                with eng.store.db.tx() as con:
                    write(con)
        assert cr.image != img and eng.read(cr.image, "/etc/greeting") == b"changed\n"
        assert eng.read(cr.image, "/etc/resolv.conf") == b"nameserver 192.0.2.53\n"     # the image's own
        assert eng.ls(cr.image, "/dev") == eng.ls(img, "/dev") == []
    finally:
        link.close()
        eg.release(f"rf-{tier}")


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_a_sandbox_reaches_the_test_internet_through_the_proxy_by_policy(tmp_path, eng, img, tier):
    from netlab import netlab
    with netlab() as lab:
        home = str(tmp_path)
        e = Egress(home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}", upstream_ca=lab.ca_file)
        try:
            link = e.attach("web", Policy.from_value(["allowed.test"]))
            try:
                spec = spec_for(eng, img, "nslookup allowed.test; echo ns=$?; nslookup other.test; echo ns2=$?; "
                                          "wget -q -O - http://allowed.test/hello; r=$?; echo; echo get=$r; "
                                          "wget -q -O - http://other.test/ 2>&1; echo get2=$?; "
                                          "wget -q -O - http://11.1.1.11/ 2>&1; echo get3=$?",
                                netns_fd=link.netns_fd, runtime_files=link.runtime_files())
                with run(eng, tier, spec) as out:
                    text = out.stdout.decode()
                assert "11.1.1.10" in text and "ns=0" in text and "ns2=0" not in text, text
                assert '"path": "/hello"' in text and "get=0" in text, text
                assert "get2=0" not in text and "get3=0" not in text, text
                usage = e.usage("web")
                assert usage["connections"] >= 1 and usage["allowed_hosts"] == ["allowed.test"]
                assert usage["refused"] >= 1 and usage["dns_refused"] >= 1
                # a policy change cuts and refuses from now on
                e.set_policy("web", None)
                with run(eng, tier, spec) as out:
                    assert "get=0" not in out.stdout.decode() and "ns=0" not in out.stdout.decode(), out.stdout
                assert lab.trap_hits() == {}
            finally:
                link.close()
                final = e.release("web")
                assert final["connections"] >= 1
        finally:
            e.stop_daemon()


def test_runtime_files_are_checked(eng, img):
    rt = eng.tier("namespaces")
    for bad in ({"/etc/passwd": b"x"}, {"/dev/sandtree/../x": b"x"}, {"/dev/sandtree/a/b": b"x"},
                {"/dev/sandtree/ok": "not bytes"}):
        with pytest.raises(InvalidInput):
            rt.validate_spec(spec_for(eng, img, "true", runtime_files=bad))


# ---- release, GC, adopt, idle exit -----------------------------------------------------------------------

def test_a_link_nobody_is_in_is_collected_after_the_grace(eg):
    link = eg.attach("gc", None)
    holder = subprocess.Popen(["nsenter", f"--net=/proc/self/fd/{link.netns_fd}", "sleep", "60"],
                              pass_fds=(link.netns_fd,))
    link.close()
    try:
        time.sleep(PAST_GRACE)                       # past the grace and two sweeps
        assert "gc" in {l["key"] for l in eg.list()}   # a process is in it: kept
    finally:
        holder.kill()
        holder.wait()
    end = time.monotonic() + PAST_GRACE + 5
    while "gc" in {l["key"] for l in eg.list()} and time.monotonic() < end:
        time.sleep(0.2)
    assert "gc" not in {l["key"] for l in eg.list()}
    with pytest.raises(NotFound):
        eg.usage("gc")


def test_a_held_link_outlives_the_grace_and_rejoin_gives_it_back(eg):
    """hold: a hibernated sandbox's link, with nobody in it, is kept past GC; rejoin hands out the
    same namespace, address, placeholders and CA (what the sandbox's env and ca.pem hold)."""
    secrets = parse_secrets({"TOKEN": {"value": "held-s3cret", "hosts": ["api.example.org"]}})
    link = eg.attach("held", Policy.from_value(["api.example.org"]), secrets)
    ino = os.fstat(link.netns_fd).st_ino
    link.close()
    try:
        eg.hold("held")
        time.sleep(PAST_GRACE)                       # past the grace and two sweeps
        listed = {l["key"]: l for l in eg.list()}
        assert listed["held"]["held"] is True
        again = eg.rejoin("held")
        try:
            assert os.fstat(again.netns_fd).st_ino == ino
            assert (again.address, again.gateway, again.placeholders, again.ca_pem) == \
                (link.address, link.gateway, link.placeholders, link.ca_pem)
            assert again.placeholders["TOKEN"].startswith("sandtree-secret-TOKEN-") and again.ca_pem
        finally:
            again.close()
        for bad in ("yes", 1, None):
            with pytest.raises(InvalidInput):
                eg.hold("held", bad)
        with pytest.raises(NotFound):
            eg.hold("no-such-link")
        with pytest.raises(NotFound):
            eg.rejoin("no-such-link")
        eg.hold("held", False)                       # GC judges it again, from now
        assert "held" in {l["key"] for l in eg.list()}
        end = time.monotonic() + PAST_GRACE + 5
        while "held" in {l["key"] for l in eg.list()} and time.monotonic() < end:
            time.sleep(0.2)
        assert "held" not in {l["key"] for l in eg.list()}
    finally:
        eg.release("held")


def test_attach_like_copies_policy_secrets_and_ca_onto_a_link_of_its_own(eg):
    """attach_like (a live fork's child): the same placeholders and CA (what the restored
    processes hold and trust) and policy, a namespace and address of its own, held until told;
    each link's policy and life are its own after that."""
    secrets = parse_secrets({"TOKEN": {"value": "forked-s3cret", "hosts": ["api.example.org"]}})
    src = eg.attach("like-src", Policy.from_value(["api.example.org"]), secrets)
    try:
        copy = eg.attach_like("like-copy", "like-src")
        try:
            assert (copy.placeholders, copy.ca_pem) == (src.placeholders, src.ca_pem) and copy.ca_pem
            assert copy.address != src.address and copy.gateway != src.gateway
            assert os.fstat(copy.netns_fd).st_ino != os.fstat(src.netns_fd).st_ino
        finally:
            copy.close()
        listed = {l["key"]: l for l in eg.list()}
        assert listed["like-copy"]["policy"] == listed["like-src"]["policy"] == {"allow_out": ["api.example.org"]}
        assert listed["like-copy"]["held"] is True and listed["like-src"]["held"] is False
        with pytest.raises(Conflict):
            eg.attach_like("like-copy", "like-src")          # the key is taken
        with pytest.raises(NotFound):
            eg.attach_like("like-none", "no-such-link")
        eg.set_policy("like-copy", Policy.from_value(["other.example.org"]))
        eg.release("like-copy")
        listed = {l["key"]: l for l in eg.list()}
        assert "like-copy" not in listed and listed["like-src"]["policy"] == {"allow_out": ["api.example.org"]}
    finally:
        src.close()
        eg.release("like-src")
        eg.release("like-copy")


def test_adopt_gives_a_running_sandbox_an_address_and_no_route(eg):
    proc = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        end = time.monotonic() + 5
        while os.readlink(f"/proc/{proc.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < end
            time.sleep(0.01)
        with pytest.raises(Conflict):
            eg.adopt("self", os.getpid())            # never the daemon's, the host's or the router's
        link = eg.adopt("adopted", proc.pid)
        assert link.netns_fd is None
        with pytest.raises(Conflict):
            eg.hold("adopted")                       # the sandbox's own namespace: ends with it
        with pytest.raises(Conflict):
            eg.rejoin("adopted")
        with pytest.raises(Conflict):
            eg.attach_like("adopted-copy", "adopted")   # (a copy of it is an adopt of the copy's own)
        fd = os.open(f"/proc/{proc.pid}/ns/net", os.O_RDONLY)
        try:
            from pyroute2 import IPRoute
            with netns.entered(fd):
                ipr = IPRoute()
                srv = socket.socket()
            srv.bind((link.address, 7000))
            srv.listen(4)
            srv.settimeout(5)
            try:
                addrs = [a.get_attr("IFA_ADDRESS") for a in ipr.get_addr(family=socket.AF_INET)]
                assert link.address in addrs
                assert not [r for r in ipr.get_routes(family=socket.AF_INET) if r["dst_len"] == 0]
            finally:
                ipr.close()
            host_port = eg.expose("adopted", 7000)
            assert eg.expose("adopted", 7000) == host_port          # the same listener
            with socket.create_connection(("127.0.0.1", host_port), timeout=5) as c:
                conn, _ = srv.accept()
                conn.sendall(b"hi")
                assert c.recv(2) == b"hi"
                conn.close()
            eg.unexpose("adopted", 7000)
            with pytest.raises(NotFound):
                eg.unexpose("adopted", 7000)
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", host_port), timeout=2)
            srv.close()
        finally:
            os.close(fd)
    finally:
        proc.kill()
        proc.wait()
    assert isinstance(eg.release("adopted"), dict)


def test_an_idle_daemon_exits_and_leaves_nothing(tmp_path):
    home = str(tmp_path)
    veths = host_veths()
    start_daemon(home, "--idle", "2")
    e = Egress(home)
    pid = daemon_pid(e)
    ns = os.stat(f"/proc/{pid}/ns/net").st_ino
    link = e.attach("one", None)
    link_ns = os.fstat(link.netns_fd).st_ino
    link_cookie = _netns_cookie(link.netns_fd)
    link.close()
    e.release("one")
    end = time.monotonic() + 15
    while not gone(pid) and time.monotonic() < end:
        time.sleep(0.1)
    try:
        assert gone(pid)
        assert not os.path.exists(socket_path(home))
        assert host_veths() == veths
        in_use = {os.stat(f"/proc/{p}/ns/net").st_ino for p in os.listdir("/proc") if p.isdigit()
                  and os.path.exists(f"/proc/{p}/ns/net")}
        assert ns in in_use                              # (ns: the host's, where the daemon sat)
        # no process in the link's namespace: a namespace of the same inode number is another one
        # (the kernel reuses the numbers of freed namespaces; other tests make many): its cookie says
        for p in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.stat(f"/proc/{p}/ns/net").st_ino != link_ns:
                    continue
                fd = os.open(f"/proc/{p}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue                                 # (ended meanwhile)
            try:
                assert _netns_cookie(fd) != link_cookie, f"process {p} is still in the released link's namespace"
            finally:
                os.close(fd)
    finally:
        e.stop_daemon()


def _netns_cookie(ns_fd: int) -> int:
    """The network namespace's cookie (SO_NETNS_COOKIE: unique for the boot, never reused as inode
    numbers are), read by a socket made in it from a thread that joins it (setns is per thread)."""
    import ctypes
    import struct
    import threading
    out: list = []

    def inside():
        if ctypes.CDLL(None, use_errno=True).setns(ns_fd, 0x40000000) != 0:      # CLONE_NEWNET
            out.append(OSError(ctypes.get_errno(), "setns"))
            return
        with socket.socket() as s:
            out.append(struct.unpack("Q", s.getsockopt(socket.SOL_SOCKET, 71, 8))[0])   # SO_NETNS_COOKIE
    t = threading.Thread(target=inside)
    t.start()
    t.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_the_client_starts_the_daemon_once_per_store(tmp_path):
    home = str(tmp_path)
    a, b = Egress(home), Egress(home)
    try:
        assert a.available() == (True, "")
        pa = a.ping()["pid"]                          # started on demand
        assert b.ping()["pid"] == pa                  # the same one
        start_daemon(home)                            # a second start finds the lock taken: no-op
        assert b.ping()["pid"] == pa
    finally:
        a.stop_daemon()
    assert gone(pa)


def _daemon_netns_fds(eg) -> int:
    pid = daemon_pid(eg)
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("net:")
        except OSError:
            pass
    return n


def test_a_release_answers_at_once_and_the_link_goes_after(eg):
    """A release answers before the kernel has removed the veth (20-30 ms each); every released
    link still goes: after a burst, the daemon holds no more namespaces than before it."""
    from sandtree.network.links import POOL
    before = _daemon_netns_fds(eg)
    for i in range(40):
        link = eg.attach(f"burst{i}", None)
        link.close()
        eg.release(f"burst{i}")
    assert not {l["key"] for l in eg.list()} & {f"burst{i}" for i in range(40)}
    end = time.monotonic() + 20
    while _daemon_netns_fds(eg) > max(before, POOL + 3) and time.monotonic() < end:
        time.sleep(0.2)
    assert _daemon_netns_fds(eg) <= max(before, POOL + 3)


def test_a_live_sandbox_on_a_link_with_runtime_files(eg, eng, img):
    link = eg.attach("live1", Policy.from_value(True))
    live = eng.tier("namespaces").live()
    spec = spec_for(eng, img, "unused", netns_fd=link.netns_fd,
                    runtime_files={"/etc/resolv.conf": f"nameserver {link.gateway}\n".encode()})
    spec.argv = ["sandtree-init"]
    h = live.start(spec, 60, detach=False)
    try:
        link.close()                                  # the sandbox holds the namespace now
        with live.exec(h, spec_for(eng, img, "ip -4 -o addr show eth0; cat /etc/resolv.conf; "
                                             "echo x > /etc/resolv.conf; echo w=$?")) as out:
            text = out.stdout.decode()
        assert f"inet {link.address}/30" in text and f"nameserver {link.gateway}" in text and "w=1" in text
        time.sleep(GRACE + 1)                         # past the grace: a process is in it, so kept
        assert "live1" in {l["key"] for l in eg.list()}
    finally:
        live.stop(h)
    end = time.monotonic() + PAST_GRACE + 5    # then collected: nobody is in it any more
    while "live1" in {l["key"] for l in eg.list()} and time.monotonic() < end:
        time.sleep(0.2)
    assert "live1" not in {l["key"] for l in eg.list()}


def test_the_engine_exposes_a_live_sandboxs_port_through_the_real_daemon(tmp_path, rootfs):
    import httpx
    import sandtree
    st = sandtree.Sandtree(str(tmp_path / "home"))
    try:
        sb = st.import_image(rootfs, tag="busybox").start()
        try:
            sb.write("/www/index.html", "hello through a link\n")
            sb.exec("httpd -p 8000 -h /www")
            entry = sb.expose(8000)                   # adopt: a veth into the sandbox's own namespace
            r = httpx.get(entry["url"] + "/index.html", timeout=10, trust_env=False)
            assert r.text == "hello through a link\n"
            # nothing goes out of an adopted link: no default route
            out = sb.exec("ip route; nc -w 1 100.64.0.1 80 </dev/null; echo nc=$?")
            assert b"default" not in out.stdout and b"nc=1" in out.stdout
            sb.unexpose(8000)
            with pytest.raises(httpx.ConnectError):
                httpx.get(entry["url"] + "/index.html", timeout=5, trust_env=False)
        finally:
            sb.stop()
    finally:
        st.close()
        Egress(str(tmp_path / "home")).stop_daemon()


def test_a_killed_daemon_leaves_nothing_and_the_next_request_starts_one(tmp_path, eng, img):
    home = str(tmp_path)
    veths = host_veths()
    e = Egress(home)
    pid = daemon_pid(e)
    link = e.attach("k", Policy.from_value(["api.example.org"]),
                    parse_secrets({"TOKEN": {"value": "abcdefgh", "hosts": ["api.example.org"]}}))
    try:
        files = link.runtime_files(b"IMAGE BUNDLE\n")
        assert files["/etc/resolv.conf"] == f"nameserver {link.gateway}\n".encode()
        assert files["/dev/sandtree/ca.pem"].startswith(b"IMAGE BUNDLE\n-----BEGIN CERTIFICATE-----")
        assert link.env()["TOKEN"] == link.placeholders["TOKEN"]
        assert link.env()["SSL_CERT_FILE"] == "/dev/sandtree/ca.pem"
        os.kill(pid, 9)
        end = time.monotonic() + PAST_GRACE + 5
        while not gone(pid) and time.monotonic() < end:
            time.sleep(0.05)
        # the router namespace died with it, and both ends of every veth with it
        from pyroute2 import IPRoute
        with netns.entered(link.netns_fd):
            ipr = IPRoute()
        try:                                          # (namespaces are torn down asynchronously)
            end = time.monotonic() + PAST_GRACE + 5
            while {l.get_attr("IFLA_IFNAME") for l in ipr.get_links()} != {"lo"} and time.monotonic() < end:
                time.sleep(0.05)
            assert {l.get_attr("IFLA_IFNAME") for l in ipr.get_links()} == {"lo"}
        finally:
            ipr.close()
        assert host_veths() == veths
        assert e.release("k") == {}                   # no daemon: nothing to release
        assert e.ping()["pid"] != pid                 # a request that needs one starts one
    finally:
        link.close()
        e.stop_daemon()


def test_the_daemon_sits_in_the_upstream_namespace_and_exposes_on_the_hosts_loopback(tmp_path):
    up = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    home = str(tmp_path)
    try:
        end = time.monotonic() + 5
        while os.readlink(f"/proc/{up.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            assert time.monotonic() < end
            time.sleep(0.01)
        e = Egress(home, upstream_netns=f"/proc/{up.pid}/ns/net", upstream_dns="192.0.2.1:5353")
        try:
            pid = daemon_pid(e)
            assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/proc/{up.pid}/ns/net").st_ino
            link = e.attach("u", None)
            with netns.entered(link.netns_fd):
                srv = socket.socket()
            try:
                srv.bind((link.address, 9000))
                srv.listen(1)
                srv.settimeout(5)
                with socket.create_connection(("127.0.0.1", e.expose("u", 9000)), timeout=5):
                    srv.accept()[0].close()
            finally:
                srv.close()
                link.close()
        finally:
            e.stop_daemon()
    finally:
        up.kill()
        up.wait()
    with pytest.raises(Exception):
        Egress(home, upstream_netns="/nonexistent/ns").ping()
    assert Egress(home, upstream_netns="/nonexistent/ns").available()[0] is False


def test_a_networked_run_starts_cold_beside_a_warm_pool(eg, tmp_path, rootfs):
    e = Engine(str(tmp_path / "warm"), warm=1)
    link = eg.attach("warm", None)
    try:
        image = e.import_path(rootfs)
        rt = e.tier("namespaces")
        with rt.run(spec_for(e, image, "true")) as out:        # the pool starts after a first run
            assert out.exit_code == 0
        end = time.monotonic() + PAST_GRACE + 5
        while (rt._pool is None or not rt._pool.ready) and time.monotonic() < end:
            time.sleep(0.05)
        assert rt._pool.ready                                  # a warm helper waits ...
        with rt.run(spec_for(e, image, "ip -4 -o addr show eth0", netns_fd=link.netns_fd)) as out:
            assert f"inet {link.address}/30" in out.stdout.decode(), out.stderr
        assert rt._pool.ready                                  # ... and was not taken
        with rt.run(spec_for(e, image, "ip -o link")) as out:   # and a run without one has no eth0
            assert b"eth0" not in out.stdout and b"lo" in out.stdout
    finally:
        link.close()
        eg.release("warm")
        e.close()


def test_concurrent_attaches_of_one_key_give_one_link(eg):
    import concurrent.futures
    clients = [Egress(eg.home) for _ in range(6)]
    def attach(c):
        try:
            return c.attach("race", None)
        except Conflict:
            return None
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        links = [l for l in pool.map(attach, clients) if l is not None]
    try:
        assert len(links) == 1
        assert [l["key"] for l in eg.list()].count("race") == 1
    finally:
        for l in links:
            l.close()
        eg.release("race")
        for c in clients:
            c.close()


def test_a_killed_owner_leaves_no_link(eg):
    script = ("import sys, time; sys.path.insert(0, %r)\n"
              "from sandtree.network.client import Egress\n"
              "l = Egress(%r).attach('owned', None); print(l.address, flush=True); time.sleep(60)\n") % (SRC, eg.home)
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().startswith("100.64.")
        assert [l["owner"] for l in eg.list() if l["key"] == "owned"] == [owner.pid]
    finally:
        owner.kill()
        owner.wait()
    end = time.monotonic() + PAST_GRACE + 5     # nobody was ever in it: gone after the grace
    while "owned" in {l["key"] for l in eg.list()} and time.monotonic() < end:
        time.sleep(0.2)
    assert "owned" not in {l["key"] for l in eg.list()}


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
@pytest.mark.parametrize("kind", ["none", "link"])
def test_an_image_without_a_regular_resolv_conf_gets_the_nameserver_and_no_upper_file(eg, eng, tmp_path, tier, kind):
    """No file: the helper's lowest layer holds the mount point; a link: covered itself, never
    followed (this one crosses into /dev; test_egress_resolv.py has the rest). Neither reaches the upper."""
    root = make_rootfs(str(tmp_path / "root"))
    if kind == "link":
        os.symlink("/dev/sandtree/resolv.conf", os.path.join(root, "etc", "resolv.conf"))
    image = eng.import_path(root)
    link = eg.attach(f"nb-{tier}-{kind}", None)
    try:
        spec = spec_for(eng, image, "cat /etc/resolv.conf; echo r=$?; cat /dev/sandtree/resolv.conf",
                        netns_fd=link.netns_fd, runtime_files=link.runtime_files())
        with run(eng, tier, spec) as out:
            text = out.stdout.decode()
            seen = [os.path.relpath(os.path.join(d, n), out.changes) for d, ds, fs in os.walk(out.changes)
                    for n in ds + fs]
        assert text == f"nameserver {link.gateway}\nr=0\nnameserver {link.gateway}\n", (text, out.stderr)
        assert not [p for p in seen if p.startswith(("etc", "dev"))], seen
    finally:
        link.close()
        eg.release(f"nb-{tier}-{kind}")
