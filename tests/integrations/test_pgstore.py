"""Metadata in PostgreSQL (issue 20 item 1): what only that backend has to show. The store's own
tests run on it through the conformance suite (tests/backends.py, test_backends_*.py).

- a branch move is a compare-and-swap across connections: of racing movers from one head, one wins;
- the server killed (-9) in the middle of writes loses no committed write, and the writer meets a
  typed error (StoreUnavailable), never a raw driver error;
- `--database` and SANDTREE_DATABASE_URL select it; bad URLs and unreachable servers are typed errors.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psycopg
import pytest

import sandtree
from sandtree.errors import Conflict, InvalidInput, StoreUnavailable
from sandtree.store import refs

from pgcluster import PgCluster, Unavailable


def test_branch_moves_are_compare_and_swap_across_connections(tmp_path, pg_cluster, rootfs):
    url = pg_cluster.new_database()
    with sandtree.Sandtree(str(tmp_path / "home"), warm=0, database=url) as st:
        base = st.import_image(rootfs)
        store = st.engine.store
        refs.create(store, "main", base.id)
        movers = 8
        news = [base.run(f"echo {i} > /m").image.id for i in range(movers)]
        won, lost, go = [], [], threading.Barrier(movers)

        def move(new):
            go.wait()                                   # every thread on its own connection, at once
            try:
                refs.advance(store, "main", base.id, new, "race")
                won.append(new)
            except Conflict as exc:
                lost.append(exc)
        threads = [threading.Thread(target=move, args=(n,)) for n in news]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1 and len(lost) == movers - 1
        assert refs.head(store, "main") == won[0]
        assert [m["new"] for m in refs.reflog(store, "main")] == [base.id, won[0]]
        assert all("moved" in str(e) for e in lost)
        # the rows are PostgreSQL's: another connection sees the head
        with psycopg.connect(url) as con:
            assert con.execute("SELECT image FROM refs WHERE kind='branch' AND name='main'").fetchone()[0] == won[0]
        assert not os.path.exists(tmp_path / "home" / "sandtree.db")


WRITER = textwrap.dedent("""
    import sys, sandtree
    from sandtree.errors import SandtreeError
    home, rootfs, url = sys.argv[1:4]
    st = sandtree.Sandtree(home, warm=0, database=url)
    img = st.import_image(rootfs)
    print("ready", img.id, flush=True)
    i = 0
    try:
        while True:
            i += 1
            st.tag(img, f"t{i}")
            print("tagged", i, flush=True)               # after the commit returned
    except SandtreeError as exc:
        print("error", type(exc).__name__, flush=True)
