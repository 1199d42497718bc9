"""Network given later: a live sandbox started without network receives a policy (set_network), its
connections then go through the egress path exactly as a networked start's (the proxy decides by
the policy, the resolver answers only what it allows), and loses it again (set_network off: no
egress at all, a connection fails). The record says which (`network` in its info), a commit and a
hibernation keep working, and gVisor (whose network is fixed at its start) refuses with a typed
error that changes nothing.

Real things only: the engine on a temporary store, the real egress daemon (root, nft) whose
upstream is a netlab internet this test made (tests/netlab.py); no packet leaves namespaces made
here. The daemon is stopped at teardown, and every link it made goes with it."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import make_rootfs
from netlab import SIX, NetLab
from sandtree.engine import Engine
from sandtree.errors import RuntimeUnavailable
from sandtree.network.client import Egress

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("nft"), reason="needs root and nft")


@pytest.fixture(scope="module")
def lab():
    lab = NetLab()
    yield lab
    lab.close()


@pytest.fixture(scope="module")
def eng(tmp_path_factory, lab):
    home = str(tmp_path_factory.mktemp("netlater"))
    e = Engine(os.path.join(home, "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    yield e
    e._egress.stop_daemon()
    e.close()


@pytest.fixture(scope="module")
def img(eng, tmp_path_factory):
    root = make_rootfs(str(tmp_path_factory.mktemp("netlater-root") / "root"))
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")       # any address but loopback: the router sends DNS to the resolver
    return eng.import_path(root)


def get(name: str, ip: str) -> str:
    """A request to `ip` naming `name` (busybox nc; its wget segfaults here), then a separator."""
    return (f"nslookup {name} >/dev/null 2>&1; printf 'GET /hello HTTP/1.0\\r\\nHost: {name}\\r\\n\\r\\n' "
            f"| nc -w 5 {ip} 80; echo --; ")


def fetch(eng, sid, *pairs) -> list[str]:
    out = eng.sandbox_exec(sid, "".join(get(n, ip) for n, ip in pairs)).stdout.decode()
    return out.split("--")[:len(pairs)]


def routes(eng, sid) -> str:
    """The sandbox's IPv4 routes and interfaces as it sees them."""
    return eng.sandbox_exec(sid, "cat /proc/net/route; ls /sys/class/net").stdout.decode()


def test_a_sandbox_started_offline_is_given_a_policy_and_loses_it(eng, img, lab):
    sid = eng.sandbox_start(img)["id"]
    try:
        assert eng.sandbox_info(sid)["network"] is None
        assert "200 OK" not in fetch(eng, sid, ("allowed.test", lab.allowed))[0]
        before = lab.hits[(lab.allowed, 80)]

        on = eng.sandbox_set_network(sid, ["allowed.test"])
        assert on["network"] == {"allow_out": ["allowed.test"]}
        ok, other = fetch(eng, sid, ("allowed.test", lab.allowed), ("other.test", lab.other))
        assert "200 OK" in ok and "200 OK" not in other, (ok, other)
        assert lab.hits[(lab.allowed, 80)] == before + 1 and lab.hits[(lab.other, 80)] == 0
        # the same refusals as a networked start's: a name outside the policy gets no answer, a
        # bare address no rule names is refused by the proxy, and the usage says so
        names = eng.sandbox_exec(sid, "nslookup other.test 2>&1; echo; nslookup allowed.test 2>&1").stdout.decode()
        assert lab.other not in names and lab.allowed in names, names
        usage = eng.egress.usage(sid)
        assert usage["connections"] >= 1 and usage["refused"] >= 1 and usage["dns_refused"] >= 1, usage
        assert any(r["host"] == "other.test" for r in usage["refused_hosts"]), usage
        assert lab.trap_hits() == {}

        # a connection held open across the removal is cut; nothing goes out afterwards
        eng.sandbox_exec(sid, "mkfifo /tmp/f; (sleep 30 > /tmp/f &); "
                              f"(nc {lab.allowed} 7 < /tmp/f > /tmp/held; echo done > /tmp/cut) > /dev/null 2>&1 &")
        off = eng.sandbox_set_network(sid, "off")
        assert off["network"] is None
        r = eng.sandbox_exec(sid, "for i in $(seq 50); do [ -e /tmp/cut ] && break; sleep 0.1; done; cat /tmp/cut")
        assert r.stdout.decode().startswith("done"), r
        seen = lab.hits[(lab.allowed, 80)]
        r = eng.sandbox_exec(sid, f"nc -w 3 {lab.allowed} 80 </dev/null; echo rc=$?")
        assert "rc=0" not in r.stdout.decode() and lab.hits[(lab.allowed, 80)] == seen, r
        shown = routes(eng, sid)
        assert "eth0" not in shown, shown           # its namespace has only lo again
        assert sid not in {x["key"] for x in eng.egress.list()}

        # given again (another policy), it works again; a commit keeps working meanwhile
        eng.sandbox_set_network(sid, ["other.test"])
        ok, other = fetch(eng, sid, ("other.test", lab.other), ("allowed.test", lab.allowed))
        assert "200 OK" in ok and "200 OK" not in other, (ok, other)
        eng.sandbox_exec(sid, "echo kept > /root/mark")
        image = eng.sandbox_commit(sid)
        assert eng.read(image, "/root/mark") == b"kept\n"
        assert "200 OK" in fetch(eng, sid, ("other.test", lab.other))[0]
        assert eng.sandbox_set_network(sid, None)["network"] is None
        assert eng.sandbox_set_network(sid, "off")["network"] is None          # (off again: nothing to do)
    finally:
        eng.sandbox_stop(sid)
    assert sid not in {x["key"] for x in eng.egress.list()}


