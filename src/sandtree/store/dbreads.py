"""What both metadata backends (db.Database: SQLite, pgdb.PgDatabase: PostgreSQL) do the same way
on top of their own connection(): queries, and the trees table."""

from __future__ import annotations

__all__ = ["Reads"]


class Reads:
    def query(self, sql: str, args=()):
        return self.connection().execute(sql, args).fetchall()

    def one(self, sql: str, args=()):
        return self.connection().execute(sql, args).fetchone()

    def tree_data(self, digest: str) -> bytes | None:
        row = self.one("SELECT data FROM trees WHERE hash=?", (digest,))
        if row is None:
            return None
        return row[0] if isinstance(row[0], bytes) else bytes(row[0])   # (PostgreSQL's driver: a memoryview)

    @staticmethod
    def put_trees(con, trees: dict[str, bytes]) -> None:
        # INSERT OR IGNORE: the first recording of a tree keeps its timestamps.
        con.executemany("INSERT OR IGNORE INTO trees(hash, data) VALUES(?, ?)", trees.items())
