"""The shell session of a live sandbox (engine/sandboxes/session.py) on images whose /bin/sh is busybox ash,
dash or bash, on each tier: what carries over between string commands, and that concurrent
commands, saves cut short and files another uid planted never hand a command a broken or foreign
state."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="live sandboxes need root")

SESSION = "/dev/shm/.sandtree-session-0"


def _with_shell(rootfs: str, dest: str, shell: str) -> str:
    """A copy of the busybox rootfs whose /bin/sh is the host's `shell` (with the libraries ldd
    names): the same utilities, another shell running the session script."""
    shutil.copytree(rootfs, dest, symlinks=True)
    binary = shutil.which(shell)
    libs = [w for line in subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout.splitlines()
            for w in line.split() if w.startswith("/")]
    for path in [binary] + libs:
        target = os.path.join(dest, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.lexists(target):
            os.unlink(target)
        shutil.copy2(os.path.realpath(path), target)
    os.unlink(os.path.join(dest, "bin", "sh"))              # (busybox's link)
    shutil.copy2(os.path.realpath(binary), os.path.join(dest, "bin", "sh"))
    return dest


@pytest.fixture(scope="module", params=["busybox", "dash", "bash"])
def shell_image(request, shared_st, rootfs, bb, tmp_path_factory):
    if request.param == "busybox":
        return request.param, bb
    if not shutil.which(request.param) or not shutil.which("ldd"):
        pytest.skip(f"needs the host's {request.param} and ldd to make an image whose /bin/sh it is")
    root = _with_shell(rootfs, str(tmp_path_factory.mktemp(request.param) / "root"), request.param)
    return request.param, shared_st.import_image(root)


def test_session_carries_cwd_and_exports_in_each_shell(shell_image, live_tier):
    shell, img = shell_image
    with img.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        assert sb.exec(["readlink", "/bin/sh"]).stdout == (b"busybox\n" if shell == "busybox" else b"")
        assert sb.exec(["sh", "-c", "echo ${BASH_VERSION:+bash}"]).stdout == (b"bash\n" if shell == "bash" else b"\n")
        tricky = "it's \"q\" $HOME `x` \\ ;\nsecond line"
        assert sb.exec('cd /tmp; export X=1 Q="$V"', env={"V": tricky}).ok
        assert sb.exec('pwd; echo "$X"; printf %s "$Q"; echo "-${V-unset}"').stdout == \
            b"/tmp\n1\n" + tricky.encode() + b"-unset\n"
        # per-command env and cwd for that command only, even one it overrides or exports anew
        assert sb.exec("echo $X $Y; pwd; X=9; export Y", env={"X": "2", "Y": "3"}, cwd="/etc").stdout == b"2 3\n/etc\n"
        assert sb.exec('echo "$X-${Y-none}"; pwd').stdout == b"1-none\n/tmp\n"
        # the command's own shell options and IFS do not get into its save; its exit code is its own
        r = sb.exec("set -efuxC; IFS=:; export Z=z; cd /var; exit 4", env={"T": "t"})
        assert r.exit_code == 4 and b"__st" not in r.stderr        # (no trace of the save)
        assert sb.exec('echo "$Z ${T-none}"; pwd').stdout == b"z none\n/var\n"
        bad = sb.exec("if")
        assert bad.exit_code == 2 and b"syntax error" in bad.stderr.lower()
        assert sb.exec("unset X; cd /").ok and sb.exec('echo "${X-gone}"; pwd').stdout == b"gone\n/\n"
        # another uid has its own session, and a save is readable by its owner only
        assert sb.exec("export U=1000; cd /tmp", uid=1000, gid=1000).ok
        assert sb.exec('echo "$U"; pwd', uid=1000, gid=1000).stdout == b"1000\n/tmp\n"
        assert sb.exec('echo "${U-none}"; pwd').stdout == b"none\n/\n"
        modes = sb.exec(["stat", "-c", "%a %u", f"{SESSION}.d", f"{SESSION[:-1]}1000.d"]).stdout
        assert modes == b"700 0\n700 1000\n"


def test_session_concurrent_commands_cut_saves_and_planted_files(bb, live_tier):
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        # a value of ~20 KB full of quotes and code: a save read half-written or spliced would run it
        big = "".join(f"line {i} '; touch /tmp/pwned; echo '\n" for i in range(600))
        assert sb.exec('export BIG="$V"; cd /tmp', env={"V": big}).ok
        bad, errors = [], []

        def worker(w: int) -> None:
            try:
                for i in range(12):
                    r = sb.exec(f'[ "$BIG" = "$V" ] && [ "$PWD" = /tmp ] || echo bad; export W{w}={i}', env={"V": big})
                    if r.stdout or not r.ok:
                        bad.append((w, i, r.stdout, r.stderr[-300:]))
            except Exception as e:      # (a thread's exception would be lost)
                errors.append(e)
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and not bad
        assert sb.exec('[ "$BIG" = "$V" ] && echo same', env={"V": big}).stdout == b"same\n"
        assert sb.exec(["test", "-e", "/tmp/pwned"]).exit_code == 1
        # what a save killed halfway leaves (its file, no .ok) and an .ok whose file is gone, numbered
        # past the newest: neither is read; another uid cannot put anything there
        plant = (f"printf \"export X=partial BIG='cut\" > {SESSION}.d/900000.7; "
                 f": > {SESSION}.d/900001.8.ok")
        assert sb.exec(["sh", "-c", plant]).ok
        assert sb.exec(["sh", "-c", f": > {SESSION}.d/900002.9.ok"], uid=1000).exit_code != 0
        assert sb.exec('[ "$BIG" = "$V" ] && echo "same ${X-unset} $PWD"', env={"V": big}).stdout == b"same unset /tmp\n"
        # saves are cleaned up as they pile up: the files stay few however many commands ran
        for i in range(40):
            assert sb.exec(f"export N={i}").ok
        left = sb.exec(["sh", "-c", f"ls {SESSION}.d | wc -l"]).stdout
        assert int(left) <= 40 and sb.exec('echo "$N ${#BIG}"').stdout == f"39 {len(big)}\n".encode()


def test_session_reads_the_file_an_older_wrapper_left(bb, live_tier):
    """A sandbox started (or hibernated) under the previous wrapper kept one file renamed into
    place; its state carries over to the first command after the upgrade."""
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        assert sb.exec(["sh", "-c", f"printf \"export OLD='from before'\\nexport PWD=/etc\\n\" > {SESSION}"]).ok
        assert sb.exec('echo "$OLD"; pwd; export NEW=1').stdout == b"from before\n/etc\n"
        assert sb.exec('echo "$OLD $NEW"').stdout == b"from before 1\n"


def test_session_ignores_what_another_uid_made_first(bb, live_tier):
    """A uid that gets to /dev/shm first (a 1777 directory) and makes root's session directory or
    the older wrapper's file there does not choose root's next environment: they are not root's,
    so root's commands run without a session instead."""
    with bb.start(idle_timeout=120, lifetime=300, tier=live_tier) as sb:
        plant = (f"mkdir -m 777 {SESSION}.d && printf 'export X=foreign\\n' > {SESSION}.d/5.1 && "
                 f": > {SESSION}.d/5.1.ok && printf 'export X=foreign\\n' > {SESSION}")
        assert sb.exec(["sh", "-c", plant], uid=1000, gid=1000).ok
        assert sb.exec('echo "${X-unset}"; export Y=1').stdout == b"unset\n"
        assert sb.exec('echo "${X-unset} ${Y-unset}"').stdout == b"unset unset\n"
