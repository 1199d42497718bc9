"""CRIU, for hibernating live sandboxes: which binary, and the options both halves must agree on.

Debian bookworm's CRIU 3.17 fails on this kernel (../shared/PLATFORM.md), and 4.1 cannot dump an
inet socket on Linux >= 6.16 (getsockopt SO_PASSCRED fails there): a sandbox running any server
could not hibernate. scripts/install-deps unpacks Debian's 4.2 into /opt/sandtree/criu;
SANDTREE_CRIU names another binary.

What a checkpoint holds, and what it does not: the process tree of the sandbox (pid 1 and
everything under it: memory, registers, open files, pipes, sockets, its /dev tmpfs and /dev/shm
contents, the namespaces, except a networked sandbox's link: TCP_LINK below). Not the
filesystem: that is committed to an image first, with the processes frozen, and the resumed
sandbox runs on that image (the upper starts empty again).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import struct
import subprocess
import time

from ..config import criu_binary
from ..errors import RuntimeUnavailable
from ..procid import start_time

MIN_VERSION = (4, 2)
DEFAULT = "/opt/sandtree/criu/criu"

# Shared by dump and restore: bind mounts of host device nodes (/dev/null, ...) are re-bound from
# the host at restore; cgroups are ours (the helper joins them before CRIU runs); file locks are
# part of the state.
COMMON = ["--external", "mnt[]", "--manage-cgroups=ignore", "--file-locks"]
# TCP connections. In a sandbox's own network namespace (no network, or only exposed ports) they
# can only be on its loopback, and are part of the state. A networked sandbox runs in its link, a
# namespace the egress daemon made (owned by the host's user namespace): the dump is taken from
# inside it (in_netns), so the checkpoint holds no namespace and the restore puts the tasks back
# into the link it runs in (helper/restore.c restore_sandbox). A connection cannot come back there: TCP
# repair needs CAP_NET_ADMIN over the link's namespace, which the restoring CRIU (root of a user
# namespace of the sandbox's own) does not hold, and the proxy's end of an outbound one is gone
# anyway. So they are cut: restored closed (reads see EOF or ECONNRESET). Listening sockets come
# back listening.
TCP_OWN = ["--tcp-established"]
TCP_LINK = ["--tcp-close"]
# A live fork's dump leaves the source running: its connections are not put in repair mode, nor
# dumped (--tcp-close skips them), so the source's go on untouched; each child is restored with
# them closed (fork_restore_args), since the peer of each is the source's (or the world's) alone.
# No network lock either: it keeps packets from changing connections while they are dumped, and
# none is; everything inside is frozen, and what reaches a networked source's link meanwhile (its
# exposed ports' veth is removed first) changes only connections the children get closed anyway.
# Locking and unlocking run iptables-restore in its namespace: about 70 ms of the source's stall.
TCP_FORK = ["--tcp-close", "--leave-running", "--network-lock", "skip"]

_found: tuple[str | None, str] | None = None


def find() -> tuple[str | None, str]:
    """(path, "") of a usable criu, or (None, why not)."""
    global _found
    if _found is None:
        _found = _find()
    return _found


def _find() -> tuple[str | None, str]:
    path = criu_binary() or (DEFAULT if os.path.exists(DEFAULT) else shutil.which("criu"))
    if not path:
        return None, "hibernate needs CRIU >= 4.2 (scripts/install-deps installs it in /opt/sandtree/criu)"
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{path} does not run: {exc}"
    m = re.search(r"Version:\s*(\d+)\.(\d+)", out)
    if not m or (int(m[1]), int(m[2])) < MIN_VERSION:
        return None, f"hibernate needs CRIU >= 4.2; {path} is {out.strip() or 'unknown'}"
    return path, ""


def dump_args(criu: str, pid: int, images: str, freezer: str | None, ghost_limit: int,
              owner: int = 0, link: bool = False, leave_running: bool = False) -> list[str]:
    """owner: the uid owning the sandbox's user namespaces (namespace_owner); CRIU runs as it.
    link: the sandbox runs in an egress link (the caller runs this inside it: in_netns).
    leave_running: a live fork's (TCP_FORK)."""
    # ghost files: files the sandbox deleted but holds open are saved whole, up to its disk size
    args = [criu, "dump", "-t", str(pid), "-D", images, "-o", "dump.log", "--ghost-limit", str(ghost_limit)]
    # --unprivileged: CRIU refuses an effective uid other than 0 without it. It holds every
    # capability still; what the option changes for a dump: no cgroup image (we manage cgroups
    # ourselves: --manage-cgroups=ignore), no loginuid (the restored tasks get the engine's, as
    # they had), and no cache of its kernel probe (which as root it keeps only on a tmpfs /run,
    # not this VM's: it probes at every run either way).
    unpriv = ["--unprivileged"] if owner else []
    tcp = TCP_FORK if leave_running else TCP_LINK if link else TCP_OWN
    return as_owner(owner) + args + unpriv + COMMON + tcp \
        + (["--freeze-cgroup", freezer] if freezer else [])


