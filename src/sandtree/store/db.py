"""Metadata database (SQLite, WAL, the default; or PostgreSQL, store/pgdb.py): trees, images, lineage edges, operations, refs and their log.

An image row is written in the same transaction as its trees, edges and operation, and only
after its layer directory and blobs are in place, so after a kill -9 at any point no image is
listed whose objects are missing. One connection per thread; writers serialise on SQLite's lock.

On-disk format: `meta.format` holds SCHEMA_VERSION; a store written by a newer sandtree is refused.

A full disk: a write that finds no room raises DiskFull ("disk full"), never a
raw sqlite3 error, and nothing of it is kept (the transaction rolls back). Reads keep working: a
WAL database needs its -shm file, which a connection must create when no other one is open; if
that fails for want of room, and no WAL file holds unmerged commits (so the main file is
complete), the database is opened read-only as immutable. Writes then retry a normal open (the
room may be back) and raise DiskFull if it still fails.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import logging
import os
import sqlite3
import threading
import time
from urllib.parse import quote

from ..errors import DiskFull, InvalidInput, StoreUnavailable
from . import durable
from .dbreads import Reads
from .pgdb import PgDatabase

log = logging.getLogger("sandtree.store")

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trees(hash TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS images(
    id TEXT PRIMARY KEY,           -- = root tree hash
    layers TEXT NOT NULL,          -- JSON list of layer ids, top first
    links TEXT NOT NULL,           -- JSON {group key: [paths]} of hard-link groups
    created REAL NOT NULL,
    size INTEGER NOT NULL,
    files INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS operations(
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, source TEXT, result TEXT,
    spec TEXT NOT NULL, outcome TEXT, started REAL NOT NULL, finished REAL);
CREATE INDEX IF NOT EXISTS operations_source ON operations(source);
CREATE TABLE IF NOT EXISTS edges(
    parent TEXT NOT NULL, child TEXT NOT NULL, op TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY(parent, child, op));
CREATE INDEX IF NOT EXISTS edges_child ON edges(child);
-- OCI out (store/ociout.py): a layer's digests by the two images it lies between (lower '' = none) and
-- how it was written; digest '' = an empty delta. pushed: blobs known to be in a registry's repository.
CREATE TABLE IF NOT EXISTS oci_layers(lower TEXT NOT NULL, upper TEXT NOT NULL, encoding TEXT NOT NULL,
    digest TEXT NOT NULL, diff_id TEXT NOT NULL, size INTEGER NOT NULL, PRIMARY KEY(lower, upper, encoding));
CREATE INDEX IF NOT EXISTS images_layers ON images(layers);
CREATE TABLE IF NOT EXISTS registry_auth(registry TEXT PRIMARY KEY, username TEXT NOT NULL, secret TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS file_sets(id TEXT PRIMARY KEY, files TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS blob_loc(hash TEXT PRIMARY KEY, path TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS layer_objects(   -- layers packed in S3 (store/layercache.py): what a fetch must match
    layer TEXT PRIMARY KEY, sha256 TEXT NOT NULL, size INTEGER NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS blob_loc_path ON blob_loc(path);
CREATE TABLE IF NOT EXISTS refs(
    name TEXT NOT NULL, kind TEXT NOT NULL, image TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY(kind, name));
CREATE TABLE IF NOT EXISTS reflog(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, name TEXT NOT NULL,
    old TEXT, new TEXT, at REAL NOT NULL, reason TEXT);
CREATE TABLE IF NOT EXISTS sandboxes(   -- live sandboxes (sandboxes.py); handle: how to find them
    id TEXT PRIMARY KEY, image TEXT NOT NULL, state TEXT NOT NULL, handle TEXT NOT NULL,
    spec TEXT NOT NULL, created REAL NOT NULL, last_used REAL NOT NULL, idle_timeout REAL,
    expires REAL NOT NULL, head TEXT);
-- Live states (engine/sandboxes/livestates.py): the checkpoint a live fork or a hibernation took, kept with its
-- image (the commit taken at the same instant) so fork_from(image) starts live sandboxes from it. spec: what the
-- children are made of (the source's env, limits, tier); checkpoint: its S3 object's sha256 and size, or NULL.
CREATE TABLE IF NOT EXISTS live_states(image TEXT PRIMARY KEY, source TEXT NOT NULL, spec TEXT NOT NULL,
    checkpoint TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sandbox_ports(   -- exposed ports of live sandboxes (engine/sandboxes/ports.py)
    sandbox TEXT NOT NULL, port INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY(sandbox, port));
-- Tenants (tenants.py): tokens are stored as sha256 of their random secret, never the secret.
-- Visibility per tenant: images it imported/merged/was given (tenant_images), results of its own
-- operations (tenant_ops), and public_images; its uploads and file sets likewise.
CREATE TABLE IF NOT EXISTS tenants(name TEXT PRIMARY KEY, limits TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens(
    id TEXT PRIMARY KEY, tenant TEXT NOT NULL, hash TEXT NOT NULL, scopes TEXT NOT NULL,
    created REAL NOT NULL, revoked REAL);
CREATE TABLE IF NOT EXISTS tenant_images(tenant TEXT NOT NULL, image TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY(tenant, image));
-- A token's network grant (network/policy.py Grant.to_json): a token without a row may ask for none.
CREATE TABLE IF NOT EXISTS token_network(token TEXT PRIMARY KEY, grant_json TEXT NOT NULL);
-- the isolation tier forced on a token's runs, starts and builds (`token create --tier gvisor`)
CREATE TABLE IF NOT EXISTS token_tier(token TEXT PRIMARY KEY, tier TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenant_ops(op TEXT PRIMARY KEY, tenant TEXT NOT NULL, token TEXT);
CREATE INDEX IF NOT EXISTS tenant_ops_tenant ON tenant_ops(tenant);
CREATE TABLE IF NOT EXISTS tenant_blobs(tenant TEXT NOT NULL, kind TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY(tenant, kind, id));
-- by: the tenant that shared it (NULL: the operator); only it or an admin may unshare it
CREATE TABLE IF NOT EXISTS public_images(image TEXT PRIMARY KEY, at REAL NOT NULL, by TEXT);
CREATE TABLE IF NOT EXISTS audit(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, tenant TEXT NOT NULL, token TEXT,
    action TEXT NOT NULL, image TEXT, result TEXT, op TEXT, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_tenant ON audit(tenant, seq);
-- The build cache (engine/builds/cache.py): a principal's step key -> the image its step made, written in
-- the transaction that records the step; a hit needs the image still there (and visible). principal: the
-- tenant that built it, '' the operator (and admins): one principal never hits, nor replaces, another's row.
CREATE TABLE IF NOT EXISTS build_cache_by(principal TEXT NOT NULL, key TEXT NOT NULL, image TEXT NOT NULL,
    op TEXT, hermetic INTEGER NOT NULL, created REAL NOT NULL, PRIMARY KEY(principal, key));
-- Before build_cache_by (one row per key, whoever built it): emptied into it on open (MOVES), kept so
-- that the move reads it on every store.
CREATE TABLE IF NOT EXISTS build_cache(key TEXT PRIMARY KEY, image TEXT NOT NULL, op TEXT,
    hermetic INTEGER NOT NULL, created REAL NOT NULL);
-- Ephemeral images (store/ephemeral.py): a disposable run's end state, unlisted, collected after a TTL.
CREATE TABLE IF NOT EXISTS ephemeral_images(image TEXT PRIMARY KEY, at REAL NOT NULL);
-- Annotations (engine/images/annotations.py): a score and metadata about an image, like git notes: they never
-- change its ID. Each principal's own (a tenant's name, '' the operator and admins): one that writes them
-- changes only what it reads itself.
CREATE TABLE IF NOT EXISTS annotations_by(principal TEXT NOT NULL, image TEXT NOT NULL, score REAL,
    meta TEXT NOT NULL, updated REAL NOT NULL, PRIMARY KEY(principal, image));
-- Before annotations_by (one row per image, any owner wrote it): emptied into it on open (MOVES).
CREATE TABLE IF NOT EXISTS annotations(image TEXT PRIMARY KEY, score REAL, meta TEXT NOT NULL, updated REAL NOT NULL);
-- Engines that own operations, by boot id, pid and start time (engine/runs/heartbeat.py): beat every few
-- seconds, so an engine on another machine (API replicas on one database) can tell that one is gone.
CREATE TABLE IF NOT EXISTS engines(owner TEXT PRIMARY KEY, beat REAL NOT NULL);
-- Egress tapes (store/tapes.py): the tape's JSON is the blob named by its id; `op` the run (or live
-- sandbox) that recorded it, `parent` the tape a replay_or_record extended.
CREATE TABLE IF NOT EXISTS tapes(id TEXT PRIMARY KEY, op TEXT, parent TEXT, created REAL NOT NULL,
    exchanges INTEGER NOT NULL, bytes INTEGER NOT NULL);
"""

