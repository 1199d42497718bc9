"""Hibernate and resume (a mixin of sandboxes.Sandboxes, which provides store, live, specs, ahead,
unlink, _running, _row, _view, _commit_lock, _snapshot, check_resolv_link, hold_link, resume_link
and info): a live sandbox saved whole (its filesystem an image, its processes a checkpoint) and
brought back where it was.

With S3 objects the checkpoint directory is also uploaded (store/checkpoints.py) before
the row says `hibernated`, its sha256 and size in the row's spec ("checkpoint"): any node of the
store resumes it, fetching and verifying the checkpoint when its home lacks it. A failed upload
leaves it hibernated on this node alone (nothing is lost; the row has no "checkpoint").

Once resumed, the checkpoint is kept with the hibernation's image as a live state (livestates.py):
fork_from(image) starts that moment again; gc removes it."""

from __future__ import annotations

import json
import logging
import os
import re
import time

from . import containers as engine_containers
from ...errors import Conflict, RuntimeUnavailable, SandtreeError
from ...runtime.base import Limits, RunSpec
from ...store import checkpoints, durable
from ...store.db import dumps
from .network import LATER, joined

log = logging.getLogger("sandtree.engine")


class SandboxHibernation:
    def _checkpoint_dir(self, sid: str) -> str:
        return os.path.join(self.store.home, "sandboxes", f"{sid}.ckpt")

    def hibernate(self, sid: str, *, idle: bool = True) -> dict:
        """Save the sandbox whole and free its CPU and memory: its filesystem becomes an image (a
        commit) and its processes a CRIU checkpoint (memory included). resume() brings them back
        where they were. Its lifetime does not run while it is hibernated. Processes spawned in
        it keep running inside (their holders: processes/held.py), their relays let go meanwhile."""
        row = self._running(sid, idle=idle)
        sid, h = row["id"], row["handle"]
        if row["spec"].get("volumes"):
            raise Conflict(f"sandbox {sid[:12]} mounts volumes, which a checkpoint cannot hold: stop it instead "
                           "(its volumes keep their files)", sandbox=sid)
        # its own tier's answer, not the default's; before anything is paused or committed
        ok, why = self.live.of(h).hibernate_available(link=joined(row["spec"]))
        if not ok:
            raise RuntimeUnavailable(why, tier=h.tier)
        if h.cgroup is None:
            raise RuntimeUnavailable("hibernate needs the cgroup freezer (cgroups are not available here)")
        self.check_resolv_link(row)
        self.ahead.forget(sid)
        self.spawners.forget(sid, wait=True)        # (a checkpoint cannot hold its socket)
        self.live.end_spawners(h)                    # (another engine process's too)
        images = self._checkpoint_dir(sid)
        # the relays of its held processes let go (their holders, inside, keep them going)
        self.release(sid)
        try:
            self._hibernate(row, images)
        except BaseException:
            self._reattach(sid)
            raise
        return self.info(sid)

    def _reattach(self, sid: str) -> None:
        try:
            self.reattach(sid)
        except Exception as exc:                   # noqa: BLE001 - each is attached again when next asked
            log.warning("sandbox %s: held processes not attached again (%s)", sid, exc)

    def _hibernate(self, row: dict, images: str) -> None:
        sid, h = row["id"], row["handle"]
        with self.store.using(), self._commit_lock(sid):
            self._still_running(row)
            self.live.freeze(h, True, checkpoint=True)
            try:
                busy = self.live.outsiders(h)
                if busy:
                    raise Conflict(f"a command is still running in sandbox {sid[:12]} (exec or shell); "
                                   "hibernate it once that has finished", sandbox=sid)
                image = self._snapshot(row, True, "hibernate")
                checkpoints.remove(images)        # a failed earlier try, or a stale copy (files only)
                # The images hold the sandbox's memory, secrets included. They stay readable
                # (0644, in a 0711 dir): CRIU's restore reads some from inside the sandbox's user
                # namespace, at moments before its uid map exists. $home/sandboxes is 0700.
                os.makedirs(images)
                os.chmod(images, 0o711)
                # If this process dies during the dump, whoever looks next finds the finished
                # checkpoint and this note (see _running), so the sandbox is hibernated, not lost.
                pending = {"base": image, "remaining": max(1.0, row["expires"] - time.time())}
                self._set_spec(sid, {**row["spec"], "hibernating": pending})
                self.unlink(sid)
                # (a policy given after the start: its link is a veth into the sandbox's own
                # namespace, released as an exposed port's is; the resume gives it again)
                self.unlink_later(row)
                # A networked sandbox's link stays the daemon's, held while nothing is in it; its
                # dump leaves it out and the resume is restored into it (sandboxes/network.py).
                self.hold_link(row, True)
                self.live.dump(h, images, ghost_limit=row["spec"]["limits"]["disk"],
                               link=joined(row["spec"]))
            except BaseException:
                if self.live.alive(h):
                    self.live.freeze(h, False)
                    self._set_spec(sid, row["spec"])
                    self.hold_link(row, False)
                    self.relink_later(row)
                raise
            # (its processes are gone now: the checkpoint is whole here; S3 before the row says so)
            old = self.live.alive(h)             # (gVisor's: paused; stopped below, off this path)
            self._hibernated(sid, {**row["spec"], **pending, **self._publish(sid),
                                   **({"retiring": h.to_dict()} if old else {})})
        if old:
            self.retiring.later(sid, h)

    def _publish(self, sid: str) -> dict:
        """With S3 objects: upload sandbox `sid`'s finished checkpoint; {"checkpoint": its sha256
        and size} for its row, or {} (no S3, or the upload failed: resumable on this node only)."""
        if self.store.objects is None:
            return {}
        try:
            return {"checkpoint": checkpoints.publish(self.store, sid, self._checkpoint_dir(sid))}
        except (SandtreeError, OSError) as exc:
            log.warning("sandbox %s: checkpoint not uploaded (%s); it resumes on this node only", sid, exc)
            return {}

    def sweep_checkpoints(self) -> list[str]:
        """With S3 objects: remove this home's checkpoint directories that are no hibernated
        sandbox's current checkpoint (it resumed, stopped or hibernated again on another node:
        they hold a sandbox's memory, and must not outlive it). Returns their sandboxes' IDs."""
        d = os.path.join(self.store.home, "sandboxes")
        gone = []
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            sid = name[:-5]
            if not name.endswith(".ckpt") or not re.fullmatch(r"[0-9a-f]{32}", sid):
                continue
            if self._current_checkpoint(sid, os.path.join(d, name)):
                continue                            # (the common case: no lock taken)
            with self._commit_lock(sid):            # a hibernation or resume in progress decides
                if not self._current_checkpoint(sid, os.path.join(d, name)):
                    checkpoints.remove(os.path.join(d, name))
                    gone.append(sid)
        return gone

    def _current_checkpoint(self, sid: str, directory: str) -> bool:
        row = self.store.db.one("SELECT state, spec FROM sandboxes WHERE id=?", (sid,))
        spec = json.loads(row[1]) if row is not None else {}
        if row is None:
            return False
        if row[0] == "hibernated":
            return not spec.get("checkpoint") or checkpoints.is_local(directory, spec["checkpoint"])
        return row[0] == "running" and bool(spec.get("hibernating"))     # (a dump: see _lost_locked)

    def _drop_checkpoint(self, sid: str, spec: dict) -> None:
        """The checkpoint of a sandbox that stopped or resumed: its directory here and its object
        (a failed delete is left to gc, which removes checkpoints of sandboxes not hibernated)."""
        checkpoints.remove(self._checkpoint_dir(sid))          # files only (remove_tree refuses mounts)
        if spec.get("checkpoint") and self.store.objects is not None:
            try:
                checkpoints.delete(self.store, sid)
            except SandtreeError as exc:
                log.warning("sandbox %s: checkpoint object not deleted (%s); gc will", sid, exc)

    def _keep_or_drop(self, sid: str, row: dict, base: str) -> None:
        """A resumed sandbox's checkpoint: kept as its image's live state (livestates.py: fork_from
        starts that moment again), unless the sandbox has a network policy or serves a live run
        (whose children could not be restored: forking.py); then dropped (its object too)."""
        spec0 = row["spec"]
        if not (joined(spec0) or spec0.get(LATER) or spec0.get("run") or spec0.get("volumes")):
            uploaded = spec0.get("checkpoint") if self.store.objects is not None else None
            self.keep_live_state(base, self._checkpoint_dir(sid), sid, spec0, row["idle_timeout"],
                                 row["handle"].tier, move=True, uploaded=uploaded)
        self._drop_checkpoint(sid, spec0)

    def _set_spec(self, sid: str, spec: dict) -> None:
        with self.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET spec=? WHERE id=?", (dumps(spec), sid))

    def _hibernated(self, sid: str, spec: dict) -> None:
        """The row says hibernated (the spec: what the resume needs; `retiring`: retiring.py)."""
        spec.pop("hibernating", None)
        ckpt = self._checkpoint_dir(sid)
        if os.path.isdir(ckpt):                  # on the disk before the row says it is resumable
            durable.sync_tree(ckpt)
            durable.sync_dir(os.path.dirname(ckpt))
        with self.store.db.tx() as con:
            con.execute("UPDATE sandboxes SET state='hibernated', spec=? WHERE id=?", (dumps(spec), sid))

    def resume(self, sid: str) -> dict:
        """Bring a hibernated sandbox back: its processes continue where they were, on the image
        committed when it hibernated. Nothing is lost if this fails: it stays hibernated."""
        row = self._row(sid)
        sid = row["id"]
        with self._commit_lock(sid):
            row = self._row(sid)
            if row["state"] == "running":
                return self._view(row)
            if row["state"] != "hibernated":
                raise Conflict(f"sandbox {sid} is {row['state']}", sandbox=sid, state=row["state"])
            base, spec0 = row["spec"]["base"], row["spec"]
            self.store.ensure_layers(self.store.image(base).layers)   # resumable on any node
            if spec0.get("checkpoint") and self.store.objects is not None:
                # fetched and verified (StoreCorrupt: nothing changes) unless this home has it
                checkpoints.fetch(self.store, sid, spec0["checkpoint"], self._checkpoint_dir(sid))
            elif not os.path.isdir(self._checkpoint_dir(sid)):
                raise Conflict(f"sandbox {sid}'s checkpoint is in the home of the machine that hibernated it "
                               "(its upload to object storage failed): resume it there", sandbox=sid,
                               state="hibernated")
            spec = RunSpec(argv=["sandtree-init"], layers=self.store.image(base).layers,
                           root_meta=self.specs.root_meta(base), env=spec0["env"], cwd=spec0["cwd"],
                           hostname=spec0["hostname"], limits=Limits(**spec0["limits"]),
                           containers=bool(spec0.get("containers")))     # restored with the flags it ran with
            remaining = spec0.get("remaining", spec0["lifetime"])
            self.retiring.finish(row)              # (an old one a killed engine left: stopped first)
            link = self.resume_link(row)
            spec.netns_fd = link.netns_fd if link is not None else None
            try:
                with self.store.using():
                    handle = self.live.start(spec, remaining, restore=self._checkpoint_dir(sid),
                                             tier=row["handle"].tier)
            finally:
                if link is not None:
                    link.close()                   # (the restored processes hold the namespace)
            now = time.time()
            try:
                with self.store.db.tx() as con:
                    # the row's spec now (a retiring stop may have changed it since), less the checkpoint
                    current = json.loads(con.execute("SELECT spec FROM sandboxes WHERE id=?", (sid,)).fetchone()[0])
                    current.pop("checkpoint", None)
                    con.execute("UPDATE sandboxes SET state='running', handle=?, spec=?, last_used=?, expires=? "
                                "WHERE id=?", (dumps(handle.to_dict()), dumps(current), now, now + remaining, sid))
            except BaseException:
                self.live.stop(handle)
                raise
            self._keep_or_drop(sid, row, base)
            self.hold_link(row, False)             # (its processes are in it again: GC may judge it)
            self.relink_later(self._row(sid))      # (a policy given after the start: a new link)
        self._reattach(sid)
        if spec0.get("containers"):              # its engine's network devices are not restored (containers.py)
            engine_containers.restart(self, sid, spec0["limits"]["disk"], linked=joined(spec0))
        return self.info(sid)
