"""A link's names and address families. The nameserver on images without a regular /etc/resolv.conf (issue 14, left open):
none at all (OCI images from registries), a symbolic link (systemd's stub-resolv.conf), one that
points at a host path, and no /etc. Each run reads the link's nameserver and resolves an allowed
name through it; the committed image holds exactly what the image held there before (nothing, or
the same link) and the run's own writes; no host file is read or covered through the image's link.
Both tiers. And IPv6, which links carry to the same proxy and resolver: AAAA questions are
answered for allowed names (empty for a name with none, NXDOMAIN for others), a connection over
IPv6 is allowed or refused as over IPv4, and ::1 works inside as it does without network.

Real things only: the engine on a temporary store, the real egress daemon whose upstream is a
netlab internet this module made (tests/netlab.py); nothing leaves namespaces made here."""

from __future__ import annotations

import os
import shutil
import uuid

import pytest

from conftest import make_rootfs
from netlab import SIX, NetLab
from sandtree.engine import Engine
from sandtree.errors import NotFound
from sandtree.network.client import Egress

TIERS = ["namespaces", "gvisor"]
# What every run does: show resolv.conf, resolve an allowed name through it, write into /etc,
# and try to replace or change resolv.conf (each refused: the bind is read-only and a mount point).
PROBE = ("cat /etc/resolv.conf; echo --; nslookup allowed.test 2>&1 | grep -c 11.1.1.10; echo --; "
         "mkdir -p /etc && echo mine > /etc/hello; "
         "echo x >> /etc/resolv.conf 2>/dev/null && echo WROTE; rm -f /etc/resolv.conf 2>/dev/null && echo REMOVED; "
         "mv /etc/resolv.conf /etc/moved 2>/dev/null && echo MOVED; ln -sf /x /etc/resolv.conf 2>/dev/null && echo LINKED; "
         "echo end")


@pytest.fixture(scope="module")
def lab():
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("the netlab and the egress daemon need root and nft")
    lab = NetLab()
    yield lab
    lab.close()


