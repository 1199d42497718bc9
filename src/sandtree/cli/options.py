"""The flags that describe a command to run, shared by `run`, `exec` and `start`: declared
here once (so the verbs spell them alike) and turned into the engine's keyword arguments here.
The run options (table.options.RunOptions) each have one spelling in RUN_FLAGS; a verb whose row
takes them adds them with add_run_options and reads them back with run_options.

`--file LOCAL:PATH` becomes the engine's `files=` list ({path, content, mode, uid, gid}); a
directory becomes one entry per regular file under it. `--output PATH` collects stdout into a
file that replaces PATH only once the command has ended."""

from __future__ import annotations

import os
import stat
import sys

from ..errors import InvalidInput
from ..hostfiles import local_entries

# ---- declaring the flags ---------------------------------------------------------------------


def add_env(x) -> None:
    x.add_argument("--env", action="append", default=[], metavar="K=V")


def add_user(x) -> None:
    x.add_argument("--uid", type=int, help="user id the command runs as (default 0, the sandbox's root)")
    x.add_argument("--gid", type=int, help="group id the command runs as (default 0)")


def add_tier(x) -> None:
    x.add_argument("--tier", choices=["namespaces", "gvisor"], help="isolation tier (default: the engine's, "
                   "namespaces; gvisor: gVisor's user-space kernel)")


def add_hostname(x) -> None:
    x.add_argument("--hostname", help="the sandbox's host name (default: sandtree)")


def add_files(x, owner: str = "the command's user (--uid/--gid), else root") -> None:
    x.add_argument("--file", action="append", default=[], metavar="LOCAL:PATH", dest="files",
                   help="put a local file (or a directory's whole tree) at PATH in the sandbox first (PATH/: "
                        "into that directory); "
                        f"modes kept, owned by {owner} (repeatable)")


def add_resources(x) -> None:
    """A run's resources: --memory, --pids, --cpus, --disk (default: the engine's)."""
    x.add_argument("--memory", help="memory limit, e.g. 512M, 2G")
    x.add_argument("--pids", type=int, help="most processes at once")
    x.add_argument("--cpus", type=float, help="CPU time, in cores")
    x.add_argument("--disk", help="most bytes written, e.g. 1G")


def resources(args) -> dict:
    return {"memory": args.memory, "pids": args.pids, "cpus": args.cpus, "disk": args.disk}


def add_output(x) -> None:
    x.add_argument("--output", metavar="PATH",
                   help="write the command's stdout to PATH (its bytes, as kept) instead of the terminal")


def add_network(x) -> None:
    x.add_argument("--network", metavar="off|all|RULES",
                   help="outbound network: off (default), all (the public internet), RULES: an allow-list "
                        "like pypi.org,*.pythonhosted.org:443,203.0.113.0/24; inherit: the image's run's")
    x.add_argument("--allow", action="append", default=[], metavar="RULE",
                   help="add RULE to the allow-list (repeatable)")
    x.add_argument("--deny", action="append", default=[], metavar="RULE",
                   help="refuse RULE even when allowed (repeatable; alone: the public internet minus these)")
    x.add_argument("--secret", action="append", default=[], metavar="NAME=VALUE@HOSTS",
                   help="$NAME in the sandbox is a placeholder; requests to HOSTS (comma list) carry VALUE; "
                        "NAME=@FILE@HOSTS reads VALUE from FILE (one trailing newline dropped); NAME alone: the "
                        "stored secret NAME (`sandtree secret set`), NAME@HOSTS: it to fewer hosts (repeatable)")


def _flag(name: str, **kw):
    """An adder of one plain flag (--NAME, the row's meaning in sandtree.vocabulary)."""
    def add(x) -> None:
        x.add_argument(name, **kw)
    return add


# Each run option's one spelling on the command line (RunOptions: what each is), in RunOptions' order. `output` is
# --max-output: `run`'s --output PATH is where its stdout goes. test_conformance_cli holds this table to
# RunOptions.names(), order too: a verb's parser is built without loading the operation table (start-up time).
RUN_FLAGS = {
    "env": add_env,
    "cwd": _flag("--cwd", help="working directory (default: the image's WORKDIR, else /)"),
    "hostname": add_hostname,
    "files": add_files,
    "file_set": _flag("--file-set", metavar="ID", help="put a stored file set's files in first"),
    "tier": add_tier,
    "timeout": _flag("--timeout", type=float, help="seconds of wall clock before a command is killed"),
    "memory": _flag("--memory", help="memory limit, e.g. 512M, 2G"),
    "pids": _flag("--pids", type=int, help="most processes at once"),
    "cpus": _flag("--cpus", type=float, help="CPU time, in cores"),
    "disk": _flag("--disk", help="most bytes written, e.g. 1G"),
    "output": _flag("--max-output", metavar="SIZE", help="bytes of output kept per stream, e.g. 1M (past it the "
                    "command is stopped)"),
    "labels": _flag("--label", action="append", default=[], metavar="KEY=VALUE", dest="labels",
                    help="a label kept with it (repeatable)"),
    "network": add_network,
    "secrets": None,                      # --secret: added with --network (add_network), read by network()
    "record": _flag("--record", action="store_true", default=None,
                    help="keep an egress tape of what the command fetched (needs --network); with --replay: "
                         "requests not on that tape go out and the new tape extends it"),
    "replay": _flag("--replay", metavar="TAPE", help="answer DNS and requests from egress tape TAPE, offline "
                    "(a request not on it fails the run, naming it)"),
}
RUN_OPTIONS = tuple(RUN_FLAGS)           # RunOptions.names()


