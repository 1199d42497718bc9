"""Metadata in PostgreSQL (`--database postgresql://...`): the same interface as db.Database.

The store's code speaks SQLite's dialect through `connection()`, `tx()`, `query()` and `one()`;
here every statement passes through dialect.statement() and runs on a psycopg (v3) connection,
one per thread, in autocommit mode: a read outside tx() is its own transaction, as in SQLite.

Writers: tx() is BEGIN plus a transaction-scoped advisory lock that every write transaction of
every process takes, so writes are serialised exactly as SQLite's BEGIN IMMEDIATE serialises
them: a read-then-write inside tx() (a tag, gc deleting what it found unreferenced) cannot be
invalidated between its read and its write. Branch moves are in addition a conditional UPDATE
(refs.advance), a compare-and-swap that needs no lock. A commit is PostgreSQL's (fsynced WAL): a
process killed mid-transaction leaves nothing of it.

The schema and its migrations are db.py's (SCHEMA, MIGRATIONS, MOVES), translated once; creating them
takes a second advisory lock so two processes opening one fresh database do not race.
"""

from __future__ import annotations

import os
import threading
import weakref

from ..errors import DiskFull, InvalidInput, StoreUnavailable
from ..optional import load
from . import dialect
from .dbreads import Reads

_pg = None       # psycopg (the `postgresql` extra), loaded by the first PostgreSQL store (optional.py)

__all__ = ["PgDatabase", "WRITE_LOCK"]

WRITE_LOCK = 0x5A7D_0001          # pg_advisory_xact_lock key of the one writer at a time
_SCHEMA_LOCK = 0x5A7D_0002
_GC_FENCE = 0x5A7D_0003           # session advisory lock: shared by operations using images, gc's exclusive


def _psycopg():
    global _pg
    if _pg is None:
        _pg = load("psycopg")
    if _pg is None:
        raise StoreUnavailable("a postgresql:// database needs psycopg: pip install 'sandtree[postgresql]'")
    return _pg


def _translate_errors(exc: Exception):
    """A psycopg error as the store's typed error (or unchanged)."""
    psycopg = _psycopg()
    if isinstance(exc, psycopg.errors.DiskFull):
        return DiskFull("disk full: the metadata database has no room; nothing was written")
    if isinstance(exc, (psycopg.OperationalError, psycopg.errors.AdminShutdown)):
        return StoreUnavailable(f"the metadata database is unavailable: {str(exc).strip().splitlines()[0]}")
    return exc


def _close_if_ours(raw, pid: int) -> None:
    if os.getpid() == pid:
        raw.close()


class _Cursor:
    """What the store reads from sqlite3's cursor: rows, iteration and rowcount."""

    def __init__(self, cur):
        self._cur = cur
        self.rowcount = cur.rowcount

    def fetchone(self):
        return self._cur.fetchone() if self._cur.description else None

    def fetchall(self):
        return self._cur.fetchall() if self._cur.description else []

    def __iter__(self):
        return iter(self.fetchall())


class _Connection:
    """A psycopg connection that takes the store's SQLite statements."""

    def __init__(self, raw, pkeys):
        self.raw, self._pkeys = raw, pkeys
        self.in_transaction = False
        self.pid = os.getpid()

    def execute(self, sql: str, args=()):
        try:
            cur = self.raw.cursor()
            cur.execute(dialect.statement(sql, self._pkeys), dialect.params(args))
        except Exception as exc:
            raise _translate_errors(exc) from exc
        return _Cursor(cur)

    def executemany(self, sql: str, seq):
        rows = [dialect.params(a) for a in seq]
        if not rows:
            return None
        try:
            cur = self.raw.cursor()
            cur.executemany(dialect.statement(sql, self._pkeys), rows)
        except Exception as exc:
            raise _translate_errors(exc) from exc
        return _Cursor(cur)

    def close(self):
        self.raw.close()