@pytest.fixture(scope="module")
def eng(tmp_path_factory, lab):
    e = Engine(str(tmp_path_factory.mktemp("resolv") / "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    yield e
    e._egress.stop_daemon()
    e.close()


@pytest.fixture(scope="module")
def host_file(tmp_path_factory):
    """A host file an image's link names by its absolute path: never read, written or covered."""
    path = str(tmp_path_factory.mktemp("hostfile") / f"HOSTFILE-{uuid.uuid4().hex}")
    with open(path, "w") as f:
        f.write("HOST-CONTENT-never-seen\n")
    return path


def image(eng, tmp_path, kind: str, host_file: str) -> str:
    root = make_rootfs(str(tmp_path / f"root-{kind}"))
    conf = os.path.join(root, "etc", "resolv.conf")
    if kind == "link":                      # as on systemd images: dangling inside the image
        os.symlink("../run/systemd/resolve/stub-resolv.conf", conf)
    elif kind == "hostlink":                # absolute: followed on the host, it would be a host file
        os.symlink(host_file, conf)
    elif kind == "no-etc":
        shutil.rmtree(os.path.join(root, "etc"))
        os.symlink("/bin/busybox", os.path.join(root, "bin", "true2"))   # (a distinct image)
    return eng.import_path(root)


def tier_or_skip(eng, tier: str) -> None:
    if tier != "namespaces":
        ok, why = eng.tier(tier).available()
        if not ok:
            pytest.skip(f"tier {tier} unavailable: {why}")


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("kind", ["missing", "link", "hostlink", "no-etc"])
def test_a_networked_run_gets_the_nameserver_and_commits_none_of_it(eng, lab, tmp_path, host_file, kind, tier):
    tier_or_skip(eng, tier)
    img = image(eng, tmp_path, kind, host_file)
    before = None if kind in ("missing", "no-etc") else eng.stat(img, "/etc/resolv.conf").to_dict()
    rec = eng.run(img, PROBE, network=["allowed.test"], tier=tier)
    out = rec.stdout.decode()
    conf, resolved, rest = out.split("--\n", 2)
    assert conf.startswith("nameserver 100.64."), (out, rec.stderr)
    assert resolved.strip() != "0", out                         # nslookup answered through it
    assert "HOST-CONTENT" not in out
    for verb in ("WROTE", "REMOVED", "MOVED", "LINKED"):
        assert verb not in rest, out
    assert rest.strip().endswith("end"), out
    # the committed image: the run's own write, and at /etc/resolv.conf what the image had
    assert eng.read(rec.image, "/etc/hello") == b"mine\n"
    if before is None:
        with pytest.raises(NotFound):
            eng.stat(rec.image, "/etc/resolv.conf")
    else:
        after = eng.stat(rec.image, "/etc/resolv.conf").to_dict()
        assert after["type"] == "symlink" and after["target"] == before["target"], after
    changed = {c.to_dict()["path"] for c in eng.diff(img, rec.image)}
    assert changed <= {"/etc/hello", "/etc"}, changed
    with open(host_file) as f:
        assert f.read() == "HOST-CONTENT-never-seen\n"
    with open("/proc/self/mountinfo") as f:
        assert host_file not in f.read()


@pytest.mark.parametrize("tier", TIERS)
def test_a_run_without_network_sees_the_image_as_it_is(eng, tmp_path, host_file, tier):
    """No policy, no runtime files: the image's link stays a link, a missing file stays missing."""
    tier_or_skip(eng, tier)
    for kind in ("missing", "link"):
        img = image(eng, tmp_path / tier, kind, host_file)
        rec = eng.run(img, "ls -la /etc/resolv.conf 2>&1; cat /etc/resolv.conf 2>&1; true", tier=tier)
        out = rec.stdout.decode()
        assert "nameserver" not in out, out
        assert ("->" in out) == (kind == "link"), out
        assert rec.image == img, [c.to_dict() for c in eng.diff(img, rec.image)]


@pytest.mark.parametrize("tier", TIERS)
def test_a_regular_resolv_conf_is_still_covered_and_kept(eng, lab, tmp_path, host_file, tier):
    tier_or_skip(eng, tier)
    root = make_rootfs(str(tmp_path / f"root-regular-{tier}"))
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")
    img = eng.import_path(root)
    rec = eng.run(img, PROBE, network=["allowed.test"], tier=tier)
    assert rec.stdout.startswith(b"nameserver 100.64."), rec.stdout + rec.stderr
    assert eng.read(rec.image, "/etc/resolv.conf") == b"nameserver 192.0.2.53\n"


@pytest.mark.parametrize("tier", TIERS)
def test_ipv6_through_the_link_and_loopback_v6_works(eng, lab, tmp_path, tier):
    tier_or_skip(eng, tier)
    img = eng.import_path(make_rootfs(str(tmp_path / f"root-v6-{tier}")))
    req = "printf 'GET /v6 HTTP/1.0\\r\\nHost: {}\\r\\n\\r\\n' | nc -w 5 {} 80; echo --; "
    script = ("nslookup -type=AAAA allowed.test 2>&1; echo \"aaaa=$?\"; echo --; "
              "nslookup -type=AAAA other.test 2>&1; echo --; "
              "nslookup -type=AAAA six.test 2>&1; echo --; "
              + req.format("six.test", SIX) + "nc -w 5 fd00:ec2::254 2222 </dev/null; echo --; "
              + req.format("other.test", SIX) + "nc -w 5 fd00:5::10 2222 </dev/null; echo --; "
              "mkdir -p /www && echo hello6 > /www/index.html && httpd -p [::1]:8080 -h /www && sleep 0.3; "
              "wget -q -O- http://[::1]:8080/ 2>&1")
    before = lab.hits[("fd00:ec2::254", 2222)], lab.hits[(SIX, 80)]
    rec = eng.run(img, script, network=["allowed.test", "six.test", "[fd00:5::]/64:2222"], tier=tier)
    allowed, other, six, ok, trap, named, ula, loop6 = rec.stdout.decode().split("--\n")
    assert "aaaa=0" in allowed and "11.1.1" not in allowed and "can't find" not in allowed, allowed
    assert "can't find" in other or "NXDOMAIN" in other, other
    assert SIX in six, six
    assert "200 OK" in ok and '"address": "2600:1f18::10"' in ok, ok + rec.stderr.decode()
    assert "BANNER" not in trap and "200 OK" not in named, (trap, named)
    assert ula.strip() == "BANNER fd00:5::10", ula                       # a unique local address its rule names
    assert loop6.strip() == "hello6", loop6 + rec.stderr.decode()
    assert lab.hits[("fd00:ec2::254", 2222)] == before[0] and lab.hits[(SIX, 80)] == before[1] + 1
    refused = {r["host"] for r in rec.usage["network"]["refused_hosts"]}
    assert "other.test" in refused and any("fd00:ec2::254" in h for h in refused), rec.usage


@pytest.mark.parametrize("tier", TIERS)
def test_a_live_sandbox_gets_the_nameserver_and_its_commit_none_of_it(eng, lab, tmp_path, host_file, tier):
    """A live sandbox commits its upper while it runs: the mount point is in no layer of it."""
    tier_or_skip(eng, tier)
    for kind in ("missing", "link"):
        img = image(eng, tmp_path / f"live-{tier}", kind, host_file)
        info = eng.sandbox_start(img, network=["allowed.test"], tier=tier)
        try:
            r = eng.sandbox_exec(info["id"], PROBE)
            assert r.stdout.startswith(b"nameserver 100.64."), r.stdout + r.stderr
            for verb in (b"WROTE", b"REMOVED", b"MOVED", b"LINKED"):
                assert verb not in r.stdout, r.stdout
            head = eng.sandbox_commit(info["id"])
        finally:
            eng.sandbox_stop(info["id"])
        assert {c.to_dict()["path"] for c in eng.diff(img, head)} <= {"/etc/hello", "/etc"}
        if kind == "missing":
            with pytest.raises(NotFound):
                eng.stat(head, "/etc/resolv.conf")
        else:
            assert eng.stat(head, "/etc/resolv.conf").to_dict()["type"] == "symlink"
