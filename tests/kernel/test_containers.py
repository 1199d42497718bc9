"""Containers inside a gVisor sandbox (sandbox_start(containers=True), engine/sandboxes/containers.py):
Docker's engine from an image built by the repo's recipe (recipes/docker.Dockerfile, its RUN reaching
Debian's mirror only through the sandbox's egress path, allowed by name; skipped with the reason when the
mirror is unreachable); the inner image imported from a tar of sandtree's own export (`docker import`:
Docker 26's `docker load` reads only its own archive format, not an OCI layout, with its default store). The image is built
once a session (the store's build cache keeps it; SANDTREE_TEST_DOCKER=HOME:IMAGE reuses one).

What holds: a Compose app and a server on the Compose network, the app's test against it, `compose down`;
the same after commit -> a new sandbox from the image (the engine's state is saved into the sandbox's
filesystem) and after hibernate -> resume; refused on the namespaces tier and without dockerd in the image; the host sees only runsc's
processes; escape attempts from an inner container with every capability change nothing on the host; the sandbox's
disk and memory limits bound the inner containers."""

from __future__ import annotations

import io
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys

import pytest

from sandtree.engine import Engine
from sandtree.engine.builds.dockerfiles import dockerfile_recipe
from sandtree.errors import BuildFailed, InvalidInput, SandtreeError

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
RECIPES = os.path.join(os.path.dirname(__file__), "..", "..", "recipes")
MIRROR = "deb.debian.org"

# The Compose project: `srv` a tiny HTTP server (busybox httpd) holding the data, `app` a test script
# that asks it by its service name over the project's network and checks the answer.
COMPOSE = b"""services:
  srv:
    image: bb:latest
    command: ["sh", "-c", "mkdir -p /data && echo forty-two > /data/answer && exec httpd -f -p 8080 -h /data"]
  app:
    build: .
    depends_on: [srv]
"""
APP_DOCKERFILE = b"""FROM bb:latest
COPY test.sh /test.sh
CMD ["sh", "/test.sh"]
"""
APP_TEST = b"""i=0
until out=$(printf 'GET /answer HTTP/1.0\\r\\n\\r\\n' | nc srv 8080); do
  i=$((i+1)); [ $i -lt 40 ] || { echo "srv never answered"; exit 2; }; sleep 0.25
done
echo "$out" | grep -q '^forty-two$' && echo "TEST PASSED" || { echo "TEST FAILED: $out"; exit 1; }
"""
UP_TEST_DOWN = ("cd /proj && docker compose up -d --build srv 2>&1 && docker compose run --rm app; rc=$?; "
                "docker compose down 2>&1; exit $rc")


def mirror_rules() -> list[str]:
    # only a name lookup here: the mirror itself is reached only through a sandbox's egress path
    try:
        ips = {a[4][0] for a in socket.getaddrinfo(MIRROR, 80, socket.AF_INET)}
    except OSError as e:
        pytest.skip(f"Debian's mirror does not resolve on this machine: {e}")
    # the name, and its addresses where they are not public (see test_network_pip.py's module doc)
    return [MIRROR] + sorted(ip for ip in ips if not ipaddress.ip_address(ip).is_global)


def busybox_rootfs(root: str) -> str:
    os.makedirs(os.path.join(root, "bin"))
    os.makedirs(os.path.join(root, "tmp"), mode=0o1777)
    shutil.copy2(shutil.which("busybox"), os.path.join(root, "bin", "busybox"))
    for a in ("sh", "cat", "echo", "ls", "mkdir", "mount", "mknod", "nc", "httpd", "sleep", "head", "grep",
              "printf", "true", "id", "dd", "seq"):
        os.symlink("busybox", os.path.join(root, "bin", a))
    return root


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    if os.geteuid() != 0 or not shutil.which("nft") or not shutil.which("busybox"):
        pytest.skip("needs root, nft and busybox")
    reuse = os.environ.get("SANDTREE_TEST_DOCKER", "")
    home = reuse.rpartition(":")[0] if reuse else str(tmp_path_factory.mktemp("docker") / "home")
    e = Engine(home, warm=0)
    if not e.tier("gvisor").available()[0]:
        e.close()
        pytest.skip(f"tier gvisor unavailable: {e.tier('gvisor').available()[1]}")
    yield e
    e.egress.stop_daemon()
    e.close()


