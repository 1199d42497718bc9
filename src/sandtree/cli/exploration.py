"""`sandtree annotate IMAGE --score 0.7 --meta k=v` (a score and metadata on an image, engine/images/annotations.py)
and `sandtree trace export ROOT --format jsonl|parquet -o FILE` (the subtree as a dataset,
exploration/traces.py)."""

from __future__ import annotations

import json

from ..errors import InvalidInput
from ..exploration import traces
from . import derive
from .output import open_engine, out

__all__ = ["add_exploration", "add_trace", "cmd_annotate", "cmd_trace_export", "parse_meta"]


def parse_meta(items: list[str]) -> dict:
    """k=v pairs; v is read as JSON when it is a JSON scalar (0.5, true, null, "s"), else as a string."""
    meta = {}
    for item in items or ():
        key, sep, text = item.partition("=")
        if not sep:
            raise InvalidInput(f"--meta wants KEY=VALUE, got {item!r}")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        meta[key] = text if isinstance(value, (list, dict)) else value
    return meta


def cmd_annotate(args):
    eng = open_engine(args)
    image = derive.resolved(eng, args.image)
    got = eng.annotate(image, args.score, parse_meta(args.meta) or None)
    out(args, {"image": image, **got},
        lambda o: print(f"{o['image'][:12]} score={o['score']} " + " ".join(f"{k}={v}" for k, v in o["meta"].items())))


def add_exploration(sub, common) -> None:
    x = sub.add_parser("annotate", parents=[common], help="attach a score and metadata to an image (its ID stays)")
    x.add_argument("image")
    x.add_argument("--score", type=float)
    x.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="repeatable; VALUE null removes")
    x.set_defaults(fn=cmd_annotate)
    add_trace(sub, common)


def cmd_trace_export(args):
    eng = open_engine(args)
    got = traces.export_trace(eng, args.root, args.format, args.output, args.max_output)
    out(args, got, lambda o: print(f"{o['rows']} rows from {o['root'][:12]} -> {o['file']} ({o['format']})"))


def add_trace(sub, common) -> None:
    t = sub.add_parser("trace", help="the image tree as a dataset (RL traces, evaluation)")
    tsub = t.add_subparsers(dest="trace_command", required=True)
    x = tsub.add_parser("export", parents=[common], help="write the subtree under ROOT as JSONL or Parquet")
    x.add_argument("root")
    x.add_argument("--format", choices=traces.FORMATS, default="jsonl")
    x.add_argument("-o", "--output", required=True, help="the file to write")
    x.add_argument("--max-output", type=int, default=4096, help="bytes of stdout/stderr kept per row")
    x.set_defaults(fn=cmd_trace_export)
