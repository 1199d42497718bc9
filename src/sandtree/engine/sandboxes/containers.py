"""Containers inside a live sandbox (sandbox_start(containers=True)): Docker's engine from the image, run
on the gVisor tier, where the mounts, namespaces, cgroups and raw sockets it needs are served by gVisor's
kernel (the namespaces tier's seccomp filter rightly refuses them: no containers there).

What gVisor needs for it (its docker-in-gvisor guide, checked with this runsc): runsc --net-raw (bridges
and ARP in its netstack; runtime/gvisor.py CONTAINER_FLAGS), every capability inside, cgroup v1
hierarchies of its own mounted at /sys/fs/cgroup (dockerd wants the devices controller), dockerd with
--iptables=false (gVisor's iptables answer only the legacy interface, which the embedded DNS of Compose
networks uses: the image must select iptables-legacy), and the overlay2 driver on a tmpfs: gVisor's
overlay takes only a tmpfs as its upper. The vfs driver on the sandbox's own root does not work with
this runsc either: its gofer answers lgetxattr of a symlink with EBADF, and vfs copies
security.capability of every file (gVisor's full gofer xattrs came in 2026).

So the engine's data root is memory of the sandbox (it counts against the memory limit; its size is the
sandbox's disk limit), and a commit saves it into the sandbox's filesystem first, as one tar at STATE
(save()): a sandbox started from that image restores it before dockerd starts (start_script). A
hibernation's checkpoint holds the tmpfs, but the restored engine lacks its network devices: it is
started again after a resume or a fork (RESTART_SCRIPT), its running containers stopped. The save and
the starts are execs of the sandbox's own (recorded as such)."""

from __future__ import annotations

import shlex

from ... import defaults as D
from ...errors import InvalidInput, SandboxError

DATA_ROOT = "/var/lib/docker"
STATE = "/var/lib/sandtree-docker.tar"     # the engine's data root as of the last commit
LOG = "/var/log/sandtree-dockerd.log"
NO_ENGINE = 127                             # START's exit code when the image has no dockerd

__all__ = ["DATA_ROOT", "STATE", "LOG", "NO_ENGINE", "RESTART_SCRIPT", "SAVE_SCRIPT", "check_tier", "start_script",
           "start", "restart", "save"]


def check_tier(tier: str | None) -> str:
    """The tier of a containers=True sandbox: gvisor, given or not; namespaces refused, as its seccomp
    filter forbids what an engine inside needs (nested user namespaces, mounts) and stays so."""
    if tier is None:
        return "gvisor"
    if tier != "gvisor":
        raise InvalidInput(f"containers=True needs the gvisor tier, not {tier!r}: a container engine inside "
                           "needs mounts and namespaces, which only gVisor's own kernel serves (the namespaces "
                           "tier's seccomp filter refuses them)", tier=tier)
    return tier


def start_script(size: int, linked: bool = False) -> str:
    """The shell script that starts dockerd in the sandbox (as root), restoring its state first.
    linked: the sandbox joined an egress link (runsc --network=host: its sockets are host sockets in the
    link's namespace, where the Sentry may not make bridges), so dockerd makes no default bridge and
    containers run with --network=host (their connections are the sandbox's, under its policy)."""
    q = shlex.quote
    return f"""set -e
command -v dockerd >/dev/null 2>&1 || {{ echo "the image has no dockerd (install Docker's engine: Debian's docker.io)" >&2; exit {NO_ENGINE}; }}
if ! grep -q ' /sys/fs/cgroup/devices ' /proc/self/mounts; then
  mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
  for c in cpu cpuacct cpuset devices memory pids; do mkdir -p /sys/fs/cgroup/$c; mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c; done
fi
mkdir -p {DATA_ROOT}
grep -q ' {DATA_ROOT} ' /proc/self/mounts || mount -t tmpfs -o size={int(size)},mode=710 dockerdata {DATA_ROOT}
if [ -f {STATE} ] && [ -z "$(ls -A {DATA_ROOT})" ]; then
  tar -C {DATA_ROOT} --xattrs --xattrs-include='*' -xpf {STATE}
  rm -rf {DATA_ROOT}/network            # (see SAVE_SCRIPT)
fi
rm -rf /var/run/docker.pid /run/docker.pid /run/docker /run/containerd
mkdir -p "$(dirname {LOG})"
( setsid dockerd --iptables=false --ip6tables=false --storage-driver=overlay2 --data-root {DATA_ROOT} \\
    {"--bridge=none --ip-forward=false " if linked else ""}</dev/null >{q(LOG)} 2>&1 & )
end=$(( $(date +%s) + {int(D.CONTAINERS_ENGINE_START)} ))
until docker version >/dev/null 2>&1; do
  if grep -q 'failed to start daemon' {LOG} || [ "$(date +%s)" -gt $end ]; then
    sleep 0.5; echo "dockerd did not start:" >&2; grep -E 'level=(error|fatal)|failed to start' {LOG} | tail -n 5 >&2; exit 1
  fi
  sleep 0.25
done
"""


