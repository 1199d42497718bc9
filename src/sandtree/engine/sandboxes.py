"""Live sandboxes: started from an image, entered by many commands, committed while running.

The engine's half of issue 6 (the runtime's half is runtime/live.py). A live sandbox is a row
in the `sandboxes` table (its image, its LiveHandle, its limits, its last commit) and a set of
processes that outlive whoever started them; any engine process finds them by id, so the CLI's
`sandtree start` and `sandtree exec` work across invocations and a restarted server re-attaches
to what is still running. Stopped, expired or vanished sandboxes are marked so, never left
"running". Every command is an `exec` operation (the audit trail); a commit is a `commit`
operation whose lineage edge goes from the sandbox's last commit (or its image) to the new image.

Shell session: a string command runs in `/bin/sh` through SESSION, which restores the exported
environment and working directory the previous string command left (a file in the sandbox's
/dev/shm, a tmpfs outside the committed filesystem) and saves them when it exits. A list runs as
a fresh process with exactly the given environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import threading
import time
import uuid

from ..errors import Conflict, InvalidInput, NotFound, RuntimeUnavailable, SandtreeError
from ..runtime.base import Limits, RunSpec
from ..runtime import criu
from ..runtime.live import LiveHandle, LiveRuntime
from .secrets_mask import mask_env, mask_text, secret_values
from ..store.db import dumps

# $1: the session file, $2: the command, then NAME=VALUE pairs for this command only (their
# session values come back after it). Each step says why in the comment at the top of the file.
SESSION = r'''
unset __ST_SESSION
__st_s=$1; __st_c=$2; shift 2
if [ -r "$__st_s" ]; then . "$__st_s"; fi
__st_new=; __st_had=
for __st_kv in "$@"; do
  __st_n=${__st_kv%%=*}
  if eval "[ \"\${$__st_n+set}\" = set ]"; then
    eval "__st_old_$__st_n=\$$__st_n"; __st_had="$__st_had $__st_n"
  else __st_new="$__st_new $__st_n"; fi
  export "$__st_kv"
done
[ -n "$PWD" ] && cd "$PWD" 2>/dev/null
unset __st_kv __st_n
__st_save() {
  ( for __st_n in $__st_new; do unset "$__st_n"; done
    for __st_n in $__st_had; do eval "export $__st_n=\"\$__st_old_$__st_n\""; done
    export PWD; export -p ) > "$__st_s.$$" 2>/dev/null && mv -f "$__st_s.$$" "$__st_s"
}
trap '__st_rc=$?; __st_save; exit $__st_rc' EXIT
eval "$__st_c"
'''
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STATES = ("running", "hibernated", "stopped", "expired", "gone")


class Sandboxes:
    def __init__(self, engine):
        self.engine = engine
        self.live = LiveRuntime(engine.runtime)
        self.ahead = _Ahead(self.live)
        self._stop_reaping = threading.Event()
        self._reaped = 0.0

    def close(self) -> None:
        self._stop_reaping.set()
        self.ahead.close()

    # ---- registry ------------------------------------------------------------------------------
    def _row(self, sid: str) -> dict:
        if not isinstance(sid, str) or not sid:
            raise InvalidInput("a sandbox id must be a non-empty string")
        rows = self.engine.store.db.query("SELECT * FROM sandboxes WHERE id LIKE ?", (sid.replace("%", "") + "%",)) \
            if re.fullmatch(r"[0-9a-f]{4,32}", sid) else []
        if len(rows) > 1:
            raise InvalidInput(f"sandbox id {sid!r} is ambiguous")
        if not rows:
            raise NotFound(f"no live sandbox {sid!r}", sandbox=sid)
        return self._decode(rows[0])

    def _decode(self, r) -> dict:
        cols = ("id", "image", "state", "handle", "spec", "created", "last_used", "idle_timeout", "expires", "head")
        d = dict(zip(cols, r))
        d["handle"] = LiveHandle.from_dict(json.loads(d["handle"]))
        d["spec"] = json.loads(d["spec"])
        return d

    def _set_state(self, sid: str, state: str) -> None:
        with self.engine.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET state=? WHERE id=?", (state, sid))

    def _ours(self, row: dict) -> None:
        """Refuse a running sandbox whose processes this engine cannot identify (runtime/live.py
        foreign: started in another pid namespace); never judge it gone."""
        if row["state"] == "running" and self.live.foreign(row["handle"]):
            raise Conflict(f"sandbox {row['id']} is run by an engine in another pid namespace: use that engine",
                           sandbox=row["id"], state=row["state"])

    def _running(self, sid: str, *, idle: bool = True) -> dict:
        """The row of a sandbox that is running now (else NotFound/Conflict, and the row is fixed)."""
        row = self._row(sid)
        self._ours(row)
        if row["state"] != "running":
            hint = " (resume it first)" if row["state"] == "hibernated" else ""
            raise Conflict(f"sandbox {row['id']} is {row['state']}{hint}", sandbox=row["id"], state=row["state"])
        if idle and self._due(row, time.time()) and (state := self._expire(row)) != "running":
            raise Conflict(f"sandbox {row['id']} is {state} (idle timeout or lifetime)"
                           + (" (resume it first)" if state == "hibernated" else ""), sandbox=row["id"], state=state)
        if self.live.frozen(row["handle"]):
            # frozen by a commit: wait for it; or left frozen by a committer that died: thaw
            with self._commit_lock(row["id"]):
                if self.live.frozen(row["handle"]):
                    self.live.freeze(row["handle"], False)
            row = self._row(row["id"])                  # (it may have been hibernated meanwhile)
            if row["state"] != "running":
                raise Conflict(f"sandbox {row['id']} is {row['state']}", sandbox=row["id"], state=row["state"])
        if not self.live.alive(row["handle"]):
            state = self._lost(row)
            if state == "running":                 # resumed meanwhile by another process
                return self._running(row["id"])
            if state == "hibernated":
                raise Conflict(f"sandbox {row['id']} is hibernated (resume it first)", sandbox=row["id"],
                               state="hibernated")
            if state != "gone":
                raise Conflict(f"sandbox {row['id']} is {state}", sandbox=row["id"], state=state)
            raise Conflict(f"sandbox {row['id']} is gone (its processes ended: lifetime, or the host restarted)",
                           sandbox=row["id"], state="gone")
        return row

    @contextlib.contextmanager
    def _commit_lock(self, sid: str):
        """Held while a sandbox is frozen for a commit (any process); released by the kernel if
        the committer dies, so the next user can tell a commit in progress from a stale freeze."""
        d = os.path.join(self.engine.home, "sandboxes")
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o700)                         # checkpoints below hold sandboxes' memory
        fd = os.open(os.path.join(d, f"{sid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _due(self, row: dict, now: float) -> bool:
        """Past its lifetime, or idle past its idle timeout (a command still running is not idle)."""
        if now > row["expires"]:
            return True
        return bool(row["idle_timeout"] and now - row["last_used"] > row["idle_timeout"]
                    and not self.live.outsiders(row["handle"]))

    def _expire(self, row: dict) -> str:
        """A sandbox past its lifetime is stopped; one idle past its idle timeout is stopped or,
        with idle_action "hibernate", hibernated (stopped if that fails). Returns its state."""
        if time.time() <= row["expires"] and row["spec"].get("idle_action") == "hibernate":
            try:
                return self.hibernate(row["id"], idle=False)["state"]
            except SandtreeError:
                pass                                 # (a command running: not idle after all)
            if self.live.outsiders(row["handle"]):
                return "running"
        self._retire(row, "expired")
        return "expired"

    def reap_every(self, seconds: float) -> None:
        """A long-running process (the server) reaps on a timer, not only when someone lists."""
        def loop():
            while not self._stop_reaping.wait(seconds):
                try:
                    self.reap()
                except Exception:                  # noqa: BLE001 - a bad round must not end the timer
                    pass
        threading.Thread(target=loop, name="sandtree-reaper", daemon=True).start()

    def _lost(self, row: dict) -> str:
        """A running sandbox whose processes are gone: hibernated, if a hibernator died after its
        checkpoint was written; else gone. Under the commit lock: a hibernation in progress ends
        its processes on purpose, and decides their state itself."""
        with self._commit_lock(row["id"]):
            row = self._row(row["id"])
            if row["state"] != "running" or self.live.alive(row["handle"]):
                return row["state"]
            return self._lost_locked(row)

    def _lost_locked(self, row: dict) -> str:
        if row["spec"].get("hibernating") and self._dump_finished(row["id"]):
            self._retire(row, "running")
            self._hibernated(row["id"], {**row["spec"], **row["spec"]["hibernating"]})
            return "hibernated"
        self._retire(row, "gone")
        return "gone"

    def _retire(self, row: dict, state: str) -> None:
        self.ahead.forget(row["id"])
        self.live.stop(row["handle"])
        self._set_state(row["id"], state)

    def info(self, sid: str) -> dict:
        return self._view(self._row(sid))

    def _view(self, row: dict) -> dict:
        h = row["handle"]
        alive = row["state"] == "running" and (self.live.foreign(h) or self.live.alive(h))
        return {"id": row["id"], "image": row["image"], "head": row["head"],
                "state": row["state"] if row["state"] != "running" or alive else "gone",
                "created": row["created"], "last_used": row["last_used"], "idle_timeout": row["idle_timeout"],
                "expires": row["expires"], "memory_bytes": self.live.memory(h) if alive else None,
                "limits": row["spec"]["limits"], "cwd": row["spec"]["cwd"],
                "idle_action": row["spec"].get("idle_action", "stop")}

    def list(self, *, all: bool = False) -> list[dict]:
        """Live sandboxes (all=True: also the stopped ones), after expiring what is due."""
        self.reap()
        sql = "SELECT * FROM sandboxes" + ("" if all else " WHERE state IN ('running', 'hibernated')") + \
            " ORDER BY created"
        return [self._view(self._decode(r)) for r in self.engine.store.db.query(sql)]

    def reap(self) -> list[str]:
        """Stop sandboxes idle past their idle timeout or past their lifetime; mark vanished ones
        gone. Called on list and start, and by a long-running server on a timer (reap_every)."""
        now = time.time()
        self._reaped = time.monotonic()
        done = []
        for r in self.engine.store.db.query("SELECT * FROM sandboxes WHERE state='running'"):
            row = self._decode(r)
            if self.live.foreign(row["handle"]):
                continue                            # (its own engine reaps it; its helper ends it)
            if self._due(row, now):
                self._expire(row)                   # (its helper ends it at its lifetime by itself)
            elif not self.live.alive(row["handle"]):
                self._lost(row)
            else:
                continue
            done.append(row["id"])
        return done

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, ref: str, *, env: dict | None = None, cwd: str = "/", hostname: str = "sandtree",
              files=None, file_set: str | None = None, idle_timeout: float = 600, lifetime: float = 3600,
              idle_action: str = "stop", tier: str | None = None, **limits) -> dict:
        """Start a live sandbox on image `ref`. limits as for a run (timeout = per command).
        idle_action: what idle_timeout does, "stop" it or "hibernate" it (nothing is lost)."""
        eng = self.engine
        if (tier or eng.default_tier) != "namespaces":
            raise RuntimeUnavailable("live sandboxes run on the namespaces tier")
        ok, why = self.live.available()
        if not ok:
            raise RuntimeUnavailable(why)
        if idle_action not in ("stop", "hibernate"):
            raise InvalidInput(f"idle_action must be 'stop' or 'hibernate', not {idle_action!r}")
        if idle_action == "hibernate":
            ok, why = self.live.hibernate_available()
            if not ok:
                raise RuntimeUnavailable(why)
        for name, v in (("idle_timeout", idle_timeout), ("lifetime", lifetime)):
            if not isinstance(v, (int, float)) or v < 0 or (name == "lifetime" and v == 0):
                raise InvalidInput(f"{name} must be a positive number of seconds")
        source = eng.resolve(ref)
        row = eng.store.image(source)
        lim = eng._limits(limits)
        user_env = {str(k): str(v) for k, v in (env or {}).items()}
        injected = [eng._file(f) for f in (files or [])]
        if file_set is not None:
            injected = [eng._file(f) for f in eng.file_set(file_set)] + injected
        eng._check_cwd(source, cwd, injected)
        root = eng.store.tree(source)["."]
        from .core import DEFAULT_ENV
        spec = RunSpec(argv=["sandtree-init"], layers=row.layers, root_meta=(root.mode, root.uid, root.gid),
                       env={**DEFAULT_ENV, **user_env}, cwd=cwd, hostname=hostname, files=injected, limits=lim,
                       prepare_changes=(lambda upper: eng._inject(source, upper, injected)) if injected else None)
        if time.monotonic() - self._reaped > 1.0:     # (each reap looks at every sandbox)
            self.reap()
        with eng.store.using():                    # gc keeps the layers of running sandboxes (below)
            handle = self.live.start(spec, lifetime)
        sid = uuid.uuid4().hex
        now = time.time()
        record = {"env": {**DEFAULT_ENV, **user_env}, "masked_env": mask_env(user_env), "cwd": cwd,
                  "hostname": hostname, "limits": lim.__dict__, "files": [f.path for f in injected],
                  "lifetime": lifetime, "idle_action": idle_action}
        try:
            with eng.store.db.tx() as con:
                con.execute("INSERT INTO sandboxes(id, image, state, handle, spec, created, last_used, idle_timeout, "
                            "expires, head) VALUES(?,?,?,?,?,?,?,?,?,?)",
                            (sid, source, "running", dumps(handle.to_dict()), dumps(record), now, now,
                             idle_timeout, now + lifetime, source))
        except BaseException:
            self.live.stop(handle)
            raise
        return self.info(sid)

    def stop(self, sid: str) -> dict:
        row = self._row(sid)
        self._ours(row)
        self.ahead.forget(row["id"])
        with self._commit_lock(row["id"]):              # not while it hibernates or resumes
            row = self._row(row["id"])
            self._ours(row)
            self.live.stop(row["handle"])
            if row["state"] in ("running", "hibernated"):
                self._set_state(row["id"], "stopped")
            shutil.rmtree(self._checkpoint_dir(row["id"]), ignore_errors=True)   # files only
        return self.info(row["id"])

    def _touch(self, sid: str) -> None:
        with self.engine.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET last_used=? WHERE id=?", (time.time(), sid))

    # ---- commands ------------------------------------------------------------------------------
    def _command_spec(self, row: dict, command, *, env, cwd, stdin, uid, gid, limits) -> tuple[RunSpec, str]:
        eng = self.engine
        base = row["spec"]
        lim = Limits(**{**base["limits"], **{k: v for k, v in eng._limits(limits).__dict__.items()
                                                 if k in limits and limits[k] is not None}})
        user_env = {str(k): str(v) for k, v in (env or {}).items()}
        if isinstance(command, str):
            if not command.strip():
                raise InvalidInput("empty command")
            for k in user_env:
                if not NAME.match(k):
                    raise InvalidInput(f"bad environment variable name {k!r} for a shell command")
            if cwd is not None:
                if not isinstance(cwd, str) or not cwd.startswith("/"):
                    raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
                user_env["PWD"] = cwd
            session = f"/dev/shm/.sandtree-session-{int(uid)}"
            # the wrapper travels in the environment (and leaves it at once): `ps` shows one line
            argv = ["/bin/sh", "-c", 'eval "$__ST_SESSION"', "sandtree-session", session, command] + \
                [f"{k}={v}" for k, v in user_env.items()]
            env_out = {**base["env"], "__ST_SESSION": SESSION}
            shown = command
            run_cwd = base["cwd"]
        elif isinstance(command, (list, tuple)) and command:
            argv = [str(a) for a in command]
            env_out = {**base["env"], **user_env}
            shown = " ".join(argv)
            run_cwd = cwd or base["cwd"]
        else:
            raise InvalidInput("command must be a shell string or a non-empty list of arguments")
        if isinstance(stdin, str):
            stdin = stdin.encode()
        spec = RunSpec(argv=argv, layers=[], root_meta=(0, 0, 0), env=env_out, cwd=run_cwd, stdin=stdin,
                       uid=uid, gid=gid, limits=lim)
        return spec, mask_text(shown, secret_values(user_env))

    def exec(self, sid: str, command, *, env: dict | None = None, cwd: str | None = None, stdin=None,
             uid: int = 0, gid: int = 0, on_output=None, cancel=None, **limits):
        """Run `command` inside the sandbox to its exit. A string runs in the shell session (cwd and
        exported env carry over); a list is a fresh process. Returns a RunRecord (image None)."""
        from .core import RunRecord
        eng = self.engine
        row = self._running(sid)
        spec, shown = self._command_spec(row, command, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                                         limits=limits)
        spec.on_output, spec.cancel = on_output, cancel
        op = uuid.uuid4().hex
        started = time.time()
        self._touch(row["id"])
        try:
            out = self.live.exec(row["handle"], spec, ahead=self.ahead.take(row["id"], row["handle"]))
        except Exception as exc:
            eng._record_run(op, row["image"], {"command": shown, "sandbox": row["id"]}, started, None,
                            {"error": getattr(exc, "code", "error"), "message": str(exc)}, kind="exec")
            if isinstance(exc, NotFound):
                self._running(row["id"])        # raises Conflict(gone) if it died under us
            raise
        self._touch(row["id"])
        rec = RunRecord(op, row["image"], None, out.exit_code, out.signal, out.stdout, out.stderr,
                        out.stdout_truncated, out.stderr_truncated, out.timed_out, False, out.usage, out.cancelled)
        eng._record_run(op, row["image"], {"command": shown, "sandbox": row["id"], "uid": uid, "gid": gid},
                        started, None, {"exit_code": rec.exit_code, "signal": rec.signal, "timed_out": rec.timed_out,
                                        "cancelled": rec.cancelled, "usage": rec.usage}, kind="exec")
        return rec

    def popen(self, sid: str, argv, *, env: dict | None = None, cwd: str | None = None, uid: int = 0,
              gid: int = 0, pty: bool = False, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE) -> "LiveProcess":
        """A process inside the sandbox with pipes (or a terminal), like subprocess.Popen."""
        row = self._running(sid)
        spec, shown = self._command_spec(row, list(argv) if not isinstance(argv, str) else argv, env=env,
                                         cwd=cwd, stdin=None, uid=uid, gid=gid, limits={})
        self._touch(row["id"])
        proc, rep_r, raw = self.live.popen(row["handle"], spec, stdin=stdin, stdout=stdout, stderr=stderr, pty=pty)
        # Like subprocess.Popen, return once the process exists (a commit or hibernate that
        # follows must see it): the helper reports its pid right after the fork.
        while b"pid " not in raw:
            chunk = os.read(rep_r, 4096)
            if not chunk:
                break
            raw += chunk
        op = uuid.uuid4().hex
        self.engine._record_run(op, row["image"], {"command": shown, "sandbox": row["id"], "interactive": True},
                                time.time(), None, {"started": True}, kind="exec")
        return LiveProcess(proc, rep_r, self.live, raw)

    # ---- files ---------------------------------------------------------------------------------
    # Host-side access as root to a tree the sandbox controls: runtime/openat2.py says what each
    # step defends against (host device nodes bound into /dev, FIFOs, symlinks, /proc).
    def read(self, sid: str, path: str, *, limit: int = 64 << 20) -> bytes:
        """A regular file as the sandbox sees it now (resolved inside its root, never outside);
        TooLarge over `limit` bytes, NotRegularFile for devices, FIFOs, sockets, directories."""
        from ..runtime.openat2 import read_file
        row = self._running(sid)
        self._check_path(path)
        if not isinstance(limit, int) or limit < 0:
            raise InvalidInput("limit must be a non-negative number of bytes")
        mounts = self.live.own_mounts(row["handle"])
        root = self.live.root(row["handle"])
        try:
            return read_file(root, path, limit, mounts)
        finally:
            os.close(root)

    def write(self, sid: str, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
        """Write a regular file into the running sandbox (its parent directory must exist): a new
        file renamed over the name, so nothing that was there is written into or re-owned."""
        from ..runtime.openat2 import write_file
        row = self._running(sid)
        self._check_path(path)
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput("data must be bytes or a string")
        idmap = self.engine.store.idmap
        for name, v, top in (("mode", mode, 0o7777), ("uid", uid, idmap.count - 1), ("gid", gid, idmap.count - 1)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
                raise InvalidInput(f"{name} must be an integer from 0 to {top if name != 'mode' else oct(top)}",
                                   **{name: v})
        mounts = self.live.own_mounts(row["handle"])
        root = self.live.root(row["handle"])
        try:
            write_file(root, path, bytes(data), mode, idmap.host_uid(uid), idmap.host_gid(gid), mounts)
        finally:
            os.close(root)
        self._touch(row["id"])

    @staticmethod
    def _check_path(path) -> None:
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
            raise InvalidInput(f"path must be absolute, not {path!r}")

    # ---- commit ----------------------------------------------------------------------------------
    def commit(self, sid: str, *, tag: str | None = None) -> str:
        """An image of the sandbox's filesystem now. Its processes are frozen for the instant of
        the snapshot (the cgroup freezer), then thawed; the sandbox keeps running."""
        eng = self.engine
        row = self._running(sid)
        h = row["handle"]
        with eng.store.using(), self._commit_lock(row["id"]):
            # Unfrozen, the sandbox's processes would rename and swap files under the walk (a
            # directory for a symlink to a host path between the walk's lstat and its open):
            # the freezer is what makes the snapshot one instant, so no freezer, no commit.
            if not self.live.freeze(h, True):
                raise RuntimeUnavailable("committing a live sandbox needs the cgroup freezer "
                                         "(cgroups are not available here); nothing was committed")
            try:
                image = self._snapshot(row, True)
            finally:
                self.live.freeze(h, False)
        if tag:
            eng.tag(image, tag)
        return image

    def _snapshot(self, row: dict, frozen: bool, how: str = "commit") -> str:
        """Commit the upper (the caller holds the commit lock and froze the processes); record a
        `commit` operation and its lineage edge from the sandbox's head; move the head."""
        eng = self.engine
        h = row["handle"]
        op = uuid.uuid4().hex
        started = time.time()
        fd = self.live.scratch(h)
        try:
            # after a resume the upper holds the changes since the hibernation's commit
            cr = eng.committer.commit(eng.store.image(row["spec"].get("base") or row["image"]),
                                      f"/proc/self/fd/{fd}/u", max_file_size=row["spec"]["limits"]["disk"])
        finally:
            os.close(fd)
        write = eng._image_writer(cr)
        parent = row["head"] or row["image"]
        execs = [r[0] for r in eng.store.db.query(
            "SELECT id FROM operations WHERE kind='exec' AND source=? AND started>=? AND spec LIKE ?",
            (row["image"], self._last_commit(row), f'%"sandbox":"{row["id"]}"%'))]
        eng._record_run(op, row["image"], {"sandbox": row["id"], "frozen": frozen, "execs": execs,
                                           "command": f"{how} of live sandbox {row['id'][:12]}"},
                        started, cr.image, {"exit_code": 0}, write, kind="commit", parent=parent)
        with eng.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET head=? WHERE id=?", (cr.image, row["id"]))
        row["head"] = cr.image
        return cr.image

    # ---- hibernate -------------------------------------------------------------------------------
    def _checkpoint_dir(self, sid: str) -> str:
        return os.path.join(self.engine.home, "sandboxes", f"{sid}.ckpt")

    def hibernate(self, sid: str, *, idle: bool = True) -> dict:
        """Save the sandbox whole and free its CPU and memory: its filesystem becomes an image (a
        commit) and its processes a CRIU checkpoint (memory included). resume() brings them back
        where they were. Its lifetime does not run while it is hibernated."""
        eng = self.engine
        ok, why = self.live.hibernate_available()
        if not ok:
            raise RuntimeUnavailable(why)
        row = self._running(sid, idle=idle)
        sid, h = row["id"], row["handle"]
        if h.cgroup is None:
            raise RuntimeUnavailable("hibernate needs the cgroup freezer (cgroups are not available here)")
        self.ahead.forget(sid)
        images = self._checkpoint_dir(sid)
        with eng.store.using(), self._commit_lock(sid):
            self.live.freeze(h, True)
            try:
                busy = self.live.outsiders(h)
                if busy:
                    raise Conflict(f"a command is still running in sandbox {sid[:12]} (exec or shell); "
                                   "hibernate it once that has finished", sandbox=sid)
                image = self._snapshot(row, True, "hibernate")
                if os.path.isdir(images):
                    shutil.rmtree(images)         # a failed earlier try (files only, no mounts)
                # The images hold the sandbox's memory, secrets included. They stay readable
                # (0644, in a 0711 dir): CRIU's restore reads some from inside the sandbox's user
                # namespace, at moments before its uid map exists. $home/sandboxes is 0700.
                os.makedirs(images)
                os.chmod(images, 0o711)
                # If this process dies during the dump, whoever looks next finds the finished
                # checkpoint and this note (see _running), so the sandbox is hibernated, not lost.
                pending = {"base": image, "remaining": max(1.0, row["expires"] - time.time())}
                self._set_spec(sid, {**row["spec"], "hibernating": pending})
                self.live.dump(h, images, ghost_limit=row["spec"]["limits"]["disk"])
            except BaseException:
                if self.live.alive(h):
                    self.live.freeze(h, False)
                    self._set_spec(sid, row["spec"])
                raise
            self._hibernated(sid, {**row["spec"], **pending})
        return self.info(sid)

    def _set_spec(self, sid: str, spec: dict) -> None:
        with self.engine.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET spec=? WHERE id=?", (dumps(spec), sid))

    def _hibernated(self, sid: str, spec: dict) -> None:
        spec.pop("hibernating", None)
        with self.engine.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET state='hibernated', spec=? WHERE id=?", (dumps(spec), sid))

    def _dump_finished(self, sid: str) -> bool:
        return criu.dump_finished(self._checkpoint_dir(sid))

    def resume(self, sid: str) -> dict:
        """Bring a hibernated sandbox back: its processes continue where they were, on the image
        committed when it hibernated. Nothing is lost if this fails: it stays hibernated."""
        eng = self.engine
        row = self._row(sid)
        sid = row["id"]
        with self._commit_lock(sid):
            row = self._row(sid)
            if row["state"] == "running":
                return self._view(row)
            if row["state"] != "hibernated":
                raise Conflict(f"sandbox {sid} is {row['state']}", sandbox=sid, state=row["state"])
            base, spec0 = row["spec"]["base"], row["spec"]
            image = eng.store.image(base)
            root = eng.store.tree(base)["."]
            spec = RunSpec(argv=["sandtree-init"], layers=image.layers, root_meta=(root.mode, root.uid, root.gid),
                           env=spec0["env"], cwd=spec0["cwd"], hostname=spec0["hostname"],
                           limits=Limits(**spec0["limits"]))
            remaining = spec0.get("remaining", spec0["lifetime"])
            with eng.store.using():
                handle = self.live.start(spec, remaining, restore=self._checkpoint_dir(sid))
            now = time.time()
            try:
                with eng.store.db.tx() as con:
                    con.execute("UPDATE sandboxes SET state='running', handle=?, last_used=?, expires=? WHERE id=?",
                                (dumps(handle.to_dict()), now, now + remaining, sid))
            except BaseException:
                self.live.stop(handle)
                raise
            shutil.rmtree(self._checkpoint_dir(sid), ignore_errors=True)
        return self.info(sid)

    def _last_commit(self, row: dict) -> float:
        r = self.engine.store.db.one("SELECT MAX(started) FROM operations WHERE kind='commit' AND spec LIKE ?",
                                     (f'%"sandbox":"{row["id"]}"%',))
        return r[0] or 0.0


