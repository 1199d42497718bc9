"""Rows that are one principal's (a tenant's, or the operator's: ""): the build cache and annotations.
A store made before they were (one row per key, whoever wrote it) has its rows moved on open, on SQLite
and on PostgreSQL: a build cache row goes to the principal whose operation made it (a tenant's, by
tenant_ops; any other: the operator's; none, a pull: dropped), an annotation row to the operator and to
every tenant that owns the image, so that each reads what it read before and writes only its own."""

from __future__ import annotations

import json

import pytest

from sandtree.store.db import open_database


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request):
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("pg_cluster").new_database()


def _old_rows(db) -> None:
    """What the store held before: rows of the tables keyed by step key and by image alone."""
    with db.tx() as con:
        for i in ("img-op", "img-alice", "img-pull", "img-x", "img-y"):
            con.execute("INSERT INTO images(id, layers, links, created, size, files) VALUES(?,?,?,?,?,?)",
                        (i, "[]", "{}", 1.0, 1, 1))
        con.execute("INSERT INTO operations(id, kind, source, result, spec, outcome, started, finished) "
                    "VALUES(?,?,?,?,?,?,?,?)", ("op-alice", "exec", "img-base", "img-y", "{}", None, 1.0, 2.0))
        con.execute("INSERT INTO tenant_ops(op, tenant, token) VALUES(?,?,?)", ("op-alice", "alice", "t"))
        con.execute("INSERT INTO tenant_images(tenant, image, at) VALUES(?,?,?)", ("bob", "img-x", 1.0))
        for key, image, op in (("k-op", "img-op", "op-operator"), ("k-alice", "img-alice", "op-alice"),
                               ("k-pull", "img-pull", None)):
            con.execute("INSERT INTO build_cache(key, image, op, hermetic, created) VALUES(?,?,?,?,?)",
                        (key, image, op, 1, 1.0))
        for image, score in (("img-x", 0.5), ("img-y", 0.25)):
            con.execute("INSERT INTO annotations(image, score, meta, updated) VALUES(?,?,?,?)",
                        (image, score, json.dumps({"s": score}), 1.0))


def test_old_rows_move_to_their_principals_on_open(tmp_path, database_url):
    db = open_database(str(tmp_path), database_url)
    _old_rows(db)
    db.close()
    for _ in range(2):                           # the move is done once; opening again changes nothing
        db = open_database(str(tmp_path), database_url)
        try:
            assert sorted(tuple(r) for r in db.query("SELECT principal, key, image FROM build_cache_by")) == [
                ("", "k-op", "img-op"), ("alice", "k-alice", "img-alice")]
            assert sorted(tuple(r) for r in db.query("SELECT principal, image, score FROM annotations_by")) == [
                ("", "img-x", 0.5), ("", "img-y", 0.25), ("alice", "img-y", 0.25), ("bob", "img-x", 0.5)]
            assert not db.query("SELECT key FROM build_cache") and not db.query("SELECT image FROM annotations")
        finally:
            db.close()