SAVE_SCRIPT = f"""set -e
grep -q ' {DATA_ROOT} ' /proc/self/mounts || exit 0
rc=0
# Not its networks: restored, dockerd fails ("existing interface docker0 is not a bridge": gVisor's
# netlink does not say a link is a bridge); `docker compose up` makes a project's network again.
tar -C {DATA_ROOT} --xattrs --xattrs-include='*' --warning=no-file-ignored --exclude=./network -cpf {STATE}.new . \
  || rc=$?
# 1: a file changed while it was read (a running container's): the rest is kept; 2: a real failure
[ $rc -le 1 ] || exit $rc
mv {STATE}.new {STATE}
"""


# After a resume (or in a fork's child): gVisor restores the engine's processes and its tmpfs, but not the
# network devices they made (a new container fails: "adding interface ... to bridge docker0 failed: Device
# does not exist"), nor a way into the restored containers' namespaces (`docker exec`: setns fails). So the
# engine is started again: its processes killed (they are the engine's: dockerd, containerd, their shims
# and what the shims started), its network state dropped, then START (the data root is still mounted).
RESTART_SCRIPT = """victims=""
for d in /proc/[0-9]*; do
  case "$(cat $d/comm 2>/dev/null)" in dockerd|containerd|containerd-shim*|docker-proxy) victims="$victims ${d#/proc/}";; esac
done
# the shims' children: the containers' first processes (the rest die with their pid namespace)
for d in /proc/[0-9]*; do
  set -- $(sed 's/.*) //' $d/stat 2>/dev/null) x x
  for v in $victims; do [ "$2" = "$v" ] && victims="$victims ${d#/proc/}"; done
done
[ -z "$victims" ] || kill -9 $victims 2>/dev/null || true
sleep 0.5
# the containers' root mounts and the engine's namespace files (nsfs binds under /run/docker)
grep -E ' (""" + DATA_ROOT + """|/run/docker|/var/run/docker)/' /proc/self/mounts | cut -d' ' -f2 | sort -r |
  while read m; do umount -l "$m" || true; done
rm -rf """ + DATA_ROOT + """/network
"""


def start(sandboxes, sid: str, size: int, linked: bool = False) -> None:
    """Start the engine in sandbox `sid` and wait until it answers; a clear error if it cannot."""
    rec = sandboxes.exec(sid, ["/bin/sh", "-c", start_script(size, linked)], uid=0, gid=0,
                         timeout=D.CONTAINERS_ENGINE_START + 30)
    if rec.exit_code == NO_ENGINE:
        raise InvalidInput("containers=True needs an image with Docker's engine (dockerd): "
                           + rec.stderr.decode(errors="replace").strip()[-500:])
    if rec.exit_code != 0:
        raise SandboxError("the container engine did not start in the sandbox: "
                           + (rec.stderr + rec.stdout).decode(errors="replace").strip()[-1500:], sandbox=sid)


def restart(sandboxes, sid: str, size: int, linked: bool = False) -> None:
    """Start the engine again in a restored sandbox (RESTART_SCRIPT): its images, volumes and stopped
    containers are kept; containers that were running are stopped."""
    rec = sandboxes.exec(sid, ["/bin/sh", "-c", RESTART_SCRIPT], uid=0, gid=0, timeout=60)
    if rec.exit_code != 0:
        raise SandboxError("the container engine could not be stopped after the restore: "
                           + rec.stderr.decode(errors="replace").strip()[-1000:], sandbox=sid)
    start(sandboxes, sid, size, linked)


def save(sandboxes, sid: str) -> None:
    """Save the engine's data root into the sandbox's filesystem (STATE), so a commit keeps it."""
    rec = sandboxes.exec(sid, ["/bin/sh", "-c", SAVE_SCRIPT], uid=0, gid=0, timeout=D.CONTAINERS_STATE_SAVE)
    if rec.exit_code != 0:
        raise SandboxError("could not save the container engine's state for the commit (nothing was committed): "
                           + rec.stderr.decode(errors="replace").strip()[-1000:], sandbox=sid)
