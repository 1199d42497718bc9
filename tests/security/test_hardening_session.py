"""Attacks on the shell session (engine/sandboxes/session.py) by another uid in the same sandbox: names it
makes in /dev/shm before root's first string command (a 1777 directory) must never make root
source a file it chose, nor write root's exported values where it can read them."""

from __future__ import annotations

import os

import pytest

from test_session import shell_image  # noqa: F401 - fixture: busybox ash, dash, bash as /bin/sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")

SESSION = "/dev/shm/.sandtree-session-0"


def _root_runs_unplanted(sb, plant: str, export: str = "Y=1") -> None:
    """uid 1000 runs `plant`; root's next two string commands see none of it (X unset)."""
    assert sb.exec(["sh", "-c", plant], uid=1000, gid=1000).ok
    assert sb.exec(f'echo "${{X-unset}}"; export {export}').stdout == b"unset\n"
    assert sb.exec('echo "${X-unset}"').stdout == b"unset\n"


def test_session_directory_symlinked_to_a_root_owned_1777_directory(shell_image, live_tier):  # noqa: F811
    """/tmp is root's and 1777: a symlink to it passes an owner test that follows links, and the
    saves the attacker put there would run as root; root's saves (secrets) would land there."""
    _, img = shell_image
    with img.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        plant = (f"ln -s /tmp {SESSION}.d && printf 'export X=foreign; touch /tmp/rooted\\n' > /tmp/99.1 && "
                 f": > /tmp/99.1.ok")
        _root_runs_unplanted(sb, plant, "SECRET=s3cr3t-value")
        assert sb.exec(["test", "-e", "/tmp/rooted"]).exit_code == 1
        # root's exported values went nowhere another uid can read
        leaked = sb.exec(["sh", "-c", "grep -rl s3cr3t-value /tmp /dev/shm"], uid=1000, gid=1000)
        assert leaked.stdout == b""
        assert sb.exec(["sh", "-c", "ls -a /tmp"]).stdout.split() == [b".", b"..", b"99.1", b"99.1.ok"]


def test_session_directory_symlinked_to_root_owned_directory_made_writable(bb, live_tier):
    """The same through a directory root made 0777 in /dev/shm itself (a parent check alone
    would pass it)."""
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        assert sb.exec(["sh", "-c", "mkdir -m 777 /dev/shm/shared"]).ok
        plant = (f"ln -s /dev/shm/shared {SESSION}.d && printf 'export X=foreign\\n' > /dev/shm/shared/99.1 && "
                 f": > /dev/shm/shared/99.1.ok")
        _root_runs_unplanted(sb, plant)


def test_older_wrappers_file_symlinked_to_a_root_owned_file(bb, live_tier):
    """The older wrapper's file name pointed at a root-owned file whose text another uid chose
    (here one root wrote for it): root does not source it."""
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        assert sb.exec(["sh", "-c", "printf 'export X=foreign\\n' > /tmp/notes"]).ok
        _root_runs_unplanted(sb, f"ln -s /tmp/notes {SESSION}")



def test_a_commands_own_env_values_are_not_in_its_argv(bb, live_tier):
    """A string command's env= values reach its shell by the environment (/proc/PID/environ: its
    uid's alone), not its argv, which every uid in the sandbox reads (/proc/PID/cmdline, ps)."""
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        secret = "tok-5e6f7a8b9c0d"
        proc = sb.popen('sleep 30', env={"TOKEN": secret})
        try:
            seen = b""
            for _ in range(100):
                seen = sb.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], uid=1000, gid=1000).stdout
                if b"sleep 30" in seen:
                    break
            assert b"sleep 30" in seen and secret.encode() not in seen
        finally:
            proc.kill()
            proc.wait()
        assert sb.exec('echo "$TOKEN ${TOKEN2-unset}"', env={"TOKEN": secret}).stdout == f"{secret} unset\n".encode()


def test_a_string_commands_secret_values_stay_out_of_its_record(bb, live_tier):
    """The record of a string command in the session holds no value of its env= (masked where
    the command's text repeats one), as a run's does."""
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        secret = "s3cr3tv4lue-x7"
        r = sb.exec(f'[ "$API_TOKEN" = {secret} ] && export KEPT="$API_TOKEN" && echo same',
                    env={"API_TOKEN": secret})
        assert r.stdout == b"same\n"
        op = bb._st.operation(r.operation)
        assert op["spec"]["command"].startswith('[ "$API_TOKEN" = ***') and secret not in str(op)
        assert sb.exec('echo "$KEPT"').stdout == f"{secret}\n".encode()