def test_a_policy_given_later_carries_ipv6_too(eng, img, lab):
    sid = eng.sandbox_start(img)["id"]
    try:
        assert "200 OK" not in fetch(eng, sid, ("six.test", SIX))[0]
        eng.sandbox_set_network(sid, ["six.test"])
        out = eng.sandbox_exec(sid, "nslookup -type=AAAA six.test 2>&1; echo --; " + get("six.test", SIX)
                               + get("other.test", SIX)).stdout.decode()
        names, ok, other = out.split("--")[:3]
        assert SIX in names and "200 OK" in ok and "200 OK" not in other, out
        eng.sandbox_set_network(sid, "off")
        assert "200 OK" not in fetch(eng, sid, ("six.test", SIX))[0]
        assert "eth0" not in routes(eng, sid)
    finally:
        eng.sandbox_stop(sid)


def test_a_policy_given_later_survives_hibernate_and_resume(eng, img, lab):
    sid = eng.sandbox_start(img)["id"]
    try:
        eng.sandbox_set_network(sid, ["allowed.test"])
        try:
            hib = eng.sandbox_hibernate(sid)
        except RuntimeUnavailable as e:
            assert "CRIU" in str(e) or "criu" in str(e), e
            pytest.skip(f"no hibernation here: {e}")
        assert hib["state"] == "hibernated" and hib["network"] == {"allow_out": ["allowed.test"]}
        res = eng.sandbox_resume(sid)
        assert res["state"] == "running" and res["network"] == {"allow_out": ["allowed.test"]}
        ok, other = fetch(eng, sid, ("allowed.test", lab.allowed), ("other.test", lab.other))
        assert "200 OK" in ok and "200 OK" not in other, (ok, other)
        eng.sandbox_set_network(sid, "off")
        assert "200 OK" not in fetch(eng, sid, ("allowed.test", lab.allowed))[0]
        hib = eng.sandbox_hibernate(sid)                # and without it: as a sandbox never given one
        assert hib["network"] is None
        eng.sandbox_resume(sid)
        assert "eth0" not in routes(eng, sid)
    finally:
        eng.sandbox_stop(sid)


def test_exposed_ports_and_a_later_policy_share_the_link(eng, img, lab):
    sid = eng.sandbox_start(img)["id"]
    try:
        eng.sandbox_exec(sid, "mkdir -p /srv && echo page > /srv/index.html && "
                              "(httpd -p 8080 -h /srv > /dev/null 2>&1 &)")
        url = eng.sandbox_expose(sid, 8080)["url"]
        eng.sandbox_set_network(sid, ["allowed.test"])
        assert "200 OK" in fetch(eng, sid, ("allowed.test", lab.allowed))[0]
        eng.sandbox_set_network(sid, "off")
        assert "200 OK" not in fetch(eng, sid, ("allowed.test", lab.allowed))[0]
        import httpx
        assert httpx.get(url + "/index.html", timeout=10).text == "page\n"    # the port's link stayed
    finally:
        eng.sandbox_stop(sid)


def test_gvisor_refuses_a_later_policy_and_changes_nothing(eng, img):
    ok, why = eng.tier("gvisor").available()
    if not ok:
        pytest.skip(f"gVisor: {why}")
    sid = eng.sandbox_start(img, tier="gvisor")["id"]
    try:
        with pytest.raises(RuntimeUnavailable, match="network is fixed when it starts"):
            eng.sandbox_set_network(sid, ["allowed.test"])
        assert eng.sandbox_info(sid)["network"] is None
        assert eng.sandbox_set_network(sid, "off")["network"] is None
    finally:
        eng.sandbox_stop(sid)


