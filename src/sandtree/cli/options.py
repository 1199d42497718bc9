"""The flags that describe a command to run, shared by `run`, `exec` and `start`: declared
here once (so the verbs spell them alike) and turned into the engine's keyword arguments here.

`--file LOCAL:PATH` becomes the engine's `files=` list ({path, content, mode, uid, gid}); a
directory becomes one entry per regular file under it. `--output PATH` collects stdout into a
file that replaces PATH only once the command has ended."""

from __future__ import annotations

import os
import stat
import sys
import tempfile

from ..errors import InvalidInput

# ---- declaring the flags ---------------------------------------------------------------------


def add_env(x) -> None:
    x.add_argument("--env", action="append", default=[], metavar="K=V")


def add_user(x) -> None:
    x.add_argument("--uid", type=int, help="user id the command runs as (default 0, the sandbox's root)")
    x.add_argument("--gid", type=int, help="group id the command runs as (default 0)")


def add_hostname(x) -> None:
    x.add_argument("--hostname", help="the sandbox's host name (default: sandtree)")


def add_files(x, owner: str = "root") -> None:
    x.add_argument("--file", action="append", default=[], metavar="LOCAL:PATH", dest="files",
                   help="put a local file (or a directory's whole tree) at PATH in the sandbox first (PATH/: "
                        "into that directory); "
                        f"modes kept, owned by {owner} (repeatable)")


def add_output(x) -> None:
    x.add_argument("--output", metavar="PATH",
                   help="write the command's stdout to PATH (its bytes, as kept) instead of the terminal")


# ---- reading them ----------------------------------------------------------------------------


def command(args):
    if not args.cmd:
        raise SystemExit(f"sandtree {args.command}: no command given (... -- CMD ARGS, or one shell string)")
    return args.cmd[0] if len(args.cmd) == 1 else args.cmd          # one argument: a shell string


def env(args) -> dict:
    out = {}
    for kv in args.env:
        if "=" not in kv:
            raise SystemExit(f"sandtree {args.command}: --env wants KEY=VALUE, not {kv!r}")
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def given(args, *names) -> dict:
    """The named flags the user gave, as keyword arguments: the engine's defaults stay the only
    defaults (an absent flag is not passed at all)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def files(args) -> list[dict]:
    """--file LOCAL:PATH (repeatable) as the engine's files= entries. Everything is read before
    the command starts, so a missing or unreadable local file refuses the command, not half of it."""
    owner = given(args, "uid", "gid")             # the files belong to the user the command runs as
    entries: list[dict] = []
    for spec in args.files:
        local, sep, target = spec.rpartition(":")
        if not sep or not local or not target.startswith("/"):
            raise InvalidInput(f"--file wants LOCAL:/ABSOLUTE/PATH, not {spec!r}", file=spec)
        try:
            st = os.lstat(local)
        except OSError as exc:
            raise InvalidInput(f"--file {local!r}: {exc.strerror}", file=spec) from None
        if stat.S_ISDIR(st.st_mode):
            entries.extend(_tree(local, target, owner, spec))
        else:                                     # PATH/ : into that directory, as cp does
            name = os.path.basename(local) if target.endswith("/") else ""
            entries.append(_entry(local, st, target + name, owner, spec))
    return entries


def _entry(local: str, st: os.stat_result, target: str, owner: dict, spec: str) -> dict:
    if not stat.S_ISREG(st.st_mode):
        # the engine injects regular files only: a link or device is refused, not copied as something else
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise InvalidInput(f"--file {local!r} is {kind}; only regular files and directories can be put in",
                           file=spec)
    try:
        with open(local, "rb") as f:
            content = f.read()
    except OSError as exc:
        raise InvalidInput(f"--file {local!r}: {exc.strerror}", file=spec) from None
    return {"path": target, "content": content, "mode": stat.S_IMODE(st.st_mode), **owner}


def _tree(local: str, target: str, owner: dict, spec: str) -> list[dict]:
    out = []
    errors: list[OSError] = []
    for d, dirs, names in os.walk(local, onerror=errors.append):
        dirs.sort()
        rel = os.path.relpath(d, local)
        base = target.rstrip("/") + ("" if rel == "." else "/" + rel.replace(os.sep, "/"))
        for name in sorted(names + [n for n in dirs if os.path.islink(os.path.join(d, n))]):
            p = os.path.join(d, name)
            out.append(_entry(p, os.lstat(p), f"{base}/{name}", owner, spec))
    if errors:
        raise InvalidInput(f"--file {errors[0].filename!r}: {errors[0].strerror}", file=spec)
    return out


class OutputFile:
    """--output PATH. The bytes are written to a temporary file beside PATH and renamed over it
    when the command has ended, so a refused or failed command leaves PATH as it was. The file
    is made before the command starts: a path that cannot be written refuses the command."""

    def __init__(self, path: str):
        if os.path.isdir(path):
            raise InvalidInput(f"--output {path!r} is a directory", output=path)
        try:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask                  # what `> PATH` would make
        except OSError as exc:
            raise InvalidInput(f"--output {path!r}: {exc.strerror}", output=path) from None
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=".sandtree-output-", dir=os.path.dirname(os.path.abspath(path)))
        except OSError as exc:
            raise InvalidInput(f"--output {path!r}: {exc.strerror}", output=path) from None
        os.fchmod(fd, mode)
        self.file = os.fdopen(fd, "wb")
        self.path = path

    def keep(self, data: bytes) -> None:
        try:
            with self.file:
                self.file.write(data)
            os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        self.file.close()
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def live_output(args, sink: OutputFile | None):
    """The on_output listener for a run or exec: the command's output on this terminal as it
    comes (stdout left out when it goes to --output); none with --json."""
    if args.json:
        return None

    def show(stream: str, chunk: bytes) -> None:
        if stream == "stdout" and sink is not None:
            return
        f = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
        f.write(chunk)
        f.flush()
    return show