# Columns added since a store was made (same format: older code ignores them), for both backends:
# (table, column, type in SQLite's words).
# layer_objects.erofs_*: a layer's EROFS image (store/erofs.py), NULL: its tar alone. idmap: the
# packer's ("uid_base gid_base count"): a node with another one takes the tar.
MIGRATIONS = [("public_images", "by", "TEXT"), ("layer_objects", "erofs_sha256", "TEXT"),
              ("layer_objects", "erofs_size", "INTEGER"), ("layer_objects", "erofs_idmap", "TEXT")]

# Rows moved from a table whose key changed into its successor, on every open in the schema's transaction
# (nothing once moved; an older sandtree writing the old table meanwhile is moved again), for both backends:
# (old table, statements).
# The build cache: a row made by a tenant's operation (tenant_ops) is that tenant's, by any other operation
# the operator's; a pull's or FROM scratch's (no operation: who asked is unknown) is dropped, to be made
# again. Annotations: each old row becomes the operator's and every owning tenant's (tenancy/tenant.py
# OWNED), so each reads what it read before; a public image's readers see its sharer's (an owner's).
_OWNERS = ("SELECT image AS image, tenant AS tenant FROM tenant_images UNION "
           "SELECT o.result, w.tenant FROM tenant_ops w JOIN operations o ON o.id=w.op "
           "WHERE o.result IS NOT NULL AND (o.source IS NULL OR o.result != o.source)")
