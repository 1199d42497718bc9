"""The `sandtree` command: an adapter over the engine (human output by default, --json everywhere).
The verbs of one operation each are made from the operation table's rows (derive.py); the others live by
group in images.py, runs.py, sandboxes.py, inspection.py, branching.py and admin.py; here the parser is
assembled and errors become exit statuses.

Exit status (the one table: exits.py): `run` and `exec` exit with the command's status (128+N for a signal,
124 on timeout, 125 for a sandtree error); other commands exit 0, or 1 with `error: ...` (or a JSON error object).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import sys

from . import exits
from .. import config
from ..errors import DiskFull, SandtreeError
from .usage import Parser

# The verbs in the order `sandtree --help` lists them (kept from before the split by group), as "module.function"
# of sandtree.cli: a command line imports only its own verb's modules (lazy.py).
GROUPS = ("images.add_image", "build.add_build", "evaluation.add_eval", "runs.add_run", "sandboxes.add_sandboxes",
          "processes.add_processes", "inspection.add_inspection", "admin.add_store_checks", "branching.add_branching",
          "runs.add_fork", "branching.add_bundle", "images.add_registry", "admin.add_services", "secrets.add_secrets",
          "inspection.add_op", "exploration.add_exploration")
REST = "derive.add_rest"            # the rows' verbs not placed by GROUPS (a new row's, with no edit here)


def builder(name: str):
    """GROUPS' "module.function" (or REST) as the function."""
    module, fn = name.rsplit(".", 1)
    return getattr(importlib.import_module(f"{__package__}.{module}"), fn)


def common_parser() -> argparse.ArgumentParser:
    # The common options are accepted before or after the subcommand; SUPPRESS keeps a
    # subcommand's unset default from overwriting a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output")
    common.add_argument("--home", default=argparse.SUPPRESS,
                        help="store directory (default $SANDTREE_HOME or ~/.local/share/sandtree)")
    common.add_argument("--database", default=argparse.SUPPRESS, metavar="URL",
                        help="the store's metadata database: postgresql://... (default $SANDTREE_DATABASE_URL, "
                             "else SQLite in the store directory)")
    common.add_argument("--objects", default=argparse.SUPPRESS, metavar="URL",
                        help="the store's objects in S3-compatible storage: s3://bucket/prefix (default "
                             "$SANDTREE_OBJECTS_URL, else the store directory only; endpoint: $SANDTREE_S3_ENDPOINT)")
    common.add_argument("--cluster", default=argparse.SUPPRESS, metavar="ADDRESS",
                        help="send runs and live sandboxes to a Ray cluster's nodes: auto, HOST:PORT or "
                             "ray://HOST:PORT (default $SANDTREE_CLUSTER, else none: this process runs them)")
    return common


def top_parser(common):
    """The `sandtree` parser with no verb yet: (it, its subparsers action)."""
    p = Parser(prog="sandtree", parents=[common],
                                description="Sandboxes for AI agents with git-like images.")
    return p, p.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every verb built (the tests', and a command line the verb index cannot place: lazy.py)."""
    common = common_parser()
    p, sub = top_parser(common)
    for name in GROUPS + (REST,):
        builder(name)(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    from .lazy import parser_for           # (lazy.py builds on this module's parsers)
    argv = list(sys.argv[1:] if argv is None else argv)
    tail = None
    if "--" in argv:                       # everything after -- is the command, options included
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1:]
    parser = parser_for(argv)              # only the verb given is built (start-up time), the others named
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.home = getattr(args, "home", None)
    config.use_database(getattr(args, "database", None))
    config.use_objects(getattr(args, "objects", None))
    config.use_cluster(getattr(args, "cluster", None))
    if tail is not None:
        if not getattr(args, "takes_command", False):
            parser.error("'--' is only for `sandtree run IMAGE -- CMD ...`, `exec` and `shell`")
        args.cmd = list(args.cmd) + tail
    try:
        try:
            rc = args.fn(args)
        except OSError as exc:               # a full disk outside the engine (this command's own files)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DiskFull(f"disk full: {exc.strerror}") from None
        return rc or exits.OK
    except SandtreeError as exc:
        if args.json:
            print(json.dumps(exc.to_dict(), default=str))
        else:
            print(f"error: {exc.message}", file=sys.stderr)
        # run and exec keep 0-124 and 128+ for the command's own status
        return getattr(args, "error_status", exits.ERROR)
    except BrokenPipeError:
        return exits.OK
    except KeyboardInterrupt:
        return exits.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
