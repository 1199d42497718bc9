"""Git-like work on images: `diff`, `merge`, `branch ...`, `tree`, `lineage ...` and
`bundle ...` (images with their lineage in one file). `branch ...` and `bundle ...` are made from their rows
(derive.py); diff (with --patch), merge (with --preview), tree and lineage, more than one operation each, here."""

from __future__ import annotations

import json
import sys

from . import derive, exits, options
from ..errors import InvalidInput
from .output import open_engine, out
from .usage import usage_error
# Two names the engine has no public home for yet: the merge's default ignore globs (shown in
# --help and extended by --ignore) and the text/SVG drawings of Engine.lineage_tree's result.
# Both are pure (no store, no runtime); they move when the engine or a defaults module offers them.
from ..render import render_svg, render_text
from ..defaults import MERGE_IGNORE as DEFAULT_IGNORE


def cmd_diff(args):
    eng = open_engine(args)
    a, b = derive.resolved(eng, [args.a, args.b])
    changes = eng.diff(a, b)
    if args.patch and not args.json:
        sys.stdout.write(eng.patch(a, b))
        return exits.OK
    res = {"a": a, "b": b, "changes": [c.to_dict() for c in changes]}
    if args.patch:
        res["patch"] = eng.patch(a, b)

    def human(o):
        marks = {"added": "A", "removed": "D", "modified": "M", "type_changed": "T", "metadata_changed": "m"}
        for c in o["changes"]:
            print(f"{marks[c['kind']]}  {c['path']}")
    out(args, res, human)


def cmd_merge(args):
    if len(args.images) not in (2, 3):
        usage_error(args, f"merge takes OURS THEIRS or BASE OURS THEIRS: 2 or 3 images, not {len(args.images)}")
    eng = open_engine(args)
    refs_ = derive.resolved(eng, args.images)
    base, ours, theirs = (refs_ if len(refs_) == 3 else [None] + refs_)
    if args.preview:                       # merge_preview: what merge would make, making nothing
        if args.strategy or args.ignore or args.no_default_ignore:
            raise InvalidInput("merge --preview takes no --strategy, --ignore or --no-default-ignore")
        res = eng.merge_preview(base, ours, theirs)

        def preview(o):
            for c in o["conflicts"]:
                print(f"CONFLICT ({c['kind']}): {c['path']}")
            print("clean: merge would make an image" if o["clean"] else "merge would stop at these conflicts")
        out(args, res, preview)
        return exits.OK if res["clean"] else exits.NO
    ignore = None if args.ignore is None and not args.no_default_ignore else \
        ([] if args.no_default_ignore else list(DEFAULT_IGNORE)) + (args.ignore or [])
    # the conflicts come back to be listed (exit 1 says no image was made)
    res = eng.merge(base, ours, theirs, strategy=args.strategy, ignore=ignore, on_conflict="return")

    def human(o):
        for c in o["conflicts"]:
            print(f"CONFLICT ({c['kind']}): {c['path']}", file=sys.stderr)
        print(o["image"] if o["image"] else "no image made: resolve the conflicts or pass --strategy",
              file=sys.stdout if o["image"] else sys.stderr)
    out(args, res, human)
    return exits.OK if res["image"] else exits.NO


def cmd_tree(args):
    eng = open_engine(args)
    t = eng.lineage_tree(derive.resolved(eng, args.image))
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(render_svg(t))
    if args.json:
        print(json.dumps(t))
    elif not args.svg:
        sys.stdout.write(render_text(t))


LINEAGE_ARITY = {"ancestors": 1, "descendants": 1, "path": 2, "common": 2, "produced-by": 1}   # images each query takes


def cmd_lineage(args):
    eng = open_engine(args)
    q = args.query
    ids = derive.resolved(eng, args.images)
    if len(ids) != LINEAGE_ARITY[q]:
        raise InvalidInput(f"sandtree lineage {q} takes {LINEAGE_ARITY[q]} image(s)")
    if q in ("ancestors", "descendants"):
        d = eng.ancestors(ids[0]) if q == "ancestors" else eng.descendants(ids[0])
        res = [{"image": i, "distance": n} for i, n in sorted(d.items(), key=lambda kv: kv[1]) if n]
    elif q == "path":
        res = eng.lineage_path(*ids)
    elif q == "common":
        res = {"image": eng.common_ancestor(*ids)}
    else:
        res = eng.produced_by(ids[0])
    out(args, res, lambda o: print(json.dumps(o, indent=2)))


def add_branching(sub, common) -> None:
    """diff, merge, branch, tree, lineage (bundle comes later in --help: add_bundle)."""
    x = sub.add_parser("diff", parents=[common], help="what changed from image A to image B")
    x.add_argument("a"); x.add_argument("b")
    x.add_argument("--patch", action="store_true", help="a unified patch of text files")
    x.set_defaults(fn=cmd_diff)
    x = sub.add_parser("merge", parents=[common], help="three-way merge: [BASE] OURS THEIRS")
    x.add_argument("images", nargs="+", metavar="IMAGE")
    options.add_quiet(x)
    x.add_argument("--strategy", choices=["ours", "theirs", "markers"])
    x.add_argument("--ignore", action="append", metavar="GLOB",
                   help="paths that never conflict, ours taken (repeatable; added to the defaults "
                        f"{' '.join(DEFAULT_IGNORE)})")
    x.add_argument("--no-default-ignore", action="store_true", help="do not ignore the default globs")
    x.add_argument("--preview", action="store_true", help="say what merge would make (clean, its conflicts), "
                   "making nothing; exit 1 if it would conflict")
    x.set_defaults(fn=cmd_merge)
    derive.group(sub, "branch", help="branches: movable names that advance with each run on them")
    derive.add(sub, common, "branches", "branch_create", "branch_delete", "rollback", "branch_log", "branch_head")
    x = sub.add_parser("tree", parents=[common], help="the lineage tree under an image")
    x.add_argument("image"); x.add_argument("--svg", metavar="FILE", help="also draw it as SVG")
    x.set_defaults(fn=cmd_tree)
    x = sub.add_parser("lineage", parents=[common], help="ancestors, descendants, path, common, produced-by")
    x.add_argument("query", choices=list(LINEAGE_ARITY))
    x.add_argument("images", nargs="+", metavar="IMAGE")
    options.add_quiet(x)
    x.set_defaults(fn=cmd_lineage)


def add_bundle(sub, common) -> None:
    derive.group(sub, "bundle", help="images with their lineage as one verifiable file")
    derive.add(sub, common, "bundle_create", "bundle_import")