@pytest.fixture(scope="module")
def docker_image(eng):
    reuse = os.environ.get("SANDTREE_TEST_DOCKER", "")
    if reuse:
        return reuse.rpartition(":")[2]
    rules = mirror_rules()
    try:
        eng.bootstrap("debian:trixie", tag="debian:trixie")
    except Exception as e:          # (debootstrap's own failure: the mirror unreachable from the host)
        pytest.skip(f"debootstrap of Debian trixie failed: {e}")
    recipe = dockerfile_recipe(eng, RECIPES, dockerfile=os.path.join(RECIPES, "docker.Dockerfile"))
    try:
        res = eng.build(recipe, tag="docker:trixie", network=rules)
    except BuildFailed as exc:
        op = eng.operation(exc.details["operation"])
        net = op["outcome"]["usage"].get("network", {})
        if net.get("bytes_in", 0) == 0 and not net.get("refused"):
            pytest.skip(f"Debian's mirror is unreachable through the egress path: {exc.message[-300:]}")
        raise
    return res.image


@pytest.fixture(scope="module")
def project(eng, tmp_path_factory):
    """The sandbox's files: bb.tar (sandtree's export of a busybox image) and the Compose project."""
    bb = eng.import_path(busybox_rootfs(str(tmp_path_factory.mktemp("bb") / "root")), tag="bb-inner")
    buf = io.BytesIO()
    eng.export_tar(bb, buf)
    return [{"path": "/bb.tar", "content": buf.getvalue()},
            {"path": "/proj/compose.yaml", "content": COMPOSE},
            {"path": "/proj/Dockerfile", "content": APP_DOCKERFILE},
            {"path": "/proj/test.sh", "content": APP_TEST}]


def sh(eng, sid, cmd, timeout=240):
    r = eng.sandbox_exec(sid, cmd, timeout=timeout)
    return r.exit_code, (r.stdout + r.stderr).decode(errors="replace")


def test_compose_app_and_server_then_the_same_after_commit(eng, docker_image, project):
    sb = eng.sandbox_start(docker_image, containers=True, files=project)
    assert sb["tier"] == "gvisor"
    try:
        rc, out = sh(eng, sb["id"], "docker import /bb.tar bb:latest && docker images --format '{{.Repository}}:{{.Tag}}'")
        assert rc == 0 and "bb:latest" in out, out[-3000:]
        rc, out = sh(eng, sb["id"], "docker run --rm bb:latest echo hello-inner")
        assert rc == 0 and "hello-inner" in out, out[-3000:]
        rc, out = sh(eng, sb["id"], UP_TEST_DOWN)
        assert rc == 0 and "TEST PASSED" in out, out[-3000:]
        image = eng.sandbox_commit(sb["id"])
    finally:
        eng.sandbox_stop(sb["id"])
    sb = eng.sandbox_start(image, containers=True)
    try:
        rc, out = sh(eng, sb["id"], "docker images --format '{{.Repository}}:{{.Tag}}'")
        assert rc == 0 and "bb:latest" in out and "proj-app:latest" in out, out   # kept, not loaded again
        rc, out = sh(eng, sb["id"], UP_TEST_DOWN)
        assert rc == 0 and "TEST PASSED" in out, out[-3000:]
    finally:
        eng.sandbox_stop(sb["id"])


