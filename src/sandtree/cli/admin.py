"""Running and looking after a sandtree: the store (`fsck`, `gc`), the host (`doctor`, `cluster status`), the
servers (`serve`, `ui`, `mcp`) and tenants (`token ...`, `audit`, `whoami`). gc, doctor, cluster status, audit and
whoami are made from their rows (derive.py); the servers and tokens are no operation of the table, and fsck keeps
its --quick (the row's verify_content=False)."""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time

from .. import config, defaults as D
from ..errors import InvalidInput
from . import derive, exits
from .output import fmt_time, open_engine, out


def cmd_fsck(args):
    eng = open_engine(args)
    res = eng.fsck(verify_content=not args.quick)

    def human(r):
        print(f"{'ok' if r['ok'] else 'PROBLEMS'}: {r['images']} images, {r['trees']} trees, "
              f"{r['blobs']} blobs, {r['layers']} layers")
        for p in r["problems"]:
            print("  " + json.dumps(p))
    out(args, res, human)
    return exits.OK if res["ok"] else exits.NO


def pool_source(spec: str) -> dict:
    """One --pool value: IMAGE=SIZE ({"image", "size"}), or DOCKERFILE[:CONTEXT][#TAG]=SIZE
    ({"dockerfile", "context", "tag", "size"}). A Dockerfile is an existing file (or a directory
    holding one named Dockerfile), or a path that says it is one (/, ./, ../ or "dockerfile" in
    its name, so a missing one is an error, not an image ref); CONTEXT defaults to its directory,
    TAG to pool/<context name>/<file name>."""
    source, _, size = spec.rpartition("=")
    if not source or not size.isdigit():
        raise InvalidInput(f"--pool takes IMAGE=SIZE or DOCKERFILE[:CONTEXT][#TAG]=SIZE, not {spec!r}")
    source, hashed, tag = source.partition("#")
    path, context = source, None
    if not os.path.exists(path) and ":" in source and os.path.isfile(source.rpartition(":")[0]):
        path, _, context = source.rpartition(":")
    if os.path.isdir(path):
        path = os.path.join(path, "Dockerfile")
    looks = path.startswith(("/", "./", "../")) or "dockerfile" in os.path.basename(path).lower()
    if not os.path.isfile(path) and not looks:
        if hashed:
            raise InvalidInput(f"--pool {spec!r}: #TAG is for a Dockerfile, and {source!r} is none")
        return {"image": source, "size": int(size)}
    context = context or os.path.dirname(path) or "."
    if not os.path.isdir(context):
        raise InvalidInput(f"--pool {spec!r}: the build context {context!r} is not a directory")
    if not tag:
        clean = lambda name: re.sub(r"[^A-Za-z0-9._-]", "-", name).strip(".-") or "x"   # noqa: E731
        tag = f"pool/{clean(os.path.basename(os.path.abspath(context)))}/{clean(os.path.basename(path))}"
    return {"dockerfile": path, "context": context, "tag": tag, "size": int(size)}


def _rest():
    # the REST adapter's entry points (`serve`, and its connection limits for `mcp --http`):
    # the one place the CLI reaches into another adapter; loaded only for those (FastAPI's import)
    from ..http.server import ConnLimits, connection_options, serve
    return ConnLimits, connection_options, serve


def cmd_serve(args):
    ConnLimits, _, serve = _rest()
    pools, recipes = {}, []
    for spec in args.pool or []:
        got = pool_source(spec)
        if "image" in got:
            pools[got["image"]] = got["size"]
        else:
            recipes.append(got)
    given = {k: getattr(args, a) for k, a in (("header_bytes", "max_header_bytes"), ("header_timeout", "header_timeout"),
                                              ("keep_alive", "keep_alive"), ("per_client", "max_client_connections"),
                                              ("total", "max_connections")) if getattr(args, a, None) is not None}
    serve(args.home or config.default_home(), host=args.host, port=args.port, max_runs=args.max_runs,
          access_log=args.access_log, pools=pools, max_upload=args.max_upload, recipe_pools=recipes,
          watch=args.watch, ports_port=args.ports_port, preview_url=getattr(args, "preview_url", None),
          conn_limits=ConnLimits(**given))


def cmd_ui(args):
    """`sandtree serve` on a free loopback port (or --port) for the web page; prints its URL."""
    import socket, webbrowser      # only `ui` needs them: 8 ms of every other command's start-up

    def open_when_listening(port: int, url: str) -> None:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                webbrowser.open(url)
                return
            except OSError:
                time.sleep(0.1)

    if args.port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    url = f"http://127.0.0.1:{args.port}/"
    print(url, flush=True)
    if args.open:
        threading.Thread(target=open_when_listening, args=(args.port, url), daemon=True).start()
    args.host, args.pool, args.watch, args.access_log = "127.0.0.1", None, None, "off"
    args.ports_port = 0                     # any free port: the page's own was picked free too
    cmd_serve(args)


