"""Builds the C helper (helper.c) on first use, keyed by the hash of its source."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

from ..errors import RuntimeUnavailable

SOURCE = os.path.join(os.path.dirname(__file__), "helper.c")


def helper_path(cache_dir: str) -> str:
    with open(SOURCE, "rb") as f:
        src = f.read()
    tag = hashlib.sha256(src).hexdigest()[:12]
    path = os.path.join(cache_dir, f"sandtree-exec-{tag}")
    if os.path.exists(path):
        return path
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeUnavailable("a C compiler (cc) is needed once to build the sandbox helper")
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=".build-")
    os.close(fd)
    try:
        # static: no dynamic loader on the start path of every sandbox
        r = subprocess.run([cc, "-O2", "-Wall", "-static", "-o", tmp, SOURCE], capture_output=True)
        if r.returncode != 0:
            subprocess.run([cc, "-O2", "-Wall", "-o", tmp, SOURCE], check=True, capture_output=True)
        os.chmod(tmp, 0o755)
        os.rename(tmp, path)
    except subprocess.CalledProcessError as exc:
        os.unlink(tmp)
        raise RuntimeUnavailable(f"building the sandbox helper failed: {exc.stderr.decode()[-500:]}") from None
    return path