MOVES = [
    ("build_cache", [
        "INSERT OR IGNORE INTO build_cache_by(principal, key, image, op, hermetic, created) "
        "SELECT COALESCE((SELECT w.tenant FROM tenant_ops w WHERE w.op=c.op), ''), c.key, c.image, c.op, "
        "c.hermetic, c.created FROM build_cache c WHERE c.op IS NOT NULL",
        "DELETE FROM build_cache"]),
    ("annotations", [
        "INSERT OR IGNORE INTO annotations_by(principal, image, score, meta, updated) "
        "SELECT '', image, score, meta, updated FROM annotations",
        "INSERT OR IGNORE INTO annotations_by(principal, image, score, meta, updated) "
        f"SELECT DISTINCT w.tenant, a.image, a.score, a.meta, a.updated FROM annotations a JOIN ({_OWNERS}) w "
        "ON w.image=a.image",
        "DELETE FROM annotations"]),
]


def move_rows(con, moves) -> None:
    """MOVES, each only when its old table holds rows (so an open writes nothing once they are moved:
    a read-only open of a full disk's database keeps working)."""
    for table, statements in moves:
        if con.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:
            for sql in statements:
                con.execute(sql)


def check_url(url: str | None) -> str:
    """The backend a database URL names ("sqlite" or "postgresql"), or InvalidInput."""
    if not url:
        return "sqlite"
    if not isinstance(url, str):
        raise InvalidInput("a database URL is a string")
    if url.startswith("sqlite://"):
        if not url[len("sqlite://"):].startswith("/"):
            raise InvalidInput(f"a sqlite:// URL names an absolute path (sqlite:///path): {url!r}")
        return "sqlite"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql"
    raise InvalidInput(f"a database URL is postgresql://... or sqlite:///path: {url.split('@')[-1]!r}")


def open_database(home: str, url: str | None, durability: str = durable.STRICT):
    """The store's metadata database: `url` postgresql://... (store/pgdb.py), or None / "" / a
    sqlite:///path URL: SQLite (default: HOME/sandtree.db). durability: store/durable.py (a
    PostgreSQL commit is durable at either level)."""
    if check_url(url) == "postgresql":
        return PgDatabase(url, SCHEMA, MIGRATIONS, SCHEMA_VERSION, MOVES)
    return Database(url[len("sqlite://"):] if url else os.path.join(home, "sandtree.db"), durability)


