"""A live sandbox pins no host filesystem: one mounted on the host before the sandbox started is
gone from every process of the sandbox (its helper, its pid 1, what runs in it; on gVisor also
`runsc run`, the Sentry and the gofer) once the host unmounts it (runtime/helper/live.c detach_host),
after a start and after a resume alike, on both tiers; and what the engine reaches through the
helper (the upper, for a commit; gVisor's runsc exec) still works."""

from __future__ import annotations

import os
import secrets
import subprocess

import pytest

import sandtree
from sandtree.runtime import criu
from sandtree.runtime.liveproc import LiveHandle


def _processes(h: LiveHandle) -> set[int]:
    pids = {h.helper_pid, h.init_pid}
    cg = h.cg()
    return pids | (cg.pids() if cg else set())


def _holding(h: LiveHandle, source: str) -> list[str]:
    """The sandbox's processes whose mount table still has a mount of `source`."""
    out = []
    for pid in sorted(_processes(h)):
        try:
            with open(f"/proc/{pid}/mountinfo") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        out += [f"{pid}: {ln}" for ln in lines if ln.split(" - ", 1)[-1].split()[1:2] == [source]]
    return out


@pytest.fixture
def host_mount(tmp_path):
    """mount(source, dir): a tmpfs on the host named `source`; unmounted at the end if still there."""
    made = []

    def mount() -> tuple[str, str]:
        source = f"sandtree-pin-{secrets.token_hex(4)}"
        d = tmp_path / source
        d.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", source, str(d)], check=True)
        made.append(str(d))
        with open(d / "f", "w") as f:
            f.write("host")
        return source, str(d)
    yield mount
    for d in made:
        subprocess.run(["umount", "-l", d], capture_output=True)


def test_a_live_sandbox_does_not_pin_host_mounts(tmp_path, rootfs, host_mount, live_tier):
    st = sandtree.Sandtree(str(tmp_path / "home"), warm=0)
    try:
        source, d = host_mount()
        sb = st.import_image(rootfs).start(idle_timeout=300, lifetime=600, tier=live_tier)
        assert sb.exec("echo in > /tmp/x; sleep 1000 >/dev/null 2>&1 &").ok
        h = st._engine.sandboxes._row(sb.id)["handle"]
        subprocess.run(["umount", d], check=True)
        assert _holding(h, source) == []
        # what the engine reaches through the helper still works
        assert sb.commit().read("/tmp/x") == b"in\n"
        sb.write("/tmp/y", "2")
        assert sb.exec("cat /tmp/x /tmp/y").stdout == b"in\n2"
        ok, _ = st._engine.sandboxes.live.hibernate_available(live_tier)
        if ok and (live_tier != "namespaces" or criu.find()[0]):
            source, d = host_mount()                           # mounted before the resume
            assert sb.hibernate()["state"] == "hibernated"
            st._engine.sandboxes.retiring.wait(sb.id)         # (gVisor's paused one: stopped off the path)
            assert sb.resume()["state"] == "running"
            h = st._engine.sandboxes._row(sb.id)["handle"]
            subprocess.run(["umount", d], check=True)
            assert _holding(h, source) == []
            assert sb.exec("cat /tmp/x; pidof sleep >/dev/null && echo up").stdout == b"in\nup\n"
            assert sb.commit().read("/tmp/y") == b"2"
        sb.stop()
    finally:
        st.close()
