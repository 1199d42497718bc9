"""Hibernating live sandboxes that have a network policy and secrets (issue 14, left open by its
first round): the link (a namespace the egress daemon made) is kept by the daemon while the
sandbox sleeps, its dump leaves the link out, and the restore puts the processes back into it.

Real things only: real CRIU, the store's real egress daemon (started here with a short GC grace,
so a test can watch GC leave a hibernated sandbox's link alone), whose upstream is a netlab
internet this test made (tests/netlab.py); every packet stays in namespaces made here or on
loopback. The daemon is stopped at teardown."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import httpx
import pytest

import sandtree
from conftest import make_rootfs, tier_or_skip
from served import get as preview_get, serving
from netlab import NetLab
from sandtree.errors import Conflict, RuntimeUnavailable
from sandtree.network.client import Egress

SECRET = "hib3rnated-s3cret-value-7d41e0"
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
GRACE = 2        # the daemon's GC grace here (seconds): a hibernated sandbox's link must outlive it

# A server that holds state only in memory: MEMVAL is made at its start and lives in nc's
# environment (its memory); each connection is answered by a child that prints it.
ANSWER = b"#!/bin/sh\necho \"mem=$MEMVAL\"\n"
SERVE = ("export MEMVAL=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \\n'); "
         "(nc -ll -p 7000 -e /bin/answer >/dev/null 2>&1 &); httpd -p 8000 -h /www")


def get(name: str, ip: str) -> str:
    """busybox: resolve (the daemon's resolver) and send a request naming `name` to `ip`:80."""
    return (f"nslookup {name} >/dev/null 2>&1; printf 'GET /hello HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n' "
            f"| nc -w 5 {ip} 80; echo --; ")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the egress daemon and the netlab need root")
    lab = NetLab()
    home = str(tmp_path_factory.mktemp("nethib") / "home")
    env = {"SANDTREE_EGRESS_NETNS": lab.path, "SANDTREE_EGRESS_DNS": f"{lab.dns[0]}:{lab.dns[1]}",
           "SANDTREE_EGRESS_CA": lab.ca_file}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    st = None
    try:
        st = sandtree.Sandtree(home, warm=0)
        ok, why = st.engine.sandboxes.live.hibernate_available()
        if not ok:
            pytest.skip(f"hibernate unavailable here: {why}")
        # the store's daemon, started as Egress starts it but with a GC grace of GRACE seconds
        subprocess.run([sys.executable, "-m", "sandtree.network.daemon", "--home", home,
                        "--upstream-netns", lab.path, "--upstream-dns", env["SANDTREE_EGRESS_DNS"],
                        "--upstream-ca", lab.ca_file, "--grace", str(GRACE)],
                       env={**os.environ, "PYTHONPATH": SRC}, check=True, timeout=60)
        root = make_rootfs(str(tmp_path_factory.mktemp("nethib-root") / "root"))
        from test_secret_store import add_tls_client
        add_tls_client(root, lab.ca_file)              # a secret's value goes only over HTTPS
        with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
            f.write("nameserver 192.0.2.53\n")
        os.makedirs(os.path.join(root, "www"))
        with open(os.path.join(root, "www", "index.html"), "w") as f:
            f.write("hello from the sandbox\n")
        with open(os.path.join(root, "bin", "answer"), "wb") as f:
            f.write(ANSWER)
        os.chmod(os.path.join(root, "bin", "answer"), 0o755)
        img = st.import_image(root)
        yield st, img, lab, home
    finally:
        if st is not None:
            for sb in st.sandboxes():
                with contextlib.suppress(Exception):
                    sb.stop()
            Egress(home).stop_daemon()
            st.close()
        lab.close()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v




def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=10, trust_env=False)


def _netns(st, sid: str) -> int:
    """The inode of the network namespace the sandbox's pid 1 is in (from the host)."""
    h = st.engine.sandboxes._row(sid)["handle"]
    return os.stat(f"/proc/{h.init_pid}/ns/net").st_ino


def _link(st, sid: str) -> dict:
    return next(l for l in st.engine.egress.list() if l["key"] == sid)


def _reach(sb) -> tuple[str, str]:
    out = sb.exec(get("allowed.test", "11.1.1.10") + get("other.test", "11.1.1.11")).stdout.decode()
    allowed, other = out.split("--", 1)
    return allowed, other


