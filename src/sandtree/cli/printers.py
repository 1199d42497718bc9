"""How a derived verb (derive.py) prints its answer, by the printer's name a row's Cli(show=...) gives: with --json
one JSON document, else lines for people. Without a name: the answer as it is (plain()). Each printer takes the
parsed command line, the engine call's arguments (images resolved to full IDs) and the answer."""

from __future__ import annotations

import json
import sys
import time

from . import exits
from .output import fmt_size, fmt_time, out

__all__ = ["PRINTERS", "default", "plain", "show"]


def plain(obj):
    """An answer as JSON-able data: value objects (Entry, Change, ImageConfig, ...) by their to_dict()."""
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (list, tuple)):
        return [plain(o) for o in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def _human(obj) -> None:
    if obj is None:
        return
    if isinstance(obj, bool):
        print("yes" if obj else "no")
    elif isinstance(obj, (str, int, float)):
        print(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            print(f"{k}: {v if isinstance(v, (str, int, float, type(None))) else json.dumps(v, default=str)}")
    else:
        for o in obj:
            print(o if isinstance(o, str) else json.dumps(o, default=str))


def default(args, kw, res):
    if isinstance(res, bytes):
        return _bytes(args, kw, res)
    out(args, plain(res), _human)


def _bytes(args, kw, data):
    if args.json:
        return out(args, {"data": data.decode("utf-8", "replace")}, None)
    sys.stdout.buffer.write(data)


def _image_made(args, kw, image):
    out(args, {"image": image, "tag": kw.get("tag")}, lambda o: print(o["image"]))


def _images(args, kw, rows):
    def human(rows):
        for r in rows:
            print(f"{r['id'][:12]}  {fmt_time(r['created'])}  {fmt_size(r['size']):>7}  {r['files']:>6} files  "
                  f"{' '.join(r['tags'])}")
    out(args, rows, human)


def _push(args, kw, res):
    out(args, res, lambda o: print(f"{o['reference']}@{o['digest']}  {o['layers']} layers, "
                                   f"{o['uploaded']} blobs uploaded ({fmt_size(o['bytes'])}) in {o['seconds']:.3f}s"))


def _removed(args, kw, _):
    out(args, {"removed": kw["image"]}, lambda o: [print(i) for i in o["removed"]])


def _share(args, kw, res):
    out(args, res, lambda o: print(f"{o['image']} {'public' if o['public'] else 'private'}"))


def _entries(args, kw, entries):
    def human(rows):
        for r in rows:
            extra = f" -> {r['target']}" if "target" in r else ""
            print(f"{r['type'][0] if r['type'] != 'symlink' else 'l'}{r['mode']} {r['uid']:>5} {r['gid']:>5} "
                  f"{r['size']:>10}  {r['name']}{extra}")
    out(args, plain(entries), human)


def _fields(args, kw, res):
    out(args, plain(res), lambda o: [print(f"{k}: {v}") for k, v in o.items()])


def _log(args, kw, rows):
    def human(rows):
        for r in rows:
            tags = f" ({', '.join(r['tags'])})" if r["tags"] else ""
            code = "" if r["exit_code"] is None else f" [exit {r['exit_code']}]"
            print(f"{r['image'][:12]}{tags}  {r['command'] or ''}{code}")
    out(args, rows, human)


def _tagged(args, kw, _):
    out(args, {"image": kw["image"], "tag": kw["name"]}, lambda o: print(f"{o['tag']} -> {o['image']}"))


def _untagged(args, kw, image):
    out(args, {"image": image, "untagged": kw["name"]}, lambda o: print(f"untagged {o['untagged']}"))


def _indented(args, kw, res):
    out(args, plain(res), lambda o: print(json.dumps(o, indent=2)))


def _branches(args, kw, res):
    out(args, res, lambda o: [print(f"{n}  {i[:12]}") for n, i in o.items()])


def _branch_moved(args, kw, image):
    out(args, {"branch": kw["name"], "image": image or kw.get("image")}, lambda o: print(f"{o['branch']} -> {o['image']}"))


def _branch_deleted(args, kw, image):
    out(args, {"deleted": kw["name"], "image": image}, lambda o: print(f"deleted {o['deleted']}"))


def _branch_log(args, kw, rows):
    out(args, rows, lambda rows: [print(f"{(r['old'] or '-')[:12]} -> {(r['new'] or '-')[:12]}  {r['reason']}")
                                  for r in rows])


def _bundle(args, kw, res):
    out(args, res, lambda o: print(f"{o['file']}: {o['images']} images, {o['trees']} trees, {o['blobs']} blobs"))


def _bundle_images(args, kw, res):
    out(args, res, lambda o: [print(i) for i in o["images"]])


def _sandbox_id(args, kw, info):
    out(args, info, lambda o: print(o["id"]))


def _code(args, kw, ex):
    """A code interpreter's execution as a notebook cell shows it: what it wrote, its results'
    text (other formats named), its error's traceback on stderr; exits.NO after an error."""
    def human(ex):
        sys.stdout.write("".join(ex["logs"]["stdout"]))
        sys.stderr.write("".join(ex["logs"]["stderr"]))
        for r in ex["results"]:
            formats = [k for k, v in r.items() if v and k not in ("text", "is_main_result")]
            print(r.get("text") if r.get("text") is not None else "", *(f"[{f}]" for f in formats))
        if ex["error"]:
            sys.stderr.write(ex["error"]["traceback"] or f"{ex['error']['name']}: {ex['error']['value']}\n")
    out(args, ex, human)
    return exits.NO if ex["error"] else None          # (the verb worked: the code raised)


def _states(args, kw, infos):
    out(args, infos, lambda o: [print(f"{i['id']}  {i['state']}") for i in o])


def _hibernated(args, kw, infos):
    out(args, infos, lambda o: [print(f"{i['id']}  {i['state']}  image {i['head']}") for i in o])


def _committed(args, kw, image):
    out(args, {"image": image, "sandbox": kw["sid"], "tag": kw.get("tag")}, lambda o: print(o["image"]))


def _registry_logout(args, kw, host):
    out(args, {"registry": host}, lambda o: print(f"logged out of {o['registry']}"))


def _registries(args, kw, rows):
    out(args, rows, lambda rs: [print(f"{r['registry']:<32} {r['username']}") for r in rs])


def _ps(args, kw, rows):
    def human(rows):
        for r in rows:
            mem = fmt_size(r["memory_bytes"]) if r["memory_bytes"] is not None else "-"
            idle = time.time() - r["last_used"]
            print(f"{r['id'][:12]}  {r['state']:8}  image {r['image'][:12]}  mem {mem:>7}  idle {idle:5.0f}s")
    out(args, rows, human)


def _top(args, kw, rows):
    """A sandbox's processes as its kernel tells them (sandbox_ps), like ps -ef."""
    def human(rows):
        print(f"{'PID':>6} {'PPID':>6} {'USER':<10} {'STATE':<10} COMMAND")
        for r in rows:
            user = r["user"] or (str(r["uid"]) if r["uid"] is not None else "?")
            print(f"{r['pid']:>6} {r['ppid']:>6} {user:<10} {r['state']:<10} {' '.join(r['argv']) or '[' + r['name'] + ']'}")
    out(args, rows, human)


def _secrets(args, kw, rows):
    def human(rows):
        for r in rows:
            shared = f"  tenants={','.join(r['tenants'])}" if r.get("tenants") else ""
            print(f"{r['name']:<24} {r['owner']:<12} {fmt_time(r['created'])}  {','.join(r['hosts'])}{shared}")
    out(args, rows, human)


def _secret_removed(args, kw, _):
    out(args, {"name": kw["name"], "removed": True}, lambda o: print(f"removed {o['name']}"))


def _gc(args, kw, res):
    out(args, res, lambda r: print(", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in r.items())))


def _doctor(args, kw, rows):
    out(args, rows, lambda rs: [print(f"{r['tier']:<11} {'yes' if r['available'] else 'no ':<4} {r['reason']}")
                                for r in rs])


def _cluster(args, kw, res):
    def human(r):
        print(f"mode: {r['mode']}" + (f" ({r['address']})" if r.get("address") else "") + f", database: {r['database']}")
        print(f"{'NODE':<14} {'ALIVE':<6} {'CPUS':>5} {'RUNNING':>8} {'SANDBOXES':>10}  PID")
        for n in r["nodes"]:
            print(f"{n['node'][:12]:<14} {'yes' if n.get('alive') else 'no':<6} {n.get('cpus', 0):>5g} "
                  f"{n.get('running', 0):>8} {n.get('sandboxes', 0):>10}  {n.get('pid', '')}"
                  + (f"  ({n['reason']})" if n.get("reason") else ""))
    out(args, res, human)


def _audit(args, kw, rows):
    def human(rows):
        for r in rows:
            what = r.get("command") or r.get("tag") or r.get("branch") or ""
            outcome = f" [{r['outcome']}{'' if r.get('exit_code') is None else ' exit ' + str(r['exit_code'])}]" \
                if r.get("outcome") else ""
            print(f"{fmt_time(r['at'], seconds=True)}  {r['tenant']}/{r['token'] or '-'}  {r['action']:<8} "
                  f"{(r['image'] or '-')[:12]} -> {(r['result'] or '-')[:12]}  {what}{outcome}")
    out(args, rows, human)


PRINTERS = {
    "bytes": _bytes, "image_made": _image_made, "images": _images, "push": _push, "removed": _removed,
    "share": _share, "entries": _entries, "fields": _fields, "log": _log, "tagged": _tagged, "untagged": _untagged,
    "indented": _indented, "branches": _branches, "branch_moved": _branch_moved, "branch_deleted": _branch_deleted,
    "branch_log": _branch_log, "bundle": _bundle, "bundle_images": _bundle_images, "sandbox_id": _sandbox_id,
    "code": _code, "states": _states, "hibernated": _hibernated, "committed": _committed, "ps": _ps, "top": _top,
    "registry_logout": _registry_logout, "registries": _registries, "secrets": _secrets,
    "secret_removed": _secret_removed, "gc": _gc, "doctor": _doctor, "cluster": _cluster, "audit": _audit,
}


def show(name: str | None, args, kw: dict, result):
    """Print a derived verb's answer with the named printer (None: default); its exit status (None: 0)."""
    return (PRINTERS[name] if name else default)(args, kw, result)