def test_every_surface_gives_and_takes_a_later_policy(tmp_path, lab, rootfs):
    """Over a real server: the remote SDK (sync and async) and REST give a sandbox started without
    network a policy and take it away; the CLI too, on the same store."""
    import asyncio
    import json
    import subprocess
    import sys

    import httpx

    import sandtree
    from sandtree.client.aio import AsyncSandtree
    from test_network_surfaces import lab_env, server
    home = str(tmp_path / "home")
    with server(home, lab) as url:
        st = sandtree.connect(url)
        try:
            img = st.import_image(rootfs)
            sb = img.start()
            try:
                assert sb.set_network(["allowed.test"])["network"] == {"allow_out": ["allowed.test"]}
                ok, other = sb.exec(get("allowed.test", lab.allowed) + get("other.test", lab.other)).stdout.decode() \
                    .split("--")[:2]
                assert "200 OK" in ok and "200 OK" not in other, (ok, other)
                with httpx.Client(base_url=url + "/api/v1") as h:
                    r = h.post(f"/sandboxes/{sb.id}/network", json={"network": "off"})
                    assert r.status_code == 200 and r.json()["network"] is None, r.text
                    assert "200 OK" not in sb.exec(get("allowed.test", lab.allowed)).stdout.decode()
                    r = h.post(f"/sandboxes/{sb.id}/network", json={"network": ["other.test"]})
                    assert r.status_code == 200 and r.json()["network"] == {"allow_out": ["other.test"]}, r.text
                assert "200 OK" in sb.exec(get("other.test", lab.other)).stdout.decode()

                async def go():
                    async with AsyncSandtree.connect(url) as ast:
                        asb = await (await ast.image(img.id)).start()
                        try:
                            on = await asb.set_network(["allowed.test"])
                            got = (await asb.exec(get("allowed.test", lab.allowed))).stdout.decode()
                            off = await asb.set_network(None)
                            gone = (await asb.exec(get("allowed.test", lab.allowed))).stdout.decode()
                        finally:
                            await asb.stop()
                    return on, got, off, gone
                on, got, off, gone = asyncio.run(go())
                assert on["network"] == {"allow_out": ["allowed.test"]} and "200 OK" in got, got
                assert off["network"] is None and "200 OK" not in gone, gone
            finally:
                sb.stop()
        finally:
            st.close()
    env = {**lab_env(lab), "SANDTREE_HOME": home}

    def cli(*args):
        p = subprocess.run([sys.executable, "-m", "sandtree", *args], env=env, capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        return p
    try:
        img = json.loads(cli("image", "import", rootfs, "--json").stdout)["image"]
        sid = json.loads(cli("start", img, "--json").stdout)["id"]
        try:
            assert json.loads(cli("network", sid, "--allow", "allowed.test", "--json").stdout)["network"] == \
                {"allow_out": ["allowed.test"]}
            out = json.loads(cli("exec", sid, "--json", "--", "sh", "-c", get("allowed.test", lab.allowed)).stdout)
            assert "200 OK" in out["stdout"], out
            assert json.loads(cli("network", sid, "--network", "off", "--json").stdout)["network"] is None
        finally:
            cli("stop", sid)
    finally:
        Egress(home).stop_daemon()


def test_mcp_gives_and_takes_a_later_policy(tmp_path, lab, rootfs):
    """The sandbox_set_network tool through the real MCP client, on a sandbox started without network."""
    import asyncio
    import json
    import sys

    from mcp.client.client import Client
    from mcp.client.stdio import StdioServerParameters
    from test_network_surfaces import lab_env
    home = str(tmp_path / "home")
    params = StdioServerParameters(command=sys.executable, args=["-m", "sandtree", "--home", home, "mcp", "--tools", "all"],
                                   env=lab_env(lab))

    async def main():
        async with Client(params) as c:
            img = json.loads((await c.call_tool("import_image", {"source": rootfs})).content[0].text)["image"]
            sid = json.loads((await c.call_tool("sandbox_start", {"image": img})).content[0].text)["id"]
            try:
                async def fetch_():
                    r = await c.call_tool("sandbox_exec", {"sandbox_id": sid, "command": get("allowed.test", lab.allowed)})
                    return json.loads(r.content[0].text)["stdout"]
                on = await c.call_tool("sandbox_set_network", {"sandbox_id": sid, "network": ["allowed.test"]})
                assert not on.is_error and json.loads(on.content[0].text)["network"] == {"allow_out": ["allowed.test"]}
                assert "200 OK" in await fetch_()
                off = await c.call_tool("sandbox_set_network", {"sandbox_id": sid, "network": None})
                assert not off.is_error and json.loads(off.content[0].text)["network"] is None, off.content[0].text
                assert "200 OK" not in await fetch_()
            finally:
                await c.call_tool("sandbox_stop", {"sandbox_id": sid})
    try:
        asyncio.run(main())
    finally:
        Egress(home).stop_daemon()
