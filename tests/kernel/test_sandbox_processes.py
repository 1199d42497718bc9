"""A live sandbox's processes as the rows added for E2B's envd have them, in process through the SDK
(the engine's own checks; tests/e2e/test_e2b_commands.py drives the same through E2B's SDK): spawn
with a user, a tag, a terminal (and its resize); sandbox_follow's stream; sandbox_processes; and
sandbox_ps, the kernel's process table, on each tier."""

from __future__ import annotations

import threading
import time

import pytest

from sandtree.errors import Conflict, InvalidInput, NotFound


def until(fn, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_spawn_as_a_user_with_a_tag_listed_with_its_env(st, rootfs):
    with st.import_image(rootfs).start() as sb:
        p = sb.spawn("id -u; id -g; sleep 30", user="user", tag="job", env={"A": "1"}, cwd="/tmp")
        until(lambda: p.state()["stdout"] == "1000\n1000\n")
        listed = sb.processes()
        assert [(q["pid"], q["tag"], q["env"], q["cwd"], q["running"]) for q in listed] == \
            [(p.pid, "job", {"A": "1"}, "/tmp", True)]
        assert "stdout" not in listed[0]                          # the list has no output
        with pytest.raises(Conflict, match="tagged"):
            sb.spawn("true", tag="job")                           # a running process has it
        for bad in ({"tag": ""}, {"tag": "x" * 300}, {"user": "nosuch"}, {"user": "user", "uid": 5}):
            with pytest.raises(InvalidInput):
                sb.spawn("true", **bad)
        assert len(sb.processes()) == 1                           # nothing was started by those
        p.kill()
        p.wait(10)
        assert sb.spawn("echo again", tag="job").wait(10)["stdout"] == "again\n"   # ended: free again
        assert sb.spawn("id -un", user="root").wait(10)["stdout"] == "root\n"


def test_a_terminal_its_input_size_and_its_refusals(st, rootfs):
    with st.import_image(rootfs).start() as sb:
        t = sb.spawn(["sh", "-i"], pty=True, cols=100, rows=30, env={"PS1": "$ "})
        t.write(b"stty size; tty\n")
        until(lambda: "30 100" in t.state()["stdout"] and "/dev/pts/" in t.state()["stdout"])
        t.resize(132, 43)
        t.write(b"stty size\n")
        until(lambda: "43 132" in t.state()["stdout"])
        assert t.state()["pty"] is True and t.state()["stderr"] == ""      # one stream
        with pytest.raises(InvalidInput, match="terminal"):
            t.write(b"", close=True)                              # ^D ends a terminal's input
        for cols, rows in ((0, 10), (10, 100000)):
            with pytest.raises(InvalidInput):
                t.resize(cols, rows)
        t.write(b"exit 4\n")
        assert t.wait(10)["exit_code"] == 4
        with pytest.raises(NotFound):
            t.resize(80, 24)                                      # it ended
        plain = sb.spawn("true")
        plain.wait(10)
        with pytest.raises(InvalidInput, match="no terminal"):
            sb._st.engine.sandbox_resize(sb.id, plain.pid, 80, 24)
        with pytest.raises(InvalidInput):
            sb.spawn("true", pty=True, cols=0)


def test_follow_replays_then_streams_until_the_end_or_a_cancel(st, rootfs):
    with st.import_image(rootfs).start() as sb:
        p = sb.spawn("echo one; read x; echo $x; echo err >&2", stdin_open=True)
        until(lambda: p.state()["stdout"] == "one\n")
        heard = []
        follower = threading.Thread(target=lambda: heard.append(
            sb.follow(p.pid, lambda stream, chunk: heard.append((stream, chunk)), replay=True)))
        follower.start()
        until(lambda: heard)
        p.write("two\n", close=True)
        follower.join(10)
        end = heard.pop()
        assert end["exit_code"] == 0 and "stdout" not in end
        got = {"stdout": b"", "stderr": b""}
        for stream, chunk in heard:
            got[stream] += chunk
        assert got == {"stdout": b"one\ntwo\n", "stderr": b"err\n"}

        sleeper = sb.spawn("sleep 30")
        cancel = threading.Event()
        state = {}
        t = threading.Thread(target=lambda: state.update(sb.follow(sleeper.pid, lambda *a: None, cancel=cancel)))
        t.start()
        cancel.set()
        t.join(10)
        assert not t.is_alive() and state["running"] is True      # given up on: the process goes on
        sleeper.kill()


def test_ps_is_the_kernel_s_table(st, rootfs, each_tier):
    with st.import_image(rootfs).start(tier=each_tier) as sb:
        p = sb.spawn("sleep 55; true", user="user")
        rows = until(lambda: [r for r in sb.ps() if r["argv"][:2] == ["sleep", "55"] or r["name"] == "sleep"]
                     and sb.ps())
        pids = {r["pid"]: r for r in rows}
        assert 1 in pids
        sleeper = next(r for r in rows if r["argv"][:2] == ["sleep", "55"] or r["name"] == "sleep")
        assert sleeper["uid"] == 1000 and sleeper["user"] == "user"
        assert sleeper["ppid"] in pids and pids[sleeper["ppid"]]["uid"] == 1000         # its sh
        if each_tier == "namespaces":
            assert sleeper["state"] == "sleeping" and pids[sleeper["ppid"]]["argv"][:2] == ["/bin/sh", "-c"]
        p.kill()
        sid = sb.id
    with pytest.raises(Conflict):
        st._engine.sandbox_ps(sid)                                # stopped
    with pytest.raises(NotFound):
        st._engine.sandbox_ps("0" * 32)


def test_a_signal_right_after_the_spawn_is_not_lost(st, rootfs):
    """The entering helper reports the command's pid before the command has its own process group
    (its setsid): a signal sent in between goes to the command itself (helper/enter.c forward_rt)."""
    with st.import_image(rootfs).start() as sb:
        for _ in range(40):
            p = sb.spawn(["sleep", "100"])
            p.kill()
            assert p.wait(30)["signal"] == 9


def test_a_close_after_a_held_command_read_its_input_and_exited(st, rootfs):
    """A held process (engine/processes/held.py) whose command reads its input and exits at once
    ends its holder, maybe before the engine has read the exit: closing its stdin then is not an
    error (nothing is left to close, as with a pipe whose reader has gone), while data no one can
    read any more is (BrokenPipeError, which sandbox_stdin answers with Conflict). The engine's
    reader of the holder is not started here, so the exit is not known when the close comes (and
    the data goes before the holder's hello is read: it waits in the relay's stdin, in order);
    sandbox_stdin(data, close=True) sends both in one write (tests/integrations/test_cluster.py's
    'process 1 no longer reads its stdin' came from a close sent after the data, apart)."""
    from sandtree.engine.processes.held import spawn_held

    with st.import_image(rootfs).start() as sb:
        e = st._engine
        held = spawn_held(e.sandboxes, sb.id, ["sh", "-c", "read x; echo $x$x"], env=None, cwd=None,
                          uid=None, gid=None)
        held.write(b"ab\n")
        held.relay.wait(30)                   # its holder passed the exit on and left: its relay ends
        held.close_stdin()
        with pytest.raises(BrokenPipeError):
            held.write(b"more\n")
        # and through the engine, many times: data and its close together, never a Conflict
        for _ in range(20):
            spid = e.sandbox_spawn(sb.id, ["sh", "-c", "read x; echo $x$x"], stdin_open=True)
            e.sandbox_stdin(sb.id, spid, "ab\n")
            assert e.sandbox_follow(sb.id, spid, lambda s, c: None)["exit_code"] == 0
            assert e.sandbox_process(sb.id, spid)["stdout"] == "abab\n"


# What a command can see of how it was started: its ids, groups, capabilities, seccomp and
# no_new_privs, resource limits, cgroups, namespaces, open fds, environment, umask and cwd.
_IDENTITY = ("id -u; id -g; id -G; grep -E '^(Uid|Gid|Groups|Cap|NoNewPrivs|Seccomp)' /proc/self/status; "
             "cat /proc/self/limits /proc/self/cgroup; for n in user mnt pid net ipc uts cgroup; do "
             "readlink /proc/self/ns/$n; done; ls /proc/self/fd; env | sort; umask; pwd")


@pytest.mark.parametrize("ids", [(0, 0), (1000, 1000)])
def test_a_spawned_command_is_given_exactly_what_an_exec_s_command_is(st, rootfs, ids):
    """A spawned command comes from the sandbox's spawner (engine/processes/spawner.py: a fork
    inside, no enter), an exec's from an enter (helper/command.c): the command cannot tell them
    apart, so the spawner gives it nothing the sandbox would not (and takes nothing away)."""
    uid, gid = ids
    with st.import_image(rootfs).start(env={"FROM_START": "1"}) as sb:
        e = st._engine
        spid = e.sandbox_spawn(sb.id, ["sh", "-c", _IDENTITY], env={"MINE": "x y"}, cwd="/tmp", uid=uid, gid=gid)
        spawned = e.sandbox_follow(sb.id, spid, lambda s, c: None)
        assert spawned["exit_code"] == 0, e.sandbox_process(sb.id, spid)["stderr"]
        assert st.engine.sandboxes.spawners.by_sid.get(sb.id) is not None      # (the spawner's, not a relay's)
        ran = sb.exec(["sh", "-c", _IDENTITY], env={"MINE": "x y"}, cwd="/tmp", uid=uid, gid=gid)
        assert ran.exit_code == 0, ran.stderr
        got = e.sandbox_process(sb.id, spid)["stdout"]
        assert got == ran.stdout.decode()
        assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in got and "MINE=x y" in got and "FROM_START=1" in got
        assert "NoNewPrivs:\t1" in got and "Seccomp:\t2" in got
        if uid:
            assert "CapEff:\t0000000000000000" in got and "CapPrm:\t0000000000000000" in got


def test_the_spawner_killed_from_inside_is_started_again(st, rootfs):
    """The spawner is a process of the sandbox: its root can kill it. The commands it started go
    on (their holders are their own), and the next spawn starts another spawner."""
    with st.import_image(rootfs).start() as sb:
        e = st._engine
        sleeper = e.sandbox_spawn(sb.id, ["sleep", "60"])

        def spawner():                        # (pid 1's: its child is one a moment before it is named a holder)
            return [r for r in sb.ps() if r["name"] == "sandtree-spawn" and r["ppid"] == 1]
        spawners = spawner()
        assert len(spawners) == 1 and spawners[0]["uid"] == 0
        assert sb.exec(["kill", "-9", str(spawners[0]["pid"])]).exit_code == 0
        until(lambda: not spawner())
        for _ in range(3):
            spid = e.sandbox_spawn(sb.id, ["sh", "-c", "echo again"])
            assert e.sandbox_follow(sb.id, spid, lambda s, c: None)["exit_code"] == 0
            assert e.sandbox_process(sb.id, spid)["stdout"] == "again\n"
        again = spawner()
        assert len(again) == 1 and again[0]["pid"] != spawners[0]["pid"]
        assert e.sandbox_process(sb.id, sleeper)["running"] is True
        e.sandbox_signal(sb.id, sleeper, "KILL")
        assert e.sandbox_follow(sb.id, sleeper, lambda s, c: None)["signal"] == 9


def test_a_spawned_command_that_cannot_start_says_why(st, rootfs):
    """The spawner's holder reports a command that cannot start as an enter does: a missing
    working directory or program is the caller's error, and the sandbox spawns on."""
    from sandtree.errors import CommandNotFound

    with st.import_image(rootfs).start() as sb:
        e = st._engine
        for argv, cwd, err in ((["true"], "/no/such", InvalidInput), (["/no/such/program"], None, CommandNotFound)):
            try:
                spid = e.sandbox_spawn(sb.id, argv, cwd=cwd)
            except err:
                continue                       # (known at once)
            state = e.sandbox_follow(sb.id, spid, lambda s, c: None)
            assert state["exit_code"] in (126, 127), state
        spid = e.sandbox_spawn(sb.id, ["sh", "-c", "echo fine"])
        assert e.sandbox_follow(sb.id, spid, lambda s, c: None)["exit_code"] == 0


def test_hibernate_and_a_live_fork_let_the_spawner_go(st, rootfs, tmp_path, store_database, store_objects):
    """The spawner holds a socket of the engine's, which no checkpoint can hold: a hibernation and
    a live fork let it go first (no "command still running"), another engine process's spawner
    too, and a spawn after starts another."""
    import sandtree
    from sandtree.runtime import criu

    if not criu.find()[0]:
        pytest.skip(criu.find()[1])
    with st.import_image(rootfs).start() as sb:
        e = st._engine
        ok, why = e.sandboxes.live.hibernate_available()
        if not ok:
            pytest.skip(why)
        other = sandtree.Sandtree(str(tmp_path / "home"), warm=0, database=store_database, objects=store_objects)
        try:
            o = other._engine                             # another engine process's on the same home
            for engine in (e, o):
                spid = engine.sandbox_spawn(sb.id, ["true"])
                assert engine.sandbox_follow(sb.id, spid, lambda s, c: None)["exit_code"] == 0
            assert len([r for r in sb.ps() if r["name"] == "sandtree-spawn" and r["ppid"] == 1]) == 2
            assert sb.hibernate()["state"] == "hibernated"
            assert sb.resume()["state"] == "running"
            for engine in (e, o):
                spid = engine.sandbox_spawn(sb.id, ["sh", "-c", "echo resumed"])
                assert engine.sandbox_follow(sb.id, spid, lambda s, c: None)["exit_code"] == 0
                assert engine.sandbox_process(sb.id, spid)["stdout"] == "resumed\n"
        finally:
            other.close()
        [kid] = sb.fork()
        try:
            assert kid.exec(["echo", "kid"]).stdout == b"kid\n"
            spid = e.sandbox_spawn(kid.id, ["sh", "-c", "echo spawned in kid"])
            assert e.sandbox_follow(kid.id, spid, lambda s, c: None)["exit_code"] == 0
        finally:
            kid.stop()
        spid = e.sandbox_spawn(sb.id, ["sh", "-c", "echo after the fork"])
        assert e.sandbox_follow(sb.id, spid, lambda s, c: None)["exit_code"] == 0


def test_a_sandbox_whose_spawned_commands_ended_goes_idle(st, rootfs):
    """The spawner stays, but nothing of the engine's stays outside the sandbox with it (the enter
    that started it ends at once): a sandbox is idle once its commands have ended, and its idle
    timeout stops it."""
    sb = st.import_image(rootfs).start(idle_timeout=2)
    e = st._engine
    try:
        row = e.sandboxes._row(sb.id)
        spid = e.sandbox_spawn(sb.id, ["true"])
        e.sandbox_follow(sb.id, spid, lambda s, c: None)
        assert e.sandboxes.spawners.by_sid.get(sb.id) is not None         # (the spawner runs)
        assert e.sandboxes.live.outsiders(row["handle"]) == []
        until(lambda: {s.id: s.state for s in st.sandboxes()}.get(sb.id) != "running", 30)    # (a list reaps)
        assert sb.info()["state"] in ("stopped", "expired")
    finally:
        sb.stop()
