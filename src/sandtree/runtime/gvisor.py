"""Tier `gvisor`: the same images and run semantics, executed on gVisor's user-space kernel.

The privileged half is shared with the namespaces tier: runtime/helper/ mounts the run's
size-capped tmpfs and the overlay of the image's layers in a private mount namespace, then
(--exec) becomes `runsc run` on that root. runsc runs with --overlay2=none, so the sandbox's
writes and deletions land in our overlay's upper dir and commit is the same code for both tiers
(same IDs for the same change). Inside: gVisor's Sentry with the systrap platform (no hardware
virtualization needed), no network, the user namespace mapping sandbox root to the same
unprivileged host range, Docker's capability set, no_new_privs. Limits come from the run's
cgroup, which runsc and everything it starts join before they exist; a timeout kills the group.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import socket
import subprocess

from ..errors import CommandNotFound, InvalidInput, RuntimeUnavailable
from ..store.layers import opaque_xattr
from .base import LiveTier, RunSpec
from .gvisor_live import GVisorLive
from .namespaces import KEEP_CAPS, NamespaceRuntime, Started
from .runfiles import RESOLV_CONF, RUNTIME_DIR, fds_of, network_args

CAP_NAMES = {0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 3: "CAP_FOWNER", 4: "CAP_FSETID", 5: "CAP_KILL",
             6: "CAP_SETGID", 7: "CAP_SETUID", 8: "CAP_SETPCAP", 10: "CAP_NET_BIND_SERVICE",
             13: "CAP_NET_RAW", 18: "CAP_SYS_CHROOT", 27: "CAP_MKNOD", 29: "CAP_AUDIT_WRITE",
             31: "CAP_SETFCAP"}
# Every capability gVisor knows (CAP_CHOWN .. CAP_CHECKPOINT_RESTORE), for a sandbox that runs a
# container engine (RunSpec.containers): dockerd and runc need CAP_SYS_ADMIN, CAP_NET_ADMIN and more
# to make namespaces, mounts, bridges and cgroups, all of which gVisor's kernel serves itself.
ALL_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
            "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
            "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
            "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
            "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
            "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN",
            "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
            "CAP_CHECKPOINT_RESTORE"]
# What gVisor documents for Docker inside (its docker-in-gvisor tutorial): raw sockets in its netstack
# (dockerd's bridges and the inner containers' ARP/ICMP). No --allow-packet-socket-write: Docker < 28
# does not need it, and it would let the sandbox craft arbitrary frames on its own netstack's links.
CONTAINER_FLAGS = ["--net-raw"]
RUNSC_FLAGS = ["--platform=systrap", "--network=none", "--overlay2=none", "--ignore-cgroups"]
# A joined link namespace (RunSpec.netns_fd): `--network=sandbox` (gVisor's own netstack on the
# namespace's interfaces) is refused here ("cannot run with network enabled in root network
# namespace": runsc cannot tell the link's namespace from the host's when /proc/1/ns/net is not
# readable to it, as in this container), and would need runsc to take eth0 over. `--network=host`
# makes the sandbox's sockets host sockets *in the namespace runsc runs in*: the link's, so every
# packet still leaves through the veth to the router and its rules; the Sentry cannot change the
# link's addresses or routes (RTNETLINK: permission denied, tested), and the namespace is owned by
# the host's user namespace. Without a link the sandbox keeps `--network=none`.
NETWORK_FLAG = "--network=host"


def runsc_path() -> str | None:
    return shutil.which("runsc")


class GVisorRuntime(NamespaceRuntime):
    name = "gvisor"
    container_flags = CONTAINER_FLAGS

    def available(self) -> tuple[bool, str]:
        if runsc_path() is None:
            return False, "runsc is not installed (Debian bookworm-backports package `runsc`; make test installs it)"
        if self.idmap.rootless:
            return False, "the gvisor tier needs root (runsc run with a user namespace mapping)"
        if not self.cgroups.available:
            return False, "no writable cgroups: the gvisor tier's limits could not be enforced"
        return super().available()

    def take_linked(self, provide, retire, fits=None, layers=()) -> None:
        return None                              # runsc starts per run: no helpers kept ahead

    def live(self) -> LiveTier:
        """This tier's live sandboxes (gvisor_live.py)."""
        if self._live is None:
            self._live = GVisorLive(self, RUNSC_FLAGS, NETWORK_FLAG, runsc_path)
        return self._live

    def warm(self, size: int = 2) -> None:
        """runsc starts its own sandbox per run; there is nothing to start ahead here yet."""

    def _start_warm(self, spec: RunSpec):
        return None

    def _image_has_dir(self, spec: RunSpec, name: str) -> bool:
        """Whether the image's top-level `name` is a directory (top layer first)."""
        for layer in spec.layers:
            p = os.path.join(self.layers_dir, layer, name)
            if os.path.lexists(p):
                return os.path.isdir(p) and not os.path.islink(p)
        return False

    @staticmethod
    def process(spec: RunSpec, terminal: bool = False) -> dict:
        """The OCI process of spec's command: its ids, env and cwd, Docker's capability set,
        no_new_privs, no core dumps (a run's pid 1, or a command in a live sandbox)."""
        caps = ALL_CAPS if spec.containers else [CAP_NAMES[c] for c in sorted(KEEP_CAPS.values())]
        return {"args": spec.argv, "env": [f"{k}={v}" for k, v in spec.env.items()], "terminal": terminal,
                "cwd": spec.cwd, "user": {"uid": spec.uid, "gid": spec.gid}, "noNewPrivileges": True,
                "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
                "rlimits": [{"type": "RLIMIT_CORE", "hard": 0, "soft": 0}]}

    def oci_config(self, spec: RunSpec, mounts: tuple = ()) -> bytes:
        """mounts: more OCI mounts (a live sandbox's pid 1, gvisor_live.py)."""
        rng = {"containerID": 0, "hostID": self.idmap.uid_base, "size": self.idmap.count}
        grng = {"containerID": 0, "hostID": self.idmap.gid_base, "size": self.idmap.count}
        config = {
            "ociVersion": "1.0.2",
            "process": self.process(spec),
            "root": {"path": "/tmp/r", "readonly": False},
            # runsc puts a private tmpfs on an empty /tmp unless the spec mounts one: bind the
            # image's own, so writes there are part of the result as on every other tier.
            "mounts": [{"destination": "/tmp", "type": "bind", "source": "/tmp/r/tmp",
                        "options": ["rbind", "rw"]}] if self._image_has_dir(spec, "tmp") else [],
            "hostname": spec.hostname,
            "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount", "user")
                                     if t != "network" or spec.netns_fd is None],
                      "uidMappings": [rng], "gidMappings": [grng]},
        }
        # /dev/shm as the namespaces tier has it (helper/mounts.c DEV_SHM_OPTS): gVisor's own is a
        # root-only directory, where no other uid could keep its shell session (engine/sandboxes/session.py)
        config["mounts"] += [{"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                              "options": ["nosuid", "nodev", "mode=1777", "size=64m"]}]
        config["mounts"] += self._runtime_mounts(spec) + list(mounts)
        return json.dumps(config).encode()

    def _runtime_mounts(self, spec: RunSpec) -> list[dict]:
        """Runtime files (helper/runfiles.c wrote them into the scratch's x/, a read-only tmpfs): the
        directory at /dev/sandtree, and resolv.conf over the image's where runsc will find a
        regular file there: the image's own, the helper's mount point where the image has none
        (its lowest layer), or that mount point bound by the helper over an image's link (which
        runsc would follow); not where a layer hides the path otherwise (a whiteout, an opaque or
        linked /etc: runsc would make a mount point in our upper)."""
        if not spec.runtime_files:
            return []
        out = [{"destination": RUNTIME_DIR.rstrip("/"), "type": "bind", "source": "/tmp/x",
                "options": ["rbind", "ro", "nosuid", "nodev", "noexec"]}]
        if RESOLV_CONF in spec.runtime_files and self._image_has_file(spec, RESOLV_CONF.lstrip("/"),
                                                                        missing=True, link=True):
            out.append({"destination": RESOLV_CONF, "type": "bind", "source": "/tmp/x/resolv.conf",
                        "options": ["bind", "ro", "nosuid", "nodev", "noexec"]})
        return out

    def run(self, spec: RunSpec):
        # _start_cold wraps prepare_changes with the bundle's writer: on a copy, so the caller's
        # spec can be run again (it would find the bundle written twice)
        out = super().run(dataclasses.replace(spec))
        if spec.runtime_files and out.changes:
            _drop_mount_point(out.changes)
        return out

    def _image_has_file(self, spec: RunSpec, path: str, *, missing: bool = False, link: bool = False) -> bool:
        """Whether `path` (directly under a top-level dir, e.g. etc/resolv.conf) is a regular file
        of the image (or, if asked, a link itself, or in no layer at all): the top-most layer that
        has it or ends the lookup decides (a whiteout, a link on the way, a non-directory or opaque
        parent: not one). runsc would create a missing bind destination in our upper, so the
        answer must be exact."""
        parent = os.path.dirname(path)
        for layer in spec.layers:
            base = os.path.join(self.layers_dir, layer)
            p = os.path.join(base, path)
            if os.path.lexists(p):
                mode = os.lstat(p).st_mode
                real = os.path.realpath(os.path.dirname(p)) == os.path.abspath(os.path.dirname(p))
                return real and (stat.S_ISREG(mode) or (link and stat.S_ISLNK(mode)))
            d = os.path.join(base, parent)
            if os.path.lexists(d):
                if os.path.islink(d) or not os.path.isdir(d):
                    return False
                try:
                    if os.getxattr(d, opaque_xattr(self.idmap), follow_symlinks=False):
                        return False            # an opaque parent hides the layers below
                except OSError:
                    pass
        return missing                          # in no layer: the helper's lowest layer has it

    def _start_cold(self, spec: RunSpec) -> Started:
        runsc = runsc_path()
        if runsc is None:
            raise RuntimeUnavailable(self.available()[1])
        lim = spec.limits
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        rep_r, rep_w = os.pipe()
        args = [self.helper(), "--sock", str(theirs.fileno()), "--report", str(rep_w),
                "--uid-map", self.idmap.uid_map_line(), "--gid-map", self.idmap.gid_map_line()]
        args += self.run_args(spec)[:-2] + ["--inject", "1", "--exec", "1"]
        extra, rt = network_args(spec)
        args += extra
        config = self.oci_config(spec)
        inject = spec.prepare_changes

        def prepare(upper: str) -> None:
            # The bundle lives in the run's scratch: the store may be under /tmp, hidden there.
            bundle = os.path.join(os.path.dirname(upper), "b")
            os.mkdir(bundle, 0o700)
            with open(os.path.join(bundle, "config.json"), "wb") as f:
                f.write(config)
            if inject:
                inject(upper)
        spec.prepare_changes = prepare
        cg = self.cgroups.create(memory=lim.memory, pids=lim.pids, cpus=lim.cpus)
        for f in cg.procs_files:
            args += ["--cgroup", f]
        flags = RUNSC_FLAGS if spec.netns_fd is None else [NETWORK_FLAG if f == "--network=none" else f
                                                           for f in RUNSC_FLAGS]
        cmd = [runsc, "--root", "/tmp/state", *flags, "run", "--bundle", "/tmp/b", "sandtree"]
        try:
            proc = subprocess.Popen(args + ["--"] + cmd, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                                    close_fds=True, pass_fds=(theirs.fileno(), rep_w, *fds_of(spec, rt)),
                                    stdin=subprocess.PIPE if spec.stdin else subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except BaseException:
            ours.close(); os.close(rep_r); cg.remove()
            raise
        finally:
            theirs.close()
            os.close(rep_w)
            if rt is not None:
                os.close(rt)
        return Started(proc, ours, rep_r, cg, bytearray())

    @staticmethod
    def _kill_sandbox(proc, report_raw: bytearray, cg=None) -> None:
        if cg is not None:
            cg.kill_all()                      # runsc, its sandbox, its gofer: all in the group
        proc.kill()

    def _exit_status(self, proc, report: dict, out: dict) -> tuple[int | None, int | None]:
        rc = proc.wait()
        err = out["stderr"]
        if rc == 128 and re.search(rb"(executable file not found|no such file or directory)", err[-2000:]) \
                and b"starting container" in err[-2000:]:
            if re.search(rb"chdir|working directory|cwd", err[-2000:]):
                raise InvalidInput("working directory does not exist in the image")
            raise CommandNotFound("the command does not exist in the image")
        if out["timed_out"]:
            return None, 9
        if rc > 128:                           # runsc reports a signal death as 128+n
            return None, rc - 128
        if rc < 0:                             # runsc itself killed (output cap, cancel)
            return None, -rc
        return rc, None


def _drop_mount_point(upper: str) -> None:
    """runsc's gofer makes the /dev/sandtree mount point in the root it was given (our overlay),
    so the upper gets dev/ (a copy-up) and dev/sandtree: not the sandbox's change. gVisor's /dev
    is its own tmpfs, so nothing the sandbox writes lands there: both go when empty."""
    for d in ("dev/sandtree", "dev"):
        try:
            os.rmdir(os.path.join(upper, d))
        except OSError:                # not empty (or not there): leave it
            return
