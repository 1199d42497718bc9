"""The record of what ran: operation rows and the lineage edges they make.

Every operation row (run, exec, commit, import, merge, a bundle's copies) is written here and
only here, so what a row holds and when it is final is decided in one place: a submitted
operation's row is written queued (finished NULL) and completed by the transaction that records
its result; an edge goes from each parent to the image an operation made, never to itself.
Writers that must share a transaction with other rows (an import's image, a merge's layer) take
the open connection. Refs (tags, branches) are store/refs.py's; image rows are the store's.
"""

from __future__ import annotations

import json
import time

from ...errors import NotFound
from ...store.db import dumps
from ...values import check_kind
from ...store.store import Store
from ...branching.lineage import op_summary

_COLUMNS = "id, kind, source, result, spec, outcome, started, finished"



class Records:
    def __init__(self, store: Store):
        self.store = store

    # ---- writing -------------------------------------------------------------------------------
    @staticmethod
    def write(con, op: str, kind: str, source: str | None, result: str | None, spec: dict,
              outcome: dict | None, started: float, finished: float | None, *, parents=(),
              replace: bool = True) -> None:
        """One operation row, and an edge from each parent to `result`, inside `con`.
        replace: complete a queued row of the same id (a submitted operation)."""
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        con.execute(f"{verb} INTO operations({_COLUMNS}) VALUES(?,?,?,?,?,?,?,?)",
                    (op, kind, source, result, dumps(spec), dumps(outcome) if outcome is not None else None,
                     started, finished))
        for parent in parents:
            if result and parent and parent != result:
                Records.edge(con, parent, result, op, finished or time.time())

    @staticmethod
    def edge(con, parent: str, child: str, op: str, created: float) -> None:
        con.execute("INSERT OR IGNORE INTO edges(parent, child, op, created) VALUES(?,?,?,?)",
                    (parent, child, op, created))

    @staticmethod
    def copy(con, op: str, row: dict) -> None:
        """An operation row as another store recorded it (a bundle's): kept if already here."""
        con.execute(f"INSERT OR IGNORE INTO operations({_COLUMNS}) VALUES(?,?,?,?,?,?,?,?)",
                    (op, row["kind"], row["source"], row["result"], dumps(row["spec"]),
                     dumps(row["outcome"]) if row["outcome"] is not None else None, row["started"],
                     row["finished"]))

    def queue(self, op: str, kind: str, source: str | None, spec: dict) -> None:
        """The row of an operation submitted now and run later (status: queued, then running)."""
        with self.store.db.tx() as con:
            self.write(con, op, kind, source, None, spec, None, time.time(), None, replace=False)

    def start(self, op: str, spec: dict) -> None:
        """A queued row's run has begun: its spec says so (`queued` gone, `began` set), so another
        replica, which cannot see this process's queue, reads it as running. Outside the one-writer
        order: it decides nothing on what it reads."""
        spec = {**{k: v for k, v in spec.items() if k != "queued"}, "began": time.time()}
        with self.store.db.tx(serial=False) as con:
            con.execute("UPDATE operations SET spec=? WHERE id=? AND finished IS NULL", (dumps(spec), op))

    def finish(self, op: str, outcome: dict) -> None:
        """End an operation that made nothing (failed, cancelled) with its outcome (over the one its
        run recorded: the typed error the caller sees); never one that made an image (a run that
        committed on a cluster node whose reply was lost stays done: its image and lineage exist)."""
        with self.store.db.tx() as con:
            con.execute("UPDATE operations SET outcome=?, finished=? WHERE id=? AND result IS NULL",
                        (dumps(outcome), time.time(), op))

    def interrupt(self, ops: list[str], outcome: dict) -> None:
        """End rows left unfinished by an engine that stopped (never those finished meanwhile)."""
        now = time.time()
        with self.store.db.tx() as con:
            con.executemany("UPDATE operations SET outcome=?, finished=? WHERE id=? AND finished IS NULL",
                            [(dumps(outcome), now, op) for op in ops])

    def record(self, op: str, source: str, spec: dict, started: float, result: str | None,
               outcome: dict, write_image=None, *, kind: str = "run", parent: str | None = None,
               also=None, serial: bool | None = None, edge: bool = True) -> None:
        """One transaction per run: the new image's rows (write_image(con), if any), the
        operation, the lineage edge (from `parent`, by default the source). A published layer
        that no row came to name is removed again. also(con): more rows of the same transaction
        (a build step's cache row). serial: the transaction's place in the one-writer order
        (db.tx); by default only when it writes an image or more rows (`also`): an operation's own
        row alone (an exec, a disposable run) decides nothing on what it reads. edge=False: no
        lineage edge (another operation's edge says where the image came from)."""
        used = True
        try:
            serial = (write_image is not None or also is not None) if serial is None else serial
            with self.store.db.tx(serial=serial) as con:
                if write_image is not None:
                    used = write_image(con)
                self.write(con, op, kind, source, result, spec, outcome, started, time.time(),
                           parents=[parent or source] if edge else [])
                if also is not None:
                    also(con)
        except BaseException:
            used = False
            raise
        finally:
            if write_image is not None and not used:
                self.store.layers.remove(write_image.layer)

    # ---- reading -------------------------------------------------------------------------------
    def get(self, op: str) -> dict:
        r = self.store.db.one(f"SELECT {_COLUMNS} FROM operations WHERE id=?", (op,))
        if not r:
            raise NotFound(f"no operation {op!r}")
        return {"id": r[0], "kind": r[1], "source": r[2], "result": r[3], "spec": json.loads(r[4]),
                "outcome": json.loads(r[5]) if r[5] else None, "started": r[6], "finished": r[7]}

    def unfinished(self) -> list[tuple[str, dict]]:
        return [(op, json.loads(spec)) for op, spec in
                self.store.db.query("SELECT id, spec FROM operations WHERE finished IS NULL")]

    def recent_runs(self, limit: int, kind: str = "run") -> list[str]:
        """The newest operations of `kind` (run by default), newest first."""
        return [r[0] for r in self.store.db.query(
            "SELECT id FROM operations WHERE kind=? ORDER BY started DESC LIMIT ?", (check_kind(kind), limit))]

    def summary(self, op: str) -> dict:
        return op_summary(self.store, op)      # (lineage's: a networked run's policy included)

    def edge_view(self, row) -> dict:
        """An edge row (parent, child, op, created) with what its operation did."""
        parent, child, op, created = row
        return {"parent": parent, "child": child, "op": op, "created": created, **self.summary(op)}

    def _edges(self, where: str, image: str) -> list[dict]:
        return [self.edge_view(r) for r in self.store.db.query(
            f"SELECT parent, child, op, created FROM edges WHERE {where}=? ORDER BY created", (image,))]

    def parents(self, image: str) -> list[dict]:
        return self._edges("child", image)

    def children(self, image: str) -> list[dict]:
        return self._edges("parent", image)

    def import_of(self, image: str) -> tuple[str, dict] | None:
        """The first import that made `image` (its id and spec), if one did."""
        r = self.store.db.one("SELECT id, spec FROM operations WHERE result=? AND kind='import' "
                              "ORDER BY started LIMIT 1", (image,))
        return (r[0], json.loads(r[1])) if r else None

    def sandbox_execs(self, image: str, sandbox: str, since: float) -> list[str]:
        """A live sandbox's exec operations since `since` (what a commit of it includes)."""
        return [r[0] for r in self.store.db.query(
            "SELECT id FROM operations WHERE kind='exec' AND source=? AND started>=? AND spec LIKE ?",
            (image, since, f'%"sandbox":"{sandbox}"%'))]

    def last_commit(self, sandbox: str) -> float:
        r = self.store.db.one("SELECT MAX(started) FROM operations WHERE kind='commit' AND spec LIKE ?",
                              (f'%"sandbox":"{sandbox}"%',))
        return r[0] or 0.0