def test_hibernate_and_resume_keep_the_engines_images(eng, docker_image, project):
    """gVisor restores the engine's processes and its tmpfs, not the network devices it made: the
    engine is started again at the resume (containers.py RESTART_SCRIPT), its images kept."""
    sb = eng.sandbox_start(docker_image, containers=True, files=project)
    try:
        rc, out = sh(eng, sb["id"], "docker import /bb.tar bb:latest >/dev/null && cd /proj && docker compose build 2>&1")
        assert rc == 0, out[-3000:]
        assert eng.sandbox_hibernate(sb["id"])["state"] == "hibernated"
        assert eng.sandbox_resume(sb["id"])["state"] == "running"
        rc, out = sh(eng, sb["id"], "docker images --format '{{.Repository}}:{{.Tag}}'")
        assert rc == 0 and "bb:latest" in out and "proj-app:latest" in out, out
        # the default bridge (made before the hibernation) works again
        rc, out = sh(eng, sb["id"], "docker run --rm bb:latest echo after-resume")
        assert rc == 0 and "after-resume" in out, out[-2000:]
        rc, out = sh(eng, sb["id"], UP_TEST_DOWN)
        assert rc == 0 and "TEST PASSED" in out, out[-3000:]
    finally:
        eng.sandbox_stop(sb["id"])


def test_with_a_network_policy_host_network_containers_reach_what_it_allows(eng, docker_image, project):
    """In an egress link the sandbox's sockets are host sockets in the link's namespace (runsc
    --network=host), where no bridge can be made: dockerd runs without one and containers take
    --network=host, so their connections are the sandbox's, under its policy (the mirror, by name)."""
    sb = eng.sandbox_start(docker_image, containers=True, files=project[:1], network=mirror_rules())
    try:
        rc, out = sh(eng, sb["id"], "docker import /bb.tar bb:latest >/dev/null && docker run --rm --network=host "
                                    "bb:latest sh -c 'printf \"HEAD /debian/ HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n\" "
                                    f"{MIRROR} | nc {MIRROR} 80 | head -1'")
        if rc == 0 and not out.strip():
            pytest.skip(f"Debian's mirror is unreachable through the egress path: {out[-300:]}")
        assert rc == 0 and out.startswith("HTTP/1."), out[-2000:]
    finally:
        eng.sandbox_stop(sb["id"])


