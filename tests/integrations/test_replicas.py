"""API replicas (issue 20 item 4): two `sandtree serve` processes on one PostgreSQL database serve
the same tenants, tokens, images, operations and audit; one killed -9 mid-load loses nothing, and
the other ends the operations it was running as interrupted (engine/runs/heartbeat.py).

Real things only: a throwaway PostgreSQL cluster (tests/pgcluster.py), two real servers on loopback.
Both replicas run on this machine over one store directory (objects in S3 with node caches are
issue 20's other steps); an owner on *another* machine is judged by its heartbeat, which
test_an_owner_of_another_machine_is_judged_by_its_heartbeat checks with rows such an owner writes
(no second machine here: the rows are written as it would write them)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import httpx
import pytest

import sandtree
from conftest import free_port, wait_for_port
from sandtree.engine.runs.heartbeat import LEASE
from sandtree.procid import Owner


def cli(home, db, *args) -> str:
    p = subprocess.run([sys.executable, "-m", "sandtree", "--home", str(home), "--database", db, *args],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def replica(home, db, log):
    port = free_port()
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "sandtree", "--home", str(home), "--database", db, "serve",
                                 "--port", str(port), "--ports-port", "0"], stdout=subprocess.DEVNULL, stderr=err)
    wait_for_port(port, 30)
    return proc, f"http://127.0.0.1:{port}/api/v1"


def test_two_replicas_serve_one_store_and_a_killed_one_loses_nothing(tmp_path, pg_cluster, rootfs):
    db = pg_cluster.new_database()
    home = tmp_path / "home"
    alice = json.loads(cli(home, db, "token", "create", "--tenant", "alice", "--json"))["token"]
    procs, clients = [], []
    try:
        for name in ("a", "b"):
            proc, url = replica(home, db, tmp_path / f"{name}.log")
            procs.append(proc)
            clients.append(httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {alice}"},
                                        trust_env=False))
        a, b = clients
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            t.add(rootfs, arcname=".")
        img = a.post("/images/import", content=buf.getvalue()).json()["image"]
        # a client alternating between them sees one store
        r = b.post("/runs", json={"image": img, "command": "echo from-b > /f"}).json()
        assert r["status"] == "done" and r["outcome"]["exit_code"] == 0, r
        assert a.put("/tags/seen", json={"image": r["result"]}).status_code < 300
        assert b.get("/resolve", params={"ref": "seen"}).json()["image"] == r["result"]
        assert a.get(f"/images/{r['result']}/read", params={"path": "/f"}).content == b"from-b\n"
        quick = a.post("/runs", json={"image": img, "command": "echo quick", "wait": False}).json()["id"]
        assert b.post(f"/operations/{quick}/wait", params={"timeout": 60}).status_code == 200
        for _ in range(100):
            if b.get(f"/operations/{quick}").json()["status"] == "done":
                break
            time.sleep(0.1)
        assert b.get(f"/operations/{quick}").json()["status"] == "done"
        # runs in flight on A when it dies
        slow = [a.post("/runs", json={"image": img, "command": "sleep 60", "wait": False}).json()["id"]
                for _ in range(2)]
        # B cannot see A's queue: the rows say they began (A's own view agrees)
        end = time.monotonic() + 30
        while {b.get(f"/operations/{op}").json()["status"] for op in slow} != {"running"} and time.monotonic() < end:
            time.sleep(0.2)
        assert {b.get(f"/operations/{op}").json()["status"] for op in slow} == {"running"}
        assert {a.get(f"/operations/{op}").json()["status"] for op in slow} == {"running"}
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=30)
        # B ends them as interrupted (A's process is gone: judged at B's next sweep), and serves on
        end = time.monotonic() + 30
        while True:
            recs = [b.get(f"/operations/{op}").json() for op in slow]
            if all(rec["status"] == "failed" for rec in recs) or time.monotonic() > end:
                break
            time.sleep(0.5)
        assert all(rec["status"] == "failed" and rec["outcome"]["error"] == "interrupted" for rec in recs), recs
        r2 = b.post("/runs", json={"image": "seen", "command": "cat /f"}).json()
        assert r2["outcome"]["exit_code"] == 0 and r2["stdout"] == "from-b\n", r2
        listed = {i["id"] for i in b.get("/images").json()}
        assert {img, r["result"]} <= listed
        # the audit holds what alice did through either replica (an admin reads it: the store's CLI)
        actions = {e["action"] for e in json.loads(cli(home, db, "audit", "--tenant", "alice", "--json"))}
        assert {"import", "run", "tag"} <= actions, actions
    finally:
        for c in clients:
            c.close()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    st = sandtree.Sandtree(str(home), database=db)
    try:
        report = st.fsck()
        assert report["ok"], report
        assert r["result"] in st.engine.tags().values()             # (alice's tag, under her name)
    finally:
        st.close()


def test_an_owner_of_another_machine_is_judged_by_its_heartbeat(tmp_path, pg_cluster):
    """An unfinished operation of an owner with another boot id (another machine on the same
    database) stays while its heartbeat is fresh, and is ended as interrupted once it is older than
    LEASE or gone; an owner of this machine is judged by its process, as before."""
    db = pg_cluster.new_database()
    st = sandtree.Sandtree(str(tmp_path / "home"), database=db)
    try:
        eng = st.engine
        ops = eng.operations
        me = Owner.me()
        other = Owner(me.pid, me.start, me.ns, "0" * 8 + "-other-machine")     # our very pid, elsewhere
        fresh, stale, gone = "a" * 32, "b" * 32, "c" * 32
        for op in (fresh, stale, gone):
            ops.records.queue(op, "run", None, {"command": "sleep 1", **other.to_dict(), "queued": True})
        with eng.store.db.tx() as con:
            con.execute("INSERT INTO engines(owner, beat) VALUES(?, ?)", (other.key(), time.time()))
        ops._recover()
        assert all(ops.get(op)["status"] == "queued" for op in (fresh, stale, gone))
        ops.records.start(fresh, {"command": "sleep 1", **other.to_dict(), "queued": True})
        assert ops.get(fresh)["status"] == "running" and "queued" not in ops.get(fresh)["spec"]
        with eng.store.db.tx() as con:
            con.execute("UPDATE engines SET beat=? WHERE owner=?", (time.time() - LEASE - 1, other.key()))
        ops._recover()
        assert all(ops.get(op)["status"] == "failed" for op in (fresh, stale, gone))
        assert ops.get(fresh)["outcome"]["error"] == "interrupted"
        # this machine's own dead owner (a pid that is not running) is judged without a heartbeat
        dead = Owner(me.pid, (me.start or 0) + 1, me.ns, me.boot)
        op = "d" * 32
        ops.records.queue(op, "run", None, {"command": "x", **dead.to_dict(), "queued": True})
        ops._recover()
        assert ops.get(op)["status"] == "failed"
        # our own engine beats while it watches operations, and its row goes when it closes
        assert eng.store.db.one("SELECT beat FROM engines WHERE owner=?", (me.key(),)) is not None
    finally:
        st.close()
    st = sandtree.Sandtree(str(tmp_path / "home"), database=db)
    try:
        assert st.engine.store.db.one("SELECT beat FROM engines WHERE owner=?", (Owner.me().key(),)) is None
    finally:
        st.close()
