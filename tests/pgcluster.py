"""A throwaway PostgreSQL cluster for the tests: Debian's server binaries (scripts/install-deps),
`initdb` + `pg_ctl start` as the unprivileged user `nobody` in a temp dir of its own, listening
only on a unix socket in that dir (no TCP port), stopped (and its dir removed) at the end.

PgCluster.start() raises Unavailable with the reason when the cluster cannot start; the fixtures
turn that into a skip that says why."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid


class Unavailable(Exception):
    pass


def _bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return os.path.dirname(found[-1]) if found else None


class PgCluster:
    USER = "nobody"

    def __init__(self):
        self.dir = None
        self.bindir = _bindir()

    def start(self) -> "PgCluster":
        if self.bindir is None:
            raise Unavailable("PostgreSQL server binaries not installed (Debian `postgresql`, scripts/install-deps)")
        try:
            pw = pwd.getpwnam(self.USER)
        except KeyError:
            raise Unavailable(f"no user {self.USER!r} to run PostgreSQL as") from None
        self.dir = tempfile.mkdtemp(prefix="st-pg-", dir="/tmp")   # short: a socket path has 107 bytes
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.data = os.path.join(self.dir, "data")
        as_user = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd=self.dir,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}, capture_output=True, text=True)
        r = subprocess.run([f"{self.bindir}/initdb", "-D", self.data, "-U", "sandtree", "--auth=trust",
                            "-E", "UTF8", "--no-sync"], **as_user)
        if r.returncode:
            self.stop()
            raise Unavailable(f"initdb failed: {r.stderr.strip()[-300:]}")
        opts = f"-c listen_addresses='' -k {self.dir} -c fsync=on -c max_connections=200"
        r = subprocess.run([f"{self.bindir}/pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"),
                            "-o", opts, "-w", "-t", "60", "start"], **as_user)
        if r.returncode:
            log = open(os.path.join(self.dir, "log")).read()[-500:] if os.path.exists(os.path.join(self.dir, "log")) else ""
            self.stop()
            raise Unavailable(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log}")
        self._as_user = as_user
        return self

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://sandtree@/{dbname}?host={self.dir}"

    def new_database(self) -> str:
        """A fresh, empty database's URL."""
        import psycopg
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as con:
            con.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def postmaster_pid(self) -> int:
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def stop(self) -> None:
        if self.dir is None:
            return
        if os.path.exists(os.path.join(self.dir, "data", "postmaster.pid")):
            subprocess.run([f"{self.bindir}/pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"],
                           **self._as_user)
        shutil.rmtree(self.dir, ignore_errors=True)     # a plain directory: nothing is mounted under it
        self.dir = None