""")


def _kill_cluster(cluster: PgCluster) -> None:
    """SIGKILL the postmaster and every backend of it (a machine losing the server)."""
    pm = cluster.postmaster_pid()
    kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == pm]
    for pid in [pm, *kids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_server_killed_mid_writes_loses_nothing_committed(tmp_path, rootfs):
    try:
        cluster = PgCluster().start()            # its own: this test kills it
    except Unavailable as exc:
        pytest.skip(f"PostgreSQL cannot start here: {exc}")
    try:
        url = cluster.new_database()
        home = str(tmp_path / "home")
        proc = subprocess.Popen([sys.executable, "-c", WRITER, home, rootfs, url], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        first = proc.stdout.readline().split()
        assert first[0] == "ready", proc.stderr.read()
        lines = []
        while len(lines) < 30:                   # writes in flight, then the server dies under them
            lines.append(proc.stdout.readline().strip())
        _kill_cluster(cluster)
        out, err = proc.communicate(timeout=60)
        lines += out.splitlines()
        assert lines[-1] == "error StoreUnavailable", (lines[-3:], err[-2000:])
        committed = [int(x.split()[1]) for x in lines if x.startswith("tagged")]
        for _ in range(50):                      # crash recovery; the killed backends' pids must be gone
            time.sleep(0.2)
            if subprocess.run([f"{cluster.bindir}/pg_ctl", "-D", cluster.data, "-l", os.path.join(cluster.dir, "log"),
                               "-o", f"-c listen_addresses='' -k {cluster.dir}", "-w", "start"],
                              **cluster._as_user).returncode == 0:
                break
        with sandtree.Sandtree(home, warm=0, database=url) as st:
            tags = st.engine.store.tags()
            assert {f"t{i}" for i in committed} <= set(tags), "a committed tag was lost"
            assert len(tags) >= len(committed) >= 30
            assert st.fsck()["ok"]
    finally:
        cluster.stop()


def test_database_chosen_by_flag_or_environment(tmp_path, pg_cluster, rootfs):
    url = pg_cluster.new_database()
    home = str(tmp_path / "home")
    env = {k: v for k, v in os.environ.items() if k != "SANDTREE_DATABASE_URL"}

    def cli(*args, **extra):
        p = subprocess.run([sys.executable, "-m", "sandtree", "--home", home, *args], capture_output=True,
                           text=True, timeout=120, env={**env, **extra})
        assert p.returncode == 0, p.stderr
        return p.stdout
    cli("--database", url, "image", "import", rootfs, "--tag", "viaflag")
    assert not os.path.exists(os.path.join(home, "sandtree.db"))     # nothing went to SQLite
    listed = json.loads(cli("image", "list", "--json", SANDTREE_DATABASE_URL=url))
    assert [i["tags"] for i in listed] == [["viaflag"]]
    with psycopg.connect(url) as con:
        assert con.execute("SELECT name FROM refs").fetchall() == [("viaflag",)]
    # without either: the SQLite default of the same home, which holds nothing
    assert json.loads(cli("image", "list", "--json")) == []
    assert os.path.exists(os.path.join(home, "sandtree.db"))


@pytest.mark.parametrize("url, err", [
    ("mysql://localhost/x", InvalidInput),
    ("sqlite://relative/path.db", InvalidInput),
    ("postgresql://sandtree@/nope?host=/nonexistent-dir", StoreUnavailable),
])
def test_bad_database_urls_are_typed_errors(tmp_path, url, err):
    with pytest.raises(err):
        sandtree.Sandtree(str(tmp_path / "home"), warm=0, database=url)
    assert not os.path.exists(tmp_path / "home")                  # nothing made


def test_threads_that_end_leave_no_server_connection(tmp_path, pg_cluster, rootfs):
    url = pg_cluster.new_database()

    def backends():
        with psycopg.connect(url, autocommit=True) as con:
            return con.execute("SELECT count(*) FROM pg_stat_activity WHERE datname=current_database()").fetchone()[0] - 1
    with sandtree.Sandtree(str(tmp_path / "home"), warm=0, database=url) as st:
        img = st.import_image(rootfs)
        for i in range(60):                          # each thread opens its own connection, then ends
            t = threading.Thread(target=lambda: st.engine.store.db.one("SELECT 1"))
            t.start()
            t.join()
        ops = [img.run(f"echo {i} > /f") for i in range(5)]
        assert len({o.image.id for o in ops}) == 5
        time.sleep(0.3)
        assert backends() <= 10, "connections of ended threads are still open"
    time.sleep(0.3)
    assert backends() == 0                           # close() closed the rest


def test_dialect_knows_the_primary_key_of_every_table_replaced_into():
    """INSERT OR REPLACE becomes an upsert on the table's primary key, read from the schema: every
    table of the schema has one found, and every table the source replaces into is among them."""
    import glob
    import re
    from sandtree.store import db, dialect
    keys = dialect.primary_keys(db.SCHEMA)
    tables = set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", db.SCHEMA))
    assert tables == set(keys), tables - set(keys)
    assert keys["sandboxes"] == ["id"] and keys["refs"] == ["kind", "name"]
    src = os.path.join(os.path.dirname(sandtree.__file__))
    replaced = set()
    for path in glob.glob(os.path.join(src, "**", "*.py"), recursive=True):
        replaced |= set(re.findall(r"INSERT OR REPLACE INTO (\w+)", open(path).read()))
    assert replaced and replaced <= set(keys)
    sql = dialect.statement("INSERT OR REPLACE INTO sandboxes(id, image, state) VALUES(?,?,?)",
                            tuple((t, tuple(k)) for t, k in keys.items()))
    assert sql.endswith("ON CONFLICT (id) DO UPDATE SET image=EXCLUDED.image, state=EXCLUDED.state")


def test_live_sandbox_forks_keep_the_parents_sessions(tmp_path, pg_cluster, rootfs):
    """A live sandbox's helper is forked from the engine: the child dropping the threads (and their
    connections) it inherited must not end the parent's PostgreSQL sessions (it did: every call
    after start() met StoreUnavailable)."""
    url = pg_cluster.new_database()
    with sandtree.Sandtree(str(tmp_path / "home"), warm=0, database=url) as st:
        img = st.import_image(rootfs)
        threading.Thread(target=lambda: st.engine.store.db.one("SELECT 1")).start()   # another thread's session
        sb = img.start()
        try:
            assert sb.exec("echo hi > /f; cat /f").stdout == b"hi\n"
            done = sb.commit(tag="live")
        finally:
            sb.stop()
        assert st.image("live").id == done.id
        assert done.run("cat /f").stdout == b"hi\n"


def test_postgresql_answers_as_sqlite_does(tmp_path, pg_cluster):
    """The same rows, the same store queries, the same answers: byte order of names even on a
    database whose locale sorts otherwise (ICU en-US: 'a' < 'B'), NULLs last descending, LIKE
    without an escape character and case-insensitive, booleans as integers, sizes past 2^31."""
    name = "t_icu_" + os.urandom(4).hex()
    with psycopg.connect(pg_cluster.url(), autocommit=True) as con:
        con.execute(f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' "
                    "LOCALE 'C.UTF-8'")
    from sandtree.store.db import open_database
    dbs = [open_database(str(tmp_path), None), open_database(str(tmp_path), pg_cluster.url(name))]
    answers = []
    for db in dbs:
        with db.tx() as con:
            for n in ["b", "B", "a", "A", "_x", "a/b", "a-b", "Z9"]:
                con.execute("INSERT INTO refs(name, kind, image, updated) VALUES(?,?,?,?)", (n, "branch", "i" + n, 1.0))
            for i, fin in enumerate([None, 3.0, 2.0, None]):
                con.execute("INSERT INTO operations(id, kind, source, result, spec, outcome, started, finished) "
                            "VALUES(?,?,?,?,?,?,?,?)", (f"op{i}", "exec", "s", f"r{i}", '{"k": "a_b\\\\c"}', None, i, fin))
            con.execute("INSERT OR REPLACE INTO build_cache(key, image, op, hermetic, created) VALUES(?,?,?,?,?)",
                        ("k", "img", None, True, 1.0))
            con.execute("INSERT INTO images(id, layers, links, created, size, files) VALUES(?,?,?,?,?,?)",
                        ("ab" * 32, "[]", "{}", 1.0, 5 << 31, 1))
        answers.append([
            db.query("SELECT name FROM refs WHERE kind='branch' ORDER BY name"),
            db.query("SELECT id FROM operations WHERE source=? ORDER BY finished DESC", ("s",)),
            db.query("SELECT id FROM operations WHERE spec LIKE ?", ('%A_B\\%',)),
            db.query("SELECT id FROM operations WHERE spec LIKE ?", ('%a\\_b%',)),
            db.query("SELECT name FROM refs WHERE instr(name, ?)=0 AND substr(name, 1, ?)=? ORDER BY name", ("/", 1, "a")),
            db.query("SELECT hermetic FROM build_cache"),
            db.query("SELECT id, size FROM images WHERE id >= ? AND id < ?", ("abab", "ababg")),
        ])
        db.close()
    assert answers[0] == [[tuple(r) for r in q] for q in answers[1]]
    assert [r[0] for r in answers[0][0]] == sorted(["b", "B", "a", "A", "_x", "a/b", "a-b", "Z9"])
    assert answers[0][1][-2:] in ([("op0",), ("op3",)], [("op3",), ("op0",)])     # NULLs last descending


def test_a_command_in_a_live_sandbox_does_not_queue_behind_the_write_lock(tmp_path, pg_cluster, rootfs):
    """An exec's record and its sandbox's last-use stamp are rows of their own: they are written
    while another connection holds the one-writer lock (as a slow commit would), which a ref move
    still waits for."""
    from sandtree.store.pgdb import WRITE_LOCK
    url = pg_cluster.new_database()
    with sandtree.Sandtree(str(tmp_path / "home"), warm=0, database=url) as st:
        img = st.import_image(rootfs)
        sb = img.start(idle_timeout=600)
        try:
            with psycopg.connect(url) as holder:
                holder.execute("BEGIN")
                holder.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                done = {}
                execs = threading.Thread(target=lambda: done.update(rec=[sb.exec(f"echo {i}") for i in range(3)]))
                tag = threading.Thread(target=lambda: done.update(tag=img.tag("held")))
                execs.start()
                tag.start()
                execs.join(60)
                assert not execs.is_alive() and [r.stdout for r in done["rec"]] == [b"0\n", b"1\n", b"2\n"]
                tag.join(1)
                assert tag.is_alive() and "tag" not in done       # a ref move waits for the lock
                holder.execute("ROLLBACK")
            tag.join(60)
            assert not tag.is_alive() and st.image("held").id == img.id
            ops = [st.operation(r.operation) for r in done["rec"]]
            assert [o["kind"] for o in ops] == ["exec"] * 3 and all(o["outcome"]["exit_code"] == 0 for o in ops)
        finally:
            sb.stop()
