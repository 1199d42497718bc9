"""CRIU, for hibernating live sandboxes: which binary, and the options both halves must agree on.

Debian bookworm's CRIU 3.17 fails on this kernel (../shared/PLATFORM.md), and 4.1 cannot dump an
inet socket on Linux >= 6.16 (getsockopt SO_PASSCRED fails there): a sandbox running any server
could not hibernate. scripts/install-deps unpacks Debian's 4.2 into /opt/sandtree/criu;
SANDTREE_CRIU names another binary.

What a checkpoint holds, and what it does not: the process tree of the sandbox (pid 1 and
everything under it: memory, registers, open files, pipes, sockets, its /dev tmpfs and /dev/shm
contents, the namespaces). Not the filesystem: that is committed to an image first, with the
processes frozen, and the resumed sandbox runs on that image (the upper starts empty again).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

MIN_VERSION = (4, 2)
DEFAULT = "/opt/sandtree/criu/criu"

# Shared by dump and restore: bind mounts of host device nodes (/dev/null, ...) are re-bound from
# the host at restore; cgroups are ours (the helper joins them before CRIU runs); connections on
# the sandbox's own loopback and file locks are part of the state.
COMMON = ["--external", "mnt[]", "--manage-cgroups=ignore", "--tcp-established", "--file-locks"]

_found: tuple[str | None, str] | None = None


def find() -> tuple[str | None, str]:
    """(path, "") of a usable criu, or (None, why not)."""
    global _found
    if _found is None:
        _found = _find()
    return _found


def _find() -> tuple[str | None, str]:
    path = os.environ.get("SANDTREE_CRIU") or (DEFAULT if os.path.exists(DEFAULT) else shutil.which("criu"))
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


def dump_args(criu: str, pid: int, images: str, freezer: str | None, ghost_limit: int) -> list[str]:
    # ghost files: files the sandbox deleted but holds open are saved whole, up to its disk size
    args = [criu, "dump", "-t", str(pid), "-D", images, "-o", "dump.log", "--ghost-limit", str(ghost_limit)]
    return args + COMMON + (["--freeze-cgroup", freezer] if freezer else [])


def restore_args(criu: str, images: str, root: str) -> list[str]:
    # --leave-stopped: the tasks wait until the sandbox's limits are back (LiveRuntime)
    return [criu, "restore", "-D", images, "-o", "restore.log", "--root", root, "--restore-detached",
            "--leave-stopped"] + COMMON


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