def cmd_mcp(args):
    # the MCP adapter's entry point (as `serve` is the REST one's)
    from ..mcp.server import main as mcp_main
    token = config.remote_token() if args.url else None
    # over HTTP, the connection limits of `serve` (header caps and timeout, connections per client)
    options = _rest()[1]() if args.http else None
    mcp_main(args.home or config.default_home(), http=args.http, host=args.host, port=args.port, url=args.url,
             token=token, server_options=options, tools=args.tools)


# ---- tenants, tokens, audit (tenancy/) ----------------------------------------------------------
def _limits(args) -> dict:
    return {"max_runs": args.max_runs, "max_timeout": args.max_timeout, "max_output": args.max_output,
            "max_sandboxes": args.max_sandboxes, "max_upload": args.max_upload, "max_memory": args.max_memory,
            "max_pids": args.max_pids, "max_disk": args.max_disk, "max_cpus": args.max_cpus,
            "max_ports": args.max_ports, "max_volumes": args.max_volumes}


def cmd_token(args):
    eng = open_engine(args)
    sub = args.token_command
    if sub == "create":
        res = eng.tenancy.create_token(args.tenant, args.scopes, network=args.network, tier=args.tier,
                                        **_limits(args))
        out(args, res, lambda o: (print(o["token"]), print(
            f"token {o['id']} for tenant {o['tenant']} ({','.join(o['scopes'])}): shown once, keep it",
            file=sys.stderr)))
    elif sub == "list":
        def human(rows):
            for r in rows:
                state = "revoked" if r["revoked"] else "active"
                lim = " ".join(f"{k}={int(v) if float(v).is_integer() else v}" for k, v in r["limits"].items())
                net = f" network={json.dumps(r['network'], separators=(',', ':'))}" if r.get("network") else ""
                tier = f" tier={r['tier']}" if r.get("tier") else ""
                print(f"{r['id']}  {r['tenant']:<16} {state:<8} {fmt_time(r['created'])}  {','.join(r['scopes'])}  "
                      f"{lim}{net}{tier}".rstrip())
        out(args, eng.tenancy.tokens(), human)
    elif sub == "revoke":
        out(args, eng.tenancy.revoke(args.id), lambda o: print(f"revoked {o['id']} ({o['tenant']})"))
    elif sub == "limits":
        res = eng.tenancy.set_limits(args.tenant, **_limits(args))
        out(args, {"tenant": args.tenant, "limits": res}, lambda o: print(json.dumps(o)))


def add_store_checks(sub, common) -> None:
    x = sub.add_parser("fsck", parents=[common], help="verify the store")
    x.add_argument("--quick", action="store_true", help="skip re-hashing file contents")
    x.set_defaults(fn=cmd_fsck)
    derive.add(sub, common, "gc")


def _limit_args(x) -> None:
    x.add_argument("--max-runs", type=int, help="the tenant's runs at once (more are refused)")
    x.add_argument("--max-timeout", type=float, help="longest run timeout the tenant may ask (s)")
    x.add_argument("--max-output", help="most output kept per stream (e.g. 1M)")
    x.add_argument("--max-sandboxes", type=int, help="live sandboxes the tenant may keep at once (default 8)")
    x.add_argument("--max-upload", help="largest upload or image tar the tenant may send (e.g. 200M; "
                                        "default: the server's --max-upload)")
    x.add_argument("--max-memory", help="most memory a run or sandbox may ask (default: the engine's 2G)")
    x.add_argument("--max-pids", type=int, help="most processes a run or sandbox may ask (default 1024)")
    x.add_argument("--max-disk", help="most disk a run or sandbox may ask (default: the engine's 1G)")
    x.add_argument("--max-ports", type=int, help="exposed ports the tenant may have at once, over all its "
                                                  "sandboxes (default 64)")
    x.add_argument("--max-cpus", type=float, help="most CPUs a run or sandbox may ask (default: any)")
    x.add_argument("--max-volumes", help="bytes all of the tenant's volumes hold together (e.g. 10G; default 1G); "
                                         "raising it grows them, lowering it does not shrink them")


