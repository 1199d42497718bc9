"""What a run is made of: the builder that turns a caller's options (limits, files, cwd,
command) into the pieces of a runtime RunSpec, and the id map a store defaults to.

The parts (runs, live sandboxes, pools, operations) import this module and values.py, never
engine/core.py: the engine constructs one RunSpecs and hands it to each part. Where the rows of what ran are
written is records.py; the runtime's own types are runtime/base.py.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Callable

from ... import defaults as D
from ...errors import InvalidInput, NotFound, PathEscape
from ...runtime.base import InjectedFile, Limits
from ...store import inspect
from ...store.layers import IdMap
from ...store.objects import DIR
from ...store.store import Store
from ...values import parse_size

def default_idmap() -> IdMap:
    if os.geteuid() == 0:
        return IdMap(100000, 100000, 65536)
    return IdMap(os.geteuid(), os.getegid(), 1)


def injected_file(f, blob_path: Callable[[str], str] | None = None) -> InjectedFile:
    """A file to inject, from the public dict form; blob_path(sha256) says where an upload is."""
    if isinstance(f, InjectedFile):
        return f
    if isinstance(f, dict):
        source = None
        if "sha256" in f and blob_path is not None:
            content, source = b"", blob_path(f["sha256"])
        else:
            content = f.get("content", b"")
        if isinstance(content, str):
            content = content.encode()
        mode = f.get("mode", 0o644)
        try:
            mode, uid, gid = int(mode, 8) if isinstance(mode, str) else int(mode), int(f.get("uid", 0)), int(f.get("gid", 0))
        except (TypeError, ValueError, OverflowError):
            raise InvalidInput("a file's mode is octal permission bits, its uid and gid integers") from None
        # (mode 10**30 was "Python int too large to convert to C int", an internal failure; uid -1 a chown that kept root's)
        if not 0 <= mode <= 0o7777 or not 0 <= uid < 65536 or not 0 <= gid < 65536:
            raise InvalidInput(f"a file's mode is 0 to 0o7777 and its uid and gid 0 to 65535, not "
                               f"{mode}, {uid}, {gid}"[:200], path=str(f.get("path"))[:200])
        return InjectedFile(str(f["path"]), content, mode, uid, gid, source)
    raise InvalidInput("a file to inject is {'path': ..., 'content' or 'sha256': ..., 'mode': ..., 'uid': ..., 'gid': ...}")


def command_argv(command) -> list[str]:
    """A shell string runs through /bin/sh -c; a list is the argv itself."""
    if isinstance(command, str):
        if not command.strip():
            raise InvalidInput("empty command")
        return ["/bin/sh", "-c", command]
    if isinstance(command, (list, tuple)) and command:
        return [str(a) for a in command]
    raise InvalidInput("command must be a shell string or a non-empty list of arguments")


def check_bound(name: str, value) -> None:
    """A limit the kernel can take: finite and at most defaults.LIMITS_MAX (pids 11885755610 was
    EINVAL from pids.max, cpus 1e16 ERANGE from the CFS quota, timeout Infinity an answer JSON
    cannot carry). Whether it is positive is validate_spec's (runtime/validate.py)."""
    top = D.LIMITS_MAX.get(name)
    if top is None or isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number, not {value}")
    if value > top:
        raise InvalidInput(f"{name} must be at most {top}, not {value}", **{name: str(value)[:40], "max": top})