def test_a_sandbox_with_an_allow_list_hibernates_and_resumes_in_its_link(world):
    """Memory state, a listening server, the policy (enforced by the link the processes are back
    in, not the host's namespace) and the link itself (same namespace, address) survive; GC of the
    daemon leaves the link of the sleeping sandbox alone."""
    st, img, lab, home = world
    sb = img.start(network={"allow_out": ["allowed.test"]}, idle_timeout=300)
    try:
        assert sb.exec(SERVE).ok
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        mem = sb.exec("nc 127.0.0.1 7000 </dev/null").stdout
        assert mem.startswith(b"mem=") and len(mem) > 10, mem
        addr = sb.exec("ip -4 -o addr show eth0").stdout
        assert b"100.64." in addr
        ns = _netns(st, sb.id)
        assert ns != os.stat("/proc/self/ns/net").st_ino
        # connections open at the hibernation (one on the sandbox's loopback, one out through the
        # proxy) do not stop it: they are cut (criu.py TCP_LINK)
        assert sb.exec("(sleep 100000 | nc 127.0.0.1 8000 >/dev/null 2>&1 &); "
                       "(sleep 100000 | nc 11.1.1.10 80 >/dev/null 2>&1 &); sleep 0.3").ok
        assert sb.exec("netstat -tn | grep -c ESTABLISHED").stdout.strip() not in (b"", b"0")

        t0 = time.monotonic()
        info = sb.hibernate()
        hib_s = time.monotonic() - t0
        assert info["state"] == "hibernated" and info["network"] == {"allow_out": ["allowed.test"]}
        assert _link(st, sb.id)["held"] is True
        time.sleep(GRACE + 2 * 2 + 0.5)            # past the grace, and two GC sweeps (2 s each)
        assert _link(st, sb.id)["held"] is True, "GC dropped the link of a hibernated sandbox"

        t0 = time.monotonic()
        assert sb.resume()["state"] == "running"
        resume_s = time.monotonic() - t0
        print(f"\nhibernate {hib_s * 1000:.0f} ms, resume {resume_s * 1000:.0f} ms (with a link)")
        assert _netns(st, sb.id) == ns              # back in its link, not a new or the host's namespace
        assert _link(st, sb.id)["held"] is False
        assert sb.exec("ip -4 -o addr show eth0").stdout == addr
        assert sb.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem      # same memory, still listening
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
        assert sb.exec("cat /etc/resolv.conf").stdout.startswith(b"nameserver 100.64.")
        assert b"ESTABLISHED" not in sb.exec("netstat -tn").stdout           # (they were cut)
        # root in the resumed sandbox holds no capability over its link, as after a start
        r = sb.exec("ip route del default; echo rc=$?; ip link set eth0 down; echo rc=$?; ip route")
        assert r.stdout.count(b"rc=0") == 0 and b"default via 100.64." in r.stdout, r.stdout + r.stderr
        # the daemon's counters went on over the hibernation (the same link)
        usage = st.engine.egress.usage(sb.id)
        assert usage["connections"] >= 2 and usage["refused"] >= 2, usage
        # and it hibernates again
        assert sb.hibernate()["state"] == "hibernated"
        assert sb.resume()["state"] == "running"
        assert sb.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem
    finally:
        sb.stop()
    assert sb.id not in {l["key"] for l in st.engine.egress.list()}      # released at stop