KDAT = "criu-kdat-own"       # beside a live fork's images dir: CRIU's cache of its kernel probe (dump_env)


def dump_env(images: str, leave_running: bool, link: bool = False) -> dict | None:
    """The environment of a dump (None: this process's). A live fork's caches CRIU's kernel probe
    (kerndat: 15-20 ms at every start, inside the source's stall) in KDAT beside its images dir:
    CRIU keeps it only on a tmpfs (so a reboot, a new kernel, clears it), and as --unprivileged
    it looks in $XDG_RUNTIME_DIR. That dir is root's and 0700 (engine/sandboxes/forking.py
    _fork_dir), and every fork's dump runs as the same kind of caller (the sandbox's owner, all
    capabilities, the host's namespaces but the sandbox's own network namespace: NETNS_FRESH),
    so the probe it caches is the one it would make. Hibernations, and forks of a networked
    sandbox (dumped from inside its link, whose probe could differ), probe anew."""
    if not leave_running or link:
        return None
    cache = os.path.join(os.path.dirname(os.path.abspath(images)), KDAT)
    try:
        os.mkdir(cache, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(cache)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        return None
    # (CRIU runs ip, iptables-save and tar by name; nothing else of this process's environment)
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "XDG_RUNTIME_DIR": cache}


def in_netns(fd: int) -> list[str]:
    """The prefix that runs a command in network namespace `fd` (an fd passed to it). CRIU dumps
    the namespaces in which its target differs from CRIU itself: run in the sandbox's link, it
    leaves the link out of the checkpoint (a veth whose peer is the daemon's router could not be
    restored: "Unknown peer net namespace")."""
    path = shutil.which("nsenter", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise RuntimeUnavailable("hibernating a networked sandbox, or forking a live one, needs nsenter (util-linux)")
    return [path, f"--net=/proc/self/fd/{fd}", "--"]


def as_owner(owner: int) -> list[str]:
    """The prefix that runs a command as `owner` (all three uids; gid 0) with every capability
    this process holds. CRIU's dump prlimit()s the sandbox's tasks, which across a user namespace
    needs CAP_SYS_RESOURCE (this VM withholds it from root) unless the caller's euid owns that
    namespace: the kernel gives the owner all capabilities in it. Owners are uids of each
    sandbox's own (helper/main.c), so no other process runs as one. (A restore does not run as the
    owner: helper/restore.c's enter_owned_userns says why and what it does instead.)

    How the capabilities survive: no_setuid_fixup keeps them across the uid change, and after an
    execve with no uid 0 left only the ambient set carries over, so each permitted capability is
    made inheritable and ambient (by number: those this kernel and host give; raising one outside
    the bounding set fails)."""
    if owner == 0:                        # a sandbox started before live namespaces had owners
        return []
    path = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    if path is None:
        raise RuntimeUnavailable("hibernate needs setpriv (util-linux) to run CRIU as the sandbox's owner")
    caps = ",".join(f"+cap_{n}" for n in range(64) if _permitted() >> n & 1)
    return [path, "--securebits=+no_setuid_fixup", f"--inh-caps={caps}", f"--ambient-caps={caps}",
            f"--reuid={owner}", "--keep-groups", "--"]


def _permitted() -> int:
    with open("/proc/self/status") as f:
        return int(next(ln for ln in f if ln.startswith("CapPrm:")).split()[1], 16)


NS_GET_PARENT = 0xB702          # linux/nsfs.h: _IO(0xb7, 0x2)
NS_GET_OWNER_UID = 0xB704       # linux/nsfs.h: _IO(0xb7, 0x4)


def namespace_owner(ns_fd: int) -> int:
    """The uid that owns the chain of user namespaces from ours down to `ns_fd` (an open
    /proc/PID/ns/user): the owner of its topmost ancestor below ours, which is what the kernel
    charges per-user counts to here and what may act in all of them. A resumed sandbox's
    namespace lies in one more, made for its restore (helper/restore.c: enter_owned_userns)."""
    ours = os.stat("/proc/self/ns/user").st_ino
    fd = os.dup(ns_fd)
    try:
        for _ in range(32):                  # the kernel nests user namespaces 32 deep at most
            try:
                parent = fcntl.ioctl(fd, NS_GET_PARENT)
            except PermissionError:          # its parent is not below ours: fd is not ours at all
                break
            if os.fstat(parent).st_ino == ours:
                os.close(parent)
                break
            os.close(fd)
            fd = parent
        buf = bytearray(4)
        fcntl.ioctl(fd, NS_GET_OWNER_UID, buf)
        return struct.unpack("I", buf)[0]
    finally:
        os.close(fd)


FORKED = "forked"            # in a live fork's images dir: restore its children with TCP_FORK's closed ends
# In a live fork's images dir of a sandbox in its own network namespace (not a link): the dump ran
# inside that namespace (in_netns), so the checkpoint holds none, and each child is restored into
# a new one the helper makes (--fresh-net: restore.c fresh_netns). Dumping a namespace and
# restoring it run ip and iptables save/restore: about 45 ms of the source's stall and as much of
# each child's start. Its sockets are in the checkpoint as ever (listening ones listen again; TCP
# connections are cut in the children: TCP_FORK). A hibernation keeps dumping it: its loopback
# connections come back established, under a network lock that needs the namespace dumped.
NETNS_FRESH = "netns-fresh"


def restore_args(criu: str, images: str, root: str, link: bool = False, forked: bool = False) -> list[str]:
    # --leave-stopped: the tasks wait until the sandbox's limits are back (LiveRuntime).
    # --unprivileged: CRIU runs as root of a user namespace of the sandbox's own, not of the
    # host's (helper/restore.c: enter_owned_userns), so what needs the host's capabilities takes the
    # fallbacks this option allows (socket buffers within wmem_max/rmem_max, no tun probe).
    return [criu, "restore", "-D", images, "-o", "restore.log", "--root", root, "--restore-detached",
            "--leave-stopped", "--unprivileged"] + COMMON + (TCP_LINK if link or forked else TCP_OWN)


DUMPER = "criu.pid"          # in the images dir: the pid of the shell that runs a dump (live.py dump)


def dumper_running(images: str) -> bool:
    """Whether the shell that runs the dump into `images` is still there (CRIU kills the tree
    before it exits and the shell writes criu.rc: an engine that finds the sandbox's processes
    gone in between must not judge it lost). A pid is that shell's only while it is alive and
    its cwd is `images` (a later process with its pid would have to be the next dump there)."""
    if os.path.exists(os.path.join(images, "criu.rc")):
        return False
    try:
        with open(os.path.join(images, DUMPER)) as f:
            pid = int(f.read().split()[0])
        here = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, ValueError, IndexError):
        return False
    return here == os.path.realpath(images) and start_time(pid) is not None


def wait_dumper(images: str, timeout: float) -> None:
    """Until the recorded dump into `images` has ended (at most `timeout` seconds)."""
    end = time.monotonic() + timeout
    while dumper_running(images) and time.monotonic() < end:
        time.sleep(0.02)


def dump_finished(images: str) -> bool:
    """Whether a dump into `images` ran to success (the exit status its wrapper recorded)."""
    try:
        with open(os.path.join(images, "criu.rc")) as f:
            return f.read().strip() == "0"
    except OSError:
        return False


def log_tail(images: str, name: str, lines: int = 6) -> str:
    """The errors of a failed dump or restore, for the exception."""
    try:
        with open(os.path.join(images, name), errors="replace") as f:
            errs = [ln.strip() for ln in f if "Error" in ln and "RLIMIT_NOFILE" not in ln]
    except OSError:
        return ""
    return " | ".join(errs[-lines:])