def add_run_options(x, names=RUN_OPTIONS) -> None:
    """The flags of these run options (all of them by default)."""
    names = set(names)
    if "secrets" in names:
        names.add("network")                               # --secret comes with the network flags
    for n in RUN_OPTIONS:
        if n in names and RUN_FLAGS[n] is not None:
            RUN_FLAGS[n](x)


def run_options(args, names=RUN_OPTIONS) -> dict:
    """The run options given on the command line, as the engine's keyword arguments (absent: the row's default)."""
    out = {}
    for n in names:
        if n == "env":
            out.update({"env": env(args)} if args.env else {})
        elif n == "files":
            out.update({"files": files(args)} if args.files else {})
        elif n == "labels":
            out.update({"labels": pairs(args.labels, "--label")} if args.labels else {})
        elif n == "output":
            out.update(given(args, "max_output") and {"output": args.max_output})
        elif n not in ("network", "secrets"):
            out.update(given(args, n))
    if {"network", "secrets"} & set(names):
        out.update(network(args))
    return out


def pairs(values, flag: str) -> dict:
    """KEY=VALUE values (repeatable flags) as a dict."""
    out = {}
    for kv in values or ():
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise InvalidInput(f"{flag} wants KEY=VALUE, not {kv!r}")
        out[k] = v
    return out


# ---- reading them ----------------------------------------------------------------------------


def command(args, default_ok: bool = False):
    """The command line's command; None when none is given and the verb runs the image's CMD (default_ok)."""
    if not args.cmd:
        if default_ok:
            return None
        raise InvalidInput(f"sandtree {args.command}: no command given (... -- CMD ARGS, or one shell string)")
    return args.cmd[0] if len(args.cmd) == 1 else args.cmd          # one argument: a shell string


def env(args) -> dict:
    out = {}
    for kv in args.env:
        if "=" not in kv:
            raise InvalidInput(f"sandtree {args.command}: --env wants KEY=VALUE, not {kv!r}")
        k, v = kv.split("=", 1)
        out[k] = v
    return out


def given(args, *names) -> dict:
    """The named flags the user gave, as keyword arguments: the engine's defaults stay the only
    defaults (an absent flag is not passed at all)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def files(args) -> list[dict]:
    """--file LOCAL:PATH (repeatable) as the engine's files= entries (hostfiles.local_entries)."""
    owner = given(args, "uid", "gid")             # the files belong to the user the command runs as
    entries: list[dict] = []
    for spec in args.files:
        local, sep, target = spec.rpartition(":")
        if not sep or not local or not target.startswith("/"):
            raise InvalidInput(f"--file wants LOCAL:/ABSOLUTE/PATH, not {spec!r}", file=spec)
        entries += local_entries(local, target, owner=owner, label=f"--file {spec}")
    return entries


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
            import tempfile              # (not at start-up: shutil, bz2, lzma...)
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


def add_quiet(x, run: bool = False) -> None:
    """-q on every verb that makes an image (run, commit, merge, import, pull, build, bootstrap): its stdout
    is the new image's ID alone, so `A=$(sandtree VERB -q ...)` captures it."""
    x.add_argument("-q", "--quiet", action="store_true",
                   help="print only the new image's ID on stdout" + (" (the command's stdout goes to stderr)"
                                                                     if run else ""))


def live_output(args, sink: OutputFile | None):
    """The on_output listener for a run or exec: the command's output on this terminal as it
    comes (stdout left out when it goes to --output); none with --json. With -q the command's stdout
    goes to stderr: this process's stdout holds the new image's ID alone (`A=$(sandtree run -q ...)`)."""
    if args.json:
        return None
    quiet = getattr(args, "quiet", False)

    def show(stream: str, chunk: bytes) -> None:
        if stream == "stdout" and sink is not None:
            return
        f = sys.stdout.buffer if stream == "stdout" and not quiet else sys.stderr.buffer
        f.write(chunk)
        f.flush()
    return show


def network(args) -> dict:
    """--network/--allow/--deny/--secret as the engine's network= and secrets= (only those given)."""
    out = {}
    base = args.network
    if args.allow or args.deny:
        allow = list(args.allow)
        if base is not None and base.strip().lower() in ("all", "on", "public", "internet"):
            allow.append("*")
        elif base is not None and base.strip().lower() not in ("off", "none", ""):
            if base.strip().lower() == "inherit":
                raise InvalidInput("--network inherit cannot be combined with --allow/--deny")
            allow += [r for r in base.split(",") if r.strip()]
        out["network"] = {"allow_out": allow or None, "deny_out": list(args.deny)}
    elif base is not None:
        out["network"] = base
    secrets = {}
    for spec in args.secret:
        if "=" not in spec:                          # NAME or NAME@HOSTS: a stored secret
            name, at, hosts = spec.partition("@")
            secrets[name] = {"stored": True, **({"hosts": [h for h in hosts.split(",") if h]} if at else {})}
            continue
        name, eq, rest = spec.partition("=")
        value, at, hosts = rest.rpartition("@")
        if not eq or not at or not name:
            raise InvalidInput(f"--secret is NAME=VALUE@HOST[,HOST...] or NAME=@FILE@HOSTS, not {spec.split('=')[0]!r}=...")
        if value.startswith("@"):
            try:
                with open(value[1:], encoding="utf-8") as f:
                    value = f.read()
            except OSError as e:
                raise InvalidInput(f"--secret {name}: cannot read {value[1:]}: {e.strerror}") from None
            value = value[:-1] if value.endswith("\n") else value
        secrets[name] = {"value": value, "hosts": [h for h in hosts.split(",") if h]}
    if secrets:
        out["secrets"] = secrets
    return out
