"""`sandtree build [-f Dockerfile] [CONTEXT]`: a Dockerfile built into an image, each step one engine
operation cached on the image DAG (Engine.build), with docker build's progress on stderr
(buildprogress.py) and the image ID (or, with --json, the whole result) on stdout."""

from __future__ import annotations

import sys

from . import options
from .buildprogress import JsonProgress, LiveProgress, PlainProgress, StepLabels
from .output import engine_api, open_engine, out, remote_engine
from ..values import name_values



def progress_view(mode: str, recipe, stream=None, *, tty: bool | None = None):
    """The progress callback for --progress MODE (auto: live on a terminal, else plain); None: quiet."""
    stream = stream if stream is not None else sys.stderr
    tty = stream.isatty() if tty is None else tty
    labels = StepLabels(recipe)
    if mode == "quiet":
        return None
    if mode == "json":
        return JsonProgress(stream)
    if mode == "plain" or not tty:
        return PlainProgress(stream, labels)
    return LiveProgress(stream, labels)


def _remote_build(args) -> dict:
    """`--server URL`: the context directory sent as a tar, the Dockerfile as its text unless it
    is the context's own; the server's progress events drawn here as the local build's are."""
    eng = remote_engine(args.server)
    read_dockerfile = engine_api().read_dockerfile
    try:
        text = sys.stdin.read() if args.file == "-" else read_dockerfile(args.file) if args.file else None
        filters = tuple(f for x in args.no_cache_filter for f in x.split(",") if f)
        view = progress_view(args.progress, None)
        try:
            return eng.build_context(args.context, text=text, tag=args.tag,
                                     build_args=name_values(args.build_arg, "--build-arg"), target=args.target,
                                     network=options.network(args).get("network"), no_cache=args.no_cache,
                                     no_cache_filter=filters, progress=view).to_dict()
        finally:
            if view is not None:
                view.close()
    finally:
        eng.close()


def cmd_build(args):
    if args.quiet:
        args.progress = "quiet"
    if args.server:
        return out(args, _remote_build(args), lambda o: print(o["image"]))
    api = engine_api()
    dockerfile_recipe, read_dockerfile = api.dockerfile_recipe, api.read_dockerfile
    eng = open_engine(args)
    try:
        text = None
        if args.file == "-":
            text = sys.stdin.read()
        elif args.file is not None:
            text = read_dockerfile(args.file)
        recipe = dockerfile_recipe(eng, args.context, text=text, build_args=name_values(args.build_arg, "--build-arg"),
                                   target=args.target, network=options.network(args).get("network"))
        filters = tuple(f for x in args.no_cache_filter for f in x.split(",") if f)
        view = progress_view(args.progress, recipe)
        try:
            result = eng.build(recipe, tag=args.tag, no_cache=args.no_cache, no_cache_filter=filters, progress=view)
        finally:
            if view is not None:
                view.close()
    finally:
        eng.close()
    out(args, result.to_dict(), lambda o: print(o["image"]))


def add_build(sub, common) -> None:
    x = sub.add_parser("build", parents=[common], help="build an image from a Dockerfile (each step cached)")
    x.add_argument("context", nargs="?", default=".", help="the build context directory (default .)")
    x.add_argument("-f", "--file", help="the Dockerfile (default CONTEXT/Dockerfile; - reads stdin)")
    x.add_argument("-t", "--tag", help="tag the result")
    x.add_argument("--build-arg", action="append", default=[], metavar="NAME=VALUE",
                   help="a value for an ARG (repeatable)")
    x.add_argument("--target", metavar="STAGE", help="build this stage (default: the last)")
    x.add_argument("--network", metavar="off|all|RULES",
                   help="network of the RUN steps without their own --network: off (default), all, or an "
                        "allow-list like pypi.org,*.pythonhosted.org:443")
    x.add_argument("--allow", action="append", default=[], metavar="RULE", help="add RULE to the allow-list")
    x.add_argument("--deny", action="append", default=[], metavar="RULE", help="refuse RULE even when allowed")
    x.add_argument("--no-cache", action="store_true", help="run every step again (results are cached anew)")
    x.add_argument("--no-cache-filter", action="append", default=[], metavar="STAGE",
                   help="run this stage's steps again (repeatable, or comma-separated)")
    x.add_argument("--progress", choices=("auto", "plain", "json", "quiet"), default="auto",
                   help="auto: a live view on a terminal, else plain (docker's #N lines); json: an event a line")
    x.add_argument("--server", metavar="URL", help="build on a `sandtree serve` at URL (the context is sent as a "
                   "tar; token: $SANDTREE_TOKEN)")
    options.add_quiet(x)
    x.set_defaults(fn=cmd_build, secret=[])
