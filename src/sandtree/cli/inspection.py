"""Reading images without running anything (`cat`, `ls`, `stat`, `grep`, `log`), naming them
(`tag`, `untag`) and the record of an operation (`op`): all made from their rows (derive.py) but `grep`,
whose row keeps its options (glob, max_matches, ignore_case) in **kw, so they are written here."""

from __future__ import annotations

from . import derive, exits
from .output import open_engine, out


def cmd_grep(args):
    eng = open_engine(args)
    hits = eng.grep(derive.resolved(eng, args.image), args.pattern, args.path, glob=args.glob,
                    max_matches=args.max_matches, ignore_case=args.ignore_case)
    out(args, hits, lambda rows: [print(f"{r['path']}:{r['line']}:{r['text']}") for r in rows])
    return exits.OK if hits else exits.NO


def add_inspection(sub, common) -> None:
    derive.add(sub, common, "read", "ls", "stat")
    x = sub.add_parser("grep", parents=[common], help="search file contents of an image")
    x.add_argument("image"); x.add_argument("pattern"); x.add_argument("path", nargs="?", default="/")
    x.add_argument("--glob"); x.add_argument("--max-matches", type=int, default=1000)
    x.add_argument("-i", "--ignore-case", action="store_true")
    x.set_defaults(fn=cmd_grep)
    derive.add(sub, common, "log", "tag", "untag")


def add_op(sub, common) -> None:
    derive.add(sub, common, "operation")
