"""Egress tapes in the store (network/tape.py records them; engine/tapes.py moves them here). A tape
is an immutable object named by the sha256 of its canonical JSON, stored as a blob like any file's
contents; its bodies are blobs too (the same response in two tapes is stored once). The `tapes`
row says which run recorded it and what it extends; gc keeps a tape (and its bodies) while an
operation record names it or it is younger than the retention."""

from __future__ import annotations

import hashlib
import json
import os

from ..errors import InvalidInput, NotFound
from .blobs import hash_file

__all__ = ["put", "load", "resolve", "digests", "kept"]


def digests(tape: dict) -> set[str]:
    """Every body a tape names."""
    out = set()
    for ex in tape.get("http", ()):
        out.update(d for d in (ex.get("body"), ex.get("response_body")) if d)
    for c in tape.get("tcp", ()):
        out.update(seg[1] for seg in c.get("segments", ()) if seg[1])
    return out


def put(store, directory: str, op: str | None, now: float) -> str:
    """The tape the daemon left in `directory` (tape.json and its bodies by digest) into the store;
    its id. Each body is checked against its name before it is kept."""
    with open(os.path.join(directory, "tape.json"), "rb") as f:
        tape = json.load(f)
    size = 0
    for digest in digests(tape):
        path = os.path.join(directory, digest)
        if not os.path.exists(path):               # (a body the tape it extends holds: stored already)
            if not store.blobs.has(digest):
                raise NotFound(f"tape body {digest[:12]} is missing")
            continue
        got, n = hash_file(path)
        if got != digest:
            raise InvalidInput(f"tape body {digest[:12]} does not match its name")
        size += n
        if not store.blobs.has(digest):
            store.blobs.put_file(path, digest)
    data = json.dumps(tape, sort_keys=True, separators=(",", ":")).encode()
    tid = store.blobs.put_bytes(data)
    with store.db.tx() as con:
        con.execute("INSERT OR IGNORE INTO tapes(id, op, parent, created, exchanges, bytes) VALUES(?,?,?,?,?,?)",
                    (tid, op, tape.get("parent"), now, len(tape.get("http", ())) + len(tape.get("tcp", ())),
                     size + len(data)))
    return tid


def resolve(db, ref) -> str:
    """A tape's full id from its id or a unique prefix (at least 8 hex digits); NotFound otherwise."""
    if not isinstance(ref, str) or len(ref) < 8 or any(c not in "0123456789abcdef" for c in ref) or len(ref) > 64:
        raise NotFound(f"no tape {ref!r}", tape=ref)
    rows = db.query("SELECT id FROM tapes WHERE id >= ? AND id < ? LIMIT 2", (ref, ref + "g"))
    if len(rows) != 1:
        if len(rows) > 1:
            raise InvalidInput(f"tape id {ref!r} is ambiguous")
        raise NotFound(f"no tape {ref!r}", tape=ref)
    return rows[0][0]


def load(store, tid: str) -> dict:
    with store.blobs.open(tid) as f:
        data = f.read()
    if hashlib.sha256(data).hexdigest() != tid:
        raise NotFound(f"tape {tid[:12]} is damaged")
    return json.loads(data)


def kept(store, con, now: float, retention: float) -> set[str]:
    """(for gc, inside its transaction) the blobs of every tape still named by an operation record
    (a run's usage, a replay's spec) or a live sandbox's row (stopped ones too), or younger than
    `retention`; the rest's rows go."""
    named = set()
    for spec, outcome in con.execute("SELECT spec, outcome FROM operations WHERE spec LIKE '%\"tape\"%' "
                                      "OR outcome LIKE '%\"tape\"%'"):
        for text in (spec, outcome):
            if not text:
                continue
            obj = json.loads(text)
            for holder in (obj, obj.get("usage") or {}):
                if isinstance(holder, dict) and isinstance(holder.get("tape"), str):
                    named.add(holder["tape"])
    for (spec,) in con.execute("SELECT spec FROM sandboxes WHERE spec LIKE '%tape\"%'"):     # live sandboxes'
        obj = json.loads(spec)
        named.update(t for t in (obj.get("recorded_tape"), obj.get("tape")) if isinstance(t, str))
    out: set[str] = set()
    for tid, created in list(con.execute("SELECT id, created FROM tapes")):
        if tid not in named and now - created >= retention:
            con.execute("DELETE FROM tapes WHERE id=?", (tid,))
            continue
        out.add(tid)
        try:
            out |= digests(load(store, tid))
        except (OSError, NotFound, ValueError):
            pass
    return out
