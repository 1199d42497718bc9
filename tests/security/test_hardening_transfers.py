"""gc's sweep of dead transfers' temp files (store/layers.py remove_dead_transfers) never deletes
outside the store: a leftover name that is a symlink, or a leftover dir holding one, is removed
itself, never what it points at."""

from __future__ import annotations

import os
import subprocess
import sys

import sandtree


def test_gc_transfer_sweep_removes_symlinks_not_their_targets(tmp_path):
    home = str(tmp_path / "home")
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep").write_text("keep")
    (outside / "sub" / "keep2").write_text("keep")
    dead = subprocess.run([sys.executable, "-c", "from sandtree.procid import owner_prefix; print(owner_prefix())"],
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.strip()
    assert dead
    with sandtree.Sandtree(home) as st:
        sandboxes = os.path.join(home, "sandboxes")
        shard = os.path.join(home, "objects", "blobs", "cd")
        os.makedirs(sandboxes, exist_ok=True)
        os.makedirs(shard, exist_ok=True)
        links = [os.path.join(sandboxes, f".fetch-{dead}sb1-0a0b"), os.path.join(shard, f".tmp-{dead}x"),
                 os.path.join(sandboxes, f".pack-{dead}sb1-0c0d")]
        os.symlink(str(outside), links[0])
        os.symlink(str(outside / "keep"), links[1])
        os.symlink(str(outside / "sub"), links[2])
        staged = os.path.join(sandboxes, f".fetch-{dead}sb2-0e0f")
        os.makedirs(os.path.join(staged, "d"))
        os.symlink(str(outside), os.path.join(staged, "d", "out"))
        os.symlink(str(outside / "keep"), os.path.join(staged, "f"))
        assert st.gc()["removed_transfers"] == 4
        assert not any(os.path.lexists(p) for p in [*links, staged])
        assert (outside / "keep").read_text() == "keep" and (outside / "sub" / "keep2").read_text() == "keep"
