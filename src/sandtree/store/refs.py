"""Refs: the names of images (tags and branches) and their history (the reflog).

Every write of a ref goes through this module (record(), or advance()'s compare-and-swap), so each
move is appended to the reflog in the same transaction, whoever makes it (a tag, an import's tag, a bundle's, a
tenant's namespaced names, a branch move, image rm).

Branches are movable names that advance with each run made on them. A move is a compare-and-swap (a conditional UPDATE) inside one write transaction: it succeeds only if
the branch still points where the mover saw it, so concurrent runs on one branch are applied in
order or rejected as stale, never silently lost (the stale run's image stays in the store and is
named in the error). Every move is appended to the reflog, which rollback and gc read.
"""

from __future__ import annotations

import re
import time

from ..errors import Conflict, ImageNotFound, InvalidInput, NotFound
from .names import HEX_RE, check_tag

# `store` below is a store.Store; not imported: store.py calls this module (tag, untag).

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


def record(con, kind: str, name: str, old: str | None, new: str | None, reason: str) -> None:
    """Point ref (kind, name) at `new` (None: delete it) and log the move, inside `con`."""
    now = time.time()
    if new is None:
        con.execute("DELETE FROM refs WHERE kind=? AND name=?", (kind, name))
    else:
        con.execute("INSERT OR REPLACE INTO refs(name, kind, image, updated) VALUES(?,?,?,?)",
                    (name, kind, new, now))
    con.execute("INSERT INTO reflog(kind, name, old, new, at, reason) VALUES(?,?,?,?,?,?)",
                (kind, name, old, new, now, reason))


def target(con, kind: str, name: str) -> str | None:
    row = con.execute("SELECT image FROM refs WHERE kind=? AND name=?", (kind, name)).fetchone()
    return row[0] if row else None


def set_tag(con, name: str, image: str, reason: str) -> bool:
    """Point tag `name` at `image` inside `con` (no move logged if it is there already)."""
    old = target(con, "tag", name)
    if old == image:
        return False
    record(con, "tag", name, old, image, reason)
    return True


def remove_tag(con, name: str, reason: str) -> str:
    """Delete tag `name` inside `con`; returns the image it named."""
    old = target(con, "tag", name)
    if old is None:
        raise NotFound(f"no tag {name!r}")
    record(con, "tag", name, old, None, reason)
    return old


def naming(con, image: str) -> list[str]:
    """The names of every ref (tag or branch) that points at `image`."""
    return [r[0] for r in con.execute("SELECT name FROM refs WHERE image=?", (image,))]


def release_image(con, image: str, reason: str) -> list[str]:
    """Delete every ref naming `image` (image rm --force); returns their names."""
    rows = con.execute("SELECT kind, name FROM refs WHERE image=?", (image,)).fetchall()
    for kind, name in rows:
        record(con, kind, name, image, None, reason)
    return [name for _, name in rows]


def tag(store, image: str, name: str) -> None:
    check_tag(name)
    with store.db.tx() as con:
        if con.execute("SELECT 1 FROM images WHERE id=?", (image,)).fetchone() is None:
            raise ImageNotFound(f"no image {image!r}", image=image)
        set_tag(con, name, image, "tag")


def untag(store, name: str) -> str:
    with store.db.tx() as con:
        return remove_tag(con, name, "untag")


def check_branch(name: str) -> None:
    if not isinstance(name, str) or not NAME_RE.match(name) or HEX_RE.match(name) or ".." in name:
        raise InvalidInput(f"invalid branch name {name!r} (letters, digits and ._/-; not a hex id)")




def set_branch(con, name: str, image: str, *, force: bool, shown: str | None = None) -> None:
    """Create branch `name` at `image` inside `con` (force: move it if it exists). shown: the
    name to put in an error (a tenant's own, without its namespace)."""
    old = target(con, "branch", name)
    if old is not None and not force:
        raise Conflict(f"branch {shown or name!r} exists (at {old[:12]})", branch=shown or name, image=old)
    record(con, "branch", name, old, image, "create")


def branch_named(store, ref) -> str | None:
    """The branch a reference names, if it names one: `branch:NAME`, or a bare name that is a
    branch and not a tag (tags win over branches)."""
    if not isinstance(ref, str):
        return None
    if ref.startswith("branch:"):
        return ref[7:]
    if HEX_RE.match(ref):
        return None               # an ID or its prefix: no tag or branch is named so (check_tag, check_branch)
    if store.db.one("SELECT 1 FROM refs WHERE kind='tag' AND name=?", (ref,)):
        return None
    if store.db.one("SELECT 1 FROM refs WHERE kind='branch' AND name=?", (ref,)):
        return ref
    return None


def head(store, name: str) -> str:
    row = store.db.one("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,))
    if row is None:
        raise NotFound(f"no branch {name!r}", branch=name)
    return row[0]


def branches(store) -> dict[str, str]:
    return dict(store.db.query("SELECT name, image FROM refs WHERE kind='branch' ORDER BY name"))


def create(store, name: str, image: str, *, force: bool = False) -> None:
    check_branch(name)
    with store.db.tx() as con:
        if con.execute("SELECT 1 FROM images WHERE id=?", (image,)).fetchone() is None:
            raise ImageNotFound(f"no image {image!r}", image=image)
        set_branch(con, name, image, force=force)


def delete(store, name: str) -> str:
    with store.db.tx() as con:
        row = con.execute("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no branch {name!r}", branch=name)
        record(con, "branch", name, row[0], None, "delete")
        return row[0]


def advance(store, name: str, old: str, new: str, reason: str) -> None:
    """Move `name` from `old` to `new`, or raise Conflict if it is no longer at `old`."""
    with store.db.tx() as con:
        # The compare-and-swap itself: a conditional UPDATE, atomic on either database whatever
        # else holds the write lock; the reflog row joins it in the same transaction.
        now = time.time()
        if con.execute("UPDATE refs SET image=?, updated=? WHERE kind='branch' AND name=? AND image=?",
                       (new, now, name, old)).rowcount == 1:
            if new != old:
                con.execute("INSERT INTO reflog(kind, name, old, new, at, reason) VALUES(?,?,?,?,?,?)",
                            ("branch", name, old, new, now, reason))
            return
        row = con.execute("SELECT image FROM refs WHERE kind='branch' AND name=?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no branch {name!r}", branch=name)
        if row[0] != old:
            raise Conflict(f"branch {name!r} moved to {row[0][:12]} while this run started from {old[:12]}; "
                           f"the run's result {new[:12]} was kept but not applied",
                           branch=name, expected=old, actual=row[0], image=new)


def reflog(store, name: str, kind: str = "branch") -> list[dict]:
    return [{"seq": s, "old": o, "new": n, "at": a, "reason": r} for s, o, n, a, r in store.db.query(
        "SELECT seq, old, new, at, reason FROM reflog WHERE kind=? AND name=? ORDER BY seq", (kind, name))]


def rollback_target(store, name: str, *, steps: int | None, to: str | None, is_ancestor) -> str:
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
