"""Branches: movable names that advance with each run made on them.

A move is a compare-and-swap inside one write transaction (BEGIN IMMEDIATE): it succeeds only if
the branch still points where the mover saw it, so concurrent runs on one branch are applied in
order or rejected as stale, never silently lost (the stale run's image stays in the store and is
named in the error). Every move is appended to the reflog, which rollback and gc read.
"""

from __future__ import annotations

import re

from ..errors import Conflict, ImageNotFound, InvalidInput, NotFound
from .db import Database
from .store import HEX_RE, Store

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def _check(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name) or HEX_RE.match(name) or ".." in name:
        raise InvalidInput(f"invalid branch name {name!r} (letters, digits and ._/-; not a hex id)")


def head(store: Store, name: str) -> str:
    row = store.db.one("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,))
    if row is None:
        raise NotFound(f"no branch {name!r}", branch=name)
    return row[0]


def branches(store: Store) -> dict[str, str]:
    return dict(store.db.query("SELECT name, image FROM refs WHERE kind='branch' ORDER BY name"))


def create(store: Store, name: str, image: str, *, force: bool = False) -> None:
    _check(name)
    with store.db.tx() as con:
        if con.execute("SELECT 1 FROM images WHERE id=?", (image,)).fetchone() is None:
            raise ImageNotFound(f"no image {image!r}", image=image)
        row = con.execute("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,)).fetchone()
        if row is not None and not force:
            raise Conflict(f"branch {name!r} exists (at {row[0][:12]})", branch=name, image=row[0])
        Database.record_ref(con, "branch", name, row[0] if row else None, image, "create")


def delete(store: Store, name: str) -> str:
    with store.db.tx() as con:
        row = con.execute("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no branch {name!r}", branch=name)
        Database.record_ref(con, "branch", name, row[0], None, "delete")
        return row[0]


def advance(store: Store, name: str, old: str, new: str, reason: str) -> None:
    """Move `name` from `old` to `new`, or raise Conflict if it is no longer at `old`."""
    with store.db.tx() as con:
        row = con.execute("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no branch {name!r}", branch=name)
        if row[0] != old:
            raise Conflict(f"branch {name!r} moved to {row[0][:12]} while this run started from {old[:12]}; "
                           f"the run's result {new[:12]} was kept but not applied",
                           branch=name, expected=old, actual=row[0], image=new)
        if new != old:
            Database.record_ref(con, "branch", name, old, new, reason)


def reflog(store: Store, name: str, kind: str = "branch") -> list[dict]:
    return [{"seq": s, "old": o, "new": n, "at": a, "reason": r} for s, o, n, a, r in store.db.query(
        "SELECT seq, old, new, at, reason FROM reflog WHERE kind=? AND name=? ORDER BY seq", (kind, name))]


def rollback_target(store: Store, name: str, *, steps: int | None, to: str | None, is_ancestor) -> str:
    cur = head(store, name)
    if (steps is None) == (to is None):
        raise InvalidInput("rollback needs exactly one of steps or to")
    if to is not None:
        if to != cur and not is_ancestor(to, cur):
            raise InvalidInput(f"{to[:12]} is not an ancestor of branch {name!r} ({cur[:12]})")
        return to
    if steps <= 0:
        raise InvalidInput("steps must be positive")
    # Walk the branch's own history back: each move's old value is one step back.
    moves = [m for m in reflog(store, name) if m["new"] is not None]
    target, at = cur, cur
    for m in reversed(moves):
        if steps == 0:
            break
        if m["new"] == at and m["old"] is not None:
            target = at = m["old"]
            steps -= 1
    if steps:
        raise InvalidInput(f"branch {name!r} has fewer moves than requested")
    return target