class _Ahead:
    """For each of the last KEEP live sandboxes this process exec'd in, one helper already inside it (cgroups joined,
    namespaces entered: the slow part of an exec), prepared after each exec by one long-lived
    thread (the helpers die with the thread that forked them)."""

    KEEP = 32

    def __init__(self, live: LiveRuntime):
        self.live = live
        self.ready: dict[str, tuple[LiveHandle, object]] = {}
        self.want: dict[str, LiveHandle] = {}
        self.cv = threading.Condition()
        self.closed = False
        self.thread: threading.Thread | None = None

    def take(self, sid: str, handle: LiveHandle):
        with self.cv:
            got = self.ready.pop(sid, None)
            self.want.pop(sid, None)
            self.want[sid] = handle                 # most recent last
            while len(self.want) > self.KEEP:       # a helper (and 5 fds) per sandbox: only the recent
                old = next(iter(self.want))
                self.want.pop(old)
                drop = self.ready.pop(old, None)
                if drop is not None:
                    threading.Thread(target=drop[1].discard, daemon=True).start()
            if self.thread is None and not self.closed:
                self.thread = threading.Thread(target=self._loop, name="sandtree-enter", daemon=True)
                self.thread.start()
            self.cv.notify_all()
        if got is None:
            return None
        if got[0] != handle or not self.live.alive(handle):
            got[1].discard()
            return None
        return got[1]

    def forget(self, sid: str) -> None:
        with self.cv:
            self.want.pop(sid, None)
            got = self.ready.pop(sid, None)
        if got is not None:
            got[1].discard()

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.closed and not (set(self.want) - set(self.ready)):
                    self.cv.wait()
                if self.closed:
                    return
                todo = {k: v for k, v in self.want.items() if k not in self.ready}
            for sid, h in todo.items():
                try:
                    e = self.live.enter_ahead(h) if self.live.alive(h) else None
                except Exception:                  # noqa: BLE001 - the exec enters by itself then
                    e = None
                with self.cv:
                    if e is not None and self.want.get(sid) == h and not self.closed:
                        self.ready[sid] = (h, e)
                        e = None
                    elif self.want.get(sid) == h and e is None:
                        self.want.pop(sid, None)    # gone: stop trying
                if e is not None:
                    e.discard()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            got, self.ready = list(self.ready.values()), {}
            self.cv.notify_all()
        for _, e in got:
            e.discard()
        if self.thread is not None:
            self.thread.join(timeout=10)