class PgDatabase(Reads):
    def __init__(self, url: str, sqlite_schema: str, migrations, schema_version: int, moves=()):
        if not url.startswith(("postgresql://", "postgres://")):
            raise InvalidInput(f"a database URL is postgresql://...: {url.split('@')[-1]!r}")
        self.path = url                      # what errors and fsck name
        self.url = url
        self._local = threading.local()
        self._all: weakref.WeakSet = weakref.WeakSet()    # every thread's live connection, for close()
        self._pkeys = tuple((t, tuple(k)) for t, k in dialect.primary_keys(sqlite_schema).items())
        with self.tx(lock=_SCHEMA_LOCK) as con:
            con.raw.execute(dialect.schema(sqlite_schema))
            for table, column, kind in migrations:
                have = con.raw.execute("SELECT 1 FROM information_schema.columns WHERE table_schema=current_schema() "
                                       "AND table_name=%s AND column_name=%s", (table, column)).fetchone()
                if have is None:
                    con.raw.execute(f"ALTER TABLE {table} ADD COLUMN {column} {dialect.schema(kind)}")
            for table, statements in moves:          # db.py move_rows (not imported: db.py imports this module)
                if con.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
                    for sql in statements:
                        con.execute(sql)
            row = con.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            if row is None:
                con.execute("INSERT INTO meta VALUES('format', ?)", (str(schema_version),))
            elif int(row[0]) > schema_version:
                raise RuntimeError(f"store format {row[0]} is newer than this sandtree ({schema_version})")

    def connection(self, *, write: bool = False) -> _Connection:
        con = getattr(self._local, "con", None)
        if con is not None and (con.raw.closed or con.pid != os.getpid()):
            con = None                          # gone, or the parent's (this is a forked child)
        if con is None:
            psycopg = _psycopg()
            try:
                raw = psycopg.connect(self.url, autocommit=True, connect_timeout=30)
            except psycopg.Error as exc:
                raise _translate_errors(exc) from None
            con = self._local.con = _Connection(raw, self._pkeys)
            # A thread that ends drops its local, and with it the connection: closed then, so
            # threads that come and go (runs, requests) hold no server connection after them.
            # Only in this process: a forked child (a sandbox helper) dropping the threads it
            # did not inherit must not close the parent's session (psycopg's own __del__ checks too).
            weakref.finalize(con, _close_if_ours, raw, os.getpid())
            self._all.add(con)
        return con

    def close(self) -> None:
        cons, self._all = [c for c in self._all if c.pid == os.getpid()], weakref.WeakSet()
        for con in cons:
            try:
                con.close()
            except Exception:              # closing a connection to a server already gone
                pass
        self._local = threading.local()

    class _Tx:
        def __init__(self, db, lock):
            self.db, self.lock = db, lock

        def __enter__(self):
            self.con = self.db.connection(write=True)
            try:
                self.con.raw.execute("BEGIN")
                self.con.in_transaction = True
                if self.lock is not None:
                    self.con.raw.execute("SELECT pg_advisory_xact_lock(%s)", (self.lock,))
            except Exception as exc:
                self._end(False)
                raise _translate_errors(exc) from exc
            return self.con

        def _end(self, commit: bool) -> None:
            self.con.in_transaction = False
            if not self.con.raw.closed:
                self.con.raw.execute("COMMIT" if commit else "ROLLBACK")

        def __exit__(self, et, ev, tb):
            if et is None:
                try:
                    self._end(True)
                    return False
                except Exception as exc:
                    raise _translate_errors(exc) from exc
            try:
                self._end(False)
            except Exception:              # the connection died with the error we are raising
                pass
            return False

    def tx(self, lock: int = WRITE_LOCK, *, serial: bool = True, durable: bool = False):
        """A write transaction. serial=False: one that only writes rows of its own (a new operation
        row, its own sandbox's last-use stamp) and decides nothing on what it reads, so it takes no
        part in the one-writer lock: PostgreSQL's row locks order it (a command in a live sandbox
        is one such; it would otherwise queue behind every run's commit). durable: every commit
        here is (synchronous_commit on: store/durable.py)."""
        return self._Tx(self, lock if serial else None)

    def fence(self, *, shared: bool) -> "_Fence":
        """gc's fence (store.py using/collecting) for every process on this database, on every
        machine: a session-level advisory lock on this thread's connection (PostgreSQL ends the
        session, and the lock, of a process that dies)."""
        return _Fence(self, shared)


class _Fence:
    def __init__(self, db: PgDatabase, shared: bool):
        self.db, self.kind = db, "_shared" if shared else ""

    def __enter__(self):
        self.con = self.db.connection()
        try:
            self.con.raw.execute(f"SELECT pg_advisory_lock{self.kind}(%s)", (_GC_FENCE,))
        except Exception as exc:
            raise _translate_errors(exc) from exc
        return self

    def __exit__(self, *exc):
        raw = self.con.raw
        if raw.closed:                      # the session, and its lock, ended with it
            return False
        try:
            raw.execute(f"SELECT pg_advisory_unlock{self.kind}(%s)", (_GC_FENCE,))
        except Exception:                   # (a failed transaction): never leave gc locked out
            _close_if_ours(raw, self.con.pid)
        return False

