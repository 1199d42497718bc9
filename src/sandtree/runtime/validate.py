"""What a valid RunSpec is, checked before any sandbox starts: every tier's validate_spec and
the engine's own checks use these, so bad input gets one clear error whichever tier would run it.
"""

from __future__ import annotations

from .. import defaults as D
from ..errors import InvalidInput, TooLarge
from .base import RunSpec
from .runfiles import check_runtime_files


def disk_inodes(disk: int) -> int:
    """The inode cap of a run's scratch: one per 4 KiB of disk (a page, what the smallest
    non-empty file takes there), at least 1024. Without it, a run under disk=1M could create
    50,000 empty files (each a host inode after commit)."""
    return max(disk // 4096, 1024)


def validate_spec(spec: RunSpec) -> None:
    """Bad input gets a clear error before anything starts (shared by every tier and the engine's checks)."""
    lim = spec.limits
    check_command(spec.argv, D.RUNTIME_ROOM)     # (the engine checked the caller's own without it)
    check_env(spec.env, D.RUNTIME_ROOM)
    if not (lim.timeout > 0):
        raise InvalidInput(f"timeout must be positive, not {lim.timeout}")
    for name in ("memory", "pids", "disk", "output"):
        if getattr(lim, name) <= 0:
            raise InvalidInput(f"{name} must be positive")
    if lim.cpus is not None and lim.cpus <= 0:
        raise InvalidInput("cpus must be positive")
    if lim.memory < (8 << 20):
        raise InvalidInput("memory must be at least 8 MiB")
    if not isinstance(spec.cwd, str) or not spec.cwd.startswith("/") or "\0" in spec.cwd:
        raise InvalidInput(f"cwd must be an absolute path, not {spec.cwd!r}"[:200])
    if _size(spec.cwd, D.PATH_MAX_BYTES, "cwd") > D.PATH_MAX_BYTES:
        raise InvalidInput(f"cwd is longer than {D.PATH_MAX_BYTES} bytes", limit=D.PATH_MAX_BYTES)
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


_MAX_ARG_STRLEN = 128 << 10             # the kernel's cap on one argv/envp string, its NUL included


def _size(s: str, cap: int, what: str) -> int:
    """s's length in bytes as execve gets it (UTF-8; bytes the caller's text could not decode
    kept as surrogate escapes), or any number over cap once it is surely over: a 30 MB string is
    refused by its length alone, never copied."""
    if len(s) > cap:
        return len(s)
    try:
        return len(s.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} is not valid text (a lone surrogate)") from None


def check_command(argv, room: int = 0) -> None:
    """The command's arguments fit what execve takes in the sandbox (defaults.COMMAND_MAX_*):
    beyond it the kernel answers E2BIG, or a helper's spec would not fit; refused here, before
    anything starts, whatever the tier. room: bytes the engine added (defaults.RUNTIME_ROOM)."""
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise InvalidInput("the command must be a non-empty list of strings without NUL bytes")
    max_args, max_bytes = D.COMMAND_MAX_ARGS + room // 256, D.COMMAND_MAX_BYTES + room
    max_arg = D.ARG_MAX_BYTES if not room else _MAX_ARG_STRLEN - 1
    if len(argv) > max_args:
        raise InvalidInput(f"the command has {len(argv)} arguments (at most {D.COMMAND_MAX_ARGS})",
                           limit=D.COMMAND_MAX_ARGS)
    total = 0
    for i, a in enumerate(argv):
        n = _size(a, max_arg, "the command")
        if n > max_arg:
            raise InvalidInput(f"argument {i} of the command is {n} bytes (at most {D.ARG_MAX_BYTES} each)",
                               limit=D.ARG_MAX_BYTES)
        total += n + 1
        if total > max_bytes:
            raise InvalidInput(f"the command is over {D.COMMAND_MAX_BYTES} bytes", limit=D.COMMAND_MAX_BYTES)


def check_env(env, room: int = 0) -> None:
    """The environment fits what execve takes in the sandbox (defaults.ENV_*); names are
    non-empty, without '=' or NUL (NAME=VALUE would split elsewhere), values without NUL.
    room: bytes the engine added (defaults.RUNTIME_ROOM)."""
    if not isinstance(env, dict):
        raise InvalidInput("env must map names to values")
    # (a variable the engine renamed, a shell session's __st_v_NAME, may be longer than the
    # caller's: up to what a cold start's helper takes as _ST_NAME=VALUE)
    max_var = D.ENV_VAR_MAX_BYTES if not room else _MAX_ARG_STRLEN - len("_ST_") - 1
    if len(env) > D.ENV_MAX_VARS + room // 256:
        raise InvalidInput(f"env has {len(env)} variables (at most {D.ENV_MAX_VARS})", limit=D.ENV_MAX_VARS)
    total = 0
    for k, v in env.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or "=" in k or "\0" in k or "\0" in v:
            raise InvalidInput(f"bad environment variable {k!r}"[:200])
        n = _size(k, max_var, "env") + 1 + _size(v, max_var, "env")
        if n > max_var:
            raise InvalidInput(f"environment variable {k[:64]!r} is {n} bytes as NAME=VALUE "
                               f"(at most {D.ENV_VAR_MAX_BYTES} each)", limit=D.ENV_VAR_MAX_BYTES)
        total += n + 1
        if total > D.ENV_MAX_BYTES + room:
            raise InvalidInput(f"the environment is over {D.ENV_MAX_BYTES} bytes", limit=D.ENV_MAX_BYTES)


def too_big_for_execve() -> InvalidInput:
    """What an E2BIG from execve becomes: within the limits above that happens only where the
    engine runs with a stack rlimit under 8 MiB (execve takes a quarter of it); still the
    caller's input, not an internal error."""
    return InvalidInput("the command and its environment are too large for execve on this host "
                        "(its stack limit allows less than the documented limits)")


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
    """A command's environment as a helper started cold gets it: `_ST_NAME` entries (helper/options.c
    takes them for the command). The helper is root on the host: nothing a caller or an image's
    config puts in env (LD_PRELOAD, GLIBC_TUNABLES, ...) may be its own environment, and argv
    would show the values to every host user (/proc/PID/cmdline)."""
    return {"_ST_" + k: v for k, v in env.items()}
