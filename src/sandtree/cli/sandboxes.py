"""Live sandboxes: `start`, `exec`, `stop`, `network`, `hibernate`, `resume`, `commit`, `ps`, `port` and `shell`
(the terminal side of `shell` is terminal.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import options
from .output import fmt_size, open_engine, out
from .runs import report_run
from .terminal import interactive
from .. import defaults as D
from ..errors import InvalidInput, SandtreeError


def cmd_start(args):
    eng = open_engine(args)
    files = options.files(args)
    info = eng.sandbox_start(args.image, env=options.env(args), cwd=args.cwd, timeout=args.timeout,
                             memory=args.memory, pids=args.pids, cpus=args.cpus, disk=args.disk,
                             idle_timeout=args.idle_timeout, lifetime=args.lifetime, idle_action=args.on_idle,
                             tier=args.tier, **({"files": files} if files else {}), **options.given(args, "hostname"),
                             **options.network(args))
    out(args, info, lambda o: print(o["id"]))


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


def cmd_stop(args):
    eng = open_engine(args)
    res = [eng.sandbox_stop(s) for s in args.sandboxes]
    out(args, res, lambda o: [print(f"{i['id']}  {i['state']}") for i in o])


def cmd_set_network(args):
    given = options.network(args)
    if "secrets" in given:      # a live sandbox's secrets are fixed at its start (its link's CA and placeholders)
        raise InvalidInput("`sandtree network` replaces the policy only: secrets are given at `sandtree start`")
    if "network" not in given:
        raise InvalidInput("`sandtree network ID` needs --network, --allow or --deny")
    eng = open_engine(args)
    info = eng.sandbox_set_network(args.sandbox, given["network"])
    out(args, info, lambda o: print(f"{o['id']}  network {json.dumps(o.get('network'), separators=(',', ':'))}"))


def cmd_hibernate(args):
    eng = open_engine(args)
    res = [eng.sandbox_hibernate(s) for s in args.sandboxes]
    out(args, res, lambda o: [print(f"{i['id']}  {i['state']}  image {i['head']}") for i in o])


def cmd_resume(args):
    eng = open_engine(args)
    res = [eng.sandbox_resume(s) for s in args.sandboxes]
    out(args, res, lambda o: [print(f"{i['id']}  {i['state']}") for i in o])


def cmd_sandbox_commit(args):
    eng = open_engine(args)
    image = eng.sandbox_commit(args.sandbox, tag=args.tag)
    out(args, {"image": image, "sandbox": args.sandbox, "tag": args.tag}, lambda o: print(o["image"]))


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


def cmd_ps(args):
    eng = open_engine(args)

    def human(rows):
        for r in rows:
            mem = fmt_size(r["memory_bytes"]) if r["memory_bytes"] is not None else "-"
            idle = time.time() - r["last_used"]
            print(f"{r['id'][:12]}  {r['state']:8}  image {r['image'][:12]}  mem {mem:>7}  idle {idle:5.0f}s")
    out(args, eng.sandbox_list(all=args.all), human)


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


def add_sandboxes(sub, common) -> None:
    limits = argparse.ArgumentParser(add_help=False)
    limits.add_argument("--timeout", type=float, help="seconds per command")
    options.add_resources(limits)
    x = sub.add_parser("start", parents=[common, limits], help="start a live sandbox on an image; prints its id")
    x.add_argument("image")
    options.add_env(x)
    x.add_argument("--cwd", help="working directory (default: the image's WORKDIR, else /)")
    x.add_argument("--idle-timeout", type=float, default=D.SANDBOX_IDLE_TIMEOUT, help="seconds without a command before it stops")
    x.add_argument("--lifetime", type=float, default=D.SANDBOX_LIFETIME, help="seconds until it stops in any case")
    x.add_argument("--on-idle", choices=["stop", "hibernate"], default=D.SANDBOX_IDLE_ACTION,
                   help="what the idle timeout does (hibernate: nothing is lost; `sandtree resume` continues it)")
    options.add_hostname(x)
    options.add_tier(x)
    options.add_network(x)
    options.add_files(x)
    x.set_defaults(fn=cmd_start)
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
    x.set_defaults(fn=cmd_exec, takes_command=True, error_status=125)
    x = sub.add_parser("stop", parents=[common], help="stop live sandboxes")
    x.add_argument("sandboxes", nargs="+")
    x.set_defaults(fn=cmd_stop)
    x = sub.add_parser("network", parents=[common], help="replace a live sandbox's network policy "
                       "(it must have started with one; connections the new policy forbids are cut)")
    x.add_argument("sandbox")
    options.add_network(x)
    x.set_defaults(fn=cmd_set_network)
    x = sub.add_parser("hibernate", parents=[common],
                       help="save live sandboxes (files and processes, memory included) and free them")
    x.add_argument("sandboxes", nargs="+")
    x.set_defaults(fn=cmd_hibernate)
    x = sub.add_parser("resume", parents=[common], help="bring hibernated sandboxes back where they were")
    x.add_argument("sandboxes", nargs="+")
    x.set_defaults(fn=cmd_resume)
    x = sub.add_parser("ps", parents=[common], help="list live sandboxes")
    x.add_argument("--all", action="store_true", help="also stopped, expired and gone ones")
    x.set_defaults(fn=cmd_ps)
    x = sub.add_parser("port", parents=[common], help="expose a port of a live sandbox and print its URL "
                       "(on the host's loopback; no PORT: list the exposed ones)")
    x.add_argument("sandbox")
    x.add_argument("port", nargs="?", type=int)
    x.add_argument("--url-ttl", type=float, metavar="SECONDS",
                   help="print a signed URL under `sandtree serve` that works without a token this long")
    x.add_argument("--close", action="store_true", help="unexpose the port (unreachable again)")
    x.set_defaults(fn=cmd_port)
    x = sub.add_parser("commit", parents=[common], help="an image of a live sandbox's filesystem now")
    x.add_argument("sandbox")
    x.add_argument("--tag")
    x.set_defaults(fn=cmd_sandbox_commit)
    x = sub.add_parser("shell", parents=[common], help="interactive shell in a live sandbox (ID) or a new one (IMAGE)")
    x.add_argument("target", help="a live sandbox id, or an image")
    options.add_user(x)
    x.add_argument("cmd", nargs="*", help="-- PROGRAM ARGS (default: /bin/sh -i)")
    x.set_defaults(fn=cmd_shell, takes_command=True)
