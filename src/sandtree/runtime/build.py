"""Builds the C helpers on first use, each keyed by the hash of its sources: helper/ (every
sandbox start: one file per concern and one header, helper/helper.h, all compiled together),
init.c (pid 1 of a live sandbox: a few hundred bytes, no libc), drain.c (the reader of a live
exec's output, likewise) and agent.c (pid 1 of a live gVisor sandbox)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time

from ..config import inherited_environment
from ..errors import RuntimeUnavailable

HERE = os.path.dirname(__file__)
HELPER_DIR = os.path.join(HERE, "helper")
INIT_SOURCE = os.path.join(HERE, "init.c")
NOLIBC_HEADER = os.path.join(HERE, "nolibc.h")
DRAIN_SOURCE = os.path.join(HERE, "drain.c")
AGENT_SOURCE = os.path.join(HERE, "agent.c")
HOLD_SOURCE = os.path.join(HERE, "hold.c")

# static: no dynamic loader on the start path of every sandbox (a dynamic build if libc.a is missing)
HELPER_FLAGS = (["-O2", "-Wall", "-static"], ["-O2", "-Wall"])
# no libc, no PIE (nothing would relocate it), no padding to pages (-n): it is copied per sandbox
INIT_FLAGS = (["-Os", "-Wall", "-static", "-nostdlib", "-fno-pie", "-no-pie", "-fno-stack-protector",
               "-fno-asynchronous-unwind-tables", "-Wl,--build-id=none", "-Wl,-n", "-s"],)
# (freestanding: the compiler must not turn its loops into calls of strlen or memset)
AGENT_FLAGS = (INIT_FLAGS[0] + ["-ffreestanding", "-fno-tree-loop-distribute-patterns"],)


def helper_sources(directory: str = HELPER_DIR) -> list[str]:
    """sandtree-exec's files: every .c there (compiled together) and its header, by name. All of
    them key the build: a change to any one of them builds a new helper."""
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if n.endswith((".c", ".h"))]


def helper_path(cache_dir: str, directory: str = HELPER_DIR) -> str:
    """sandtree-exec, built from the files in `directory` (tests build a copy)."""
    return _build(cache_dir, helper_sources(directory), "sandtree-exec", HELPER_FLAGS)


def init_path(cache_dir: str) -> str:
    return _build(cache_dir, [INIT_SOURCE, NOLIBC_HEADER], "sandtree-init", INIT_FLAGS)


def drain_path(cache_dir: str) -> str:
    """sandtree-drain: the reader of a live exec's output inside the sandbox (no libc, as init)."""
    return _build(cache_dir, [DRAIN_SOURCE, NOLIBC_HEADER], "sandtree-drain", INIT_FLAGS)


def agent_path(cache_dir: str) -> str:
    """sandtree-agent: pid 1 of a live gVisor sandbox, which starts its commands (agent.c), and
    the holder of a spawned command's stdio inside any live sandbox (hold.c)."""
    return _build(cache_dir, [AGENT_SOURCE, HOLD_SOURCE, NOLIBC_HEADER], "sandtree-agent", AGENT_FLAGS)


def source_tag(files: list[str]) -> str:
    """The build's key: each file's name, size and bytes, in order (a line moved from one file
    to the next, or a file renamed, is another key)."""
    h = hashlib.sha256()
    for p in files:
        with open(p, "rb") as f:
            data = f.read()
        h.update(b"%s\0%d\0" % (os.path.basename(p).encode(), len(data)))
        h.update(data)
    return h.hexdigest()[:12]


def _build(cache_dir: str, files: list[str], name: str, flag_sets: tuple) -> str:
    """Compile the .c files among `files` into one binary, named after all of `files` (the
    headers they include are among them: nolibc.h for init.c, drain.c and agent.c)."""
    tag = source_tag(files)
    sources = [p for p in files if p.endswith(".c")]
    path = os.path.join(cache_dir, f"{name}-{tag}")
    if os.path.exists(path):
        return path
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeUnavailable("a C compiler (cc) is needed once to build the sandbox helper")
    os.makedirs(cache_dir, exist_ok=True)
    _clean_stale(cache_dir)
    # Everything of one build (the output and the compiler's temporary files) is in one
    # directory named after us: a build killed with us leaves only that, removed by the next.
    work = tempfile.mkdtemp(dir=cache_dir, prefix=f"{BUILD_PREFIX}{os.getpid()}-")
    tmp = os.path.join(work, name)
    env = {**inherited_environment(), "TMPDIR": work}
    try:
        for i, flags in enumerate(flag_sets):
            r = subprocess.run(_contained([cc, *flags, "-o", tmp, *sources]), capture_output=True, env=env,
                               preexec_fn=_die_with_us)
            if r.returncode == 0:
                break
            if i == len(flag_sets) - 1:
                raise subprocess.CalledProcessError(r.returncode, r.args, r.stdout, r.stderr)
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
    except subprocess.CalledProcessError as exc:
        raise RuntimeUnavailable(f"building {name} failed: {exc.stderr.decode()[-500:]}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)        # a plain directory of ours: no mounts
    return path


BUILD_PREFIX = ".build-"


def _contained(argv: list[str]) -> list[str]:
    """As root, the compiler runs as pid 1 of a pid namespace of its own (util-linux unshare,
    which dies with us and takes its child along, --kill-child): when that pid 1 dies, the
    kernel kills cc1, as and ld too, so a killed engine leaves no compiler running. Rootless,
    only the driver dies with us (its passes finish their one file and exit)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return argv
    return [unshare, "--pid", "--fork", "--kill-child=SIGKILL", "--", *argv]


def _die_with_us() -> None:
    ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)              # PR_SET_PDEATHSIG, SIGKILL


def _clean_stale(cache_dir: str) -> None:
    """Remove what builds of dead processes left (.build-<pid>-...); an unnamed one from older
    versions once it is an hour old."""
    for n in os.listdir(cache_dir):
        if not n.startswith(BUILD_PREFIX):
            continue
        owner = n[len(BUILD_PREFIX):].split("-", 1)[0]
        p = os.path.join(cache_dir, n)
        try:
            if owner.isdigit():
                if os.path.exists(f"/proc/{owner}"):
                    continue
            elif time.time() - os.lstat(p).st_mtime < 3600:
                continue
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)
        except FileNotFoundError:
            pass
