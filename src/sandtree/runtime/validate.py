"""What a valid RunSpec is, checked before any sandbox starts: every tier's validate_spec and
the engine's own checks use these, so bad input gets one clear error whichever tier would run it.
"""

from __future__ import annotations

from ..errors import InvalidInput, TooLarge
from .base import RunSpec
from .runfiles import check_runtime_files

MAX_ENV_BYTES = 256 * 1024


def disk_inodes(disk: int) -> int:
    """The inode cap of a run's scratch: one per 4 KiB of disk (a page, what the smallest
    non-empty file takes there), at least 1024. Without it, a run under disk=1M could create
    50,000 empty files (each a host inode after commit)."""
    return max(disk // 4096, 1024)


def validate_spec(spec: RunSpec) -> None:
    """Bad input gets a clear error before anything starts (shared by every tier and the engine's checks)."""
    lim = spec.limits
    if not spec.argv or not all(isinstance(a, str) and "\0" not in a for a in spec.argv):
        raise InvalidInput("the command must be a non-empty list of strings without NUL bytes")
    if not (lim.timeout > 0):
        raise InvalidInput(f"timeout must be positive, not {lim.timeout}")
    for name in ("memory", "pids", "disk", "output"):
        if getattr(lim, name) <= 0:
            raise InvalidInput(f"{name} must be positive")
    if lim.cpus is not None and lim.cpus <= 0:
        raise InvalidInput("cpus must be positive")
    if lim.memory < (8 << 20):
        raise InvalidInput("memory must be at least 8 MiB")
    size = 0
    for k, v in spec.env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise InvalidInput(f"bad environment variable {k!r}")
        size += len(k) + len(v) + 2
    if size > MAX_ENV_BYTES:
        raise InvalidInput(f"environment too large ({size} bytes; the limit is {MAX_ENV_BYTES})")
    if not spec.cwd.startswith("/") or "\0" in spec.cwd:
        raise InvalidInput(f"cwd must be an absolute path, not {spec.cwd!r}")
    if not spec.hostname or len(spec.hostname) > 64 or not all(c.isalnum() or c in "-." for c in spec.hostname):
        raise InvalidInput(f"bad hostname {spec.hostname!r}")
    for v in (spec.uid, spec.gid):
        if not (0 <= v < 65536):
            raise InvalidInput("uid and gid must be in 0..65535")
    check_files_fit(spec)
    check_runtime_files(spec.runtime_files)
    if spec.netns_fd is not None and (isinstance(spec.netns_fd, bool) or not isinstance(spec.netns_fd, int)
                                      or spec.netns_fd < 0):
        raise InvalidInput(f"netns_fd must be an open file descriptor, not {spec.netns_fd!r}")


def check_files_fit(spec: RunSpec) -> None:
    """Injected files are written into the run's scratch, so they count against its disk (in
    whole pages, as tmpfs counts them) and its inodes: refused here, before any sandbox starts,
    rather than failing half-written inside one."""
    if not spec.files:
        return
    disk = spec.limits.disk
    sizes = [f.size for f in spec.files]
    used = sum(-(-n // 4096) * 4096 for n in sizes)
    if used > disk:
        raise TooLarge(f"files are {sum(sizes)} bytes ({used} in 4 KiB pages), disk is {disk}: "
                       f"ask for more disk", files_bytes=sum(sizes), disk=disk)
    parts = [[p for p in f.path.split("/") if p] for f in spec.files]
    inodes = len(spec.files) + len({tuple(p[:i]) for p in parts for i in range(1, len(p))})
    if inodes > disk_inodes(disk):                     # the files and their parent dirs
        raise TooLarge(f"{len(spec.files)} files and their directories need {inodes} inodes, "
                       f"disk={disk} gives {disk_inodes(disk)}: ask for more disk", inodes=inodes, disk=disk)



def env_args(env: dict) -> list[str]:
    """A command's environment as `--env K=V` options of a spec sent on a pipe (warm helpers)."""
    out: list[str] = []
    for k, v in env.items():
        out += ["--env", f"{k}={v}"]
    return out


def helper_env(env: dict) -> dict:
    """A command's environment as a helper started cold gets it: `_ST_NAME` entries (helper.c
    takes them for the command). The helper is root on the host: nothing a caller or an image's
    config puts in env (LD_PRELOAD, GLIBC_TUNABLES, ...) may be its own environment, and argv
    would show the values to every host user (/proc/PID/cmdline)."""
    return {"_ST_" + k: v for k, v in env.items()}