def test_exposed_ports_work_after_resume_and_a_request_resumes(world):
    """A dev server's exposed port answers after a resume (the daemon's listener stayed, the same
    host port), and a request through the server to the port of the hibernated sandbox resumes it."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=300)
    try:
        assert sb.exec(SERVE).ok
        entry = sb.expose(8000)
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"
        assert sb.hibernate()["state"] == "hibernated"
        assert [p["url"] for p in sb.ports()] == [None]
        assert sb.resume()["state"] == "running"
        assert sb.ports() == [entry]                                       # the same host port
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"

        assert sb.hibernate()["state"] == "hibernated"
        with serving(st.engine) as srv:
            r = preview_get(srv.preview(sb.id, 8000) + "/index.html")
            assert r.status_code == 200 and r.text == "hello from the sandbox\n", r.text
        assert sb.info()["state"] == "running"
        assert _get(entry["url"] + "/index.html").text == "hello from the sandbox\n"
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
    finally:
        sb.stop()


def test_secrets_survive_a_hibernation_and_never_reach_the_checkpoint(world):
    """The same placeholder and CA after the resume, the test server still gets the real value,
    and no file of the checkpoint holds it."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test", "other.test"], idle_timeout=300,
                   secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    req = "tlsget 11.1.1.10 443 allowed.test /s"          # through the link's CA, kept over the sleep

    def sent() -> str:
        n = len(lab.requests)
        assert sb.exec(req).ok
        return next(r["headers"].get("authorization") for r in lab.requests[n:]
                    if r["headers"].get("host") == "allowed.test")
    try:
        # a process that keeps the placeholder only in memory
        assert sb.exec("(sleep 100000 &)").ok
        placeholder = sb.exec("echo $TOKEN").stdout
        assert placeholder.startswith(b"sandtree-secret-TOKEN-")
        ca = sb.exec("cat /dev/sandtree/ca.pem").stdout
        assert b"BEGIN CERTIFICATE" in ca
        assert sent() == f"Bearer {SECRET}"

        assert sb.hibernate()["state"] == "hibernated"
        ckpt = os.path.join(home, "sandboxes", f"{sb.id}.ckpt")
        files = [os.path.join(d, n) for d, _, names in os.walk(ckpt) for n in names]
        assert any(n.startswith(os.path.join(ckpt, "pages-")) for n in files), files
        seen_placeholder = False
        for path in files:
            with open(path, "rb") as f:
                data = f.read()
            assert SECRET.encode() not in data, path
            seen_placeholder |= placeholder.strip() in data
        assert seen_placeholder, "the checkpoint should hold the placeholder (the sandbox's env)"

        assert sb.resume()["state"] == "running"
        assert sb.exec("echo $TOKEN").stdout == placeholder
        assert sb.exec("cat /dev/sandtree/ca.pem").stdout == ca
        assert sent() == f"Bearer {SECRET}"
        env = sb.exec("cat /proc/[0-9]*/environ").stdout
        assert placeholder.strip() in env and SECRET.encode() not in env
    finally:
        sb.stop()


def test_idle_action_hibernate_with_a_policy(world):
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=1, idle_action="hibernate")
    try:
        assert sb.exec("export KEPT=yes").ok
        time.sleep(2.5)
        assert {s.id: s.state for s in st.sandboxes()}[sb.id] == "hibernated"    # (the list reaps)
        with pytest.raises(Conflict, match="resume"):
            sb.exec("true")
        assert sb.resume()["state"] == "running"
        r = sb.exec("echo $KEPT; " + get("allowed.test", "11.1.1.10"))
        assert r.stdout.startswith(b"yes\n") and b"200 OK" in r.stdout, r.stdout
    finally:
        sb.stop()


HIBERNATOR = """
import sys, sandtree
sandtree.Sandtree(sys.argv[1], warm=0).sandbox(sys.argv[2]).hibernate()
"""


def _cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def test_kill_9_mid_dump_and_a_resume_by_another_engine_process(world):
    """The engine hibernating is killed -9 while CRIU writes: the sandbox is found hibernated (its
    link kept), and the CLI, another engine process, resumes it into its link."""
    st, img, lab, home = world
    sb = img.start(network=["allowed.test"], idle_timeout=300)
    try:
        assert sb.exec(SERVE).ok
        mem = sb.exec("nc 127.0.0.1 7000 </dev/null").stdout
        ns = _netns(st, sb.id)
        hibernator = subprocess.Popen([sys.executable, "-c", HIBERNATOR, home, sb.id],
                                      env={**os.environ, "PYTHONPATH": SRC})
        ckpt = os.path.join(home, "sandboxes", f"{sb.id}.ckpt")
        criu_pid = None
        for _ in range(5000):
            criu_pid = next((p for p in os.listdir("/proc") if p.isdigit() and "criu" in _cmdline(p)
                             and _cmdline(p).count(ckpt)), None)
            if criu_pid or hibernator.poll() is not None:
                break
            time.sleep(0.002)
        hibernator.kill()
        hibernator.wait()
        assert criu_pid, "the hibernator never ran criu"
        while os.path.exists(f"/proc/{criu_pid}"):
            time.sleep(0.01)
        time.sleep(GRACE + 2 * 2 + 0.5)             # GC sweeps meanwhile: the link is held
        with pytest.raises(Conflict, match="hibernated"):
            sb.exec("true")
        assert _link(st, sb.id)["held"] is True
        p = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, "resume", sb.id],
                           env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        assert sb.info()["state"] == "running"
        assert _netns(st, sb.id) == ns
        assert sb.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
    finally:
        sb.stop()