class LiveProcess:
    """A process inside a live sandbox: subprocess.Popen's shape (stdin, stdout, stderr, wait,
    communicate, send_signal, kill) with the exit status of the command itself."""

    def __init__(self, proc: subprocess.Popen, rep_r: int, live: LiveRuntime, raw: bytearray | None = None):
        self._proc, self._rep_r, self._live = proc, rep_r, live
        self.stdin, self.stdout, self.stderr = proc.stdin, proc.stdout, proc.stderr
        self.returncode: int | None = None
        self._raw = raw if raw is not None else bytearray()

    def _finish(self) -> None:
        from ..runtime.namespaces import _parse_report
        self._proc.wait()
        if self._rep_r is not None:
            while True:
                chunk = os.read(self._rep_r, 4096)
                if not chunk:
                    break
                self._raw += chunk
            os.close(self._rep_r)
            self._rep_r = None
        rep = _parse_report(self._raw)
        if "execfail" in rep:
            self.returncode = 127 if rep["execfail"][1] == "exec" else 126
        elif "signal" in rep:
            self.returncode = -rep["signal"]
        else:
            self.returncode = rep.get("exit", self._proc.returncode)

    def poll(self) -> int | None:
        if self.returncode is None and self._proc.poll() is not None:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._proc.wait(timeout)
            self._finish()
        return self.returncode

    def communicate(self, input: bytes | None = None, timeout: float | None = None):
        out, err = self._proc.communicate(input, timeout)
        self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        self._live.signal_command(self._proc, int(sig))

    def terminate(self) -> None:
        self.send_signal(15)

    def kill(self) -> None:
        self.send_signal(9)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for s in (self.stdin, self.stdout, self.stderr):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        if self.poll() is None:
            self.kill()
        self.wait()
