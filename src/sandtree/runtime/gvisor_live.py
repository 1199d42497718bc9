"""Live sandboxes on the `gvisor` tier: the same LiveTier as the namespaces tier (live.py), on
gVisor's user-space kernel.

The helper (helper/gvisor.c live_runtime) mounts the sandbox's root as for a gVisor run (the image's
layers under an overlay whose upper is on a size-capped tmpfs, in a private mount namespace) and
stays there as P, bounded by the lifetime; its child R is `runsc run` of a bundle whose pid 1 is
sandtree-init (bound in read-only from the bundle), so the Sentry, its gofer and every process
inside live as long as R. A LiveHandle names P (helper) and R (init) with their start times:
the scratch and the upper are read through /proc/P/root/tmp exactly as on the namespaces tier,
so commit is the same code and gives the same image IDs for the same changes.

Commands enter through `runsc exec --process FILE` run by the helper in P's mount namespace
(--mnt-fd: runsc's state and control socket are there), which reports like an entering helper
(pid, exit, forwarded signals). The process file (argv, env, ids, cwd, capabilities) is written
into the scratch, never onto a command line. runsc runs the root with --file-access=shared, so
files the engine writes into the upper while the sandbox runs are seen inside at once (gVisor
would otherwise cache the directory it saw). Freezing, memory and stats are the cgroup's (it
holds the Sentry), as on the other tier.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import time

from ..errors import RuntimeUnavailable, SandboxError
from .base import RunSpec
from .build import agent_path
from .gvisor_commands import AGENT, PATH_ENV, GVisorCommands, unlink_at
from .live import LiveRuntime, unlink_quietly
from .liveproc import LiveHandle, kill_pid, open_of, parent_of
from .pump import parse_report
from .runfiles import fds_of, network_args
from .validate import validate_spec
from ..procid import proc_namespace, start_time

__all__ = ["GVisorLive"]



class GVisorLive(GVisorCommands, LiveRuntime):
    """The live-sandbox half of the gvisor tier (rt: its GVisorRuntime)."""

    def __init__(self, rt, flags: list[str], network_flag: str, runsc):
        super().__init__(rt)
        self.flags, self.network_flag, self.runsc = flags, network_flag, runsc

    def available(self) -> tuple[bool, str]:
        ok, why = self.rt.available()
        if not ok:
            return ok, why
        if not hasattr(os, "pidfd_open"):
            return False, "live sandboxes need pidfd_open (Linux 5.3, Python 3.9)"
        return True, ""

    def handle(self, stored: dict) -> LiveHandle:
        return LiveHandle.from_dict(stored)

    # ---- start ---------------------------------------------------------------------------------
    def start(self, spec: RunSpec, lifetime: float, *, detach: bool = True,
              restore: str | None = None) -> LiveHandle:
        self._check()
        validate_spec(spec)
        rt, lim = self.rt, spec.limits
        runsc = self.runsc()
        if runsc is None:
            raise RuntimeUnavailable(rt.available()[1])
        agent = agent_path(rt.cache_dir)
        pid1 = dataclasses.replace(spec, argv=[AGENT], uid=0, gid=0, cwd="/", env={})
        # volumes: binds of their host directories (mounted before this helper made its mount namespace, on
        # a path outside /tmp, which it covers), nodev and nosuid as the volumes' own filesystem is
        volumes = tuple({"destination": path, "type": "bind", "source": source,
                         "options": ["rbind", "ro" if readonly else "rw", "nosuid", "nodev"]}
                        for source, path, readonly in spec.volumes)
        config = rt.oci_config(pid1, ({"destination": AGENT, "type": "bind", "source": "/tmp/i/agent",
                                        "options": ["bind", "ro", "nosuid", "nodev"]},) + volumes)
        inject = spec.prepare_changes

        def prepare(upper: str) -> None:
            bundle = os.path.join(os.path.dirname(upper), "b")    # in the scratch, as a run's
            os.mkdir(bundle, 0o700)
            with open(os.path.join(bundle, "config.json"), "wb") as f:
                f.write(config)
            # readable to the gofer, which runs as the sandbox's root (the bundle is the host's)
            os.mkdir(os.path.join(os.path.dirname(upper), "i"), 0o755)
            shutil.copyfile(agent, os.path.join(os.path.dirname(upper), "i", "agent"))
            os.chmod(os.path.join(os.path.dirname(upper), "i", "agent"), 0o555)
            if inject:
                inject(upper)

        cg = rt.cgroups.create(memory=lim.memory, pids=lim.pids, cpus=lim.cpus, live=True, detached=detach)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        deadline_file = self._deadline_file(time.time() + lifetime)
        deadline_fd = os.open(deadline_file, os.O_RDONLY | os.O_CLOEXEC)
        listener, agent_sock = self._agent_socket()
        # (a sandbox in a link gets no raw sockets: with --network=host they would be host raw sockets on
        # the link's veth, packets of its own making; its engine needs none there, having no bridge)
        flags = self.flags + ["--file-access=shared"] + (list(self.rt.container_flags)
                                                         if spec.containers and spec.netns_fd is None else [])
        if spec.netns_fd is not None:
            flags = [self.network_flag if f == "--network=none" else f for f in flags]
        args = [rt.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w),
                "--uid-map", rt.idmap.uid_map_line(), "--gid-map", rt.idmap.gid_map_line(),
                "--live", "1", "--detach", "1" if detach else "0", "--lifetime", str(max(1, int(lifetime))),
                "--deadline-fd", str(deadline_fd), "--agent-fd", str(listener.fileno())]
        args += rt.run_args(spec)[:-2] + ["--inject", "1", "--exec", "1"]
        for f in cg.procs_files:
            args += ["--cgroup", f]
        extra, rtfd = network_args(spec)
        args += extra
        images = None
        if restore is not None:
            # the checkpoint (dump) on the image committed with it: runsc restores the Sentry's
            # memory and its tasks over that root (the engine waits for runsc to say "running")
            images = os.open(restore, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            os.set_inheritable(images, True)
            args += ["--resumed", "1"]
            cmd = [runsc, "--root", "/tmp/state", *flags, "restore", "--image-path", f"/proc/self/fd/{images}",
                   "--bundle", "/tmp/b", "sandtree"]
        else:
            cmd = [runsc, "--root", "/tmp/state", *flags, "run", "--bundle", "/tmp/b", "sandtree"]
        raw = bytearray()
        scratch = proc = None
        try:
            proc = self._spawn_helper(args + ["--"] + cmd, PATH_ENV,
                               (theirs.fileno(), rep_w, deadline_fd, listener.fileno()) + fds_of(spec, rtfd)
                               + ((images,) if images is not None else ()),
                               [theirs, listener, rep_w, deadline_fd, rtfd, images], detach)
            scratch = self._handshake(proc, detach, ours, rep_r, raw, lim, prepare)
            self._failed(raw)
            report = parse_report(raw)
            if b"ready\n" not in raw or "pid" not in report:
                raise SandboxError(f"live sandbox did not start: {bytes(raw).decode(errors='replace').strip()}")
            runsc_pid = report["pid"]
            helper_pid = parent_of(runsc_pid)
            handle = LiveHandle(helper_pid, start_time(helper_pid) or 0, runsc_pid, start_time(runsc_pid) or 0,
                                {"version": cg.version, "dirs": cg.dirs}, proc_namespace(),
                                deadline_file=deadline_file, tier="gvisor", agent=agent_sock)
            if not handle.init_start or not handle.helper_start:
                raise SandboxError("live sandbox exited while starting")
            handle.proc = None if detach else proc
            if restore is not None:
                self._wait_running(handle, time.monotonic() + min(lim.timeout, 120))
                # runsc restored with host paths; now its helper may let the host's tree go
                # (helper/live.c detach_host: a host mount is never pinned by a sandbox)
                kill_pid(handle.helper_pid, handle.helper_start, signal.SIGUSR1)
            return handle
        except BaseException:
            unlink_quietly(deadline_file)
            unlink_quietly(agent_sock)
            self._abort_start(raw, proc, detach, cg)
            raise
        finally:
            ours.close()
            os.close(rep_r)
            if scratch is not None:
                os.close(scratch)

    def _agent_socket(self) -> tuple[socket.socket, str]:
        """A listening unix socket in the store's agents/ (the engine's own directory, 0700), on
        which the sandbox's helper lends pid 1's pipes (helper/gvisor.c live_runtime)."""
        d = os.path.join(os.path.dirname(self.rt.layers_dir), "agents")
        os.makedirs(d, mode=0o700, exist_ok=True)
        name = f"{os.urandom(8).hex()}.sock"
        dfd = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(f"/proc/self/fd/{dfd}/{name}")      # (a store's path may be too long for an address)
            s.listen(64)
        except BaseException:
            s.close()
            raise
        finally:
            os.close(dfd)
        return s, os.path.join(d, name)

    def stop(self, h: LiveHandle, wait: float = 5.0, *, idle: bool = False) -> None:
        super().stop(h, wait, idle=idle)
        if h.agent is not None:
            unlink_quietly(h.agent)
            unlink_quietly(h.agent + ".busy")

    @staticmethod
    def _failed(raw: bytearray) -> None:
        """Raise the helper's reported failure, with what runsc said (helper/gvisor.c: "runsc ...")."""
        report = parse_report(raw)
        if "setupfail" not in report:
            return
        err, step = report["setupfail"]
        said = next((ln[6:] for ln in bytes(raw).decode(errors="replace").splitlines() if ln.startswith("runsc ")),
                    "")
        if said:
            raise SandboxError(f"gVisor did not start the sandbox: {said.strip()[-1500:]}", step=step)
        raise SandboxError(f"sandbox setup failed at {step}: {os.strerror(err)}", step=step, errno=err)

    # ---- where its files are ---------------------------------------------------------------------
    def root(self, h: LiveHandle) -> int:
        """The sandbox's root as the host sees it: P's overlay (the Sentry serves exactly it)."""
        return open_of(h.helper_pid, h.helper_start, "root/tmp/r", os.O_PATH | os.O_DIRECTORY)

    def own_mounts(self, h: LiveHandle) -> set[int]:
        """The overlay at P's /tmp/r and what is mounted under it (gVisor's /proc, /dev and the
        like are the Sentry's own, never host mounts)."""
        fd = open_of(h.helper_pid, h.helper_start, "mountinfo", os.O_RDONLY)
        with os.fdopen(fd, "r", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
        out = set()
        for line in text.splitlines():
            fields = line.split(" - ")[0].split()
            if len(fields) > 4 and (fields[4] == "/tmp/r" or fields[4].startswith("/tmp/r/")):
                out.add(int(fields[0]))
        return out

    # ---- freeze, hibernate ------------------------------------------------------------------
    # A checkpoint is taken by the Sentry itself, which must answer runsc: for one, the sandbox is
    # paused in gVisor's kernel (its tasks stopped), not frozen by the cgroup. A file in the
    # scratch says so, for any engine process (a pauser that died leaves it: thawed by the next),
    # and how: by the Sentry's control socket (what `runsc pause` calls, without a runsc start:
    # 16-50 ms on 2 loaded cores) or, on a runsc of another layout, by `runsc pause`.
    PAUSED = "paused"
    CONTROL = "state/runsc-sandtree.sock"        # runsc's control socket of the sandbox, in its --root

    def _runsc_wait(self, h: LiveHandle, words: list[str], timeout: float = 600, pass_fds=()) -> tuple[int, bytes]:
        proc, rep_r = self._mnt(h, words, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, pass_fds=pass_fds)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        raw = b""
        while chunk := os.read(rep_r, 4096):
            raw += chunk
        os.close(rep_r)
        rep = parse_report(raw)
        return rep.get("exit", -rep.get("signal", 1) or -1), out

    def frozen(self, h: LiveHandle) -> bool:
        if super().frozen(h):
            return True
        scratch = self.scratch(h)
        try:
            os.stat(self.PAUSED, dir_fd=scratch)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(scratch)

    def freeze(self, h: LiveHandle, frozen: bool = True, *, checkpoint: bool = False) -> bool:
        if frozen and not checkpoint:
            return super().freeze(h, True)
        scratch = self.scratch(h)
        try:
            if frozen:
                _write_at(scratch, self.PAUSED, b"")
                try:
                    _control(scratch, self.CONTROL, "containerManager.Pause")
                    _write_at(scratch, self.PAUSED, b"control\n")       # (paused for sure: below)
                except FileNotFoundError:                      # (not this runsc's layout)
                    rc, out = self._runsc_wait(h, ["pause", "sandtree"], 60)
                    if rc != 0:
                        unlink_at(scratch, self.PAUSED)
                        raise SandboxError(f"runsc pause failed: {out.decode(errors='replace')[-500:]}",
                                           step="pause") from None
                    _write_at(scratch, self.PAUSED, b"runsc\n")
                except BaseException:
                    unlink_at(scratch, self.PAUSED)
                    raise
                return True
            super().freeze(h, False)
            try:
                how = _read_at(scratch, self.PAUSED)
            except FileNotFoundError:
                return True
            if how == b"control\n":
                _control(scratch, self.CONTROL, "containerManager.Resume")
            elif how == b"":
                # paused by the control socket or not at all (its pauser died before it could
                # say): the Sentry's Unpause of a kernel not paused ends the sandbox (a panic),
                # so it is left as it is; `runsc resume` refuses one runsc does not know paused
                pass
            else:
                rc, out = self._runsc_wait(h, ["resume", "sandtree"], 60)
                if rc != 0 and b"not paused" not in out and b"Running" not in out:
                    raise SandboxError(f"runsc resume failed: {out.decode(errors='replace')[-500:]}", step="resume")
            unlink_at(scratch, self.PAUSED)
            return True
        finally:
            os.close(scratch)

    # runsc's own record of the container (its --root, P's /tmp/state): read directly, it says
    # "running" as `runsc state` would, without a runsc start (~30 ms of CPU each, which the
    # restore itself needs on a small machine). `runsc state` is asked only while the file is
    # not there (another runsc's layout), and for the words of a failure: asked every 0.25 s
    # beside a readable file, it cost a loaded resume 110-300 ms (the ask's own CPU, and the
    # file unwatched while it ran).
    STATE_FILE = "state/sandtree_sandbox:sandtree.state"
    ASK_RUNSC = 0.25                 # seconds between `runsc state` asks while there is no file

    def _wait_running(self, h: LiveHandle, deadline: float) -> None:
        """Until runsc says the restored container runs (or it died: SandboxError with its words)."""
        asked = time.monotonic()
        scratch = self.scratch(h)
        try:
            while True:
                status = _status_in(scratch, self.STATE_FILE)
                if status == "running":
                    return
                out = b""
                if status is None and not _exists_in(scratch, self.STATE_FILE) \
                        and time.monotonic() - asked >= self.ASK_RUNSC:
                    rc, out = self._runsc_wait(h, ["state", "sandtree"], 30)
                    asked = time.monotonic()
                    if rc == 0 and _status(out) == "running":
                        return
                if not self.alive(h) or time.monotonic() > deadline:
                    out = out or self._runsc_wait(h, ["state", "sandtree"], 30)[1]
                    raise SandboxError(f"gVisor did not restore the sandbox: {out.decode(errors='replace')[-800:]}",
                                       step="runsc-restore")
                time.sleep(0.002)
        finally:
            os.close(scratch)

    def adopt_available(self) -> tuple[bool, str]:
        """No: without a policy the Sentry's own netstack has loopback only (--network=none) and
        runsc fixes the network mode at the start; a link is joined only then (gvisor.py). Neither
        an exposed port's link nor a policy given later (set_network) can reach it."""
        return False, ("a gVisor sandbox's network is fixed when it starts: one started without a network policy "
                       "can neither expose a port nor be given a policy later; start it with one (network=[...]: "
                       "its policy can then be replaced, even by none, and its ports exposed), "
                       "or on the namespaces tier")

    NO_LINK = ("a gVisor sandbox with a network policy cannot hibernate: gVisor checkpoints no sandbox on host "
               "networking, which is how it joins a link; stop it, or run it on the namespaces tier to hibernate it")

    def hibernate_available(self, link: bool = False) -> tuple[bool, str]:
        """Hibernate keeps the processes pid 1 (the agent) started; gVisor kills those runsc exec
        started (popen's, a terminal's: gVisor #11544), so one running refuses it (outsiders).
        Not in a link: runsc refuses "checkpoint not supported when using hostinet" (a link is
        joined with --network=host: gvisor.py NETWORK_FLAG), and must be asked before the pause,
        which ends a process blocked in accept(2) on a host socket. gVisor's own netstack would
        checkpoint, but this runsc refuses it in a link on kernels >= 6.11 (gVisor #10704) and it
        would give root in the sandbox (CAP_NET_RAW) raw packets on the link's veth."""
        if link:
            return False, self.NO_LINK
        return self.available()

    DONE = "gvisor.done"
    # memory uncompressed (the 300 ms target). Tried, not kept (2026-12-05, interleaved, 2 cores
    # at load 7-13, too noisy to show a gain): --exclude-committed-zero-pages (memstate's 100 MB
    # are random), --direct (O_DIRECT writes: the resume then reads from the disk, not the page
    # cache), and restore --direct.
    CHECKPOINT = ["--compression", "none"]

    def dump_finished(self, h: LiveHandle, images: str) -> bool:
        return os.path.exists(os.path.join(images, self.DONE))

    def dump(self, h: LiveHandle, images: str, ghost_limit: int, link: bool = False,
             leave_running: bool = False, meanwhile=None):
        """runsc checkpoint of the paused sandbox into `images` (memory uncompressed: the 300 ms
        target), leaving it running (paused): a dumper killed on the way leaves a sandbox, never
        none. Once the checkpoint is whole (DONE written) the caller stops it (off its path:
        engine/sandboxes/retiring.py). meanwhile (a commit) is called first: that runsc's
        checkpoint never writes to the sandbox's host files (a sync of what the Sentry holds) is
        not established here, and a commit must not see such a write half-way."""
        if link:
            raise RuntimeUnavailable(self.NO_LINK, tier="gvisor")      # (hibernate_available)
        got = meanwhile() if meanwhile is not None else None
        fd = os.open(images, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.set_inheritable(fd, True)
            rc, out = self._runsc_wait(h, ["checkpoint", "--image-path", f"/proc/self/fd/{fd}", *self.CHECKPOINT,
                                           "--leave-running", "sandtree"], pass_fds=(fd,))
        finally:
            os.close(fd)
        if rc != 0:
            raise SandboxError(f"runsc checkpoint failed: {out.decode(errors='replace')[-800:]}",
                               step="runsc-checkpoint")
        with open(os.path.join(images, self.DONE), "wb") as f:
            f.write(b"ok\n")
            f.flush()
            os.fsync(f.fileno())
        return got


def _status(text: bytes) -> str | None:
    try:
        got = json.loads(text)
    except ValueError:                   # (runsc rewrites the file in place: read while half written)
        return None
    return got.get("status") if isinstance(got, dict) else None


def _control(dir_fd: int, name: str, method: str, timeout: float = 60.0) -> None:
    """One call of runsc's urpc on the Sentry's control socket `name` under dir_fd: a JSON object
    each way ({"method", "arg"} -> {"success", "err"}), as runsc makes it. FileNotFoundError: no
    such socket. Its answer is the sandbox's (read to 64 KiB, only success and err used)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        s.settimeout(timeout)
        s.connect(f"/proc/self/fd/{dir_fd}/{name}")
        s.sendall(json.dumps({"method": method, "arg": None}).encode())
        got = b""
        while True:
            chunk = s.recv(65536)
            if not chunk or len(got) > 65536:
                raise SandboxError(f"gVisor's control server gave no answer to {method}", step="runsc-control")
            got += chunk
            try:
                answer = json.loads(got)
                break
            except ValueError:
                continue
    except (ConnectionRefusedError, socket.timeout) as exc:
        raise SandboxError(f"gVisor's control server did not answer {method}: {exc}", step="runsc-control") from None
    finally:
        s.close()
    if not isinstance(answer, dict) or answer.get("success") is not True:
        err = answer.get("err") if isinstance(answer, dict) else answer
        raise SandboxError(f"gVisor refused {method}: {str(err)[:500]}", step="runsc-control")


def _write_at(dir_fd: int, name: str, data: bytes) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_at(dir_fd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        return os.read(fd, 64)
    finally:
        os.close(fd)


def _exists_in(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except OSError:
        return False


def _status_in(dir_fd: int, name: str) -> str | None:
    """The "status" of runsc's state file `name` under dir_fd, None if unreadable."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return _status(f.read(1 << 20))
    except OSError:
        return None