def check_duration(name: str, value, *, zero: bool = False) -> float:
    """Seconds a caller gives (an idle timeout, a lifetime, a wait): a finite number, more than 0
    (or 0 with zero=True) and at most defaults.DURATION_MAX."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (0 <= value if zero else 0 < value) and value <= D.DURATION_MAX
    if not ok:
        raise InvalidInput(f"{name} must be a number of seconds {'from 0' if zero else 'more than 0'} "
                           f"to {D.DURATION_MAX}, not {value!r}"[:200])
    return float(value)


def _parts(path: str) -> list[str]:
    # one path rule for images: the one store/inspect.py resolves with (.. may not leave the root)
    return inspect.split_path(path)


class RunSpecs:
    """Turns what a caller passed into checked pieces of a RunSpec. Constructed once by the
    engine (store, default limits, where uploads and file sets are) and shared by every part
    that starts sandboxes: runs, live sandboxes, pools."""

    def __init__(self, store: Store, default_limits: Limits, blob_path: Callable[[str], str],
                 file_set: Callable[[str], list[dict]]):
        self.store = store
        self.default_limits = default_limits
        self.blob_path = blob_path
        self.file_set = file_set

    def limits(self, given: dict) -> Limits:
        """Limits from options (None: the default); unknown names refused."""
        unknown = set(given) - set(Limits.__dataclass_fields__)
        if unknown:
            raise InvalidInput(f"unknown option(s): {', '.join(sorted(unknown))}")
        vals = {k: v for k, v in given.items() if v is not None}
        for k in ("memory", "disk", "output"):
            if k in vals:
                vals[k] = parse_size(vals[k])
        for k in ("timeout", "cpus"):
            if k in vals:
                try:
                    vals[k] = float(vals[k])
                except (TypeError, ValueError, OverflowError):
                    raise InvalidInput(f"{k} must be a number") from None
        if "pids" in vals:
            try:
                vals["pids"] = int(vals["pids"])
            except (TypeError, ValueError, OverflowError):
                raise InvalidInput("pids must be an integer") from None
        for k, v in vals.items():
            check_bound(k, v)
        return Limits(**{**self.default_limits.__dict__, **vals})

    def file(self, f) -> InjectedFile:
        return injected_file(f, self.blob_path)

    def files(self, files, file_set: str | None) -> list[InjectedFile]:
        """The files a run injects: a file set's first, then the run's own (later ones win)."""
        injected = [self.file(f) for f in (files or [])]
        if file_set is not None:
            injected = [self.file(f) for f in self.file_set(file_set)] + injected
        return injected

    def root_meta(self, image: str) -> tuple[int, int, int]:
        root = self.store.tree(image)["."]
        return (root.mode, root.uid, root.gid)

    def check_cwd(self, source: str, cwd: str, injected: list[InjectedFile]) -> None:
        """The working directory must exist in the image (or be made by an injected file's
        parents): checked here, so every tier refuses it the same way (runsc would create it)."""
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}"[:200])
        if len(cwd) > D.PATH_MAX_BYTES or "\0" in cwd:    # (before a walk of its parts)
            raise InvalidInput(f"cwd must be a path of at most {D.PATH_MAX_BYTES} bytes without NUL",
                               limit=D.PATH_MAX_BYTES)
        try:
            e = inspect.resolve(self.store, source, cwd)[1]
        except (NotFound, PathEscape):
            e = None
        if e is not None and e.kind == DIR:
            return
        norm = "/" + "/".join(_parts(cwd))
        if any(("/" + "/".join(_parts(f.path))).startswith(norm.rstrip("/") + "/") for f in injected):
            return
        raise InvalidInput(f"working directory {cwd!r} does not exist in the image", cwd=cwd)

    def injector(self, source: str, injected: list[InjectedFile]):
        """RunSpec.prepare_changes for these files (None if there are none)."""
        if not injected:
            return None
        return lambda upper: self.inject(source, upper, injected)

    def inject(self, source: str, upper: str, files: list[InjectedFile]) -> None:
        """Write injected files into the fresh upper, parents copied from the image's metadata."""
        idmap = self.store.idmap
        for f in files:
            parts = _parts(f.path)
            if not parts:
                raise InvalidInput(f"cannot inject a file at {f.path!r}")
            tree = self.store.tree(source)
            host = upper
            for i, part in enumerate(parts[:-1]):
                e = tree.get(part) if tree is not None else None
                host = os.path.join(host, part)
                if e is not None and e.kind != DIR:
                    raise PathEscape(f"cannot inject {f.path!r}: /{'/'.join(parts[:i + 1])} is not a directory")
                if not os.path.isdir(host):
                    os.mkdir(host)
                    if e is not None:
                        os.lchown(host, idmap.host_uid(e.uid), idmap.host_gid(e.gid))
                        os.chmod(host, e.mode)
                    else:
                        os.lchown(host, idmap.host_uid(0), idmap.host_gid(0))
                        os.chmod(host, 0o755)
                tree = self.store.tree(e.ref) if e is not None else None
            target = os.path.join(host, parts[-1])
            e = tree.get(parts[-1]) if tree is not None else None
            if e is not None and e.kind == DIR:
                raise InvalidInput(f"cannot inject {f.path!r}: it is a directory in the image")
            with open(target, "wb") as out:
                if f.source is None:
                    out.write(f.content)
                else:                    # streamed: an upload may be bigger than memory allows
                    with open(f.source, "rb") as src:
                        shutil.copyfileobj(src, out, 1 << 20)
            os.lchown(target, idmap.host_uid(f.uid), idmap.host_gid(f.gid))
            os.chmod(target, f.mode)
