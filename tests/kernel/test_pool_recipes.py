"""Golden pools from recipes (issue 15, item 6): a Dockerfile built and pooled under a tag; a rebuild
that changes the ID rolls the pool over while runs go on, and the old pool's sandboxes all stop;
`sandtree serve --pool Dockerfile=SIZE` does the same on a real server.

Real things only: real builds (engine.build on the busybox image conftest makes), real pooled
sandboxes (namespaces, cgroups, overlay), a real `sandtree serve` on loopback; the networked pool
uses the real egress daemon on a netlab internet this module made (tests/netlab.py)."""

from __future__ import annotations

import os
import shutil
import statistics
import threading
import time

import httpx
import pytest

from conftest import make_rootfs, serve_process
from sandtree.cli.admin import pool_source
from sandtree.engine import Engine
from sandtree.engine.builds.dockerfiles import dockerfile_recipe
from sandtree.errors import InvalidInput

DOCKERFILE = "FROM bb\nCOPY app.txt /app.txt\nRUN echo built > /stamp\n"


@pytest.fixture
def ctx(tmp_path):
    d = tmp_path / "ctx"
    d.mkdir()
    (d / "Dockerfile").write_text(DOCKERFILE)
    (d / "app.txt").write_text("v1\n")
    return d


def alive(pid: int, start: int) -> bool:
    """The process (pid, start time) still runs (a zombie has ended: only its exit status is left)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[19]) == start and fields[0] != "Z"


def test_a_pool_from_a_dockerfile_serves_runs_warm(st, rootfs, ctx):
    st.import_image(rootfs, tag="bb")
    stats = st.pool(st.dockerfile(str(ctx)), size=2, tag="app", wait=True)
    try:
        assert stats["tag"] == "app" and stats["ready"] == 2 and stats["previous"] is None, stats
        assert st.image("app").id == stats["image"]
        plain, pooled = [], []
        for _ in range(8):
            t = time.perf_counter()
            r = st.image("bb").run("cat /etc/greeting", disposable=True)       # no pool on bb: cold
            plain.append(time.perf_counter() - t)
            assert not r.usage.get("pool")
            st.engine.pool_wait("app", 10)
            t = time.perf_counter()
            r = st.image("app").run("cat /app.txt /stamp", disposable=True)
            pooled.append(time.perf_counter() - t)
            assert r.usage.get("pool") is True and r.stdout == b"v1\nbuilt\n"
            rec = st.engine.operation(r.operation)                                    # the record says which image
            assert rec["source"] == stats["image"] and rec["outcome"]["usage"]["pool"] is True, rec
        served = next(p for p in st.pools() if p["image"] == stats["image"])["served"]
        assert served == 8
        print(f"\nrun latency p50: plain {statistics.median(plain) * 1000:.1f} ms, "
              f"from a recipe pool {statistics.median(pooled) * 1000:.1f} ms")
        again = st.pool(st.dockerfile(str(ctx)), size=2, tag="app")                  # unchanged: all cached, no roll
        assert again["image"] == stats["image"] and again["previous"] is None and again["cached"] == again["steps"]
    finally:
        st.pool("app", size=0)


def test_rebuild_rolls_the_pool_over_without_dropping_runs(st, rootfs, ctx):
    st.import_image(rootfs, tag="bb")
    cold = []
    for _ in range(6):                                 # what a cold start costs here, now (the first: warm-up)
        t = time.perf_counter()
        st.image("bb").run("cat /etc/greeting", disposable=True)
        cold.append(time.perf_counter() - t)
    first = st.pool(st.dockerfile(str(ctx)), size=2, tag="app", wait=True)
    old = first["image"]
    handles = []                                      # every sandbox the old pool holds or hands out
    runs, errors, stop = [], [], threading.Event()
    old_pool = st.engine.pools.get(old)
    real_take = old_pool.take

    def take(**kw):
        got = real_take(**kw)
        if got is not None:
            handles.append(got.h)                     # (pools.Ready)
        return got
    old_pool.take = take

    def runner():
        while not stop.is_set():
            t = time.perf_counter()
            try:
                r = st.image("app").run("cat /app.txt", disposable=True)
            except Exception as exc:                  # noqa: BLE001 - any failure fails the test below
                errors.append(repr(exc))
                continue
            runs.append((t, time.perf_counter(), r.source.id, r.stdout, r.exit_code, bool(r.usage.get("pool"))))

    th = threading.Thread(target=runner)
    th.start()
    try:
        time.sleep(0.5)
        handles.extend(r.h for r in list(old_pool.ready))
        (ctx / "app.txt").write_text("v2\n")
        t_roll = time.perf_counter()
        second = st.pool(st.dockerfile(str(ctx)), size=2, tag="app")
        t_done = time.perf_counter()
        time.sleep(0.5)
    finally:
        stop.set()
        th.join()
    new = second["image"]
    try:
        assert new != old and second["previous"] == old and second["rolled_over"] is not None, second
        assert second["cached"] == 1 and second["steps"] == 3        # FROM hit; COPY and what follows ran
        assert not errors, errors[:3]
        assert all(code == 0 for *_, code, _p in runs)
        sources = [src for _, _, src, *_ in runs]
        assert old in sources and new in sources
        flip = sources.index(new)
        assert set(sources[:flip]) == {old} and set(sources[flip:]) == {new}, "old after new"
        for _, _, src, out, *_ in runs:
            assert out == (b"v1\n" if src == old else b"v2\n")
        assert all(src == old for s, e, src, *_ in runs if e < t_roll)
        assert all(src == new for s, e, src, *_ in runs if s > t_done)
        worst = max(e - s for s, e, *_ in runs)
        # (how long the slowest run waited is reported below, not asserted: a timing under the
        # machine's load is make bench's to measure; failed or misordered runs are asserted above)
        assert st.engine.pools.get(old) is None
        assert next(p for p in st.pools() if p["image"] == new)["served"] >= 1
        # the old pool's sandboxes are all stopped: processes, cgroups, mounts
        assert handles
        for t in old_pool.fillers:                    # (the last sandbox a run held: stopped once it ended)
            t.join(10)
        assert old_pool.thread_done and not any(t.is_alive() for t in old_pool.fillers)
        for h in handles:
            assert not alive(h.init_pid, h.init_start) and not alive(h.helper_pid, h.helper_start), \
                (h, open(f"/proc/{h.init_pid}/status").read()[:300])
            for d in (h.cgroup or {}).get("dirs", {}).values():
                assert not os.path.exists(d), d
        with open("/proc/self/mountinfo") as f:
            assert st.home not in f.read()
        pooled = sum(1 for *_, p in runs if p)
        slow = sorted(runs, key=lambda x: x[0] - x[1])[:4]
        print("\nslowest:", [(round((e - s) * 1000, 1), round((s - t_roll) * 1000, 1), p) for s, e, *_, p in slow],
              f"roll call {(t_done - t_roll) * 1000:.1f} ms")
        print(f"\nroll-over: build {second['build_seconds'] * 1000:.1f} ms, new pool filled + tag moved + old "
              f"drained {second['rolled_over'] * 1000:.1f} ms; {len(runs)} runs back to back, {pooled} pooled, "
              f"worst {worst * 1000:.1f} ms (cold max {max(cold[1:]) * 1000:.1f} ms)")
    finally:
        st.pool("app", size=0)


def test_a_failed_rebuild_keeps_the_pool_and_the_tag(st, rootfs, ctx):
    st.import_image(rootfs, tag="bb")
    first = st.pool(st.dockerfile(str(ctx)), size=1, tag="app", wait=True)
    try:
        (ctx / "Dockerfile").write_text(DOCKERFILE + "RUN exit 3\n")
        with pytest.raises(Exception) as got:
            st.pool(st.dockerfile(str(ctx)), size=1, tag="app")
        assert "exit code 3" in str(got.value)
        assert st.image("app").id == first["image"] and st.engine.pools.get(first["image"]) is not None
        st.engine.pool_wait("app", 10)                # (the failed RUN ran on the pooled image: it took one)
        assert st.image("app").run("cat /app.txt", disposable=True).usage.get("pool") is True
        with pytest.raises(InvalidInput):
            st.pool(st.dockerfile(str(ctx)), size=1, tag="not a tag")
        with pytest.raises(InvalidInput):
            st.pool("bb", size=1, tag="x")                          # tag= is for a recipe
    finally:
        st.pool("app", size=0)


def test_a_builder_pool_without_a_tag_rolls_on_a_file_change(st, rootfs, ctx):
    base = st.import_image(rootfs, tag="bb")
    r = st.recipe(base, context=str(ctx)).copy("app.txt", "/app.txt")
    first = st.pool(r, size=1, wait=True)
    try:
        assert first["tag"].startswith("pool/")
        (ctx / "app.txt").write_text("v2\n")
        second = st.pool(r, size=1, wait=True)
        assert second["tag"] == first["tag"] and second["previous"] == first["image"] != second["image"]
        res = st.image(first["tag"]).run("cat /app.txt", disposable=True)
        assert res.stdout == b"v2\n" and res.usage.get("pool") is True and res.source.id == second["image"]
        assert [p["image"] for p in st.pools()] == [second["image"]]
    finally:
        st.pool(second["image"], size=0)


def test_pool_source_forms(tmp_path, monkeypatch):
    ctx = tmp_path / "my app"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text("FROM scratch\n")
    other = tmp_path / "ctx2"
    other.mkdir()
    monkeypatch.chdir(tmp_path)
    assert pool_source("bb=3") == {"image": "bb", "size": 3}
    assert pool_source("team/app:v1=2") == {"image": "team/app:v1", "size": 2}
    assert pool_source("my app/Dockerfile=2") == {"dockerfile": "my app/Dockerfile", "context": "my app",
                                                 "tag": "pool/my-app/Dockerfile", "size": 2}
    assert pool_source("my app=1")["dockerfile"] == os.path.join("my app", "Dockerfile")
    assert pool_source(f"{ctx}/Dockerfile:ctx2#web=4") == {"dockerfile": f"{ctx}/Dockerfile", "context": "ctx2",
                                                           "tag": "web", "size": 4}
    for bad in ("bb", "bb=x", "=2", "bb#t=1", f"{ctx}/Dockerfile:nowhere=1", "./missing/Dockerfile=1"):
        with pytest.raises(InvalidInput):
            pool_source(bad)
    # a path that says it is a Dockerfile stays one (serve then says: no Dockerfile at ...), not an image ref
    assert pool_source("web.Dockerfile=1") == {"dockerfile": "web.Dockerfile", "context": ".",
                                               "tag": f"pool/{tmp_path.name}/web.Dockerfile", "size": 1}


def test_serve_pool_dockerfile_over_rest(tmp_path, rootfs, ctx):
    home = str(tmp_path / "home")
    eng = Engine(home, warm=0)
    try:
        eng.import_path(rootfs, tag="bb")
    finally:
        eng.close()
    with serve_process(home, "--pool", f"{ctx}/Dockerfile=2", "--watch", "0.3", "--access-log", "off") as url:
        tag = "pool/ctx/Dockerfile"
        with httpx.Client(base_url=url, timeout=60) as c:
            pools = c.get("/api/v1/pools").json()
            assert len(pools) == 1 and pools[0]["size"] == 2 and pools[0]["tag"] == tag, pools
            first = pools[0]["image"]
            for _ in range(3):
                r = c.post("/api/v1/runs", json={"image": tag, "command": "cat /app.txt", "disposable": True})
                assert r.status_code == 201, r.text
                body = r.json()
                assert body["outcome"]["usage"].get("pool") is True and body["stdout"] == "v1\n" and body["source"] == first
                c.post(f"/api/v1/pools/{first}/wait", params={"timeout": 10})
            assert c.get("/api/v1/pools").json()[0]["served"] == 3
            (ctx / "app.txt").write_text("v2\n")                         # --watch rebuilds and rolls over
            end = time.monotonic() + 30
            while time.monotonic() < end:
                body = c.post("/api/v1/runs", json={"image": tag, "command": "cat /app.txt", "disposable": True}).json()
                if body["stdout"] == "v2\n":
                    break
                assert body["stdout"] == "v1\n" and body["source"] == first
            assert body["stdout"] == "v2\n" and body["source"] != first
            end = time.monotonic() + 10
            while [p["image"] for p in c.get("/api/v1/pools").json()] != [body["source"]] and time.monotonic() < end:
                time.sleep(0.1)
            assert [p["image"] for p in c.get("/api/v1/pools").json()] == [body["source"]]


# ---- a networked recipe pool keeps its policy across a roll-over ----------------------------------

@pytest.fixture(scope="module")
def neteng(tmp_path_factory):
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("the netlab and the egress daemon need root and nft")
    from netlab import NetLab
    from sandtree.network.client import Egress
    lab = NetLab()
    home = str(tmp_path_factory.mktemp("poolnet"))
    e = Engine(os.path.join(home, "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    root = make_rootfs(os.path.join(home, "root"))
    with open(os.path.join(root, "etc", "resolv.conf"), "w") as f:
        f.write("nameserver 192.0.2.53\n")
    e.import_path(root, tag="bb")
    yield e, lab
    e._egress.stop_daemon()
    e.close()
    lab.close()


def test_a_networked_recipe_pool_keeps_its_policy(neteng, ctx):
    eng, lab = neteng
    get = ("nslookup allowed.test >/dev/null 2>&1; printf 'GET /hello HTTP/1.0\\r\\nHost: allowed.test\\r\\n\\r\\n' "
           "| nc -w 5 11.1.1.10 80; cat /app.txt")
    policy = ["allowed.test"]
    first = eng.pool_recipe(dockerfile_recipe(eng, str(ctx)), 1, tag="netapp", network=policy, wait=True)
    try:
        assert first["network"] == {"allow_out": ["allowed.test"]} and first["ready"] == 1, first
        (ctx / "app.txt").write_text("v2\n")
        second = eng.pool_recipe(dockerfile_recipe(eng, str(ctx)), 1, tag="netapp", network=policy, wait=True)
        assert second["previous"] == first["image"] and second["network"] == first["network"], second
        rec = eng.run("netapp", get, network=policy, disposable=True)
        assert rec.usage.get("pool") is True and rec.source == second["image"], rec.usage
        assert b"200 OK" in rec.stdout and rec.stdout.endswith(b"v2\n"), rec.stdout
        assert not eng.run("netapp", "true", disposable=True).usage.get("pool")     # no policy: not this pool
    finally:
        eng.pool_remove("netapp")


def test_a_pool_removed_under_a_run_lets_it_finish(st, rootfs):
    """A pooled sandbox dies with the thread that started it (PDEATHSIG): a closed pool's filler
    thread waits for the runs holding its sandboxes, then stops them."""
    img = st.import_image(rootfs)
    st.pool(img, size=1, wait=True)
    pool = st.engine.pools.get(img.id)
    got = {}
    th = threading.Thread(target=lambda: got.update(r=img.run("sleep 0.5; echo done", disposable=True)))
    th.start()
    end = time.monotonic() + 5
    while pool.out == 0 and time.monotonic() < end:
        time.sleep(0.005)
    assert pool.out == 1
    t = time.perf_counter()
    st.engine.pool_remove(img.id)                     # waits for the run: the pool drains
    assert time.perf_counter() - t >= 0.2
    th.join()
    r = got["r"]
    assert r.exit_code == 0 and r.stdout == b"done\n" and r.usage.get("pool") is True
    assert pool.thread_done and not any(t.is_alive() for t in pool.fillers) and st.pools() == []
