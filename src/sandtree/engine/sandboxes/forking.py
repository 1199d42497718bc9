"""Forking a running sandbox (a mixin of sandboxes.Sandboxes, which provides store, live, specs,
_running, _commit_lock, _still_running, _snapshot, _row, info, unlink, unlink_later,
relink_later, fork_links, release_fork_links, hold_link, check_resolv_link and _checkpoint_dir):
N live sandboxes that go on from the source's processes, memory, open files, pipes, /dev/shm and shell session at one instant, while
the source runs on.

How: as a hibernation (hibernation.py) up to the checkpoint: the source's processes are frozen,
its filesystem committed (the fork's image: the lineage shows it, then each child's commits) and
its processes checkpointed, but the checkpoint leaves them where they were (CRIU
--leave-running; gVisor's checkpoint always does), and the freeze ends as soon as it is written:
the source's stall is the commit and the dump (on the namespaces tier the commit is made while
CRIU starts and dumps), and nothing else. Each child is then restored
from that one checkpoint as a resume is, on the fork's image, into a sandbox of its own: new
namespaces (a restore makes them; the child's pid 1 is its own, in its own pid and user
namespaces, so no child can reach another's or the source's memory), its own cgroup with the
source's limits (or those given), seccomp filter and capabilities (the helper's, as at any
start), deadline and row. TCP connections open at the fork stay the source's: the dump leaves
them alone and each child gets them closed (criu.py TCP_FORK); listening sockets listen again in
each child's own namespace.

A networked source: each child gets a link of its own with the source's policy and secrets, and
a new address. Its restored processes hold the source's secret placeholders (env, memory) and
trust the CA in its runtime files, so the child's link is the egress daemon's copy of the
source's (attach_like: the same placeholders put in place of the same values, certificates from
the same CA; the values stay in the daemon), made before the freeze; the dump is taken from
inside the source's link (as a hibernation's), which stays the source's, and each child is
restored into its own (as a resume). A policy given later (the sandbox's own namespace,
adopted): its veth is released before the dump and given back after (the source's
connections out are cut, as by a hibernation), and each child is given the policy on its own
namespace once restored. Exposed ports stay the source's (made again when next asked for);
children have none. gVisor cannot checkpoint a sandbox in a link (gvisor_live.py NO_LINK).

The checkpoint is written to a tmpfs of its own (fork_dir), not the home's disk: the dump is a
memory copy and the children's restores read it from memory (its pages are shared only while
they are being read; each child's memory is its own). Once the children run it is kept with the
fork's image (livestates.py: fork_from starts that state again later, on any node with S3).

What this kernel does not give (measured, docs/design.md "Forking a live sandbox"): soft-dirty
page tracking (criu check: "Dirty tracking is OFF"), so no iterative pre-dump: the source stalls
for the whole dump; and CRIU's lazy restore (userfaultfd) serves pages from a page server per
restore, not shared between children, so it is not used."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ... import defaults as D
from . import containers as engine_containers
from ...errors import Conflict, InvalidInput, RuntimeUnavailable
from ...procid import dead_owner, owner_prefix
from ...runtime import criu
from ...runtime.base import Limits, RunSpec
from ...store import checkpoints
from ...values import check_labels
from ..runs.spec import check_duration
from .livestates import TRANSIENT
from .network import LATER, joined

log = logging.getLogger("sandtree.engine")

FORKS = "/dev/shm/sandtree-forks"       # where checkpoints of forks are written when it is a tmpfs (_fork_dir)

# start options a child may have of its own; its env, cwd, user and files are its processes' (the checkpoint's)
CHILD_OPTIONS = ("idle_timeout", "lifetime", "idle_action", "labels")


class SandboxForking:
    def fork_live(self, sid: str, n: int = 1, **options) -> list[dict]:
        """N live sandboxes continuing from running sandbox `sid` as it is now (module doc); each
        child's info, with "forked_from" {sandbox, image, stall_ms}. options: idle_timeout,
        lifetime, idle_action, labels and the limits (memory, cpus, pids, timeout, disk, output);
        what is not given is the source's. Nothing is started if any check fails; a child that
        fails to restore stops the ones restored before it (the source runs on either way)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= D.LIVE_FORK_MAX:
            raise InvalidInput(f"n (the number of children) is an integer from 1 to {D.LIVE_FORK_MAX}", n=n)
        row = self._running(sid)
        sid, h, spec0 = row["id"], row["handle"], row["spec"]
        child = self._child_options(spec0, options, h.tier)
        self._check_forkable(row)
        cids = [uuid.uuid4().hex for _ in range(n)]
        links: dict = {}                        # a networked source's children's links (_checkpoint_running)
        images = None
        try:
            images = self._fork_dir()
            row, image, stall = self._checkpoint_running(row, images, cids, links)
            source = {"sid": sid, "spec": row["spec"], "tier": h.tier, "idle_timeout": row["idle_timeout"],
                      "remaining": max(1.0, row["expires"] - time.time())}
            forked_from = {"sandbox": sid, "image": image, "stall_ms": round(stall * 1000, 2)}
            children = self._restore_children(source, image, images, cids, child, forked_from, links)
        except BaseException:
            self.release_fork_links(links)      # (those of children stopped meanwhile: already gone)
            raise
        else:
            # the fork's image can be started live again later (livestates.py): its checkpoint kept
            # with it, moved when the fork dir is on the home's filesystem, else copied from memory;
            # not a networked source's (a child needs a link of its own, which fork_from has none of)
            # (after the call returns: keep_live_state_later; the fork dir goes once it is kept)
            if not joined(row["spec"]) and not row["spec"].get(LATER):
                moved = os.stat(images).st_dev == os.stat(os.path.dirname(self._live_dir(image))).st_dev
                kept, images = images, None
                self.keep_live_state_later(image, kept, sid, row["spec"], row["idle_timeout"], h.tier, move=moved,
                                           then=lambda: _remove_fork_dir(kept))
            return children
        finally:
            for link in links.values():
                link.close()                    # (the restored processes hold their namespaces)
            if images is not None:
                _remove_fork_dir(images)

    # ---- checks ------------------------------------------------------------------------------------
    def _child_options(self, spec0: dict, options: dict, tier: str) -> dict:
        unknown = set(options) - set(CHILD_OPTIONS) - set(Limits.__dataclass_fields__)
        if unknown:
            raise InvalidInput(f"a fork's children continue the source's processes: their env, cwd, user, "
                               f"files and tier are the source's; not {', '.join(sorted(unknown))}")
        limits = {k: v for k, v in options.items() if k in Limits.__dataclass_fields__ and v is not None}
        lim = self.specs.limits({**spec0["limits"], **limits})
        idle_timeout = options.get("idle_timeout")
        lifetime = options.get("lifetime")
        idle_action = options.get("idle_action") or spec0.get("idle_action", "stop")
        if idle_timeout is not None:
            check_duration("idle_timeout", idle_timeout, zero=True)
        if lifetime is not None:
            check_duration("lifetime", lifetime)
        if idle_action not in ("stop", "hibernate"):
            raise InvalidInput(f"idle_action must be 'stop' or 'hibernate', not {idle_action!r}")
        self._check_idle_hibernate(tier, idle_action, link=joined(spec0))
        labels = check_labels(options["labels"]) if options.get("labels") is not None else spec0.get("labels", {})
        return {"limits": lim, "idle_timeout": idle_timeout, "lifetime": lifetime, "idle_action": idle_action,
                "labels": labels}

    def _check_forkable(self, row: dict) -> None:
        sid, h, spec0 = row["id"], row["handle"], row["spec"]
        if spec0.get("run"):
            raise Conflict(f"sandbox {sid[:12]} serves a live run: fork the run's image instead", sandbox=sid)
        if spec0.get("volumes"):
            raise Conflict(f"sandbox {sid[:12]} mounts volumes, which a checkpoint cannot hold (and children "
                           "would share them): fork one without volumes", sandbox=sid)
        # (a sandbox in a link: gVisor's tier cannot checkpoint it, gvisor_live.py NO_LINK)
        ok, why = self.live.of(h).hibernate_available(link=joined(spec0))
        if not ok:
            raise RuntimeUnavailable(f"a live fork checkpoints the sandbox, and {why}", tier=h.tier)
        if h.cgroup is None:
            raise RuntimeUnavailable("a live fork needs the cgroup freezer (cgroups are not available here)")
        self.check_resolv_link(row)             # (its children are restored as a resume is)

    # ---- the checkpoint, the source running on -------------------------------------------------------
    def _fork_dir(self) -> str:
        """A new directory for one fork's checkpoint: in memory (FORKS, the host's /dev/shm) where
        that is a tmpfs, else in the home. It holds the source's memory, secrets included: its
        parent is root's and 0700 (the restores read it through an fd, as a resume's, so the
        checkpoint itself is 0711/0644 as a hibernation's). Named after this engine process: one
        killed mid-fork leaves it to the next sweep_forks."""
        base = FORKS if _on_tmpfs(os.path.dirname(FORKS)) else os.path.join(self.store.home, "sandboxes")
        os.makedirs(base, mode=0o700, exist_ok=True)
        if os.stat(base).st_uid != os.geteuid() or os.stat(base).st_mode & 0o077:
            raise RuntimeUnavailable(f"{base} is not this user's alone (0700): a fork's checkpoint holds the "
                                     "sandbox's memory, and is not written there")
        path = os.path.join(base, f"{owner_prefix()}{uuid.uuid4().hex}.fork")
        os.mkdir(path, 0o711)
        return path

    def sweep_forks(self) -> list[str]:
        """The checkpoint directories of forks whose engine process is gone (killed mid-fork),
        here and in FORKS (shared by every home on the host: only those of dead engines go)."""
        gone = []
        for base in (FORKS, os.path.join(self.store.home, "sandboxes")):
            for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
                if name.endswith(".fork") and dead_owner(name):
                    _remove_fork_dir(os.path.join(base, name))
                    gone.append(name)
        return gone

    def _checkpoint_running(self, row: dict, images: str, cids: list[str], links: dict) -> tuple[dict, str, float]:
        """Freeze, commit, checkpoint leaving it running, thaw: (the source's row as it was
        checkpointed, the fork's image, the stall in seconds: frozen to thawed). A networked
        source's children's links go into `links` (cid -> Link) first, under the lock that a
        set_network takes too (so they copy the policy the checkpoint is taken under), before the
        freeze (not part of the stall)."""
        sid, h = row["id"], row["handle"]
        self.ahead.forget(sid)
        self.spawners.forget(sid, wait=True)        # (a checkpoint cannot hold its socket)
        self.live.end_spawners(row["handle"])       # (another engine process's too)
        with self.store.using(), self._commit_lock(sid):
            self._still_running(row)
            # as it is now (a set_network or a resume waits for the lock): a policy given or taken
            # since the checks, the processes of a resume
            row = self._row(sid)
            h, spec0 = row["handle"], row["spec"]
            links.update(self.fork_links(row, cids))
            t0 = time.monotonic()
            self.live.freeze(h, True, checkpoint=True)
            unlinked = False
            try:
                if self.live.outsiders(h):
                    raise Conflict(f"a command is still running in sandbox {sid[:12]} (exec or shell); fork it "
                                   "once that has finished", sandbox=sid)
                # (an exposed port's veth: CRIU cannot dump it; the source's is made again when next asked for)
                self.unlink(sid)
                # (a policy given later: its veth too, the same link; given back below)
                unlinked = True
                self.unlink_later(row)
                with open(os.path.join(images, criu.FORKED), "w") as f:
                    f.write(sid + "\n")
                # in a joined link the dump is taken from inside it, which stays the source's (live.py);
                # the commit while CRIU starts and dumps (LiveTier.dump: where the tier allows it)
                image = self.live.dump(h, images, ghost_limit=spec0["limits"]["disk"], link=joined(spec0),
                                       leave_running=True, meanwhile=lambda: self._snapshot(row, True, "fork"))
            finally:
                if self.live.alive(h):
                    self.live.freeze(h, False)
                stall = time.monotonic() - t0
                # (after the thaw: not part of the stall; if it fails the source runs on with no
                # network, its record saying so, and the fork fails)
                if unlinked and self.live.alive(h):
                    self.relink_later(row)
        return row, image, stall

    # ---- the children --------------------------------------------------------------------------------
    def _restore_children(self, source: dict, image: str, images: str, cids: list[str], child: dict,
                          forked_from: dict, links: dict | None = None) -> list[dict]:
        """Sandboxes `cids` restored from checkpoint `images` on `image`. source: {"sid", "spec" (its
        row's), "tier", "idle_timeout", "remaining" (seconds of lifetime a child has unless given)}.
        links: a networked source's children's (cid -> Link), each restored into its own."""
        sid, spec0 = source["sid"], source["spec"]
        links = links or {}
        layers = self.store.image(image).layers
        lifetime = child["lifetime"] if child["lifetime"] is not None else source["remaining"]
        idle_timeout = child["idle_timeout"] if child["idle_timeout"] is not None else source["idle_timeout"]
        made: list[str] = []
        lock = threading.Lock()

        def restore(cid: str, directory: str) -> None:
            spec = RunSpec(argv=["sandtree-init"], layers=layers, root_meta=self.specs.root_meta(image),
                           env=spec0["env"], cwd=spec0["cwd"], hostname=spec0["hostname"], limits=child["limits"],
                           containers=bool(spec0.get("containers")))
            link = links.get(cid)
            spec.netns_fd = link.netns_fd if link is not None else None     # (restored into it, as a resume)
            handle = self.live.start(spec, lifetime, restore=directory, tier=source["tier"])
            record = {k: v for k, v in spec0.items() if k not in TRANSIENT + ("idle_timeout",)}
            record.update({"limits": child["limits"].__dict__, "lifetime": lifetime, "base": image,
                           "idle_action": child["idle_action"], "tier": handle.tier, "forked_from": forked_from})
            if child["labels"]:
                record["labels"] = child["labels"]
            else:
                record.pop("labels", None)
            try:
                self._record_running(cid, image, handle, record, idle_timeout, lifetime)
            except BaseException:
                self.live.stop(handle)
                raise
            with lock:
                made.append(cid)
            if link is not None:
                self.hold_link(self._row(cid), False)       # (its processes are in it: GC may judge it)
            self.relink_later(self._row(cid))               # (a policy given later: on its own namespace)
            if spec0.get("containers"):     # its engine's network devices are not restored (containers.py)
                engine_containers.restart(self, cid, child["limits"].disk, linked=link is not None)

        dirs = _restore_dirs(images, len(cids), self._fork_dir)
        try:
            if len(set(dirs)) == 1:             # (one child, or no private copies: one after another)
                for cid in cids:
                    restore(cid, images)
            else:
                with ThreadPoolExecutor(max_workers=min(len(cids), D.LIVE_FORK_RESTORES),
                                        thread_name_prefix="sandtree-fork") as pool:
                    for f in [pool.submit(restore, cid, d) for cid, d in zip(cids, dirs)]:
                        f.result()              # (the first error; the others run to their end first)
        except BaseException:
            for cid in made:
                try:
                    self.stop(cid)
                except Exception as exc:        # (already stopped by its deadline: nothing to undo)
                    log.warning("fork of %s: child %s not stopped after a failed restore: %s", sid, cid, exc)
            raise
        finally:
            for d in set(dirs) - {images}:
                _remove_fork_dir(d)
        made.sort(key=cids.index)               # (in the order of cids, whichever finished first)
        return [self.info(cid) for cid in made]


def _restore_dirs(images: str, n: int, new_dir) -> list[str]:
    """A directory per child to restore from: the first is `images`, the others new ones (new_dir())
    holding its files hard-linked (no copy), so that restores at once each write their own log
    (CRIU writes restore.log and stats-restore into its images directory). All `images` where that
    cannot be (another filesystem, a subdirectory): the restores then run one after another."""
    dirs = [images]
    try:
        for _ in range(n - 1):
            d = new_dir()
            dirs.append(d)
            for name in os.listdir(images):
                os.link(os.path.join(images, name), os.path.join(d, name))
    except OSError:
        for d in dirs[1:]:
            _remove_fork_dir(d)
        return [images] * n
    return dirs


def _on_tmpfs(path: str) -> bool:
    """Whether `path` lies on a tmpfs: the type of the deepest mount holding it (mountinfo)."""
    best, kind, real = "", "", os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                mnt = parts[4].replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, parts[parts.index("-") + 1]
    except OSError:
        return False
    return kind == "tmpfs"


def _remove_fork_dir(path: str) -> None:
    checkpoints.remove(path)                    # files only (remove_tree refuses mounts)
