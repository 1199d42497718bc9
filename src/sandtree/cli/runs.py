"""`sandtree run` (one command on an image; a new image from what it wrote) and `sandtree fork`
(several commands on one image at once; --live: a running sandbox's live fork), and how a run's result is reported, which `exec`
shares: the exit status is the command's (128+N for a signal, 124 on timeout)."""

from __future__ import annotations

import json
import sys

from .. import defaults as D
from ..errors import InvalidInput
from . import exits, options
from .output import open_engine, out

# The run options `run` spells through options.RUN_FLAGS alone (the others it declares above, with its own help)
RUN_MORE = ("file_set", "output", "labels", "record", "replay")


def cmd_run(args):
    eng = open_engine(args)
    command = options.command(args, default_ok=True)          # none: the image's ENTRYPOINT + CMD
    stdin = sys.stdin.buffer.read() if args.stdin else None
    files = options.files(args)
    sink = options.OutputFile(args.output) if args.output else None
    try:
        try:
            rec = eng.run(args.image, command, env=options.env(args), cwd=args.cwd, stdin=stdin,
                          disposable=args.disposable, timeout=args.timeout, memory=args.memory, pids=args.pids,
                          cpus=args.cpus, disk=args.disk, tier=args.tier, on_output=options.live_output(args, sink),
                          **({"files": files} if files else {}), **options.given(args, "uid", "gid", "hostname", "retries"),
                          **options.network(args), **options.run_options(args, RUN_MORE))
        finally:
            eng.close()          # waits for the run's helper to be reaped and its cgroups removed
    except BaseException:
        if sink is not None:
            sink.discard()
        raise
    return report_run(args, rec, sink)


def report_run(args, rec, sink: options.OutputFile | None = None) -> int:
    """Print a run's (or an exec's) result; the exit status the CLI should end with. With
    --output the stdout bytes go to that file (and the JSON names it, its "stdout" empty)."""
    if sink is not None:
        sink.keep(rec.stdout)
    if args.json:
        doc = {"image": rec.image, "source": rec.source, "exit_code": rec.exit_code,
               "signal": rec.signal, "stdout": "" if sink else rec.stdout.decode("utf-8", "replace"),
               "stderr": rec.stderr.decode("utf-8", "replace"),
               "stdout_truncated": rec.stdout_truncated, "stderr_truncated": rec.stderr_truncated,
               "timed_out": rec.timed_out, "oom_killed": rec.oom_killed, "usage": rec.usage,
               "operation": rec.op}
        if sink is not None:
            doc["stdout_file"] = sink.path
        print(json.dumps(doc))
    else:
        notes = []
        if rec.timed_out:
            notes.append("timed out")
        if rec.oom_killed:
            notes.append("out of memory")
        if rec.stdout_truncated or rec.stderr_truncated:
            notes.append("output truncated")
        # run: the new image's ID on stdout, last (after the command's own output); -q: the ID alone
        if notes:
            print(f"[{', '.join(notes)}]", file=sys.stderr)
        if args.command == "run" and args.quiet:
            if rec.image:
                print(rec.image)
        elif args.command == "run":
            sys.stdout.flush()
            print(f"image: {rec.image or '(disposable)'}")
        if rec.usage.get("tape") and not (args.command == "run" and args.quiet):
            print(f"tape: {rec.usage['tape']}", file=sys.stderr)      # (--record: what `--replay` takes)
    return exits.of_run(rec)


def cmd_fork(args):
    eng = open_engine(args)
    if args.live:
        return fork_live(args, eng)
    if args.n is not None:
        raise InvalidInput("sandtree fork: -n is the number of children of a live fork (--live SANDBOX); "
                           "an image's branches are its --cmd commands")
    if not args.cmd:
        raise InvalidInput("sandtree fork: give commands with --cmd (one per branch)")
    recs = eng.fork(args.image, args.cmd, parallel=args.parallel, timeout=args.timeout)
    rows = [{"command": c, "image": r.image, "exit_code": r.exit_code, "timed_out": r.timed_out,
             "stdout": r.stdout.decode("utf-8", "replace"), "stderr": r.stderr.decode("utf-8", "replace")}
            for c, r in zip(args.cmd, recs, strict=False)]
    out(args, rows, lambda rs: [print(f"{(r['image'] or '-')[:12]}  exit {r['exit_code']}  {r['command']}")
                                for r in rs])


def fork_live(args, eng) -> None:
    """`sandtree fork --live SID -n N`: the engine's sandbox_fork, as `sandtree sandbox fork` (the
    table's verb) prints it."""
    if args.cmd:
        raise InvalidInput("sandtree fork --live: the children continue the sandbox's own processes; "
                           "--cmd is for forking an image")
    try:
        kids = eng.sandbox_fork(args.image, 1 if args.n is None else args.n)
    finally:
        eng.close()
    out(args, kids, lambda ks: [print(f"{k['id']}  {k['state']}") for k in ks])


def add_run(sub, common) -> None:
    x = sub.add_parser("run", parents=[common], help="run a command on an image; prints the new image")
    x.add_argument("image")
    options.add_quiet(x, run=True)
    x.add_argument("--timeout", type=float)
    options.add_resources(x)
    options.add_env(x)
    x.add_argument("--cwd", help="working directory (default: the image's WORKDIR, else /)")
    x.add_argument("--stdin", action="store_true", help="pass this process's stdin to the command")
    x.add_argument("--disposable", action="store_true", help="do not keep the resulting image")
    x.add_argument("--retries", type=int, help="on a cluster: run it again on another node up to N times if "
                                               "its node is lost before it committed (default 0)")
    options.add_tier(x)
    options.add_user(x)
    options.add_hostname(x)
    options.add_network(x)
    options.add_files(x, owner="--uid/--gid")
    options.add_output(x)
    options.add_run_options(x, RUN_MORE)
    x.add_argument("cmd", nargs="*", help="-- CMD ARGS... (one argument: a shell string; none: the image's "
                                          "ENTRYPOINT and CMD)")
    x.set_defaults(fn=cmd_run, takes_command=True, error_status=exits.ERROR_IN_COMMAND)


def add_fork(sub, common) -> None:
    x = sub.add_parser("fork", parents=[common], help="run several commands from one image concurrently; "
                                                       "--live: fork a running live sandbox")
    x.add_argument("image", help="an image (or, with --live, a running live sandbox)")
    x.add_argument("--cmd", action="append", default=[])
    x.add_argument("--live", action="store_true",
                   help="IMAGE is a running live sandbox: N live sandboxes continue from its processes, memory "
                        "and files as they are now, while it runs on (as `sandtree sandbox fork`)")
    x.add_argument("-n", type=int, help="with --live: how many children (default 1)")
    x.add_argument("--parallel", type=int, default=D.CLI_FORK_PARALLEL); x.add_argument("--timeout", type=float)
    x.set_defaults(fn=cmd_fork)