def test_refused_on_the_namespaces_tier_and_without_an_engine(eng, docker_image):
    before = {s["id"] for s in eng.sandbox_list(all=True)}
    with pytest.raises(InvalidInput) as e:
        eng.sandbox_start(docker_image, containers=True, tier="namespaces")
    assert "gvisor" in e.value.message and "seccomp" in e.value.message
    with pytest.raises(InvalidInput) as e:
        eng.sandbox_start("debian:trixie", containers=True)   # the recipe's base: no dockerd
    assert "dockerd" in e.value.message
    with pytest.raises(InvalidInput):
        eng.sandbox_start(docker_image, containers="yes")
    # the CLI's --containers reaches the same check (every surface takes the row's option)
    cli = subprocess.run([sys.executable, "-m", "sandtree", "--home", eng.store.home, "start", docker_image,
                          "--containers", "--tier", "namespaces"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": SRC})
    assert cli.returncode != 0 and "needs the gvisor tier" in cli.stderr, cli.stderr
    # nothing left running: the one that started for the second try was stopped
    assert all(s["state"] != "running" for s in eng.sandbox_list(all=True) if s["id"] not in before)


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def test_isolation_host_sees_runsc_only_and_escapes_from_an_inner_container_fail(eng, docker_image, project,
                                                                                   tmp_path):
    marker = tmp_path / "host-secret"
    token = secrets.token_hex(16)
    marker.write_text(token)
    with socket.socket() as s:                 # a loopback port free on the host now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sb = eng.sandbox_start(docker_image, containers=True, files=project[:1])
    try:
        rc, out = sh(eng, sb["id"], "docker import /bb.tar bb:latest >/dev/null && docker run -d --name srv bb:latest sleep 600")
        assert rc == 0, out[-2000:]
        handle = eng.sandboxes._row(sb["id"])["handle"]
        exes = {}
        for p in _descendants(handle.init_pid):
            try:
                exes[p] = os.readlink(f"/proc/{p}/exe")
            except OSError:
                pass
        assert exes and set(exes.values()) == {shutil.which("runsc")}, exes
        # an inner container with every capability and no seccomp filter (the worst case short of
        # --privileged, which Docker refuses here: gVisor's /dev holds no real device node) tries the host
        battery = f"""
        mkdir -p /m; for d in /dev/sda /dev/vda /dev/nvme0n1 /dev/xvda; do mount $d /m 2>/dev/null && echo ESCAPE-mount-$d; done
        mknod /dev/hostdisk b 8 0 2>/dev/null; dd if=/dev/hostdisk of=/dev/null bs=512 count=1 2>/dev/null && echo ESCAPE-device
        mknod /dev/hostvda b 253 0 2>/dev/null; dd if=/dev/hostvda of=/dev/null bs=512 count=1 2>/dev/null && echo ESCAPE-device
        cat {marker} /proc/1/root{marker} 2>/dev/null
        mkdir -p /cg && mount -t cgroup -o pids none /cg 2>/dev/null; echo 7 > /cg/pids.max 2>/dev/null
        echo battery-done
        """
        run = eng.sandbox_exec(sb["id"], ["docker", "run", "--rm", "--cap-add", "ALL", "--security-opt",
                                          "seccomp=unconfined", "--network=host", "bb:latest",
                                            "sh", "-c", battery], timeout=120)
        out = (run.stdout + run.stderr).decode(errors="replace")
        assert "battery-done" in out, out[-2000:]
        assert "ESCAPE" not in out and token not in out, out
        # a host-network inner container listening on a port free on the host: it answers inside the
        # sandbox, and nothing listens on the host's loopback (the sandbox has its own network stack)
        rc, out = sh(eng, sb["id"], f"docker run -d --network=host bb:latest nc -ll -p {port} -e echo inner-listener"
                                    f" && docker run --rm --network=host bb:latest sh -c 'for i in $(seq 40); do "
                                    f"printf x | nc 127.0.0.1 {port} && break; sleep 0.25; done'")
        assert rc == 0 and "inner-listener" in out, out[-2000:]
        with socket.socket() as c:
            c.settimeout(2)
            assert c.connect_ex(("127.0.0.1", port)) != 0
    finally:
        eng.sandbox_stop(sb["id"])


def test_the_sandboxs_limits_bound_inner_containers(eng, docker_image, project):
    """Disk: the engine's data root is as big as the sandbox's disk limit. Memory: the sandbox's cgroup
    holds gVisor's kernel and all it runs, inner containers included: past the limit the sandbox ends."""
    sb = eng.sandbox_start(docker_image, containers=True, files=project[:1], disk="200M", memory="400M")
    try:
        rc, out = sh(eng, sb["id"], "docker import /bb.tar bb:latest >/dev/null && docker run --rm bb:latest "
                                    "sh -c 'dd if=/dev/zero of=/big bs=1M count=400 2>&1; echo dd-rc=$?'")
        assert "dd-rc=0" not in out and "No space left" in out, out[-2000:]
        rc, out = sh(eng, sb["id"], "docker run --rm bb:latest dd if=/dev/zero of=/dev/null bs=50M count=1")
        assert rc == 0, out                                   # within the limit: fine
        with pytest.raises(SandtreeError):                    # a 900 MB buffer: the whole sandbox ends
            eng.sandbox_exec(sb["id"], "docker run --rm bb:latest dd if=/dev/zero of=/dev/null bs=900M count=1",
                             timeout=120)
        assert eng.sandbox_info(sb["id"])["state"] != "running"
    finally:
        eng.sandbox_stop(sb["id"])
