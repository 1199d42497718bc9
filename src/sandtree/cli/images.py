"""`sandtree image ...` (import, pull, push, bootstrap, list, export, rm, share, unshare, info, config) and
`sandtree registry ...`: images coming in, going out and going away. The verbs of one operation each are made
from their rows (derive.py); bootstrap, export and registry login are written here."""

from __future__ import annotations

import os
import sys
import tarfile
import tempfile

from .. import config
from ..errors import InvalidInput
from . import derive, options
from .output import open_engine, out, status_line


def cmd_registry_login(args):
    eng = open_engine(args)
    secret = sys.stdin.readline().rstrip("\n") if args.password_stdin else config.registry_token()
    if not secret:
        raise InvalidInput("sandtree registry login: give the token on stdin (--password-stdin) or in SANDTREE_REGISTRY_TOKEN")
    host = eng.registry_login(args.registry, args.username, secret, insecure=args.insecure)
    out(args, {"registry": host, "username": args.username}, lambda o: print(f"logged in to {o['registry']}"))


def cmd_image_bootstrap(args):
    eng = open_engine(args)
    include = [p for x in args.include for p in x.split(",") if p]
    with status_line(args, f"bootstrapping {args.spec}", quiet=args.quiet) as log:
        image = eng.bootstrap(args.spec, include=include, tag=args.tag, log=log, mirror=args.mirror)
    out(args, {"image": image, "tag": args.tag or args.spec}, lambda o: print(o["image"]))


def cmd_image_export(args):
    eng = open_engine(args)
    image = derive.resolved(eng, args.image)
    if args.output and args.file:
        raise InvalidInput("sandtree image export: give the output once (FILE or -o)")
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
            raise InvalidInput(f"sandtree image export: {args.file} exists and is not an empty directory")
        with tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(args.file))) as f:
            res = eng.export_oci(image, f, name=args.name)
            f.seek(0)
            with tarfile.open(fileobj=f, mode="r") as t:
                t.extractall(args.file, filter="data")       # our own layout; still never outside the dir
    if args.file != "-":                                    # stdout is the layout itself
        out(args, {**res, "file": args.file}, lambda o: print(o["digest"]))


def add_image(sub, common) -> None:
    isub = derive.group(sub, "image", help="import, list, export and remove images")
    derive.add(sub, common, "import_path", "pull")
    x = isub.add_parser("bootstrap", parents=[common], help="build a Debian base image (debootstrap)")
    x.add_argument("spec", help="debian:SUITE, e.g. debian:bookworm")
    x.add_argument("--include", action="append", default=[], help="extra packages (comma-separated)")
    x.add_argument("--tag", help="tag (default: the spec)")
    x.add_argument("--mirror", help="Debian mirror (default: the host's apt source)")
    options.add_quiet(x)
    x.set_defaults(fn=cmd_image_bootstrap)
    derive.add(sub, common, "images")
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
    derive.add(sub, common, "push", "remove_image", "share", "unshare", "image_info", "image_config")


def add_registry(sub, common) -> None:
    rsub = derive.group(sub, "registry", help="credentials for OCI registries")
    x = rsub.add_parser("login", parents=[common], help="check and keep a registry token")
    x.add_argument("registry"); x.add_argument("--username", required=True)
    x.add_argument("--password-stdin", action="store_true"); x.add_argument("--insecure", action="store_true")
    x.set_defaults(fn=cmd_registry_login)
    derive.add(sub, common, "registry_host")