class Database(Reads):
    def __init__(self, path: str, durability: str = durable.STRICT):
        self.path = path
        # strict: every commit's WAL frames on the disk before tx() returns (GroupSync);
        # relaxed: only those of durable=True transactions (and checkpoints)
        self.strict = durability == durable.STRICT
        self.group = GroupSync(path)
        # Set when the disk failed to flush a commit: Linux then marks the lost pages clean, so no
        # later flush can say whether they reached the disk; like PostgreSQL's PANIC, the store
        # stops taking writes (every later tx: StoreUnavailable) until it is checked and reopened.
        self.failed: str | None = None
        self._local = threading.local()
        con = self.connection()
        with con:
            con.executescript(SCHEMA)
            for table, column, kind in MIGRATIONS:
                if column not in {r[1] for r in con.execute(f"PRAGMA table_info({table})")}:
                    con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            move_rows(con, MOVES)
            row = con.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            if row is None:
                con.execute("INSERT INTO meta VALUES('format', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise RuntimeError(f"store format {row[0]} is newer than this sandtree ({SCHEMA_VERSION})")

    def connection(self, *, write: bool = False) -> sqlite3.Connection:
        """This thread's connection. write: one that can write (DiskFull if the disk has no room
        for one), not the read-only fallback."""
        con = getattr(self._local, "con", None)
        if con is not None and getattr(self._local, "fallback", False) and \
                (write or time.monotonic() - self._local.fallback_at > 1.0):
            try:                                      # the room may be back: a normal connection
                fresh = self._open()
            except sqlite3.OperationalError as exc:
                if not disk_full(self.path, exc):
                    raise
                if write:
                    raise DiskFull("disk full: the store's database cannot be written") from None
                self._local.fallback_at = time.monotonic()
            else:
                con.close()
                con, self._local.con, self._local.fallback = fresh, fresh, False
        if con is None:
            try:
                con, fallback = self._open(), False
            except sqlite3.OperationalError as exc:
                if not disk_full(self.path, exc):
                    raise
                if write:
                    raise DiskFull("disk full: the store's database cannot be written") from None
                con, fallback = self._open_read_only(), True
            self._local.con, self._local.fallback, self._local.fallback_at = con, fallback, time.monotonic()
        return con

    def _open(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            # WAL frames are synced at checkpoints only; a commit that must be durable is synced
            # after it by GroupSync (FULL would sync inside SQLite's write lock, one at a time)
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute("PRAGMA busy_timeout=60000")
        except BaseException:
            con.close()
            raise
        return con

    def _open_read_only(self) -> sqlite3.Connection:
        """For reads on a full disk: immutable, so SQLite needs no -shm; only if the main file is
        complete (no WAL file with commits not yet merged into it)."""
        try:
            wal = os.path.getsize(self.path + "-wal")
        except FileNotFoundError:
            wal = 0
        if wal > 0 or not os.path.exists(self.path):
            raise DiskFull("disk full: the store's database cannot be opened (its journal needs room)")
        con = sqlite3.connect(f"file:{quote(os.path.abspath(self.path))}?immutable=1", uri=True,
                              isolation_level=None, check_same_thread=False)
        return con

    def close(self) -> None:
        con = getattr(self._local, "con", None)
        if con is not None:
            con.close()
            self._local.con = None
            self._local.fallback = False

    # A write transaction: BEGIN IMMEDIATE takes the write lock up front, so a compare-and-swap
    # read inside it cannot be invalidated by another writer before our write.
    # A full disk inside it: DiskFull, with the transaction rolled back.
    class _Tx:
        def __init__(self, db, durable_commit: bool = False):
            self.db = db
            self.sync = durable_commit or db.strict

        def __enter__(self):
            if self.db.failed is not None:
                raise StoreUnavailable(f"the store's disk failed to flush its database ({self.db.failed}): "
                                       "it takes no more writes; check the disk and `sandtree fsck`, then "
                                       "open the store again", path=self.db.path)
            self.con = self.db.connection(write=True)
            try:
                self.con.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                self.db._full(exc)
                raise
            self.changes = self.con.total_changes     # (a transaction that wrote nothing needs no sync)
            return self.con

        def __exit__(self, et, ev, tb):
            if et is None:
                try:
                    self.con.execute("COMMIT")
                except sqlite3.OperationalError as exc:
                    et, ev = type(exc), exc
                else:
                    if self.sync and self.con.total_changes != self.changes:
                        try:
                            self.db.group.sync()         # (the write lock is free again)
                        except OSError as exc:
                            # Committed, and visible: raising now would have the caller undo what
                            # the rows name (a published layer). The disk failed a flush: said
                            # loudly, and no write is taken after it (self.failed).
                            self.db.failed = f"{exc.strerror or exc}"
                            log.error("the disk failed to flush the store's database (%s): the last "
                                      "commits may not survive a power cut; the store takes no more "
                                      "writes", exc)
                    return False
            if self.con.in_transaction:
                self.con.execute("ROLLBACK")
            if isinstance(ev, (sqlite3.OperationalError, OSError)):
                self.db._full(ev)
            if et is not None and ev is not None and tb is None:
                raise ev                                 # the COMMIT's own error
            return False

    def tx(self, *, serial: bool = True, durable: bool = False):
        """A write transaction (BEGIN IMMEDIATE: SQLite has one writer at a time, so `serial`, which
        lets PostgreSQL run a transaction that only writes rows of its own beside others, changes
        nothing here). durable: its commit is on the disk when this returns even in a relaxed
        store (what files are deleted after: gc)."""
        return self._Tx(self, durable)

    def fence(self, *, shared: bool) -> "FileFence":
        """gc's fence (store.py using/collecting) for every process on this database, whatever
        store directory it uses: a flock on a file beside it (a SQLite file is one machine's)."""
        return FileFence(self.path + ".gc-lock", shared)

    def _full(self, exc) -> None:
        """Raise DiskFull if `exc` is the disk having no room."""
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFull("disk full: nothing was written") from None
        if isinstance(exc, sqlite3.OperationalError) and disk_full(self.path, exc):
            raise DiskFull("disk full: nothing was written") from None


class GroupSync:
    """Group commit for SQLite in WAL mode: after its COMMIT (synchronous=NORMAL: frames written,
    not synced), a transaction that must be durable waits for one fdatasync of the WAL file begun
    after its commit; the threads that committed meanwhile share it (one disk flush for many
    commits), and no writer holds SQLite's write lock while the disk flushes (synchronous=FULL
    syncs inside it: 4 threads made 435 write transactions/s that way on a busy disk).
    Sound because a committed transaction's frames are either still in the WAL file, flushed here,
    or were copied into the database file by a completed checkpoint, which syncs that file before
    the WAL is restarted or removed (NORMAL's rule). A WAL file new since the last flush has its
    directory synced too (its name), as SQLite does for one it creates."""

    def __init__(self, path: str):
        self.wal = path + "-wal"
        self.dir = os.path.dirname(os.path.abspath(path))
        self.cv = threading.Condition()
        self.committed = 0                # commits that asked, in the order they asked
        self.synced = 0                   # every commit up to this one is on the disk
        self.syncing = False
        self.inode: int | None = None

    def sync(self) -> None:
        """Called right after a COMMIT: returns once that commit is on the disk."""
        with self.cv:
            self.committed += 1
            ticket = self.committed
            while self.synced < ticket and self.syncing:
                self.cv.wait()                # a flush begun before our commit does not count
            if self.synced >= ticket:
                return                        # a flush begun after it did
            self.syncing = True
            upto = self.committed
        done = False
        try:
            self._flush()
            done = True
        finally:
            with self.cv:
                self.syncing = False
                if done:
                    self.synced = max(self.synced, upto)
                self.cv.notify_all()

    def _flush(self) -> None:
        try:
            fd = os.open(self.wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return          # no WAL: checkpointed into the database file (synced) and removed
        try:
            os.fdatasync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self.inode:
            durable.sync_dir(self.dir)
            self.inode = inode


class FileFence:
    """A flock held from __enter__ to __exit__ on its own open of `path` (flock is per open file,
    so each holder's is its own, and it dies with its process). An open and two flocks."""

    def __init__(self, path: str, shared: bool):
        self.path, self.mode = path, fcntl.LOCK_SH if shared else fcntl.LOCK_EX

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self.fd, self.mode)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)
        return False


def dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


def disk_full(path: str, exc: sqlite3.OperationalError) -> bool:
    """Whether a SQLite error is the disk being full: SQLITE_FULL says so; an I/O error (what a
    failed -shm or -wal write becomes) counts when the database's filesystem has no room left."""
    msg = str(exc).lower()
    if "full" in msg:
        return True
    if "disk i/o error" not in msg:
        return False
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)))
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20) or st.f_favail == 0


def typed_disk_errors(fn):
    """A full disk reaching the caller of `fn` as DiskFull ("disk full"), not a raw OSError
    (ENOSPC, EDQUOT) or sqlite3 error: what commit, import, upload and every write may meet."""

    @functools.wraps(fn)
    def wrapper(*a, **k):
        try:
            return fn(*a, **k)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(f"disk full: {exc.strerror or 'no space left'}; nothing was committed") from None
            raise
        except sqlite3.OperationalError as exc:
            if "full" in str(exc).lower():
                raise DiskFull("disk full: the store's database has no room; nothing was committed") from None
            raise
    return wrapper
