"""Checkpoints of hibernated sandboxes in S3 (issue 20 items 3 and 5): a sandbox hibernated by one
node resumes on another, whose home never had its checkpoint directory, with its processes'
memory intact; a damaged object refuses to resume and changes nothing. Real components: SeaweedFS
on loopback (tests/s3server.py), CRIU, two store directories on one database and one bucket."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import subprocess

import pytest

import sandtree
from sandtree import StoreCorrupt
from sandtree.store.checkpoints import checkpoint_key
from sandtree.store.maintenance import gc

from conftest import make_rootfs

MEMSTATE = os.path.join(os.path.dirname(__file__), "..", "programs", "memstate.c")


@pytest.fixture(scope="module")
def memstate_root(tmp_path_factory):
    """busybox plus memstate (tests/programs/memstate.c): a counter and MB random bytes held only
    in a process's memory."""
    root = make_rootfs(str(tmp_path_factory.mktemp("memstate") / "root"))
    os.makedirs(os.path.join(root, "usr/local/bin"))
    subprocess.run(["cc", "-O2", "-static", "-o", os.path.join(root, "usr/local/bin/memstate"), MEMSTATE], check=True)
    return root


def _ask(sb) -> list[bytes]:
    assert sb.exec("touch /tmp/ask; while [ -e /tmp/ask ]; do sleep 0.01; done").ok
    return sb.exec("cat /tmp/answer").stdout.split()


def _object(store, sid: str) -> bytes | None:
    o = store.objects
    if not o.exists(checkpoint_key(sid)):
        return None
    return o.client.get_object(Bucket=o.bucket, Key=o.prefix + checkpoint_key(sid))["Body"].read()


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_hibernated_on_one_node_resumes_on_another(tmp_path, s3_server, memstate_root, tier):
    """CRIU's images (namespaces) or runsc's checkpoint files (gVisor): the same directory, packed."""
    bucket = f"s3://{s3_server.new_bucket()}/store"
    db = f"sqlite:///{tmp_path}/shared.db"
    a = sandtree.Sandtree(str(tmp_path / "a"), tier=tier, database=db, objects=bucket, warm=0)
    b = sandtree.Sandtree(str(tmp_path / "b"), tier=tier, database=db, objects=bucket, warm=0)
    ok, why = a._engine.sandboxes.live.hibernate_available(tier)
    if not ok:
        a.close(), b.close()
        pytest.skip(why)
    sid = None
    try:
        sb = a.import_image(memstate_root).start(idle_timeout=300, lifetime=600)
        sid = sb.id
        assert sb.exec("echo on disk > /tmp/file; memstate 16 >/dev/null 2>&1 &").ok
        assert sb.exec("while [ ! -e /tmp/ready ]; do sleep 0.01; done").ok
        count, total = _ask(sb)
        assert count == b"1"

        assert sb.hibernate()["state"] == "hibernated"
        store_a, store_b = a._engine.store, b._engine.store
        row = store_a.db.one("SELECT spec FROM sandboxes WHERE id=?", (sid,))
        record = json.loads(row[0])["checkpoint"]         # sha256 and size in its row
        data = _object(store_a, sid)
        assert hashlib.sha256(data).hexdigest() == record["sha256"] and len(data) == record["size"]
        local_a = os.path.join(store_a.home, "sandboxes", f"{sid}.ckpt")
        assert os.path.isdir(local_a)
        subprocess.run(["rm", "-rf", "--one-file-system", local_a, local_a + ".sha256"], check=True)  # files only

        # node B never had it: fetched, verified, restored: the same process, the same memory
        sb_b = b.sandbox(sid)
        assert sb_b.resume()["state"] == "running"
        assert _ask(sb_b) == [b"2", total]
        assert sb_b.exec("cat /tmp/file").stdout == b"on disk\n"
        assert _object(store_b, sid) is None                      # resumed: its checkpoint goes
        assert not os.path.exists(os.path.join(store_b.home, "sandboxes", f"{sid}.ckpt"))

        # hibernated again (on B); the object is damaged (one bit, same size): resuming on A
        # refuses it and changes nothing, then the good bytes resume there
        assert sb_b.hibernate()["state"] == "hibernated"
        good = _object(store_b, sid)
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 1
        store_a.objects.put_bytes(checkpoint_key(sid), bytes(bad))
        sb_a = a.sandbox(sid)
        with pytest.raises(StoreCorrupt):
            sb_a.resume()
        assert sb_a.info()["state"] == "hibernated"
        assert os.listdir(os.path.join(store_a.home, "sandboxes")) == [f"{sid}.lock"]   # no staging left
        # gc keeps a hibernated sandbox's checkpoint (grace 0: it would take any other)
        gc(store_a, grace=0, retention=0)
        assert _object(store_a, sid) == bytes(bad)
        store_a.objects.put_bytes(checkpoint_key(sid), good)
        assert sb_a.resume()["state"] == "running"
        assert _ask(sb_a) == [b"3", total]

        # stopped while hibernated: its object goes (and gc takes one a stop could not delete)
        assert sb_a.hibernate()["state"] == "hibernated"
        assert _object(store_a, sid) is not None
        sb_a.stop()
        assert _object(store_a, sid) is None
        store_a.objects.put_bytes(checkpoint_key(sid), b"left behind")
        gc(store_a, grace=0, retention=0)
        assert _object(store_a, sid) is None
        sid = None
        # B's copy from its hibernation is no checkpoint any more: its reaper removes it
        b._engine.sandboxes.reap()
        assert not glob.glob(os.path.join(store_b.home, "sandboxes", "*.ckpt*"))
    finally:
        if sid is not None:
            a.sandbox(sid).stop()
        a.close(), b.close()
    assert not glob.glob(str(tmp_path / "*" / "sandboxes" / "*.ckpt"))



