"""The `sandtree` command: an adapter over the engine (human output by default, --json everywhere).

Exit status: `run` exits with the command's status (128+N for a signal, 124 on timeout, 125 for a
sandtree error); other commands exit 0, or 1 with `error: ...` (or a JSON error object).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from .. import config
from ..branching.merge import DEFAULT_IGNORE
from ..errors import InvalidInput, SandtreeError
from ..store.maintenance import GC_RETENTION


def _engine(args):
    from ..engine import Engine
    return Engine(args.home or config.default_home(), warm=0)     # one command, one process


def _out(args, obj, human) -> None:
    if args.json:
        print(json.dumps(obj, indent=None, default=str))
    else:
        human(obj)


def _fmt_size(n: int) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024


def _with_progress(args, label: str, fn):
    """fn(progress) with a rich progress bar (bytes) when stderr is a terminal."""
    if args.json or not sys.stderr.isatty():
        return fn(None)
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
    with Progress(TextColumn(label), BarColumn(), DownloadColumn(), TransferSpeedColumn(), transient=True) as prog:
        task = prog.add_task(label, total=None)
        return fn(lambda n: prog.advance(task, n))


# ---- image ---------------------------------------------------------------------------------------
def cmd_image_import(args):
    eng = _engine(args)
    image = _with_progress(args, "importing", lambda cb: eng.import_path(args.path, tag=args.tag, progress=cb))
    _out(args, {"image": image, "tag": args.tag}, lambda o: print(o["image"]))


def cmd_image_pull(args):
    eng = _engine(args)
    image = _with_progress(args, "pulling", lambda cb: eng.pull(args.reference, tag=args.tag,
                                                                 insecure=args.insecure, progress=cb))
    _out(args, {"image": image, "tag": args.tag}, lambda o: print(o["image"]))


def cmd_registry_login(args):
    eng = _engine(args)
    secret = sys.stdin.readline().rstrip("\n") if args.password_stdin else os.environ.get("SANDTREE_REGISTRY_TOKEN", "")
    if not secret:
        raise SystemExit("sandtree registry login: give the token on stdin (--password-stdin) or in SANDTREE_REGISTRY_TOKEN")
    host = eng.registry_login(args.registry, args.username, secret, insecure=args.insecure)
    _out(args, {"registry": host, "username": args.username}, lambda o: print(f"logged in to {o['registry']}"))


def cmd_image_bootstrap(args):
    eng = _engine(args)
    include = [p for x in args.include for p in x.split(",") if p]
    status = None
    if not args.json and sys.stderr.isatty():
        from rich.console import Console
        status = Console(stderr=True).status(f"bootstrapping {args.spec}")
        status.start()
    try:
        log = (lambda line: status.update(f"bootstrapping {args.spec}: {line[:100]}")) if status else None
        image = eng.bootstrap(args.spec, include=include, tag=args.tag, log=log, mirror=args.mirror)
    finally:
        if status:
            status.stop()
    _out(args, {"image": image, "tag": args.tag or args.spec}, lambda o: print(o["image"]))


def cmd_image_list(args):
    eng = _engine(args)
    rows = eng.store.images()

    def human(rows):
        for r in rows:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))
            print(f"{r['id'][:12]}  {when}  {_fmt_size(r['size']):>7}  {r['files']:>6} files  {' '.join(r['tags'])}")
    _out(args, rows, human)


def cmd_image_export(args):
    eng = _engine(args)
    image = eng.resolve(args.image)
    if args.file == "-":
        eng.export_tar(image, sys.stdout.buffer, args.path)
    else:
        tmp = args.file + ".part"
        with open(tmp, "wb") as f:
            eng.export_tar(image, f, args.path)
        os.replace(tmp, args.file)
    if args.json:
        print(json.dumps({"image": image, "file": args.file}))


def cmd_image_rm(args):
    eng = _engine(args)
    removed = []
    for ref in args.images:
        image = eng.resolve(ref)
        eng.remove_image(image, force=args.force)
        removed.append(image)
    _out(args, {"removed": removed}, lambda o: [print(i) for i in o["removed"]])


# ---- run -----------------------------------------------------------------------------------------
def _command(args):
    if not args.cmd:
        raise SystemExit(f"sandtree {args.command}: no command given (... -- CMD ARGS, or one shell string)")
    return args.cmd[0] if len(args.cmd) == 1 else args.cmd          # one argument: a shell string


def _env(args) -> dict:
    env = {}
    for kv in args.env:
        if "=" not in kv:
            raise SystemExit(f"sandtree {args.command}: --env wants KEY=VALUE, not {kv!r}")
        k, v = kv.split("=", 1)
        env[k] = v
    return env


def _live_output(stream, chunk):
    f = sys.stdout.buffer if stream == "stdout" else sys.stderr.buffer
    f.write(chunk)
    f.flush()


def cmd_run(args):
    eng = _engine(args)
    command = _command(args)
    stdin = sys.stdin.buffer.read() if args.stdin else None
    try:
        rec = eng.run(args.image, command, env=_env(args), cwd=args.cwd, stdin=stdin, disposable=args.disposable,
                      timeout=args.timeout, memory=args.memory, pids=args.pids, cpus=args.cpus, disk=args.disk,
                      tier=args.tier, on_output=None if args.json else _live_output)
    finally:
        eng.close()          # waits for the run's helper to be reaped and its cgroups removed
    return _report_run(args, rec)


def _report_run(args, rec) -> int:
    """Print a run's (or an exec's) result; the exit status the CLI should end with."""
    if args.json:
        print(json.dumps({"image": rec.image, "source": rec.source, "exit_code": rec.exit_code,
                          "signal": rec.signal, "stdout": rec.stdout.decode("utf-8", "replace"),
                          "stderr": rec.stderr.decode("utf-8", "replace"),
                          "stdout_truncated": rec.stdout_truncated, "stderr_truncated": rec.stderr_truncated,
                          "timed_out": rec.timed_out, "oom_killed": rec.oom_killed, "usage": rec.usage,
                          "operation": rec.op}))
    else:
        notes = []
        if rec.timed_out:
            notes.append("timed out")
        if rec.oom_killed:
            notes.append("out of memory")
        if rec.stdout_truncated or rec.stderr_truncated:
            notes.append("output truncated")
        if args.command == "run":
            print(f"image: {rec.image or '(disposable)'}" + (f"  [{', '.join(notes)}]" if notes else ""),
                  file=sys.stderr)
        elif notes:
            print(f"[{', '.join(notes)}]", file=sys.stderr)
    if rec.timed_out:
        return 124
    if rec.signal:
        return 128 + rec.signal
    return rec.exit_code or 0


# ---- live sandboxes ------------------------------------------------------------------------------
def cmd_start(args):
    eng = _engine(args)
    info = eng.sandbox_start(args.image, env=_env(args), cwd=args.cwd, timeout=args.timeout, memory=args.memory,
                             pids=args.pids, cpus=args.cpus, disk=args.disk, idle_timeout=args.idle_timeout,
                             lifetime=args.lifetime, idle_action=args.on_idle)
    _out(args, info, lambda o: print(o["id"]))


def cmd_exec(args):
    eng = _engine(args)
    stdin = sys.stdin.buffer.read() if args.stdin else None
    rec = eng.sandbox_exec(args.sandbox, _command(args), env=_env(args), cwd=args.cwd, stdin=stdin,
                           timeout=args.timeout, on_output=None if args.json else _live_output)
    return _report_run(args, rec)


def cmd_stop(args):
    eng = _engine(args)
    out = [eng.sandbox_stop(s) for s in args.sandboxes]
    _out(args, out, lambda o: [print(f"{i['id']}  {i['state']}") for i in o])


def cmd_hibernate(args):
    eng = _engine(args)
    out = [eng.sandbox_hibernate(s) for s in args.sandboxes]
    _out(args, out, lambda o: [print(f"{i['id']}  {i['state']}  image {i['head']}") for i in o])


def cmd_resume(args):
    eng = _engine(args)
    out = [eng.sandbox_resume(s) for s in args.sandboxes]
    _out(args, out, lambda o: [print(f"{i['id']}  {i['state']}") for i in o])


def cmd_sandbox_commit(args):
    eng = _engine(args)
    image = eng.sandbox_commit(args.sandbox, tag=args.tag)
    _out(args, {"image": image, "sandbox": args.sandbox, "tag": args.tag}, lambda o: print(o["image"]))


def cmd_ps(args):
    eng = _engine(args)

    def human(rows):
        for r in rows:
            mem = _fmt_size(r["memory_bytes"]) if r["memory_bytes"] is not None else "-"
            idle = time.time() - r["last_used"]
            print(f"{r['id'][:12]}  {r['state']:8}  image {r['image'][:12]}  mem {mem:>7}  idle {idle:5.0f}s")
    _out(args, eng.sandbox_list(all=args.all), human)


def cmd_shell(args):
    """An interactive shell: in a running sandbox (an id), or in a new one on an image that is
    stopped when the shell exits (commit it first with `sandtree commit` from another terminal)."""
    from .terminal import interactive
    eng = _engine(args)
    try:
        info, started = eng.sandbox_info(args.target), False
    except SandtreeError:
        info, started = eng.sandbox_start(args.target), True
        print(f"sandbox {info['id']} (stopped when this shell exits)", file=sys.stderr)
    try:
        return interactive(eng, info["id"], args.cmd or ["/bin/sh", "-i"])
    finally:
        if started:
            eng.sandbox_stop(info["id"])


# ---- inspection ----------------------------------------------------------------------------------
def cmd_cat(args):
    eng = _engine(args)
    data = eng.read(eng.resolve(args.image), args.path)
    sys.stdout.buffer.write(data)


def cmd_ls(args):
    eng = _engine(args)
    entries = [e.to_dict() for e in eng.ls(eng.resolve(args.image), args.path)]

    def human(rows):
        for r in rows:
            extra = f" -> {r['target']}" if "target" in r else ""
            print(f"{r['type'][0] if r['type'] != 'symlink' else 'l'}{r['mode']} {r['uid']:>5} {r['gid']:>5} "
                  f"{r['size']:>10}  {r['name']}{extra}")
    _out(args, entries, human)


def cmd_stat(args):
    eng = _engine(args)
    _out(args, eng.stat(eng.resolve(args.image), args.path).to_dict(),
         lambda o: [print(f"{k}: {v}") for k, v in o.items()])


def cmd_grep(args):
    eng = _engine(args)
    hits = eng.grep(eng.resolve(args.image), args.pattern, args.path, glob=args.glob,
                    max_matches=args.max_matches, ignore_case=args.ignore_case)
    _out(args, hits, lambda rows: [print(f"{r['path']}:{r['line']}:{r['text']}") for r in rows])
    return 0 if hits else 1


def cmd_log(args):
    eng = _engine(args)
    rows = eng.log(eng.resolve(args.image))

    def human(rows):
        for r in rows:
            tags = f" ({', '.join(r['tags'])})" if r["tags"] else ""
            code = "" if r["exit_code"] is None else f" [exit {r['exit_code']}]"
            print(f"{r['image'][:12]}{tags}  {r['command'] or ''}{code}")
    _out(args, rows, human)


def cmd_tag(args):
    eng = _engine(args)
    image = eng.resolve(args.image)
    eng.store.tag(image, args.name)
    _out(args, {"image": image, "tag": args.name}, lambda o: print(f"{o['tag']} -> {o['image']}"))


def cmd_untag(args):
    eng = _engine(args)
    image = eng.store.untag(args.name)
    _out(args, {"image": image, "untagged": args.name}, lambda o: print(f"untagged {o['untagged']}"))


def cmd_fsck(args):
    from ..store.maintenance import fsck
    eng = _engine(args)
    res = fsck(eng.store, verify_content=not args.quick)

    def human(r):
        print(f"{'ok' if r['ok'] else 'PROBLEMS'}: {r['images']} images, {r['trees']} trees, "
              f"{r['blobs']} blobs, {r['layers']} layers")
        for p in r["problems"]:
            print("  " + json.dumps(p))
    _out(args, res, human)
    return 0 if res["ok"] else 1


def cmd_gc(args):
    from ..store.maintenance import gc
    eng = _engine(args)
    res = gc(eng.store, retention=args.retention)
    _out(args, res, lambda r: print(", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in r.items())))


def cmd_doctor(args):
    eng = _engine(args)
    rows = eng.doctor()
    _out(args, rows, lambda rs: [print(f"{r['tier']:<11} {'yes' if r['available'] else 'no ':<4} {r['reason']}")
                                 for r in rs])


def cmd_serve(args):
    from ..http.server import serve
    pools = {}
    for spec in args.pool or []:
        image, _, size = spec.rpartition("=")
        if not image or not size.isdigit():
            raise InvalidInput(f"--pool takes IMAGE=SIZE, not {spec!r}")
        pools[image] = int(size)
    serve(args.home or config.default_home(), host=args.host, port=args.port, max_runs=args.max_runs,
          access_log=args.access_log, pools=pools, max_upload=args.max_upload)


# ---- tenants, tokens, audit (tenants.py) -----------------------------------------------------------
def _resource_limits(args) -> dict:
    return {"max_memory": args.max_memory, "max_pids": args.max_pids, "max_disk": args.max_disk,
            "max_cpus": args.max_cpus}


def cmd_token(args):
    eng = _engine(args)
    sub = args.token_command
    if sub == "create":
        res = eng.tenancy.create_token(args.tenant, args.scopes, max_runs=args.max_runs,
                                       max_timeout=args.max_timeout, max_output=args.max_output,
                                       max_sandboxes=args.max_sandboxes, max_upload=args.max_upload,
                                       **_resource_limits(args))
        _out(args, res, lambda o: (print(o["token"]), print(
            f"token {o['id']} for tenant {o['tenant']} ({','.join(o['scopes'])}): shown once, keep it",
            file=sys.stderr)))
    elif sub == "list":
        def human(rows):
            for r in rows:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))
                state = "revoked" if r["revoked"] else "active"
                lim = " ".join(f"{k}={int(v) if float(v).is_integer() else v}" for k, v in r["limits"].items())
                print(f"{r['id']}  {r['tenant']:<16} {state:<8} {when}  {','.join(r['scopes'])}  {lim}".rstrip())
        _out(args, eng.tenancy.tokens(), human)
    elif sub == "revoke":
        _out(args, eng.tenancy.revoke(args.id), lambda o: print(f"revoked {o['id']} ({o['tenant']})"))
    elif sub == "limits":
        res = eng.tenancy.set_limits(args.tenant, max_runs=args.max_runs, max_timeout=args.max_timeout,
                                     max_output=args.max_output, max_sandboxes=args.max_sandboxes,
                                     max_upload=args.max_upload, **_resource_limits(args))
        _out(args, {"tenant": args.tenant, "limits": res}, lambda o: print(json.dumps(o)))


def cmd_audit(args):
    eng = _engine(args)
    rows = eng.audit(tenant=args.tenant, limit=args.limit)

    def human(rows):
        for r in rows:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["at"]))
            what = r.get("command") or r.get("tag") or r.get("branch") or ""
            outcome = f" [{r['outcome']}{'' if r.get('exit_code') is None else ' exit ' + str(r['exit_code'])}]" \
                if r.get("outcome") else ""
            print(f"{when}  {r['tenant']}/{r['token'] or '-'}  {r['action']:<8} {(r['image'] or '-')[:12]} -> "
                  f"{(r['result'] or '-')[:12]}  {what}{outcome}")
    _out(args, rows, human)


def cmd_image_share(args):
    eng = _engine(args)
    image = eng.resolve(args.image)
    res = eng.share(image) if args.image_command == "share" else eng.unshare(image)
    _out(args, res, lambda o: print(f"{o['image']} {'public' if o['public'] else 'private'}"))


def cmd_mcp(args):
    from ..mcp.server import main as mcp_main
    token = os.environ.get("SANDTREE_TOKEN") if args.url else None
    mcp_main(args.home or config.default_home(), http=args.http, host=args.host, port=args.port, url=args.url,
             token=token)


def cmd_op(args):
    eng = _engine(args)
    _out(args, eng.operation(args.id), lambda o: print(json.dumps(o, indent=2)))


# ---- branching -----------------------------------------------------------------------------------
def cmd_diff(args):
    eng = _engine(args)
    a, b = eng.resolve(args.a), eng.resolve(args.b)
    changes = eng.diff(a, b)
    if args.patch and not args.json:
        sys.stdout.write(eng.patch(a, b))
        return 0
    out = {"a": a, "b": b, "changes": [c.to_dict() for c in changes]}
    if args.patch:
        out["patch"] = eng.patch(a, b)

    def human(o):
        marks = {"added": "A", "removed": "D", "modified": "M", "type_changed": "T", "metadata_changed": "m"}
        for c in o["changes"]:
            print(f"{marks[c['kind']]}  {c['path']}")
    _out(args, out, human)


def cmd_merge(args):
    eng = _engine(args)
    refs_ = [eng.resolve(r) for r in args.images]
    base, ours, theirs = (refs_ if len(refs_) == 3 else [None] + refs_)
    ignore = None if args.ignore is None and not args.no_default_ignore else \
        ([] if args.no_default_ignore else list(DEFAULT_IGNORE)) + (args.ignore or [])
    # the conflicts come back to be listed (exit 1 says no image was made)
    res = eng.merge(base, ours, theirs, strategy=args.strategy, ignore=ignore, on_conflict="return")

    def human(o):
        for c in o["conflicts"]:
            print(f"CONFLICT ({c['kind']}): {c['path']}", file=sys.stderr)
        print(o["image"] if o["image"] else "no image made: resolve the conflicts or pass --strategy",
              file=sys.stdout if o["image"] else sys.stderr)
    _out(args, res, human)
    return 0 if res["image"] else 1


def cmd_branch(args):
    eng = _engine(args)
    sub = args.branch_command
    if sub == "list":
        _out(args, eng.branches(), lambda o: [print(f"{n}  {i[:12]}") for n, i in o.items()])
    elif sub == "create":
        image = eng.resolve(args.image)
        eng.branch_create(args.name, image, force=args.force)
        _out(args, {"branch": args.name, "image": image}, lambda o: print(f"{o['branch']} -> {o['image']}"))
    elif sub == "delete":
        image = eng.branch_delete(args.name)
        _out(args, {"deleted": args.name, "image": image}, lambda o: print(f"deleted {o['deleted']}"))
    elif sub == "rollback":
        to = eng.resolve(args.to) if args.to else None
        image = eng.rollback(args.name, to=to, steps=args.steps)
        _out(args, {"branch": args.name, "image": image}, lambda o: print(f"{o['branch']} -> {o['image']}"))
    elif sub == "log":
        _out(args, eng.branch_log(args.name), lambda rows: [
            print(f"{(r['old'] or '-')[:12]} -> {(r['new'] or '-')[:12]}  {r['reason']}") for r in rows])


def cmd_tree(args):
    from .. import render as lineage
    eng = _engine(args)
    t = eng.lineage_tree(eng.resolve(args.image))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(lineage.render_svg(t))
    if args.json:
        print(json.dumps(t))
    elif not args.svg:
        sys.stdout.write(lineage.render_text(t))


def cmd_lineage(args):
    eng = _engine(args)
    q = args.query
    ids = [eng.resolve(i) for i in args.images]
    need = {"ancestors": 1, "descendants": 1, "produced-by": 1, "path": 2, "common": 2}[q]
    if len(ids) != need:
        raise SystemExit(f"sandtree lineage {q} takes {need} image(s)")
    if q == "ancestors":
        d = eng.ancestors(ids[0])
        res = [{"image": i, "distance": n} for i, n in sorted(d.items(), key=lambda kv: kv[1]) if n]
    elif q == "descendants":
        d = eng.descendants(ids[0])
        res = [{"image": i, "distance": n} for i, n in sorted(d.items(), key=lambda kv: kv[1]) if n]
    elif q == "path":
        res = eng.lineage_path(*ids)
    elif q == "common":
        res = {"image": eng.common_ancestor(*ids)}
    else:
        res = eng.produced_by(ids[0])
    _out(args, res, lambda o: print(json.dumps(o, indent=2)))


def cmd_fork(args):
    eng = _engine(args)
    image = eng.resolve(args.image)
    if not args.cmd:
        raise SystemExit("sandtree fork: give commands with --cmd (one per branch)")
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max(1, min(args.parallel, len(args.cmd)))) as pool:
        recs = list(pool.map(lambda c: eng.run(image, c, timeout=args.timeout), args.cmd))
    rows = [{"command": c, "image": r.image, "exit_code": r.exit_code, "timed_out": r.timed_out,
             "stdout": r.stdout.decode("utf-8", "replace"), "stderr": r.stderr.decode("utf-8", "replace")}
            for c, r in zip(args.cmd, recs, strict=False)]
    _out(args, rows, lambda rs: [print(f"{(r['image'] or '-')[:12]}  exit {r['exit_code']}  {r['command']}")
                                 for r in rs])


def cmd_bundle(args):
    eng = _engine(args)
    if args.bundle_command == "create":
        res = eng.bundle_create(args.file, [eng.resolve(i) for i in args.images], with_ancestry=args.with_ancestry)
        _out(args, res, lambda o: print(f"{o['file']}: {o['images']} images, {o['trees']} trees, {o['blobs']} blobs"))
    else:
        res = eng.bundle_import(args.file)
        _out(args, res, lambda o: [print(i) for i in o["images"]])


# ---- parser --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    # The common options are accepted before or after the subcommand; SUPPRESS keeps a
    # subcommand's unset default from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    common.add_argument("--home", default=argparse.SUPPRESS,
                        help="store directory (default $SANDTREE_HOME or ~/.local/share/sandtree)")

    p = argparse.ArgumentParser(prog="sandtree", parents=[common],
                                description="Sandboxes for AI agents with git-like images.")
    sub = p.add_subparsers(dest="command", required=True)

    img = sub.add_parser("image", help="import, list, export and remove images")
    isub = img.add_subparsers(dest="image_command", required=True)
    x = isub.add_parser("import", parents=[common], help="import a directory, tar, OCI layout or docker-archive")
    x.add_argument("path")
    x.add_argument("--tag")
    x.set_defaults(fn=cmd_image_import)
    x = isub.add_parser("pull", parents=[common], help="pull docker://HOST/NAME:TAG from an OCI registry")
    x.add_argument("reference")
    x.add_argument("--tag")
    x.add_argument("--insecure", action="store_true", help="plain HTTP (loopback registries use it anyway)")
    x.set_defaults(fn=cmd_image_pull)
    x = isub.add_parser("bootstrap", parents=[common], help="build a Debian base image (debootstrap)")
    x.add_argument("spec", help="debian:SUITE, e.g. debian:bookworm")
    x.add_argument("--include", action="append", default=[], help="extra packages (comma-separated)")
    x.add_argument("--tag", help="tag (default: the spec)")
    x.add_argument("--mirror", help="Debian mirror (default: the host's apt source)")
    x.set_defaults(fn=cmd_image_bootstrap)
    x = isub.add_parser("list", parents=[common], help="list images")
    x.set_defaults(fn=cmd_image_list)
    x = isub.add_parser("export", parents=[common], help="write an image as a tar")
    x.add_argument("image")
    x.add_argument("file", help="output file, or - for stdout")
    x.add_argument("--path", default="/", help="export only this subtree")
    x.set_defaults(fn=cmd_image_export)
    x = isub.add_parser("rm", parents=[common], help="remove images (their data goes at the next gc)")
    x.add_argument("images", nargs="+")
    x.add_argument("--force", action="store_true", help="also drop the tags pointing at it")
    x.set_defaults(fn=cmd_image_rm)
    for name, what in (("share", "make an image visible to every tenant (by ID)"),
                       ("unshare", "stop sharing an image")):
        x = isub.add_parser(name, parents=[common], help=what)
        x.add_argument("image")
        x.set_defaults(fn=cmd_image_share)

    x = sub.add_parser("run", parents=[common], help="run a command on an image; prints the new image")
    x.add_argument("image")
    x.add_argument("--timeout", type=float)
    x.add_argument("--memory")
    x.add_argument("--pids", type=int)
    x.add_argument("--cpus", type=float)
    x.add_argument("--disk")
    x.add_argument("--env", action="append", default=[], metavar="K=V")
    x.add_argument("--cwd", default="/")
    x.add_argument("--stdin", action="store_true", help="pass this process's stdin to the command")
    x.add_argument("--disposable", action="store_true", help="do not keep the resulting image")
    x.add_argument("--tier", choices=["namespaces", "gvisor"], help="isolation tier (default: namespaces)")
    x.add_argument("cmd", nargs="*", help="-- CMD ARGS... (one argument: a shell string)")
    x.set_defaults(fn=cmd_run)

    limits = argparse.ArgumentParser(add_help=False)
    limits.add_argument("--timeout", type=float, help="seconds per command")
    limits.add_argument("--memory")
    limits.add_argument("--pids", type=int)
    limits.add_argument("--cpus", type=float)
    limits.add_argument("--disk")
    x = sub.add_parser("start", parents=[common, limits], help="start a live sandbox on an image; prints its id")
    x.add_argument("image")
    x.add_argument("--env", action="append", default=[], metavar="K=V")
    x.add_argument("--cwd", default="/")
    x.add_argument("--idle-timeout", type=float, default=600, help="seconds without a command before it stops")
    x.add_argument("--lifetime", type=float, default=3600, help="seconds until it stops in any case")
    x.add_argument("--on-idle", choices=["stop", "hibernate"], default="stop",
                   help="what the idle timeout does (hibernate: nothing is lost; `sandtree resume` continues it)")
    x.set_defaults(fn=cmd_start)
    x = sub.add_parser("exec", parents=[common], help="run a command in a live sandbox (one argument: in its shell "
                                                      "session, where cd and export carry over)")
    x.add_argument("sandbox")
    x.add_argument("--env", action="append", default=[], metavar="K=V")
    x.add_argument("--cwd")
    x.add_argument("--timeout", type=float)
    x.add_argument("--stdin", action="store_true", help="pass this process's stdin to the command")
    x.add_argument("cmd", nargs="*", help="-- CMD ARGS... (one argument: a shell string)")
    x.set_defaults(fn=cmd_exec)
    x = sub.add_parser("stop", parents=[common], help="stop live sandboxes")
    x.add_argument("sandboxes", nargs="+")
    x.set_defaults(fn=cmd_stop)
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
    x = sub.add_parser("commit", parents=[common], help="an image of a live sandbox's filesystem now")
    x.add_argument("sandbox")
    x.add_argument("--tag")
    x.set_defaults(fn=cmd_sandbox_commit)
    x = sub.add_parser("shell", parents=[common], help="interactive shell in a live sandbox (ID) or a new one (IMAGE)")
    x.add_argument("target", help="a live sandbox id, or an image")
    x.add_argument("cmd", nargs="*", help="-- PROGRAM ARGS (default: /bin/sh -i)")
    x.set_defaults(fn=cmd_shell)

    x = sub.add_parser("cat", parents=[common], help="print a file of an image")
    x.add_argument("image"); x.add_argument("path")
    x.set_defaults(fn=cmd_cat)
    x = sub.add_parser("ls", parents=[common], help="list a directory of an image")
    x.add_argument("image"); x.add_argument("path", nargs="?", default="/")
    x.set_defaults(fn=cmd_ls)
    x = sub.add_parser("stat", parents=[common], help="metadata of one path")
    x.add_argument("image"); x.add_argument("path")
    x.set_defaults(fn=cmd_stat)
    x = sub.add_parser("grep", parents=[common], help="search file contents of an image")
    x.add_argument("image"); x.add_argument("pattern"); x.add_argument("path", nargs="?", default="/")
    x.add_argument("--glob"); x.add_argument("--max-matches", type=int, default=1000)
    x.add_argument("-i", "--ignore-case", action="store_true")
    x.set_defaults(fn=cmd_grep)
    x = sub.add_parser("log", parents=[common], help="ancestry of an image with the commands that made it")
    x.add_argument("image")
    x.set_defaults(fn=cmd_log)
    x = sub.add_parser("tag", parents=[common], help="point a tag at an image (moves it if it exists)")
    x.add_argument("image"); x.add_argument("name")
    x.set_defaults(fn=cmd_tag)
    x = sub.add_parser("untag", parents=[common], help="remove a tag")
    x.add_argument("name")
    x.set_defaults(fn=cmd_untag)
    x = sub.add_parser("fsck", parents=[common], help="verify the store")
    x.add_argument("--quick", action="store_true", help="skip re-hashing file contents")
    x.set_defaults(fn=cmd_fsck)
    x = sub.add_parser("gc", parents=[common], help="remove unreferenced images and data")
    x.add_argument("--retention", type=float, default=GC_RETENTION, help="keep untagged images younger than this (s)")
    x.set_defaults(fn=cmd_gc)
    x = sub.add_parser("diff", parents=[common], help="what changed from image A to image B")
    x.add_argument("a"); x.add_argument("b")
    x.add_argument("--patch", action="store_true", help="a unified patch of text files")
    x.set_defaults(fn=cmd_diff)
    x = sub.add_parser("merge", parents=[common], help="three-way merge: [BASE] OURS THEIRS")
    x.add_argument("images", nargs="+", metavar="IMAGE")
    x.add_argument("--strategy", choices=["ours", "theirs", "markers"])
    x.add_argument("--ignore", action="append", metavar="GLOB",
                   help="paths that never conflict, ours taken (repeatable; added to the defaults "
                        f"{' '.join(DEFAULT_IGNORE)})")
    x.add_argument("--no-default-ignore", action="store_true", help="do not ignore the default globs")
    x.set_defaults(fn=cmd_merge)
    br = sub.add_parser("branch", help="branches: movable names that advance with each run on them")
    bsub = br.add_subparsers(dest="branch_command", required=True)
    x = bsub.add_parser("list", parents=[common]); x.set_defaults(fn=cmd_branch)
    x = bsub.add_parser("create", parents=[common]); x.add_argument("name"); x.add_argument("image")
    x.add_argument("--force", action="store_true"); x.set_defaults(fn=cmd_branch)
    x = bsub.add_parser("delete", parents=[common]); x.add_argument("name"); x.set_defaults(fn=cmd_branch)
    x = bsub.add_parser("rollback", parents=[common]); x.add_argument("name")
    g = x.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int); g.add_argument("--to")
    x.set_defaults(fn=cmd_branch)
    x = bsub.add_parser("log", parents=[common]); x.add_argument("name"); x.set_defaults(fn=cmd_branch)
    x = sub.add_parser("tree", parents=[common], help="the lineage tree under an image")
    x.add_argument("image"); x.add_argument("--svg", metavar="FILE", help="also draw it as SVG")
    x.set_defaults(fn=cmd_tree)
    x = sub.add_parser("lineage", parents=[common], help="ancestors, descendants, path, common, produced-by")
    x.add_argument("query", choices=["ancestors", "descendants", "path", "common", "produced-by"])
    x.add_argument("images", nargs="+", metavar="IMAGE")
    x.set_defaults(fn=cmd_lineage)
    x = sub.add_parser("fork", parents=[common], help="run several commands from one image concurrently")
    x.add_argument("image"); x.add_argument("--cmd", action="append", default=[])
    x.add_argument("--parallel", type=int, default=4); x.add_argument("--timeout", type=float)
    x.set_defaults(fn=cmd_fork)
    bu = sub.add_parser("bundle", help="images with their lineage as one verifiable file")
    busub = bu.add_subparsers(dest="bundle_command", required=True)
    x = busub.add_parser("create", parents=[common]); x.add_argument("file"); x.add_argument("images", nargs="+")
    x.add_argument("--with-ancestry", action="store_true"); x.set_defaults(fn=cmd_bundle)
    x = busub.add_parser("import", parents=[common]); x.add_argument("file"); x.set_defaults(fn=cmd_bundle)
    rg = sub.add_parser("registry", help="credentials for OCI registries")
    rsub = rg.add_subparsers(dest="registry_command", required=True)
    x = rsub.add_parser("login", parents=[common], help="check and keep a registry token")
    x.add_argument("registry"); x.add_argument("--username", required=True)
    x.add_argument("--password-stdin", action="store_true"); x.add_argument("--insecure", action="store_true")
    x.set_defaults(fn=cmd_registry_login)
    x = sub.add_parser("doctor", parents=[common], help="which isolation tiers this host can run, and why not")
    x.set_defaults(fn=cmd_doctor)
    x = sub.add_parser("serve", parents=[common], help="the REST API (/api/v1, OpenAPI at /openapi.json)")
    x.add_argument("--host", default="127.0.0.1")
    x.add_argument("--port", type=int, default=8080)
    x.add_argument("--max-runs", type=int, default=4, help="runs at once; more queue")
    x.add_argument("--pool", action="append", metavar="IMAGE=SIZE",
                   help="keep SIZE sandboxes of IMAGE started for runs through this server (repeatable)")
    x.add_argument("--access-log", choices=["json", "off"], default="json",
                   help="request log on stderr: one JSON object per request (default), or none")
    x.add_argument("--max-upload", default="1G",
                   help="largest upload or image tar a request may send (default 1G; a tenant's own "
                        "--max-upload limit replaces it)")
    x.set_defaults(fn=cmd_serve)
    tk = sub.add_parser("token", help="API tokens: each belongs to a tenant, which sees only its own images")
    tsub = tk.add_subparsers(dest="token_command", required=True)

    def limit_args(x):
        x.add_argument("--max-runs", type=int, help="the tenant's runs at once (more are refused)")
        x.add_argument("--max-timeout", type=float, help="longest run timeout the tenant may ask (s)")
        x.add_argument("--max-output", help="most output kept per stream (e.g. 1M)")
        x.add_argument("--max-sandboxes", type=int, help="live sandboxes the tenant may keep at once (default 8)")
        x.add_argument("--max-upload", help="largest upload or image tar the tenant may send (e.g. 200M; "
                                            "default: the server's --max-upload)")
        x.add_argument("--max-memory", help="most memory a run or sandbox may ask (default: the engine's 2G)")
        x.add_argument("--max-pids", type=int, help="most processes a run or sandbox may ask (default 1024)")
        x.add_argument("--max-disk", help="most disk a run or sandbox may ask (default: the engine's 1G)")
        x.add_argument("--max-cpus", type=float, help="most CPUs a run or sandbox may ask (default: any)")
    x = tsub.add_parser("create", parents=[common], help="a new token (the secret is shown once)")
    x.add_argument("--tenant", required=True)
    x.add_argument("--scopes", help="comma-separated: import,run,list,cancel,tag (default) and admin")
    limit_args(x)
    x.set_defaults(fn=cmd_token)
    x = tsub.add_parser("list", parents=[common], help="tokens (ids, tenants, scopes; never secrets)")
    x.set_defaults(fn=cmd_token)
    x = tsub.add_parser("revoke", parents=[common], help="revoke a token by id (takes effect at once)")
    x.add_argument("id")
    x.set_defaults(fn=cmd_token)
    x = tsub.add_parser("limits", parents=[common], help="set a tenant's limits")
    x.add_argument("--tenant", required=True)
    limit_args(x)
    x.set_defaults(fn=cmd_token)
    x = sub.add_parser("audit", parents=[common], help="who ran what on which image, newest first")
    x.add_argument("--tenant")
    x.add_argument("--limit", type=int, default=50)
    x.set_defaults(fn=cmd_audit)
    x = sub.add_parser("mcp", parents=[common], help="serve sandtree to agents over MCP (stdio, or --http)")
    x.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    x.add_argument("--host", default="127.0.0.1")
    x.add_argument("--port", type=int, default=8765)
    x.add_argument("--url", help="use a `sandtree serve` at this URL (token from $SANDTREE_TOKEN)")
    x.set_defaults(fn=cmd_mcp)
    x = sub.add_parser("op", parents=[common], help="show a recorded operation")
    x.add_argument("id")
    x.set_defaults(fn=cmd_op)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    tail = None
    if "--" in argv:                       # everything after -- is the command, options included
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.home = getattr(args, "home", None)
    if tail is not None:
        if getattr(args, "fn", None) not in (cmd_run, cmd_exec, cmd_shell):
            parser.error("'--' is only for `sandtree run IMAGE -- CMD ...`, `exec` and `shell`")
        args.cmd = list(args.cmd) + tail
    try:
        try:
            rc = args.fn(args)
        except OSError as exc:               # a full disk outside the engine (this command's own files)
            import errno
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            from ..errors import DiskFull
            raise DiskFull(f"disk full: {exc.strerror}") from None
        return rc or 0
    except SandtreeError as exc:
        if getattr(args, "json", False):
            print(json.dumps(exc.to_dict(), default=str))
        else:
            print(f"error: {exc.message}", file=sys.stderr)
        return 125 if args.fn in (cmd_run, cmd_exec) else 1
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