def add_services(sub, common) -> None:
    """doctor, serve, ui, token, audit, mcp (in --help's order)."""
    derive.add(sub, common, "doctor")
    derive.group(sub, "cluster", help="the Ray cluster runs go to (with --cluster)", parents=[common])
    derive.add(sub, common, "cluster_status")
    x = sub.add_parser("serve", parents=[common], help="the REST API (/api/v1, OpenAPI at /openapi.json)")
    x.add_argument("--host", default="127.0.0.1")
    x.add_argument("--port", type=int, default=8080)
    x.add_argument("--ports-port", type=int, default=None, metavar="PORT",
                   help="where the exposed ports of sandboxes are served: an origin of their own, so a page a "
                        "sandbox serves cannot act as the API's (default: --port + 1; 0: any free port)")
    x.add_argument("--preview-url", default=None, metavar="URL",
                   help="where browsers reach each exposed port, under a host name of its own (p<port>-<id>): "
                        "http(s)://*.DOMAIN[:PORT], e.g. https://*.previews.example.com behind a proxy with a "
                        "wildcard DNS name and certificate (default: http://*.localhost:<ports port>)")
    x.add_argument("--max-runs", type=int, default=4, help="runs at once; more queue")
    x.add_argument("--pool", action="append", metavar="IMAGE=SIZE",
                   help="keep SIZE sandboxes of IMAGE started for runs through this server (repeatable); "
                        "DOCKERFILE[:CONTEXT][#TAG]=SIZE builds the Dockerfile at start (cache hits when "
                        "unchanged), tags the result TAG (default pool/CONTEXT-NAME/FILE-NAME) and pools it")
    x.add_argument("--watch", type=float, metavar="SECONDS",
                   help="every SECONDS, rebuild each Dockerfile pool (cache hits when nothing changed); a new "
                        "image rolls its pool over without dropping runs")
    x.add_argument("--access-log", choices=["json", "off"], default="json",
                   help="request log on stderr: one JSON object per request (default), or none")
    x.add_argument("--max-upload", default="1G",
                   help="largest upload or image tar a request may send (default 1G; a tenant's own "
                        "--max-upload limit replaces it)")
    x.add_argument("--header-timeout", type=float, metavar="SECONDS",
                   help=f"a request's headers must have come within this (default {D.HEADER_TIMEOUT:g}; then 408, closed)")
    x.add_argument("--keep-alive", type=float, metavar="SECONDS",
                   help=f"an idle connection is closed after this (default {D.KEEP_ALIVE:g})")
    x.add_argument("--max-header-bytes", type=int, metavar="BYTES",
                   help=f"a request's line and headers (default {D.HEADER_BYTES}; more: 431, closed)")
    x.add_argument("--max-client-connections", type=int, metavar="N",
                   help=f"connections one client address may hold (default {D.CLIENT_CONNECTIONS}; 0: no cap, "
                        "e.g. behind a reverse proxy that is every client)")
    x.add_argument("--max-connections", type=int, metavar="N",
                   help=f"connections in all (default {D.SERVER_CONNECTIONS}, at most the open-file limit less 256)")
    x.set_defaults(fn=cmd_serve)
    x = sub.add_parser("ui", parents=[common], help="the web page (lineage tree, runs, diffs, files) on a local "
                                                  "server at a free loopback port; prints its URL")
    x.add_argument("--open", action="store_true", help="open it in this machine's web browser")
    x.add_argument("--port", type=int, default=None, help="this port instead of a free one")
    x.add_argument("--max-runs", type=int, default=4, help="runs at once; more queue")
    x.add_argument("--max-upload", default="1G", help="largest upload or image tar a request may send")
    x.set_defaults(fn=cmd_ui)
    tk = sub.add_parser("token", help="API tokens: each belongs to a tenant, which sees only its own images")
    tsub = tk.add_subparsers(dest="token_command", required=True)
    x = tsub.add_parser("create", parents=[common], help="a new token (the secret is shown once)")
    x.add_argument("--tenant", required=True)
    x.add_argument("--scopes", help="comma-separated: import,run,list,cancel,tag (default) and admin")
    x.add_argument("--network", metavar="RULES|all|any|off",
                   help="network policies its runs and sandboxes may ask for: off (default), all (public "
                        "destinations), any (any policy), or RULES (comma list: each allow rule must be within one)")
    x.add_argument("--tier", metavar="TIER",
                   help="the only isolation tier (namespaces, gvisor) its runs, sandboxes and builds use, whatever they ask (asking "
                        "for another is refused): gvisor keeps its code off the host kernel")
    _limit_args(x)
    x.set_defaults(fn=cmd_token)
    x = tsub.add_parser("list", parents=[common], help="tokens (ids, tenants, scopes; never secrets)")
    x.set_defaults(fn=cmd_token)
    x = tsub.add_parser("revoke", parents=[common], help="revoke a token by id (takes effect at once)")
    x.add_argument("id")
    x.set_defaults(fn=cmd_token)
    x = tsub.add_parser("limits", parents=[common], help="set a tenant's limits")
    x.add_argument("--tenant", required=True)
    _limit_args(x)
    x.set_defaults(fn=cmd_token)
    derive.add(sub, common, "audit", "whoami")
    x = sub.add_parser("mcp", parents=[common], help="serve sandtree to agents over MCP (stdio, or --http)")
    x.add_argument("--http", action="store_true", help="streamable HTTP instead of stdio")
    x.add_argument("--host", default="127.0.0.1")
    x.add_argument("--port", type=int, default=8765)
    x.add_argument("--url", help="use a `sandtree serve` at this URL (token from $SANDTREE_TOKEN)")
    x.add_argument("--tools", default="core", metavar="PROFILE",
                   help="core (the default: the everyday tools, a small schema), all, or a comma list of tool names")
    x.set_defaults(fn=cmd_mcp)