def test_a_failed_upload_hibernates_for_this_node_only(tmp_path, s3_server, rootfs, monkeypatch):
    """The upload fails (injected: S3 refusing a PUT mid-hibernation cannot be staged on a shared
    server): the sandbox still hibernates, its row names no checkpoint object, another node
    refuses to resume it (Conflict, nothing changes), its own node resumes it."""
    from sandtree.errors import StoreUnavailable
    bucket = f"s3://{s3_server.new_bucket()}/store"
    db = f"sqlite:///{tmp_path}/shared.db"
    a = sandtree.Sandtree(str(tmp_path / "a"), tier="namespaces", database=db, objects=bucket, warm=0)
    b = sandtree.Sandtree(str(tmp_path / "b"), tier="namespaces", database=db, objects=bucket, warm=0)
    ok, why = a._engine.sandboxes.live.hibernate_available("namespaces")
    if not ok:
        a.close(), b.close()
        pytest.skip(why)
    sb = a.import_image(rootfs).start(idle_timeout=300, lifetime=600)
    try:
        assert sb.exec("echo kept > /tmp/f").ok

        put = a._engine.store.objects.put_file

        def refuse(key, path):                          # the hibernation's commit uploads its layer
            if key.startswith("checkpoints/"):
                raise StoreUnavailable(f"object storage {bucket}: connection reset (injected)")
            return put(key, path)
        monkeypatch.setattr(a._engine.store.objects, "put_file", refuse)
        assert sb.hibernate()["state"] == "hibernated"
        monkeypatch.undo()
        row = a._engine.store.db.one("SELECT spec FROM sandboxes WHERE id=?", (sb.id,))
        assert "checkpoint" not in json.loads(row[0]) and _object(a._engine.store, sb.id) is None
        with pytest.raises(sandtree.Conflict, match="upload"):
            b.sandbox(sb.id).resume()
        assert b.sandbox(sb.id).info()["state"] == "hibernated"
        assert sb.resume()["state"] == "running"
        assert sb.exec("cat /tmp/f").stdout == b"kept\n"
    finally:
        sb.stop()
        a.close(), b.close()
