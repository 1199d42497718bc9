"""Files of this machine as the engine's `files=` entries ({path, content, mode}), for the
adapters that take local paths (the SDK's files={"/dest": Path}, the CLI's --file LOCAL:PATH).
Everything is read before a command starts, so a missing or unreadable file refuses the command,
not half of it; only regular files and directories are put in (a link could point anywhere on
this machine, a device is not a file)."""

from __future__ import annotations

import os
import stat

from .errors import InvalidInput

__all__ = ["local_entries"]


def local_entries(local: str, target: str, *, owner: dict | None = None, label: str | None = None) -> list[dict]:
    """`local` (a file, or a directory's whole tree) put at absolute `target`; a target ending in
    "/" puts a file into that directory under its own name, as cp does. owner: {"uid", "gid"}
    of the entries (default: the engine's). label: how errors name what the caller gave."""
    label = label or local
    if not isinstance(target, str) or not target.startswith("/"):
        raise InvalidInput(f"a file's path inside the sandbox must be absolute, not {target!r}", file=label)
    try:
        st = os.lstat(local)
    except OSError as exc:
        raise InvalidInput(f"{local!r}: {exc.strerror} (no such local file or directory?)", file=label) from None
    if stat.S_ISDIR(st.st_mode):
        return _tree(local, target, owner or {}, label)
    name = os.path.basename(local) if target.endswith("/") else ""
    return [_entry(local, st, target + name, owner or {}, label)]


def _entry(local: str, st: os.stat_result, target: str, owner: dict, label: str) -> dict:
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise InvalidInput(f"{local!r} is {kind}; only regular files and directories can be put in", file=label)
    try:
        with open(local, "rb") as f:
            content = f.read()
    except OSError as exc:
        raise InvalidInput(f"{local!r}: {exc.strerror}", file=label) from None
    return {"path": target, "content": content, "mode": stat.S_IMODE(st.st_mode), **owner}


def _tree(local: str, target: str, owner: dict, label: str) -> list[dict]:
    out = []
    errors: list[OSError] = []
    for d, dirs, names in os.walk(local, onerror=errors.append):
        dirs.sort()
        rel = os.path.relpath(d, local)
        base = target.rstrip("/") + ("" if rel == "." else "/" + rel.replace(os.sep, "/"))
        for name in sorted(names + [n for n in dirs if os.path.islink(os.path.join(d, n))]):
            p = os.path.join(d, name)
            out.append(_entry(p, os.lstat(p), f"{base}/{name}", owner, label))
    if errors:
        raise InvalidInput(f"{errors[0].filename!r}: {errors[0].strerror}", file=label)
    return out
