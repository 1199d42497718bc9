"""`spawn` and `proc`: processes started in a live sandbox (or a live run) without waiting, on a
`sandtree serve` (--server URL): a spawned process lives with the engine that started it, so a
one-shot CLI process cannot hold one (`sandtree exec` runs one to its exit locally)."""

from __future__ import annotations

import sys
import time

from . import exits, options
from .output import out, remote_engine
from ..errors import InvalidInput


def _server(args):
    if not args.server:
        raise InvalidInput(f"`sandtree {args.command}` needs --server URL: a spawned process lives with the "
                           "engine that started it (a one-shot command cannot hold it; `sandtree exec` runs one "
                           "to its exit)")
    return remote_engine(args.server)


def cmd_spawn(args):
    eng = _server(args)
    stdin = sys.stdin.buffer.read() if args.stdin else None
    pid = eng.sandbox_spawn(args.sandbox, options.command(args), env=options.env(args) or None, cwd=args.cwd,
                            stdin=stdin, stdin_open=args.stdin_open, tag=args.tag, user=args.user,
                            **options.given(args, "uid", "gid"))
    out(args, {"sandbox": args.sandbox, "pid": pid}, lambda o: print(o["pid"]))


def cmd_procs(args):
    """The processes spawned in a sandbox of a server (they live with the engine that started them)."""
    def human(rows):
        for r in rows:
            state = "running" if r["running"] else (f"exit {r['exit_code']}" if r["exit_code"] is not None
                                                    else f"signal {r['signal']}")
            tag = f"  [{r['tag']}]" if r.get("tag") else ""
            print(f"{r['pid']:>4}  {state:<10} {r['command']}{tag}")
    out(args, _server(args).sandbox_processes(args.sandbox), human)


def cmd_proc(args):
    """Write (--write TEXT, --close), signal (--signal), then print the process's state and output
    (--wait SECONDS: once it has exited, at most that long)."""
    eng = _server(args)
    if args.write is not None or args.close:
        eng.sandbox_stdin(args.sandbox, args.pid, (args.write or "").encode(), close=args.close)
    if args.signal:
        eng.sandbox_signal(args.sandbox, args.pid, args.signal)
    end = time.monotonic() + (args.wait or 0)
    while (v := eng.sandbox_process(args.sandbox, args.pid))["running"] and time.monotonic() < end:
        time.sleep(0.05)

    def human(o):
        sys.stdout.write(o["stdout"])
        sys.stderr.write(o["stderr"])
        state = "running" if o["running"] else (f"exit {o['exit_code']}" if o["exit_code"] is not None
                                                 else f"signal {o['signal']}")
        print(f"[process {o['pid']}: {state}]", file=sys.stderr)
    out(args, v, human)
    return exits.OK if v["running"] or v["exit_code"] == 0 else exits.NO


def add_processes(sub, common) -> None:
    x = sub.add_parser("spawn", parents=[common], help="start a process in a live sandbox (or a live run's "
                       "operation) on a server without waiting; prints its pid")
    x.add_argument("sandbox")
    x.add_argument("--server", metavar="URL", help="the `sandtree serve` that runs the sandbox (token: SANDTREE_TOKEN)")
    options.add_env(x)
    x.add_argument("--cwd")
    options.add_user(x)
    x.add_argument("--stdin", action="store_true", help="pass this process's stdin to it first")
    x.add_argument("--stdin-open", action="store_true", help="keep its stdin open for `sandtree proc --write`")
    x.add_argument("--tag", help="a name to find it by (`sandtree procs`)")
    x.add_argument("--user", help="run as this user of the image's /etc/passwd (NAME or NAME:GROUP)")
    x.add_argument("cmd", nargs="*", help="-- CMD ARGS... (one argument: a shell string)")
    x.set_defaults(fn=cmd_spawn, takes_command=True)
    x = sub.add_parser("proc", parents=[common], help="a spawned process: write its stdin, signal it, show its "
                       "state and output")
    x.add_argument("sandbox")
    x.add_argument("pid", type=int)
    x.add_argument("--server", metavar="URL", help="the `sandtree serve` that runs the sandbox (token: SANDTREE_TOKEN)")
    x.add_argument("--write", metavar="TEXT", help="write TEXT to its open stdin")
    x.add_argument("--close", action="store_true", help="close its stdin (after --write)")
    x.add_argument("--signal", metavar="SIG", help="signal its process group (TERM, KILL, a number)")
    x.add_argument("--wait", type=float, metavar="SECONDS", help="wait until it exits, at most this long")
    x.set_defaults(fn=cmd_proc)
    x = sub.add_parser("procs", parents=[common], help="the processes spawned in a live sandbox on a server")
    x.add_argument("sandbox")
    x.add_argument("--server", metavar="URL", help="the `sandtree serve` that runs the sandbox (token: SANDTREE_TOKEN)")
    x.set_defaults(fn=cmd_procs)