def test_a_daemon_restart_while_hibernated(world):
    """The daemon lost the link (stopped while the sandbox slept): a policy-only sandbox resumes on
    a new link with its recorded policy; one with secrets stays hibernated, saying why."""
    st, img, lab, home = world
    plain = img.start(network=["allowed.test"], idle_timeout=300)
    secret = img.start(network=["allowed.test"], idle_timeout=300,
                       secrets={"TOKEN": {"value": SECRET, "hosts": ["allowed.test"]}})
    try:
        assert plain.exec(SERVE).ok
        mem = plain.exec("nc 127.0.0.1 7000 </dev/null").stdout
        assert plain.hibernate()["state"] == "hibernated" and secret.hibernate()["state"] == "hibernated"
        st.engine.egress.stop_daemon()
        with pytest.raises(Conflict, match="secrets"):
            secret.resume()
        assert secret.info()["state"] == "hibernated"
        assert plain.resume()["state"] == "running"
        assert plain.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem
        allowed, other = _reach(plain)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
    finally:
        plain.stop()
        secret.stop()


@pytest.mark.parametrize("kind", ["none", "link"])
def test_an_image_without_a_regular_resolv_conf_hibernates_and_resumes(world, tmp_path, kind):
    """Its root had the helper's mount-point layer for resolv.conf (an empty file under the bind,
    or the link covered): the restore makes the same root again, or CRIU cannot bind onto it."""
    st, _, lab, home = world
    root = make_rootfs(str(tmp_path / "root"))
    if kind == "link":
        os.symlink("../run/systemd/resolve/stub-resolv.conf", os.path.join(root, "etc", "resolv.conf"))
    img = st.import_image(root)
    sb = img.start(network=["allowed.test"])
    try:
        assert sb.exec("cat /etc/resolv.conf").stdout.startswith(b"nameserver 100.64.")
        if kind == "link":                  # CRIU would follow the covered link: refused, still running
            with pytest.raises(Conflict, match="resolv.conf is a link"):
                sb.hibernate()
            assert sb.exec("true").ok and sb.state == "running"
            return
        sb.hibernate()
        assert sb.resume()["state"] == "running"
        r = sb.exec("cat /etc/resolv.conf; " + get("allowed.test", "11.1.1.10"))
        assert r.stdout.startswith(b"nameserver 100.64.") and b"200 OK" in r.stdout, r.stdout + r.stderr
    finally:
        sb.stop()


def test_a_gvisor_sandbox_with_a_policy_refuses_to_hibernate_and_runs_on(world, request):
    """gVisor checkpoints no sandbox on host networking (how it joins a link): the hibernate is
    refused with the reason, and the sandbox, its processes and its policy go on as before."""
    st, img, lab, home = world
    tier_or_skip(request, st, "gvisor")
    sb = img.start(network={"allow_out": ["allowed.test"]}, idle_timeout=300, tier="gvisor")
    try:
        assert sb.exec(SERVE).ok
        mem = sb.exec("nc 127.0.0.1 7000 </dev/null").stdout
        head = sb.info()["head"]
        with pytest.raises(RuntimeUnavailable, match="host networking"):
            sb.hibernate()
        assert sb.info()["state"] == "running" and sb.info()["head"] == head     # nothing committed
        with pytest.raises(RuntimeUnavailable, match="host networking"):       # and not at a start
            img.start(network=["allowed.test"], idle_action="hibernate", tier="gvisor")
        assert sb.exec("nc 127.0.0.1 7000 </dev/null").stdout == mem
        allowed, other = _reach(sb)
        assert "200 OK" in allowed and "200 OK" not in other, (allowed, other)
    finally:
        sb.stop()
