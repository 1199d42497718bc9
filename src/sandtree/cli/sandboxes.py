"""Live sandboxes: `start`, `exec`, `stop`, `network`, `hibernate`, `resume`, `commit`, `ps`, `port`, `shell` and
`sandbox ...` (its files, state, timeout and `sandbox watch`). The verbs of one operation each are made from their rows
(derive.py); `exec` (a command's output and status), `network` (the policy flags), `port` (expose, list, sign) and
`shell` (the terminal side: terminal.py) are written here."""

from __future__ import annotations

import json
import sys

from . import derive, exits, options
from .output import open_engine, out
from .runs import report_run
from .terminal import interactive
from ..errors import InvalidInput, SandtreeError


def cmd_exec(args):
    eng = open_engine(args)
    stdin = sys.stdin.buffer.read() if args.stdin else None
    command = options.command(args)
    sink = options.OutputFile(args.output) if args.output else None
    try:
        rec = eng.sandbox_exec(args.sandbox, command, env=options.env(args), cwd=args.cwd, stdin=stdin,
                               timeout=args.timeout, on_output=options.live_output(args, sink),
                               **options.given(args, "uid", "gid"))
    except BaseException:
        if sink is not None:
            sink.discard()
        raise
    return report_run(args, rec, sink)


def cmd_set_network(args):
    given = options.network(args)
    if "secrets" in given:      # a live sandbox's secrets are fixed at its start (its link's CA and placeholders)
        raise InvalidInput("`sandtree network` replaces the policy only: secrets are given at `sandtree start`")
    if "network" not in given:
        raise InvalidInput("`sandtree network ID` needs --network, --allow or --deny")
    eng = open_engine(args)
    info = eng.sandbox_set_network(args.sandbox, given["network"])
    out(args, info, lambda o: print(f"{o['id']}  network {json.dumps(o.get('network'), separators=(',', ':'))}"))


def cmd_port(args):
    """Expose PORT and print its URL (--url-ttl: a signed URL under `sandtree serve` instead);
    --close: unexpose it; no PORT: the exposed ports."""
    eng = open_engine(args)
    if args.port is None:
        return out(args, eng.sandbox_ports(args.sandbox),
                   lambda o: [print(f"{p['port']}  {p['url'] or '-'}  {p['path']}") for p in o])
    if args.close:
        eng.sandbox_unexpose(args.sandbox, args.port)
        return out(args, {"port": args.port, "exposed": False}, lambda o: None)
    entry = eng.sandbox_expose(args.sandbox, args.port)
    if args.url_ttl is not None:
        entry["signed_url"] = eng.sandbox_port_url(args.sandbox, args.port, ttl=args.url_ttl)
    out(args, entry, lambda o: print(o.get("signed_url") or o["url"]))


def cmd_shell(args):
    """An interactive shell: in a running sandbox (an id), or in a new one on an image that is
    stopped when the shell exits (commit it first with `sandtree commit` from another terminal)."""
    eng = open_engine(args)
    try:
        info, started = eng.sandbox_info(args.target), False
    except SandtreeError:
        info, started = eng.sandbox_start(args.target), True
        print(f"sandbox {info['id']} (stopped when this shell exits)", file=sys.stderr)
    try:
        return interactive(eng, info["id"], args.cmd or ["/bin/sh", "-i"], **options.given(args, "uid", "gid"))
    finally:
        if started:
            eng.sandbox_stop(info["id"])


def cmd_watch(args):
    """Print a directory's events as they come, one JSON object a line (name, type, time), until
    interrupted or --count events; the watch is removed on the way out."""
    eng = open_engine(args)
    w = eng.sandbox_watch(args.sandbox, args.path, recursive=args.recursive)
    seen = 0
    try:
        while args.count is None or seen < args.count:
            got = eng.sandbox_watch_events(args.sandbox, w["watch"], timeout=10.0)
            for ev in got["events"]:
                print(json.dumps(ev, separators=(",", ":")), flush=True)
                seen += 1
                if args.count is not None and seen >= args.count:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        try:
            eng.sandbox_unwatch(args.sandbox, w["watch"])
        except SandtreeError:
            pass                                    # ended with its sandbox


def add_sandboxes(sub, common) -> None:
    derive.add(sub, common, "sandbox_start")
    x = sub.add_parser("exec", parents=[common], help="run a command in a live sandbox (one argument: in its shell "
                                                      "session, where cd and export carry over)")
    x.add_argument("sandbox")
    options.add_env(x)
    x.add_argument("--cwd")
    x.add_argument("--timeout", type=float)
    x.add_argument("--stdin", action="store_true", help="pass this process's stdin to the command")
    options.add_user(x)
    options.add_output(x)
    x.add_argument("cmd", nargs="*", help="-- CMD ARGS... (one argument: a shell string)")
    x.set_defaults(fn=cmd_exec, takes_command=True, error_status=exits.ERROR_IN_COMMAND)
    derive.add(sub, common, "sandbox_stop")
    x = sub.add_parser("network", parents=[common], help="replace a live sandbox's network policy "
                       "(connections the new policy forbids are cut; one started without network is given it, "
                       "--network off takes it away)")
    x.add_argument("sandbox")
    options.add_network(x)
    x.set_defaults(fn=cmd_set_network)
    derive.add(sub, common, "sandbox_hibernate", "sandbox_resume", "sandbox_list")
    x = sub.add_parser("port", parents=[common], help="expose a port of a live sandbox and print its URL "
                       "(on the host's loopback; no PORT: list the exposed ones)")
    x.add_argument("sandbox")
    x.add_argument("port", nargs="?", type=int)
    x.add_argument("--url-ttl", type=float, metavar="SECONDS",
                   help="print a signed URL under `sandtree serve` that works without a token this long")
    x.add_argument("--close", action="store_true", help="unexpose the port (unreachable again)")
    x.set_defaults(fn=cmd_port)
    derive.add(sub, common, "sandbox_commit")
    x = sub.add_parser("shell", parents=[common], help="interactive shell in a live sandbox (ID) or a new one (IMAGE)")
    x.add_argument("target", help="a live sandbox id, or an image")
    options.add_user(x)
    x.add_argument("cmd", nargs="*", help="-- PROGRAM ARGS (default: /bin/sh -i)")
    x.set_defaults(fn=cmd_shell, takes_command=True)
    derive.group(sub, "sandbox", help="a live sandbox's files, state and timeout")
    derive.add(sub, common, "sandbox_info", "sandbox_ls", "sandbox_read", "sandbox_write", "sandbox_exists",
               "sandbox_remove", "sandbox_mkdir", "sandbox_stat", "sandbox_rename", "sandbox_set_timeout",
               "sandbox_metrics")
    x = derive.group(sub, "sandbox").add_parser("watch", parents=[common], help="print a live sandbox directory's "
                                                "events as they come (JSON lines: name, type, time)")
    x.add_argument("sandbox")
    x.add_argument("path")
    x.add_argument("--recursive", "-r", action="store_true", help="also the directories below it")
    x.add_argument("--count", type=int, help="stop after this many events")
    x.set_defaults(fn=cmd_watch)
