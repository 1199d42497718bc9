"""The whole `sandtree` parser: the common options, the top parser, and every verb group's builder in the order
`sandtree --help` lists them (main.py parses with the part of it a command line needs: lazy.py)."""

from __future__ import annotations

import argparse
import importlib

from .usage import PROG, Parser

# The verbs in the order `sandtree --help` lists them (kept from before the split by group), as "module.function"
# of sandtree.cli: a command line imports only its own verb's modules (lazy.py).
GROUPS = (("images", "add_image"), ("build", "add_build"), ("evaluation", "add_eval"), ("runs", "add_run"),
          ("sandboxes", "add_sandboxes"), ("processes", "add_processes"), ("inspection", "add_inspection"),
          ("admin", "add_store_checks"), ("branching", "add_branching"), ("runs", "add_fork"),
          ("branching", "add_bundle"), ("images", "add_registry"), ("admin", "add_services"), ("secrets", "add_secrets"),
          ("inspection", "add_op"), ("exploration", "add_exploration"))
REST = ("derive", "add_rest")       # the rows' verbs not placed by GROUPS (a new row's, with no edit here)


def name_of(group: tuple[str, str]) -> str:
    """A builder's name in the verb index: "module.function"."""
    return ".".join(group)


def builder(group: tuple[str, str]):
    """A GROUPS (or REST) entry as its function."""
    module, fn = group
    # through a name: the verb modules load only when a command line's verb needs one (start-up time)
    return getattr(importlib.import_module(f".{module}", __package__), fn)


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
    p = Parser(prog=PROG, parents=[common],
                                description="Sandboxes for AI agents with git-like images.")
    return p, p.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every verb built (the tests', and a command line the verb index cannot place: lazy.py)."""
    common = common_parser()
    p, sub = top_parser(common)
    for name in GROUPS + (REST,):
        builder(name)(sub, common)
    return p
