"""`sandtree secret ...` (set, list, rm): the server's stored secrets, which runs then name
(`--secret NAME`, `secrets=["NAME"]`). A value comes from stdin or a file, never the command line
(where `ps` and shell history would keep it), and is never printed. `secret list` and `secret rm` are made from
their rows (derive.py); `set` is written here (its value read from stdin or a file, its lists comma-separated)."""

from __future__ import annotations

import getpass
import sys

from ..errors import InvalidInput
from . import derive
from .output import open_engine, out


def _value(args) -> str:
    if args.from_file:
        try:
            with open(args.from_file, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidInput(f"secret {args.name}: cannot read {args.from_file}: "
                               f"{getattr(e, 'strerror', None) or 'not UTF-8 text'}") from None
    elif sys.stdin.isatty():                                   # typed: not echoed
        return getpass.getpass(f"value of {args.name}: ")
    else:
        text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text          # the newline `echo` or a file adds


def cmd_secret(args):
    eng = open_engine(args)
    hosts = [h for h in args.hosts.split(",") if h.strip()]
    tenants = [t for t in args.tenants.split(",") if t.strip()] if args.tenants else None
    res = eng.secret_set(args.name, _value(args), hosts, tenants=tenants, tenant=args.tenant)
    out(args, res, lambda o: print(f"stored {o['name']} for {','.join(o['hosts'])} ({o['owner']})"))


def add_secrets(sub, common) -> None:
    ssub = derive.group(sub, "secret", help="stored secrets: runs use them by name (--secret NAME); values never shown")
    x = ssub.add_parser("set", parents=[common], help="store (or replace) a secret; the value from stdin or a file")
    x.add_argument("name", help="its name: the variable runs see (a placeholder) as $NAME")
    x.add_argument("--hosts", required=True, help="comma list of host names (or *.domain) the value may go to")
    x.add_argument("--from-file", metavar="PATH", help="read the value from PATH (one trailing newline dropped)")
    x.add_argument("--tenants", metavar="NAMES", help="(the operator's) tenants that may use it: a comma list, or *")
    x.add_argument("--tenant", help="store it in this tenant's namespace instead of the global one")
    x.set_defaults(fn=cmd_secret)
    derive.add(sub, common, "secret_list", "secret_remove")
