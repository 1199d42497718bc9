"""Egress tapes, the engine's part (design.md, "Egress tapes"): the `record=` / `replay=` options
of a run or live sandbox as the egress daemon's attach takes them (network/tape.py records and
replays), the tape moved into the store at the link's release (store/tapes.py), a replay's misses
as TapeMiss, and the `tape_show` row.

    record=True                       keep a tape; its ID is the run's usage["tape"]
    replay="TAPE" | {"tape": "TAPE", "ignore_headers": [...], "ignore_query": [...],
                     "match_headers": [...]}
                                      answer DNS and requests from TAPE, nothing goes out
    record=True, replay=...           replay_or_record: misses go out; the new tape extends TAPE
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field

from .. import defaults as D
from ..errors import InvalidInput, TapeMiss
from ..store import tapes as stored

__all__ = ["TapeOption", "tape_option", "TapeOps", "exchanges"]

_RULES = ("ignore_headers", "ignore_query", "match_headers")


@dataclass
class TapeOption:
    record: bool
    replay: str | None                   # the replayed tape's full id
    rules: dict = field(default_factory=dict)
    replay_file: str | None = None        # what the daemon reads (the old tape, where its bodies are)

    def spec(self) -> dict:
        """What the run's (or sandbox's) spec records."""
        out: dict = {}
        if self.record:
            out["record"] = True
        if self.replay:
            out["tape"] = self.replay
            if self.rules:
                out["tape_rules"] = self.rules
        return out

    def attach(self) -> dict:
        return {"record": self.record, "replay": self.replay_file, "rules": self.rules or None}

    def discard(self) -> None:
        if self.replay_file is not None:
            try:
                os.unlink(self.replay_file)
            except FileNotFoundError:
                pass

    def finish(self, store, usage: dict, op: str | None) -> tuple[str | None, list[str]]:
        """The released link's usage["tape"] (the daemon's) into the store: (new tape id, misses);
        usage["tape"] becomes the id (when recorded)."""
        self.discard()
        info = usage.pop("tape", None) if isinstance(usage, dict) else None
        if not isinstance(info, dict):
            return None, []
        misses = [m for m in info.get("misses") or () if isinstance(m, str)]
        tid = None
        directory = info.get("dir")
        if self.record and isinstance(directory, str) and _ours(store, directory):
            try:
                tid = stored.put(store, directory, op, time.time())
            finally:
                shutil.rmtree(directory, ignore_errors=True)     # (plain files the daemon wrote: no mount)
            usage["tape"] = tid
        if misses:
            usage["tape_misses"] = misses
        return tid, misses

    def check(self, misses: list[str], op: str | None) -> None:
        """TapeMiss naming what a replay-only run asked and its tape did not hold."""
        if misses and not self.record:
            raise TapeMiss(f"not on tape {self.replay[:12]}: " + "; ".join(misses[:10]) +
                           (f" (and {len(misses) - 10} more)" if len(misses) > 10 else ""),
                           missed=misses, tape=self.replay, op=op)


def _ours(store, directory: str) -> bool:
    """Only a directory under the daemon's tapes directory is read and removed."""
    root = os.path.realpath(os.path.join(store.home, "network", "tapes"))
    return os.path.dirname(os.path.realpath(directory)) == root


def tape_option(store, record, replay) -> TapeOption | None:
    """record= and replay= as a run or start receives them (None: no tape); InvalidInput or
    NotFound (an unknown tape) before anything starts."""
    if record in (None, False) and replay is None:
        return None
    if not isinstance(record, bool) and record is not None:
        raise InvalidInput(f"record is true or false, not {record!r}")
    rules: dict = {}
    if isinstance(replay, dict):
        unknown = set(replay) - {"tape", *_RULES}
        if unknown:
            raise InvalidInput(f"replay: unknown key(s) {', '.join(sorted(unknown))} (tape, {', '.join(_RULES)})")
        for k in _RULES:
            v = replay.get(k)
            if v is None:
                continue
            if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) and x and len(x) <= 256 for x in v) \
                    or len(v) > 64:
                raise InvalidInput(f"replay.{k} is a list of names (at most 64)")
            rules[k] = list(v)
        replay = replay.get("tape")
    if replay is not None and not isinstance(replay, str):
        raise InvalidInput("replay is a tape ID or {tape, ignore_headers, ignore_query, match_headers}")
    opt = TapeOption(bool(record), stored.resolve(store.db, replay) if replay is not None else None, rules)
    if opt.replay is not None:
        tape = stored.load(store, opt.replay)
        paths = {d: store.blobs.path(d) for d in stored.digests(tape)}
        directory = os.path.join(store.home, "network", "tapes")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        opt.replay_file = os.path.join(directory, f"replay-{uuid.uuid4().hex}.json")
        with open(opt.replay_file, "w") as f:
            json.dump({"id": opt.replay, "tape": tape, "paths": paths}, f)
    return opt


def exchanges(tape: dict, limit: int) -> list[dict]:
    """A tape's rows as tape_show lists them, in the order they happened."""
    rows = [{"kind": "dns", "host": d["name"], "method": d["type"], "path": "", "status": None,
             "request_bytes": 0, "response_bytes": 0, "answers": d["answers"], "t": None}
            for d in tape.get("dns", ())]
    for ex in tape.get("http", ()):
        path = ex["url"].split("://", 1)[-1]
        path = "/" + path.split("/", 1)[1] if "/" in path else "/"
        rows.append({"kind": ex["scheme"], "host": ex["host"], "method": ex["method"], "path": path,
                     "status": ex.get("status"), "request_bytes": ex.get("body_size", 0),
                     "response_bytes": ex.get("response_size", 0), "t": ex.get("t")})
    for c in tape.get("tcp", ()):
        segs = c.get("segments", ())
        rows.append({"kind": "tcp", "host": c["host"], "method": "", "path": f":{c['port']}", "status": None,
                     "request_bytes": sum(s[2] for s in segs if s[0] == "out"),
                     "response_bytes": sum(s[2] for s in segs if s[0] == "in"), "t": c.get("t")})
    return rows[:limit]


class TapeOps:
    """The engine's tape rows."""

    def tape_show(self, tape: str, *, limit: int = D.TAPE_SHOW_LIMIT) -> dict:
        tid = stored.resolve(self.store.db, tape)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidInput(f"limit is a positive integer, not {limit!r}")
        row = self.store.db.one("SELECT op, parent, created, exchanges, bytes FROM tapes WHERE id=?", (tid,))
        body = stored.load(self.store, tid)
        return {"id": tid, "op": row[0], "parent": row[1], "created": row[2], "bytes": row[4],
                "exchanges": exchanges(body, limit)}
