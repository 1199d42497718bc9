"""Reading images without running anything (`cat`, `ls`, `stat`, `grep`, `log`), naming them
(`tag`, `untag`) and the record of an operation (`op`)."""

from __future__ import annotations

import json
import sys

from .output import open_engine, out


def cmd_cat(args):
    eng = open_engine(args)
    data = eng.read(eng.resolve(args.image), args.path)
    sys.stdout.buffer.write(data)


def cmd_ls(args):
    eng = open_engine(args)
    entries = [e.to_dict() for e in eng.ls(eng.resolve(args.image), args.path)]

    def human(rows):
        for r in rows:
            extra = f" -> {r['target']}" if "target" in r else ""
            print(f"{r['type'][0] if r['type'] != 'symlink' else 'l'}{r['mode']} {r['uid']:>5} {r['gid']:>5} "
                  f"{r['size']:>10}  {r['name']}{extra}")
    out(args, entries, human)


def cmd_stat(args):
    eng = open_engine(args)
    out(args, eng.stat(eng.resolve(args.image), args.path).to_dict(),
        lambda o: [print(f"{k}: {v}") for k, v in o.items()])


def cmd_grep(args):
    eng = open_engine(args)
    hits = eng.grep(eng.resolve(args.image), args.pattern, args.path, glob=args.glob,
                    max_matches=args.max_matches, ignore_case=args.ignore_case)
    out(args, hits, lambda rows: [print(f"{r['path']}:{r['line']}:{r['text']}") for r in rows])
    return 0 if hits else 1


def cmd_log(args):
    eng = open_engine(args)
    rows = eng.log(eng.resolve(args.image))

    def human(rows):
        for r in rows:
            tags = f" ({', '.join(r['tags'])})" if r["tags"] else ""
            code = "" if r["exit_code"] is None else f" [exit {r['exit_code']}]"
            print(f"{r['image'][:12]}{tags}  {r['command'] or ''}{code}")
    out(args, rows, human)


def cmd_tag(args):
    eng = open_engine(args)
    image = eng.resolve(args.image)
    eng.tag(image, args.name)
    out(args, {"image": image, "tag": args.name}, lambda o: print(f"{o['tag']} -> {o['image']}"))


def cmd_untag(args):
    eng = open_engine(args)
    image = eng.untag(args.name)
    out(args, {"image": image, "untagged": args.name}, lambda o: print(f"untagged {o['untagged']}"))


def cmd_op(args):
    eng = open_engine(args)
    out(args, eng.operation(args.id), lambda o: print(json.dumps(o, indent=2)))


def add_inspection(sub, common) -> None:
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


def add_op(sub, common) -> None:
    x = sub.add_parser("op", parents=[common], help="show a recorded operation")
    x.add_argument("id")
    x.set_defaults(fn=cmd_op)
