"""Builds the C helpers on first use, each keyed by the hash of its source: helper.c (every
sandbox start), init.c (pid 1 of a live sandbox: a few hundred bytes, no libc) and drain.c (the
reader of a live exec's output, likewise)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from ..errors import RuntimeUnavailable

HERE = os.path.dirname(__file__)
SOURCE = os.path.join(HERE, "helper.c")
INIT_SOURCE = os.path.join(HERE, "init.c")
DRAIN_SOURCE = os.path.join(HERE, "drain.c")

# static: no dynamic loader on the start path of every sandbox (a dynamic build if libc.a is missing)
HELPER_FLAGS = (["-O2", "-Wall", "-static"], ["-O2", "-Wall"])
# no libc, no PIE (nothing would relocate it), no padding to pages (-n): it is copied per sandbox
INIT_FLAGS = (["-Os", "-Wall", "-static", "-nostdlib", "-fno-pie", "-no-pie", "-fno-stack-protector",
               "-fno-asynchronous-unwind-tables", "-Wl,--build-id=none", "-Wl,-n", "-s"],)


def helper_path(cache_dir: str) -> str:
    return _build(cache_dir, SOURCE, "sandtree-exec", HELPER_FLAGS)


def init_path(cache_dir: str) -> str:
    return _build(cache_dir, INIT_SOURCE, "sandtree-init", INIT_FLAGS)


def drain_path(cache_dir: str) -> str:
    """sandtree-drain: the reader of a live exec's output inside the sandbox (no libc, as init)."""
    return _build(cache_dir, DRAIN_SOURCE, "sandtree-drain", INIT_FLAGS)


def _build(cache_dir: str, source: str, name: str, flag_sets: tuple) -> str:
    with open(source, "rb") as f:
        src = f.read()
    tag = hashlib.sha256(src).hexdigest()[:12]
    path = os.path.join(cache_dir, f"{name}-{tag}")
    if os.path.exists(path):
        return path
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeUnavailable("a C compiler (cc) is needed once to build the sandbox helper")
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".build-")
    os.close(fd)
    try:
        for i, flags in enumerate(flag_sets):
            r = subprocess.run([cc, *flags, "-o", tmp, source], capture_output=True)
            if r.returncode == 0:
                break
            if i == len(flag_sets) - 1:
                raise subprocess.CalledProcessError(r.returncode, r.args, r.stdout, r.stderr)
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
    except subprocess.CalledProcessError as exc:
        os.unlink(tmp)
        raise RuntimeUnavailable(f"building {name} failed: {exc.stderr.decode()[-500:]}") from None
    return path
