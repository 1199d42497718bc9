"""`sandtree image ...` (import, pull, push, bootstrap, list, export, rm, share, unshare) and
`sandtree registry login`: images coming in, going out and going away."""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile

from .. import config
from .output import fmt_size, fmt_time, open_engine, out, status_line, with_progress


def cmd_image_import(args):
    eng = open_engine(args)
    image = with_progress(args, "importing", lambda cb: eng.import_path(args.path, tag=args.tag, progress=cb))
    out(args, {"image": image, "tag": args.tag}, lambda o: print(o["image"]))


def cmd_image_pull(args):
    eng = open_engine(args)
    image = with_progress(args, "pulling", lambda cb: eng.pull(args.reference, tag=args.tag,
                                                                insecure=args.insecure, progress=cb))
    out(args, {"image": image, "tag": args.tag}, lambda o: print(o["image"]))


def cmd_registry_login(args):
    eng = open_engine(args)
    secret = sys.stdin.readline().rstrip("\n") if args.password_stdin else config.registry_token()
    if not secret:
        raise SystemExit("sandtree registry login: give the token on stdin (--password-stdin) or in SANDTREE_REGISTRY_TOKEN")
    host = eng.registry_login(args.registry, args.username, secret, insecure=args.insecure)
    out(args, {"registry": host, "username": args.username}, lambda o: print(f"logged in to {o['registry']}"))


def cmd_image_bootstrap(args):
    eng = open_engine(args)
    include = [p for x in args.include for p in x.split(",") if p]
    with status_line(args, f"bootstrapping {args.spec}") as log:
        image = eng.bootstrap(args.spec, include=include, tag=args.tag, log=log, mirror=args.mirror)
    out(args, {"image": image, "tag": args.tag or args.spec}, lambda o: print(o["image"]))


def cmd_image_list(args):
    eng = open_engine(args)

    def human(rows):
        for r in rows:
            print(f"{r['id'][:12]}  {fmt_time(r['created'])}  {fmt_size(r['size']):>7}  {r['files']:>6} files  "
                  f"{' '.join(r['tags'])}")
    out(args, eng.images(), human)


def cmd_image_export(args):
    eng = open_engine(args)
    image = eng.resolve(args.image)
    if args.output and args.file:
        raise SystemExit("sandtree image export: give the output once (FILE or -o)")
    args.file = args.output or args.file or "-"
    if args.format == "oci":
        return _export_oci(args, eng, image)
    if args.file == "-":
        eng.export_tar(image, sys.stdout.buffer, args.path)
    else:
        tmp = args.file + ".part"
        with open(tmp, "wb") as f:
            eng.export_tar(image, f, args.path)
        os.replace(tmp, args.file)
    if args.json:
        out(args, {"image": image, "file": args.file}, None)


def _export_oci(args, eng, image):
    """An OCI image layout: a tar (FILE ending in .tar, or - for stdout) or a directory."""
    if args.file == "-":
        res = eng.export_oci(image, sys.stdout.buffer, name=args.name)
    elif args.file.endswith(".tar"):
        tmp = args.file + ".part"
        with open(tmp, "wb") as f:
            res = eng.export_oci(image, f, name=args.name)
        os.replace(tmp, args.file)
    else:
        if os.path.lexists(args.file) and (not os.path.isdir(args.file) or os.listdir(args.file)):
            raise SystemExit(f"sandtree image export: {args.file} exists and is not an empty directory")
        with tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(args.file))) as f:
            res = eng.export_oci(image, f, name=args.name)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r") as t:
                t.extractall(args.file, filter="data")       # our own layout; still never outside the dir
    if args.file != "-":                                    # stdout is the layout itself
        out(args, {**res, "file": args.file}, lambda o: print(o["digest"]))


def cmd_image_push(args):
    eng = open_engine(args)
    image = eng.resolve(args.image)
    res = with_progress(args, "pushing", lambda cb: eng.push(image, args.reference, insecure=args.insecure,
                                                             progress=cb))
    out(args, res, lambda o: print(f"{o['reference']}@{o['digest']}  {o['layers']} layers, "
                                   f"{o['uploaded']} blobs uploaded ({fmt_size(o['bytes'])}) in {o['seconds']:.3f}s"))


def cmd_image_rm(args):
    eng = open_engine(args)
    removed = []
    for ref in args.images:
        image = eng.resolve(ref)
        eng.remove_image(image, force=args.force)
        removed.append(image)
    out(args, {"removed": removed}, lambda o: [print(i) for i in o["removed"]])


def cmd_image_share(args):
    eng = open_engine(args)
    image = eng.resolve(args.image)
    res = eng.share(image) if args.image_command == "share" else eng.unshare(image)
    out(args, res, lambda o: print(f"{o['image']} {'public' if o['public'] else 'private'}"))


def add_image(sub, common) -> None:
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
    x = isub.add_parser("export", parents=[common], help="write an image as a tar or an OCI image layout")
    x.add_argument("image")
    x.add_argument("file", nargs="?", help="output file, or - for stdout (default)")
    x.add_argument("-o", "--output", help="output: a file, - for stdout, or for --format oci a directory "
                                          "(a name not ending in .tar)")
    x.add_argument("--format", choices=("tar", "oci"), default="tar",
                   help="tar: the root filesystem; oci: an OCI image layout (layers, config, manifest)")
    x.add_argument("--name", help="--format oci: the ref name in the layout's index (skopeo's oci:DIR:NAME)")
    x.add_argument("--path", default="/", help="--format tar: export only this subtree")
    x.set_defaults(fn=cmd_image_export)
    x = isub.add_parser("push", parents=[common], help="push an image to an OCI registry (docker://HOST/NAME:TAG)")
    x.add_argument("image")
    x.add_argument("reference", help="docker://HOST[:PORT]/NAME[:TAG]")
    x.add_argument("--insecure", action="store_true", help="plain HTTP (loopback registries use it anyway)")
    x.set_defaults(fn=cmd_image_push)
    x = isub.add_parser("rm", parents=[common], help="remove images (their data goes at the next gc)")
    x.add_argument("images", nargs="+")
    x.add_argument("--force", action="store_true", help="also drop the tags pointing at it")
    x.set_defaults(fn=cmd_image_rm)
    for name, what in (("share", "make an image visible to every tenant (by ID)"),
                       ("unshare", "stop sharing an image")):
        x = isub.add_parser(name, parents=[common], help=what)
        x.add_argument("image")
        x.set_defaults(fn=cmd_image_share)


def add_registry(sub, common) -> None:
    rg = sub.add_parser("registry", help="credentials for OCI registries")
    rsub = rg.add_subparsers(dest="registry_command", required=True)
    x = rsub.add_parser("login", parents=[common], help="check and keep a registry token")
    x.add_argument("registry"); x.add_argument("--username", required=True)
    x.add_argument("--password-stdin", action="store_true"); x.add_argument("--insecure", action="store_true")
    x.set_defaults(fn=cmd_registry_login)
