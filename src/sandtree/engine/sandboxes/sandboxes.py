"""Live sandboxes: started from an image, entered by many commands, committed while running.

The engine's half of live sandboxes (the runtime's half is runtime/live.py). A live sandbox is a row in the
`sandboxes` table (its image, its LiveHandle, its limits, its last commit) and a set of processes that
outlive whoever started them; any engine process finds them by id, so the CLI's `sandtree start` and
`sandtree exec` work across invocations and a restarted server re-attaches to what is still running.
Stopped, expired or vanished sandboxes are marked so, never left "running". Every command is an `exec`
operation (the audit trail); a commit is a `commit` operation whose lineage edge goes from the
sandbox's last commit (or its image) to the new image.

Beside it: the shell session a string command runs in and the spec of one command (session.py),
helpers entered ahead of an exec (warm/helpers.py), sandboxes started ahead of a start (warm/sandboxes.py),
popen's process (processes/popen.py), file access from the host (sandboxes/files.py), metrics
(sandboxes/metrics.py). The parts it is given at
construction (store, run-spec builder, records, committer, live runtime) are the engine's; it never
imports the engine. Hibernate and resume: sandboxes/hibernation.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import threading
import time
import uuid

from ... import defaults as D
from ...errors import Conflict, InvalidInput, NotFound, RuntimeUnavailable, SandtreeError
from ...runtime.base import LiveTier, RunSpec
from ...runtime.liveproc import LiveHandle, open_of
from ...runtime.openat2 import create_as
from ...runtime.validate import check_env, validate_spec
from ...store.db import dumps
from ...store.ephemeral import mark_writer       # commit(ephemeral=True): a live run's (processes/instances.py)
from ...store.store import Store
from . import locks as sandbox_locks
from . import containers as engine_containers
from ..warm.helpers import Ahead
from ..warm.sandboxes import AHEAD_TIER, StartsAhead
from ..runs.commit import Committer
from ..processes.popen import LiveProcess
from ..processes.spawner import Spawners
from ..runs.records import Records
from .retiring import Retiring
from .files import SandboxFiles
from .watches import SandboxWatches
from .hibernation import SandboxHibernation
from .forking import SandboxForking
from .livestates import SandboxLiveStates
from .lifetime import SandboxLifetime
from .metrics import SandboxMetrics
from .network import SandboxNetwork
from ...secrets_mask import mask_env
from .session import command_spec
from ..runs.spec import RunSpecs
from ...defaults import RunRecord
from ...values import check_labels, labels_match
from ..images.rundefaults import run_defaults, user_names
from ..runs.network import attach_link, network_option, require_egress
from ..tapes import tape_option
from ..volumes import check_mounts, volume_view

STATES = ("running", "hibernated", "stopped", "expired", "gone", "ahead")   # ahead: warm/sandboxes.py, unclaimed
ENDED = ("stopped", "expired", "gone")      # states a sandbox never leaves


class Sandboxes(SandboxFiles, SandboxWatches, SandboxHibernation, SandboxForking, SandboxLiveStates, SandboxLifetime,
                SandboxMetrics, SandboxNetwork):
    def __init__(self, store: Store, specs: RunSpecs, records: Records, committer: Committer,
                 live: LiveTier, resolve, default_tier, ahead_starts: bool = False):
        self.store, self.specs, self.records, self.committer, self.live = store, specs, records, committer, live
        self.resolve = resolve                     # the engine's: a ref may name a branch
        self.default_tier = default_tier            # () -> the engine's tier now (it can be set)
        self.ahead = Ahead(self.live)
        self.retiring = Retiring(store, live)        # old sandboxes a hibernation stops off its path
        self.starts = StartsAhead(store, live) if ahead_starts else None    # the engine's warm > 0
        # called with a sandbox's id before its processes are checkpointed: a veth in its namespace
        # (exposed ports' link) cannot be restored by CRIU, so it is removed (the engine's ports)
        self.unlink = lambda sid: None
        self.egress = lambda: None                  # () -> the engine's Egress (network= sandboxes)
        self.read_image = lambda image, path: b""   # the engine's read (an image's CA bundle)
        self.stored_secret = None                   # ref -> a stored secret (the tenancy's lookup)
        self.volumes = None                         # the engine's Volumes (engine/volumes.py)
        self._stop_reaping = threading.Event()
        self._reaped = 0.0
        self._touched: dict[str, float] = {}         # sid -> when this engine last wrote its last_used
        self._holders: dict[str, tuple] = {}         # sid -> its holder's program, how started (holder())
        self._holders_lock = threading.Lock()
        self._keeping: dict[str, threading.Event] = {}     # image -> its live state being kept (livestates.py)
        self._keeping_lock = threading.Lock()
        self.spawners = Spawners(self)               # each sandbox's spawner of held commands (spawn_spec)
        if self.starts is not None:                  # (one started ahead has its spawner ready too)
            self.starts.prepare, self.starts.forget = self.spawners.prepare, self.spawners.forget
        # called with a sandbox's id before its processes are checkpointed (release) and once they
        # run again, or did not stop (reattach): the engine's held processes' relays (processes/held.py)
        self.release = lambda sid: None
        self.reattach = lambda sid: None

    def close(self) -> None:
        self._stop_reaping.set()
        self._close_watches()
        if self.starts is not None:
            self.starts.close()
        self.ahead.close()
        self.spawners.close()
        self.retiring.close()
        self.wait_live_states()

    # ---- registry ------------------------------------------------------------------------------
    def _row(self, sid: str) -> dict:
        if not isinstance(sid, str) or not sid:
            raise InvalidInput("a sandbox id must be a non-empty string")
        # an "ahead" row (warm/sandboxes.py) is nobody's sandbox until a start claims it: it has no
        # caller's record to show (info's KeyError 'limits') and a stop would end what the next start takes
        rows = self.store.db.query("SELECT * FROM sandboxes WHERE id LIKE ? AND state != 'ahead'",
                                   (sid.replace("%", "") + "%",)) if re.fullmatch(r"[0-9a-f]{4,32}", sid) else []
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
        with self.store.db.tx() as con:
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

    def _still_running(self, row: dict) -> None:
        """Under the commit lock: the sandbox `_running` found is running still (a stop may have
        ended it in between: its cgroup is gone, and freezing it was ENOENT, an internal error)."""
        now = self._row(row["id"])
        if now["state"] != "running" or not self.live.alive(now["handle"]):
            state = now["state"] if now["state"] != "running" else "gone"
            raise Conflict(f"sandbox {row['id']} is {state}", sandbox=row["id"], state=state)

    def _commit_lock(self, sid: str):
        """Held while a sandbox is frozen for a commit (any process); released by the kernel if
        the committer dies, so the next user can tell a commit in progress from a stale freeze.
        Its file goes once the sandbox has ended (sandboxes/locks.py)."""
        return sandbox_locks.held(self.store.home, sid, lambda: self._ended(sid))

    def _ended(self, sid: str) -> bool:
        """No row, or one in a state nothing leaves (its lock file is no longer needed)."""
        row = self.store.db.one("SELECT state FROM sandboxes WHERE id=?", (sid,))
        return row is None or row[0] in ENDED

    def sweep_locks(self) -> int:
        """gc: the lock files of ended sandboxes (an expiry takes no lock; a killed engine)."""
        return sandbox_locks.sweep(self.store.home, self._ended)

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
        if row["spec"].get("hibernating") and self.live.dump_finished(row["handle"], self._checkpoint_dir(row["id"])):
            self._retire(row, "running", release=False)      # (the link is kept for the resume)
            self._hibernated(row["id"], {**row["spec"], **row["spec"]["hibernating"],
                                         **self._publish(row["id"])})
            return "hibernated"
        self._retire(row, "gone")
        return "gone"

    def _retire(self, row: dict, state: str, release: bool = True) -> None:
        self.ahead.forget(row["id"])
        self.spawners.forget(row["id"])
        self.live.stop(row["handle"])
        if release:
            self.release_link(row)
        self._set_state(row["id"], state)

    def info(self, sid: str) -> dict:
        return self._view(self._settled(self._row(sid)))

    def _settled(self, row: dict) -> dict:
        """The row with its state decided as exec and list decide it (one view of state): a
        "running" row whose processes are gone is resolved by _lost (hibernated, when a hibernator
        died after its checkpoint was written; else gone). Not under the commit lock (_lost takes it)."""
        h = row["handle"]
        if row["state"] == "running" and not self.live.foreign(h) and not self.live.alive(h):
            self._lost(row)
            row = self._row(row["id"])
        return row

    def _view(self, row: dict) -> dict:
        h = row["handle"]
        alive = row["state"] == "running" and (self.live.foreign(h) or self.live.alive(h))
        return {"id": row["id"], "image": row["image"], "head": row["head"],
                "state": row["state"] if row["state"] != "running" or alive else "gone",
                "created": row["created"], "last_used": row["last_used"], "idle_timeout": row["idle_timeout"],
                "expires": row["expires"], "memory_bytes": self.live.memory(h) if alive else None,
                "limits": row["spec"]["limits"], "cwd": row["spec"]["cwd"],
                "idle_action": row["spec"].get("idle_action", "stop"), "labels": row["spec"].get("labels", {}),
                "network": row["spec"].get("network"), "tier": row["handle"].tier,
                **({"tape": row["spec"]["recorded_tape"]} if row["spec"].get("recorded_tape") else {}),
                **({"volumes": volume_view(row["spec"]["volumes"])} if row["spec"].get("volumes") else {}),
                **{k: row["spec"][k] for k in ("secrets", "run", "lost", "forked_from") if row["spec"].get(k)}}

    def list(self, *, all: bool = False, labels: dict | None = None) -> list[dict]:
        """Live sandboxes (all: also stopped ones; labels: those with all of these), expired first."""
        want = check_labels(labels)
        self.reap()
        states = "state != 'ahead'" if all else "state IN ('running', 'hibernated', 'lost')"   # lost: its node was
        sql = f"SELECT * FROM sandboxes WHERE {states} ORDER BY created"
        rows = (self._decode(r) for r in self.store.db.query(sql))
        return [self._view(r) for r in rows if r["spec"] and labels_match(r["spec"].get("labels", {}), want)
                and not r["spec"].get("run")]          # a live run's sandbox is its run's (processes/instances.py)

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, ref: str, *, env: dict | None = None, cwd: str | None = None, hostname: str = D.HOSTNAME,
              files=None, file_set: str | None = None, idle_timeout: float = D.SANDBOX_IDLE_TIMEOUT,
              lifetime: float = D.SANDBOX_LIFETIME, idle_action: str = D.SANDBOX_IDLE_ACTION, tier: str | None = None,
              labels: dict | None = None, network=None, secrets: dict | None = None, volumes=None,
              run_of: str | None = None, starter=None, containers: bool = False, record: bool = False, replay=None,
              **limits) -> dict:
        """Start a live sandbox on image `ref`. limits as for a run (timeout = per command).
        idle_action: what idle_timeout does: "stop" or "hibernate" it (nothing is lost).
        network/secrets: as for a run; the link (key: the sandbox's id) lives until it stops. run_of:
        the live run it serves (processes/instances.py): a run slot, not a sandbox `list` shows; starter:
        (spec, lifetime) -> its LiveHandle instead of live.start (a warm pool's: processes/instances.py).
        volumes: {name: path} or [{name, path, readonly}] (engine/volumes.py), bound in before it returns.
        containers: Docker's engine from the image runs inside, started before this returns (gvisor tier
        only: containers.py)."""
        if containers not in (True, False):
            raise InvalidInput(f"containers must be true or false, not {containers!r}")
        if containers:
            tier = engine_containers.check_tier(tier)
        self._check_start(tier, idle_action, idle_timeout, lifetime)
        tier = tier or self.default_tier()
        mounts = self._check_volumes(volumes, tier, idle_action)
        with self._volumes_starting(mounts):     # a delete waits for (and then sees) this start
            labels = check_labels(labels)
            source = self.resolve(ref)
            row = self.store.image(source)
            net = network_option(self.store.db, source, network, secrets, stored=self.stored_secret)
            if net.policy is not None:
                self._check_idle_hibernate(tier, idle_action, link=True)
            if net.policy is not None:
                require_egress(self.egress())
            self.specs.limits(limits)                     # (bad limits refused before a replay file is written)
            net.tape = tape_option(self.store, record, replay)
            if net.tape is not None and net.policy is None:
                net.tape.discard()
                raise InvalidInput("record and replay need a network policy (network=...): a tape is what "
                                   "went through it")
            lim = self.specs.limits(limits)
            user_env = {str(k): str(v) for k, v in (env or {}).items()}
            dflt = run_defaults(self.store, source, env=user_env, cwd=cwd, uid=None, gid=None)
            check_env(dflt.env)                           # the documented limits, before anything is added
            cwd = dflt.cwd
            injected = self.specs.files(files, file_set)
            self.specs.check_cwd(source, cwd, injected)
            self.store.ensure_layers(row.layers)          # S3 objects: fetched into this node's cache
            spec = RunSpec(argv=["sandtree-init"], layers=row.layers, root_meta=self.specs.root_meta(source),
                           env=dflt.env, cwd=cwd, hostname=hostname, files=injected, limits=lim,
                           prepare_changes=self.specs.injector(source, injected),
                           volumes=[(self.volumes.directory(m["volume"]), m["path"], m["readonly"]) for m in mounts]
                           if tier == "gvisor" else [], containers=containers)
            if time.monotonic() - self._reaped > 1.0:     # (each reap looks at every sandbox)
                self.reap()
            # started ahead: only for a plain start (a warm pool's starter has its own ready sandboxes)
            # on the tier they are started on
            ahead = self.starts and starter is None and net.policy is None and not injected and tier == AHEAD_TIER \
                and not mounts and not containers
            key = self.starts.key(source, spec) if ahead else None
            got = self.starts.take(key, lifetime) if key else None     # the same spec, started ahead
            sid = got[0] if got else uuid.uuid4().hex
            link = None
            if net.policy is not None:
                link, spec.runtime_files, extra = attach_link(self.egress(), sid, net,
                                                              lambda p: self.read_image(source, p))
                spec.netns_fd, spec.env = link.netns_fd, {**spec.env, **extra}
            try:
                with self.store.using():               # gc keeps the layers of running sandboxes (below)
                    handle = got[1] if got else starter(spec, lifetime) if starter else \
                        self.live.start(spec, lifetime, tier=tier)
            except BaseException:
                self._unlink_net(sid, link)
                if net.tape is not None:
                    net.tape.discard()
                raise
            finally:
                if link is not None:
                    link.close()                       # (the sandbox's processes hold the namespace)
            made = []
            if mounts and tier == "gvisor":           # bound by runsc as it started (spec.volumes); it makes
                made = sorted({p[:i] for m in mounts for p in [m["path"]]       # the mount points it needs
                               for i in range(len(p) + 1) if i == len(p) or p[i] == "/"} - {""})
            elif mounts:
                try:
                    made = self._mount_volumes(handle, mounts)
                except BaseException:
                    self.live.stop(handle)
                    self._unlink_net(sid, link)
                    raise
            record = {"env": {**dflt.env, **{k: v for k, v in spec.env.items() if k not in dflt.env}},
                      "masked_env": mask_env(user_env), "cwd": cwd, "uid": dflt.uid, "gid": dflt.gid,
                      "hostname": hostname, "limits": lim.__dict__, "files": [f.path for f in injected],
                      "lifetime": lifetime, "idle_action": idle_action, "tier": handle.tier,
                      **({"labels": labels} if labels else {}),
                      **({"volumes": mounts, "volume_dirs": made} if mounts else {}),
                      **({"run": run_of} if run_of else {}), **({"containers": True} if containers else {}),
                      **net.record(),
                      **({**net.tape.spec(), "tape_file": net.tape.replay_file} if net.tape is not None else {})}
            try:
                self._record_running(sid, source, handle, record, idle_timeout, lifetime)
            except BaseException:
                self.live.stop(handle)
                self._unlink_net(sid, link)
                raise
            if key:
                self.starts.after(key, source, spec)
        if containers:
            try:
                engine_containers.start(self, sid, lim.disk, linked=net.policy is not None)
            except BaseException:
                self.stop(sid)
                raise
        return self.info(sid)

    def _record_running(self, sid: str, image: str, handle, record: dict, idle_timeout, lifetime: float) -> None:
        """The row of a sandbox now running on `image` (its head too); replaces a row started ahead."""
        now = time.time()
        with self.store.db.tx() as con:
            con.execute("INSERT OR REPLACE INTO sandboxes(id, image, state, handle, spec, created, last_used, "
                        "idle_timeout, expires, head) VALUES(?,?,?,?,?,?,?,?,?,?)",
                        (sid, image, "running", dumps(handle.to_dict()), dumps(record), now, now,
                         idle_timeout, now + lifetime, image))
        self._touched[sid] = now                    # (its last_used is now: a first command writes none)

    # ---- volumes (engine/volumes.py) ----------------------------------------------------------------
    def _check_volumes(self, volumes, tier: str, idle_action: str) -> list[dict]:
        mounts = check_mounts(volumes)
        if not mounts:
            return []
        if self.volumes is None:
            raise RuntimeUnavailable("volumes are not available to this engine")
        if idle_action == "hibernate":
            raise InvalidInput("a sandbox with volumes cannot hibernate (its volumes are not part of a checkpoint): "
                               "idle_action stop")
        for m in mounts:
            self.volumes.directory(m["volume"])         # NotFound before anything starts
        return mounts

    def _volumes_starting(self, mounts: list[dict]):
        """Held from a start's check of its volumes to its row (what volume_users reads): a delete of one of
        them in this engine waits, then refuses; none: nothing held."""
        return self.volumes.lock if mounts else contextlib.nullcontext()

    def _mount_volumes(self, handle, mounts: list[dict]) -> list[str]:
        ns = open_of(handle.init_pid, handle.init_start, "ns/mnt", os.O_RDONLY)
        try:
            return self.volumes.mount(mounts, ns)
        finally:
            os.close(ns)

    def volume_users(self, qualified: str) -> list[str]:
        """The live sandboxes (running, or not yet judged gone) that mount a volume."""
        self.reap()
        out = []
        for r in self.store.db.query("SELECT * FROM sandboxes WHERE state IN ('running', 'hibernated', 'lost')"):
            row = self._decode(r)
            if any(m["volume"] == qualified for m in row["spec"].get("volumes", ())) and \
                    self._settled(row)["state"] in ("running", "hibernated", "lost"):
                out.append(row["id"])
        return out

    def stop(self, sid: str) -> dict:
        row = self._row(sid)
        self._ours(row)
        self.ahead.forget(row["id"])
        self.spawners.forget(row["id"])
        with self._commit_lock(row["id"]):              # not while it hibernates or resumes
            row = self._row(row["id"])
            self._ours(row)
            self._end_watches(row["id"])
            self.live.stop(row["handle"])
            self.retiring.finish(row)
            self.release_link(row)
            if row["state"] in ("running", "hibernated", "lost"):
                self._set_state(row["id"], "stopped")
            self._drop_checkpoint(row["id"], row["spec"])
        return self.info(row["id"])

    # ---- commands ----------------------------------------------------------------------------
    def _command_spec(self, row: dict, command, *, env, cwd, stdin, uid, gid, limits) -> tuple[RunSpec, str]:
        if uid is None:          # the image's user (its config's USER), resolved at start
            uid = row["spec"].get("uid", 0)
            gid = row["spec"].get("gid", 0) if gid is None else gid
        elif gid is None:
            gid = 0
        return command_spec(row["spec"], command, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                            limits=limits, given=self.specs.limits(limits))

    def exec(self, sid: str, command, *, env: dict | None = None, cwd: str | None = None, stdin=None,
             uid: int | None = None, gid: int | None = None, on_output=None, cancel=None, **limits):
        """Run `command` inside the sandbox to its exit. A string runs in the shell session (cwd and
        exported env carry over); a list is a fresh process. Returns a RunRecord (image None)."""
        row = self._running(sid)
        spec, shown = self._command_spec(row, command, env=env, cwd=cwd, stdin=stdin, uid=uid, gid=gid,
                                         limits=limits)
        spec.on_output, spec.cancel = on_output, cancel
        op = uuid.uuid4().hex
        started = time.time()
        self._touch(row)
        try:
            out = self.live.exec(row["handle"], spec, ahead=self.ahead.take(row["id"], row["handle"]))
        except Exception as exc:
            self.records.record(op, row["image"], {"command": shown, "sandbox": row["id"]}, started, None,
                                {"error": getattr(exc, "code", "error"), "message": str(exc)}, kind="exec")
            if isinstance(exc, NotFound):
                self._running(row["id"])        # raises Conflict(gone) if it died under us
            raise
        rec = RunRecord(op, row["image"], None, out.exit_code, out.signal, out.stdout, out.stderr,
                        out.stdout_truncated, out.stderr_truncated, out.timed_out, False, out.usage, out.cancelled)
        self.records.record(op, row["image"], {"command": shown, "sandbox": row["id"], "uid": spec.uid,
                                               "gid": spec.gid},
                            started, None, {"exit_code": rec.exit_code, "signal": rec.signal,
                                            "timed_out": rec.timed_out, "cancelled": rec.cancelled,
                                            "usage": rec.usage}, kind="exec",
                            also=lambda con: self._touch(row, con), serial=False)
        return rec

    def popen(self, sid: str, argv, *, env: dict | None = None, cwd: str | None = None, uid: int | None = None,
              gid: int | None = None, pty: bool = False, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
              stderr=subprocess.PIPE, ahead=None) -> "LiveProcess":
        """A process inside with pipes (or a terminal), like subprocess.Popen; ahead: an entered helper."""
        row = self._running(sid)
        spec, shown = self._command_spec(row, list(argv) if not isinstance(argv, str) else argv, env=env,
                                         cwd=cwd, stdin=None, uid=uid, gid=gid, limits={})
        self._touch(row)
        if ahead is None and not pty and stdin == stdout == stderr == subprocess.PIPE:
            # pipes, as a helper entered ahead has them: the slow part of entering is done (as exec's)
            ahead = self.ahead.take(row["id"], row["handle"])
        proc, rep_r, raw = self.live.popen(row["handle"], spec, stdin=stdin, stdout=stdout, stderr=stderr, pty=pty, ahead=ahead)
        # Like subprocess.Popen, return once the process exists (a commit or hibernate that
        # follows must see it): the helper reports its pid right after the fork.
        while b"pid " not in raw:
            chunk = os.read(rep_r, 4096)
            if not chunk:
                break
            raw += chunk
        op = uuid.uuid4().hex
        self.records.record(op, row["image"], {"command": shown, "sandbox": row["id"], "interactive": True},
                            time.time(), None, {"started": True}, kind="exec")
        return LiveProcess(proc, rep_r, self.live.of(row["handle"]), raw)

    def spawn_spec(self, sid: str, argv: list[str], *, env: dict | None, cwd: str | None, uid: int | None,
                   gid: int | None) -> tuple[RunSpec, bool]:
        """A command's spec for the sandbox's spawner (processes/spawner.py), as popen makes it for
        an enter (its env, cwd and ids; checked, recorded), and whether its holder sets its groups
        (as an enter's command does where the user namespace has a gid map)."""
        row = self._running(sid)
        spec, shown = self._command_spec(row, list(argv), env=env, cwd=cwd, stdin=None, uid=uid, gid=gid, limits={})
        validate_spec(spec)
        self.records.record(uuid.uuid4().hex, row["image"], {"command": shown, "sandbox": row["id"], "interactive": True},
                            time.time(), None, {"started": True}, kind="exec", serial=False,
                            also=lambda con: self._touch(row, con))      # (one transaction)
        return spec, not self.store.idmap.rootless

    def holder(self, sid: str, *, again: bool = False) -> tuple[str, bool]:
        """The path inside sandbox `sid` of the program that holds a spawned command's stdio
        (runtime/hold.c): the tier's, or a copy the engine writes into the sandbox's /dev/shm
        (its own tmpfs: never committed, kept by a checkpoint) once per sandbox, under a name no
        one in it can guess before it is there (again: a new copy, the old one was removed).
        With it: whether the holder is started by exec (the tier's hold_program). RuntimeUnavailable
        on a tier without one."""
        known = self._holders.get(sid)
        if known is not None and not again:
            return known                          # (the start of every spawned process: no lookup)
        row = self._running(sid)
        return self._holder_of(row["id"], row["handle"], again)

    def _holder_of(self, sid: str, h: LiveHandle, again: bool = False) -> tuple[str, bool]:
        inside, program, by_exec = self.live.hold_program(h)
        if inside is not None:
            self._holders[sid] = (inside, by_exec)
            return inside, by_exec
        if program is None:
            raise RuntimeUnavailable("this sandbox's tier has no holder for spawned processes")
        with self._holders_lock:
            path = (self._holders.get(sid) or (None,))[0]
            if path is None or again:
                with open(program, "rb") as f:
                    data = f.read()
                name = f".sandtree-hold-{os.urandom(8).hex()}"
                idmap = self.store.idmap
                root = self.live.root(h)
                try:                              # (as its root: /dev/shm is mounted in its user namespace)
                    create_as(root, "/dev/shm", name, data, 0o555, idmap.host_uid(0), idmap.host_gid(0),
                              self.live.own_mounts(h))
                except (OSError, SandtreeError) as exc:     # (an image whose /dev/shm is not the sandbox's own)
                    raise RuntimeUnavailable(f"no holder for spawned processes in sandbox {sid}: {exc}") from None
                finally:
                    os.close(root)
                path = f"/dev/shm/{name}"
                if len(self._holders) > 4096:      # (the sandboxes of long ago: written anew if asked)
                    self._holders.clear()
                self._holders[sid] = (path, by_exec)
        return path, by_exec

    def spawner_process(self, sid: str, stdin: int, handle: LiveHandle | None = None) -> LiveProcess:
        """Sandbox `sid`'s spawner (processes/spawner.py) started by an enter, with `stdin` as its
        stdin: as the sandbox's root, in /, with no env (it passes none on). handle: a sandbox
        started ahead (warm/sandboxes.py), which has no running row yet."""
        h = handle if handle is not None else self._running(sid)["handle"]
        path, by_exec = self._holders.get(sid) or self._holder_of(sid, h)
        if by_exec:
            raise RuntimeUnavailable("this sandbox's tier starts its holders by exec: it has no spawner")
        spec = RunSpec(argv=[path, "--spawn"], layers=[], root_meta=(0o755, 0, 0), env={}, cwd="/", uid=0, gid=0)
        proc, rep_r, raw = self.live.popen(h, spec, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return LiveProcess(proc, rep_r, self.live.of(h), raw)

    def ps(self, sid: str) -> list[dict]:
        """Every process of a running sandbox as its kernel tells it (runtime pstable), each with
        its user's name from the image's /etc/passwd (None: not there)."""
        row = self._running(sid, idle=False)
        names = user_names(self.store, row["image"])
        return [{**p, "user": names.get(p["uid"])} for p in self.live.processes(row["handle"])]

    # ---- commit ----------------------------------------------------------------------------------
    def commit(self, sid: str, *, tag: str | None = None, ephemeral: bool = False) -> str:
        """An image of the sandbox's filesystem now. Its processes are frozen for the instant of
        the snapshot (the cgroup freezer), then thawed; the sandbox keeps running."""
        row = self._running(sid)
        h = row["handle"]
        if row["spec"].get("containers"):
            engine_containers.save(self, row["id"])     # the engine's data root is memory (containers.py)
        with self.store.using(), self._commit_lock(row["id"]):
            self._still_running(row)
            # Unfrozen, the sandbox's processes would rename and swap files under the walk (a
            # directory for a symlink to a host path between the walk's lstat and its open):
            # the freezer is what makes the snapshot one instant, so no freezer, no commit.
            if not self.live.freeze(h, True):
                raise RuntimeUnavailable("committing a live sandbox needs the cgroup freezer "
                                         "(cgroups are not available here); nothing was committed")
            try:
                image = self._snapshot(row, True, ephemeral=ephemeral)
            finally:
                self.live.freeze(h, False)
        if tag:
            self.store.tag(image, tag)
        return image

    def _snapshot(self, row: dict, frozen: bool, how: str = "commit", ephemeral: bool = False) -> str:
        """Commit the upper (the caller holds the commit lock and froze the processes); record a
        `commit` operation and its lineage edge from the sandbox's head; move the head."""
        h = row["handle"]
        op = uuid.uuid4().hex
        started = time.time()
        fd = self.live.scratch(h)
        try:
            # after a resume the upper holds the changes since the hibernation's commit
            cr = self.committer.commit(self.store.image(row["spec"].get("base") or row["image"]),
                                      f"/proc/self/fd/{fd}/u", max_file_size=row["spec"]["limits"]["disk"],
                                      mount_points=row["spec"].get("volume_dirs", ()))
        finally:
            os.close(fd)
        write = mark_writer(self.committer.image_writer(cr), cr.image) if ephemeral else self.committer.image_writer(cr)
        parent = row["head"] or row["image"]
        execs = self.records.sandbox_execs(row["image"], row["id"], self.records.last_commit(row["id"]))
        # The commit that ends a live run (a Contree instance, a run with live=True) is a step of
        # that run: the run's own record draws the image's edge, labelled by its command and exit
        # code. An edge here too listed the image twice, as "commit of live sandbox ...".
        run = row["spec"].get("run")
        left_out = volume_view(row["spec"].get("volumes", ()))      # a volume is never part of an image
        self.records.record(op, row["image"], {"sandbox": row["id"], "frozen": frozen, "execs": execs,
                                               "command": f"{how} of live sandbox {row['id'][:12]}"
                                               + (f" (volumes left out: {', '.join(v['path'] for v in left_out)})"
                                                  if left_out else ""),
                                               **({"volumes_left_out": left_out} if left_out else {}),
                                               **({"run": run} if run else {})},
                            started, cr.image, {"exit_code": 0}, write, kind="commit", parent=parent,
                            edge=not run)
        with self.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET head=? WHERE id=?", (cr.image, row["id"]))
        row["head"] = cr.image
        return cr.image
