"""Live states in the lineage (a mixin of sandboxes.Sandboxes, which provides store, live, specs and
forking.py's _child_options and _restore_children): the checkpoint a live fork or a hibernation
took is kept with its image (the commit taken at the same instant), so fork_from(image) starts
live sandboxes that go on from that state later, any number of times: the tree of live states is
explored as the tree of images is.

What is kept: a live fork's checkpoint (forking.py), once its children run; a hibernation's, once
the sandbox is resumed from it (hibernation.py: until then it is the sandbox's own, and its image
is started live by resuming it). Not those of a sandbox with a network policy (a child needs a link
of its own: forking.py says why) or serving a live run.

Where: `<home>/sandboxes/<image>.live` (0711 in the 0700 sandboxes dir, as a hibernation's: it
holds the sandbox's memory, secrets included), and with S3 objects `live/<image>.tar` too
(store/checkpoints.py), so any node of a cluster starts it. The live_states row (the children's
spec: the source's env, cwd, limits, tier; the object's sha256 and size) is written last: a state
is startable only once whole. gc drops the row when its image is removed or after
LIVE_STATE_RETENTION (store/maintenance.py), then its object (remote_gc) and its directory here
(sweep_live_states). Restores read the directory under a lock of its own, which the sweep takes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid

from ... import defaults as D
from ...errors import Conflict, InvalidInput, RuntimeUnavailable, SandtreeError
from ...runtime import criu
from ...store import checkpoints, durable
from ...store.db import dumps
from . import locks as sandbox_locks

log = logging.getLogger("sandtree.engine")

# the spec keys of a sandbox's row that are its own moment's, not its children's
TRANSIENT = ("hibernating", "retiring", "checkpoint", "remaining", "link_key", "forked_from", "lost", "base")


class SandboxLiveStates:
    def _live_dir(self, image: str) -> str:
        return os.path.join(self.store.home, "sandboxes", f"{image}.live")

    def _live_lock(self, image: str):
        # (its file goes at each release: the lock protocol of locks.py allows the holder to unlink)
        return sandbox_locks.held(self.store.home, f"{image}.live", lambda: True)

    # ---- keeping --------------------------------------------------------------------------------
    def keep_live_state_later(self, image: str, directory: str, *args, then, **kwargs) -> None:
        """keep_live_state(image, directory, *args, **kwargs) on a thread of its own, then `then()`
        (a live fork's: its checkpoint dir removed). A live fork returns once its children run,
        not once its checkpoint is copied from memory, synced and uploaded (0.15-0.8 s for 100
        MB). Until it is done, fork_from(image) and close() wait for it (wait_live_state); gc's
        sweep waits for its lock. Not a daemon thread: a process that ends meanwhile finishes it."""
        done = threading.Event()
        with self._keeping_lock:
            self._keeping[image] = done

        def keep() -> None:
            try:
                self.keep_live_state(image, directory, *args, **kwargs)
            except Exception:                   # (it logs its own failures; this is the unexpected)
                log.exception("image %s: keeping its live state failed", image)
            finally:
                try:
                    then()
                finally:
                    with self._keeping_lock:
                        if self._keeping.get(image) is done:
                            del self._keeping[image]
                    done.set()

        threading.Thread(target=keep, name=f"sandtree-keep-{image[:12]}").start()

    def wait_live_state(self, image: str, timeout: float = D.LIVE_STATE_KEEP_WAIT) -> None:
        """Until the live state of `image` being kept (keep_live_state_later), if any, is kept."""
        with self._keeping_lock:
            done = self._keeping.get(image)
        if done is not None:
            done.wait(timeout)

    def wait_live_states(self) -> None:
        """Until every live state being kept is (close)."""
        with self._keeping_lock:
            pending = list(self._keeping.values())
        for done in pending:
            done.wait(D.LIVE_STATE_KEEP_WAIT)

    def keep_live_state(self, image: str, directory: str, source: str, spec: dict, idle_timeout,
                        tier: str, *, move: bool, uploaded: dict | None = None) -> bool:
        """Keep checkpoint `directory` (of sandbox `source`, whose row spec and idle timeout
        were `spec` and `idle_timeout`) as image `image`'s live state. move: rename it (same
        filesystem), else copy it. uploaded: sandbox `source`'s checkpoint record in S3 (a
        hibernation's), copied in S3, not uploaded again. False (logged) if it could not be kept:
        never the caller's failure (its sandboxes run)."""
        target = self._live_dir(image)
        try:
            with self._live_lock(image):
                checkpoints.remove(target)          # (a state of the same image kept before: replaced)
                if move:
                    os.rename(directory, target)
                else:
                    shutil.copytree(directory, target, symlinks=True)
                os.chmod(target, 0o711)
                with open(os.path.join(target, criu.FORKED), "w") as f:     # children: TCP ends closed
                    f.write(source + "\n")
                record = None
                if self.store.objects is not None:
                    if uploaded is not None:
                        record = uploaded
                        checkpoints.keep(self.store, source, uploaded, target, checkpoints.live_key(image))
                    else:
                        record = checkpoints.publish(self.store, source, target, checkpoints.live_key(image))
                durable.sync_tree(target)
                durable.sync_dir(os.path.dirname(target))
                kept = {k: v for k, v in spec.items() if k not in TRANSIENT}
                kept.update({"tier": tier, "idle_timeout": idle_timeout})
                with self.store.db.tx() as con:
                    con.execute("DELETE FROM live_states WHERE image=?", (image,))
                    con.execute("INSERT INTO live_states(image, source, spec, checkpoint, created) VALUES(?,?,?,?,?)",
                                (image, source, dumps(kept), dumps(record) if record else None, time.time()))
            return True
        except (SandtreeError, OSError) as exc:
            log.warning("image %s: the live state of sandbox %s not kept (%s): fork_from cannot start it",
                        image[:12], source[:12], exc)
            try:
                checkpoints.remove(target)
            except Exception:                       # noqa: BLE001 - gc's sweep takes what is left
                pass
            return False

    def live_state(self, image: str) -> dict | None:
        """Image `image`'s live state: {"source", "spec", "checkpoint", "created"}, or None."""
        row = self.store.db.one("SELECT source, spec, checkpoint, created FROM live_states WHERE image=?", (image,))
        if row is None:
            return None
        return {"source": row[0], "spec": json.loads(row[1]), "checkpoint": json.loads(row[2]) if row[2] else None,
                "created": row[3]}

    def live_images(self) -> set[str]:
        """The images fork_from can start live."""
        return {r[0] for r in self.store.db.query("SELECT image FROM live_states")}

    # ---- starting -------------------------------------------------------------------------------
    def fork_from(self, ref: str, n: int = 1, **options) -> list[dict]:
        """N live sandboxes whose processes, memory and files go on from image `ref`'s live state
        (the checkpoint its live fork or hibernation took: module doc), as a live fork's children
        do. options: as fork_live's (the children's idle_timeout, lifetime, idle_action, labels,
        limits; what is not given is the source's, its lifetime the whole of the source's).
        Conflict, naming why, when the image has none."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= D.LIVE_FORK_MAX:
            raise InvalidInput(f"n (the number of sandboxes) is an integer from 1 to {D.LIVE_FORK_MAX}", n=n)
        image = self.resolve(ref)
        self.wait_live_state(image)                 # (the live fork that made it may still be keeping it)
        state = self.live_state(image)
        if state is None:
            raise Conflict(f"image {image[:12]} has no live state: only the commit of a live fork (sandbox_fork) "
                           "or of a hibernation (once resumed) keeps its processes' checkpoint, for "
                           f"{D.LIVE_STATE_RETENTION / 3600:g} hours at most; start a sandbox on it instead "
                           "(sandbox_start: files only)",
                           image=image)
        spec0 = state["spec"]
        tier = spec0["tier"]
        child = self._child_options(spec0, options, tier)
        ok, why = self.live.hibernate_available(tier, link=False)
        if not ok:
            raise RuntimeUnavailable(f"starting a live state restores a checkpoint, and {why}", tier=tier)
        self.store.ensure_layers(self.store.image(image).layers)        # (on any node)
        target = self._live_dir(image)
        with self.store.using(), self._live_lock(image):
            if self.live_state(image) is None:      # (gc removed it meanwhile)
                raise Conflict(f"image {image[:12]}'s live state was just removed (gc)", image=image)
            if state["checkpoint"] and self.store.objects is not None:
                # fetched and verified (StoreCorrupt: nothing starts) unless this home has it
                checkpoints.fetch(self.store, state["source"], state["checkpoint"], target,
                                  checkpoints.live_key(image))
            elif not os.path.isdir(target):
                raise Conflict(f"image {image[:12]}'s live state is in the home of the machine that kept it "
                               "(its upload to object storage failed, or there is none): start it there",
                               image=image)
            marker = os.path.join(target, criu.FORKED)
            if not os.path.exists(marker):          # (a hibernation's, fetched: its children's TCP ends closed)
                with open(marker, "w") as f:
                    f.write(state["source"] + "\n")
            source = {"sid": state["source"], "spec": spec0, "tier": tier, "idle_timeout": spec0.get("idle_timeout"),
                      "remaining": float(spec0.get("lifetime") or D.SANDBOX_LIFETIME)}
            forked_from = {"sandbox": state["source"], "image": image, "live_state": True}
            return self._restore_children(source, image, target, [uuid.uuid4().hex for _ in range(n)], child,
                                          forked_from)

    # ---- gc -------------------------------------------------------------------------------------
    def sweep_live_states(self) -> list[str]:
        """gc: this home's live state directories that no live_states row names any more (gc
        dropped it: its image was removed, or it was older than the retention), or that hold
        another upload than the row's (kept again elsewhere). Returns their images."""
        d = os.path.join(self.store.home, "sandboxes")
        gone = []
        for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
            if not name.endswith(".live") or len(name) != 69:
                continue
            image = name[:-5]
            with self._live_lock(image):
                state = self.live_state(image)
                path = os.path.join(d, name)
                if state is not None and (not state["checkpoint"] or self.store.objects is None
                                          or checkpoints.is_local(path, state["checkpoint"])):
                    continue
                checkpoints.remove(path)
                gone.append(image)
        return gone

