"""The freezer under a fork storm: a commit of a live sandbox freezes its group, and a group whose
processes keep forking must still freeze (v1's freezer can miss a task forked mid-freeze)."""

from __future__ import annotations

import os
import subprocess

import pytest

from sandtree.runtime.cgroups import Cgroups

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")


@pytest.fixture
def storm():
    groups = Cgroups()
    if not groups.available:
        pytest.skip("no writable cgroup hierarchy")
    cg = groups.create(memory=256 << 20, pids=256, cpus=None, live=True)
    procs = cg.procs_files
    # every child joins the group before it runs: the shell and each process it forks
    p = subprocess.Popen(["/bin/sh", "-c", "while :; do /bin/true; (sleep 0.001 &) ; done"],
                         preexec_fn=lambda: [open(f, "w").write("0") for f in procs],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield cg
    finally:
        try:
            cg.freeze(False)
        except OSError:
            pass
        cg.kill_all()
        p.wait()
        cg.remove(wait=2)


def test_a_forking_group_freezes_every_time_and_nothing_runs_while_frozen(storm):
    for _ in range(40):
        storm.freeze(True)
        assert storm.is_frozen()
        before = storm.pids()
        assert before                                  # the storm is in it
        with open(os.path.join(next(iter(storm.dirs.values())), "cgroup.procs")) as f:
            assert {int(x) for x in f.read().split()} == before      # nothing forks while frozen
        storm.freeze(False)
        assert not storm.is_frozen()
