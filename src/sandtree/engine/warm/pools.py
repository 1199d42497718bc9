"""Warm pools: sandboxes of one image started ahead, so a run from that image skips setup.

The golden-environment pattern: `st.pool(image, size=N)` keeps N live sandboxes of
the image ready (namespaces, overlay, /dev, /proc, cgroup: everything but the command). A run on
that image with the pool's limits takes one, enters it with the command, and commits its upper
exactly as a run would (same image ID for the same change); the used sandbox is stopped off the
caller's path and filler threads start replacements: FILLERS of them, so back-to-back runs (a run
costs less than a start) find one ready, and starting goes before stopping used ones. A run the pool cannot serve (other
limits, injected files, another tier) runs the ordinary way, so a pool never changes a result.

Pool sandboxes are not detached: they die with the engine (PDEATHSIG), so they are started from
the pool's own long-lived threads (the signal is tied to the thread that forked the helper), which
all end only once every sandbox of the pool is stopped.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import select
import signal
import threading
import time
import uuid
from typing import Callable

from ... import defaults as D
from ...errors import InvalidInput, NotFound, RuntimeUnavailable
from ...runtime.base import Limits, RunOutcome, RunSpec
from ...runtime.base import LiveTier
from ...runtime.cgroups import RunCgroup
from ...runtime.enter import Entered
from ...runtime.liveproc import LiveHandle
from ...runtime.validate import validate_spec
from ...procid import start_time
from ...store.store import Store
from ..images.rundefaults import run_defaults
from ..runs.network import network_option, require_egress
from ..runs.spec import RunSpecs

LIFETIME = 24 * 3600          # pool sandboxes end with the engine; this only bounds a stuck one
SETTLE = 0.002                # how long a run's leftover processes get to exit before it freezes them
# How long a pool run whose command was SIGKILLed by none of its own limits waits for its sandbox's
# pid 1 to be seen gone (a dying pid 1 kills the command first and ends after; 2 ms was too short
# under load: a clean-clone CI run committed such a dead sandbox's upper). Only that rare path pays it.
DIED_WAIT = 0.25
START_WAIT = 0.010            # how long a run that finds none ready waits for a start under way
FILLERS = 3                   # threads starting a pool's sandboxes at once (a start takes ~3 runs' time)


@dataclasses.dataclass
class Ready:
    """A started sandbox of a pool and what a run's end reads of it, opened when it started (not
    on the run's path): its scratch dir (the upper), a pidfd of its pid 1 (pinned: checked
    against its start time), its cgroup with the files stats() reads held open."""
    h: LiveHandle
    ahead: Entered | None                   # its helper entered ahead (None once a command took it)
    scratch: int | None = None
    pin: int | None = None
    cg: RunCgroup | None = None

    def open(self, live: LiveTier) -> None:
        self.scratch = live.scratch(self.h)
        fd = os.pidfd_open(self.h.init_pid)
        if start_time(self.h.init_pid) != self.h.init_start:
            os.close(fd)
            raise NotFound("the live sandbox is no longer running")
        self.pin = fd
        self.cg = self.h.cg()
        if self.cg is not None:
            self.cg.hold()

    def gone(self, wait: float = 0) -> bool:
        """Its pid 1 has exited (the sandbox with it), or does within `wait` seconds: a pidfd is
        readable then."""
        return self.pin is not None and bool(select.select([self.pin], [], [], wait)[0])

    def close(self) -> None:
        """Its fds (not its sandbox, not its entered helper)."""
        for fd in (self.scratch, self.pin):
            if fd is not None:
                os.close(fd)
        self.scratch = self.pin = None
        if self.cg is not None:
            self.cg.unhold()


class Pool:
    def __init__(self, live: LiveTier, image: str, template: RunSpec, size: int, policy=None, egress=None,
                 tier: str = "namespaces", ids: tuple[int, int] = (0, 0)):
        self.live = live
        self.ids = ids                                  # a run's uid, gid by default (the image's USER):
        #                                                 its helper's output relay is started ahead for them
        self.tier = tier                                # its sandboxes' (runs on another tier start their own)
        self.policy, self.egress = policy, egress      # a networked pool: each sandbox its own link
        self.links: dict[int, str] = {}                 # init pid -> its link's key
        self.image = image
        self.template = template                 # layers, root metadata, limits, hostname
        self.size = size
        # each ready sandbox comes with a helper already inside it (joined its cgroups and
        # namespaces), waiting for the command: a run pays for fork + exec + commit only
        self.ready: collections.deque[Ready] = collections.deque()
        lock = threading.RLock()
        self.cv = threading.Condition(lock)
        # the filler threads wait on their own condition (same lock): a run that takes or retires
        # a sandbox wakes one of them, not every waiter (each woken thread costs the run GIL time)
        self.fill = threading.Condition(lock)
        self.closed = False
        self.error: str | None = None
        self.served = 0
        self.misses = 0
        self._retired: list[Ready] = []
        # Sandboxes handed to runs and not retired yet: the filler thread outlives them, because
        # their PDEATHSIG is tied to it (its end would kill a run in flight: a closed pool drains)
        self.out = 0
        self.starting = 0                        # starts under way (counted with ready against size)
        self.waiting = 0                         # runs waiting for a start (Pool.take)
        # Runs in flight that took a sandbox while others were still ready: their replacement
        # starts when they end, not beside them (on 2 cores a start beside a run slows the run by
        # more than it gains); counted with ready against size until then. A take that leaves
        # fewer than half the pool ready starts one at once (a burst).
        self.held = 0
        self._held: set[int] = set()             # their init pids
        self.thread_done = False                 # after it (every filler ended), runs stop their own sandbox
        self.fillers = [threading.Thread(target=self._fill, name=f"sandtree-pool-{image[:12]}-{i}", daemon=True)
                        for i in range(FILLERS)]
        self.fillers_left = len(self.fillers)
        for t in self.fillers:
            t.start()

    # ---- serving -------------------------------------------------------------------------------
    def fits(self, spec: RunSpec, policy=None, tier: str = "namespaces") -> bool:
        t = self.template
        lim, tl = spec.limits, t.limits
        return (tier == self.tier and policy == self.policy and not spec.files and spec.prepare_changes is None and spec.hostname == t.hostname
                and (lim.memory, lim.pids, lim.cpus, lim.disk) == (tl.memory, tl.pids, tl.cpus, tl.disk))

    def take(self, hold: bool = False) -> Ready | None:
        """A ready sandbox or None. hold (a run's): while half the pool is still ready, its
        replacement waits for the run's end (`_retire` lets it start)."""
        with self.cv:
            # starts under way or owed (a filler was woken for it), not held for a run's end
            coming = self.size - self.held - len(self.ready)
            if not self.ready and not self.closed and self.waiting < coming:
                # None ready, but a start coming that no other run waits for: it ends about when
                # a cold run would, and the pool run after it is the faster one; a cold run
                # beside it would slow it (2 cores). Wait for it, up to START_WAIT.
                self.waiting += 1
                end = time.monotonic() + START_WAIT
                try:
                    while not self.ready and not self.closed:
                        left = end - time.monotonic()
                        if left <= 0:
                            break
                        self.cv.wait(left)
                finally:
                    self.waiting -= 1
            got = self.ready.popleft() if self.ready else None
            if got is None:
                self.misses += 1
                return None
            self.out += 1
            if hold and 2 * len(self.ready) >= self.size:
                self.held += 1
                self._held.add(got.h.init_pid)
            else:
                self.fill.notify()               # one start to make (lend: a borrower's)
            return got

    def lend(self, spec: RunSpec, tier: str) -> tuple[LiveHandle, Entered] | None:
        """A ready sandbox for good, with its helper entered ahead, if spec fits (a live run's:
        processes/instances.py); None: start one. Its borrower calls `returned` once it has stopped it (the
        pool's thread, which their PDEATHSIG is tied to, outlives it)."""
        got = self.take() if self.policy is None and self.fits(spec, tier=tier) else None
        if got is None:
            return None
        self.served += 1
        got.close()                              # (its borrower reads it its own way)
        return got.h, got.ahead

    def returned(self) -> None:
        """A lent sandbox has been stopped by its borrower."""
        with self.cv:
            self.out -= 1
            self.fill.notify_all()

    def run(self, spec: RunSpec) -> tuple[RunOutcome, Callable[[], None]] | None:
        """Run spec in a ready sandbox: its outcome, and what to call once the outcome is closed
        (its changes read: the sandbox is retired then). None if none is ready (the caller runs
        it cold)."""
        validate_spec(spec)
        got = self.take(hold=True)
        if got is None:
            return None
        h, ahead, got.ahead = got.h, got.ahead, None
        try:
            out = self.live.exec(h, spec, ahead=ahead)
            # The command is done; what it left running must not write while the upper is read.
            # (its output relay, sandtree-drain, often ends just after it: waited for, not frozen)
            cg = got.cg
            if cg is not None and self.tier == "namespaces" and cg.settle({h.init_pid, h.helper_pid}, SETTLE):
                self.live.freeze(h, True)
            if cg is not None:
                stats = cg.stats()
                out.oom_killed = bool(stats["oom_killed"]) and not out.timed_out
                out.usage.update(cgroup_memory_peak_bytes=stats["memory_peak"], limits_enforced=True)
            out.usage["pool"] = True
            key = self.links.pop(h.init_pid, None)
            if key is not None:                   # its link is the run's: its counters, released
                out.usage["network"] = self.egress().release(key)
            # A sandbox that died under the run fails it (NotFound), not a commit of its upper.
            # Its pid 1's end SIGKILLs the command, and pid 1 may still be in its exit when the
            # command's end is reported: a command SIGKILLed by none of the run's own limits
            # gives it up to DIED_WAIT to end (before, the helper's /proc root was opened here,
            # which raced with the same exits: 5 of 8 such runs failed, the rest committed).
            killed = out.signal == signal.SIGKILL and not (out.timed_out or out.cancelled or out.oom_killed
                                                           or out.usage.get("killed_by"))
            if got.gone(DIED_WAIT if killed else 0):
                raise NotFound("the live sandbox is no longer running")
            scratch = got.scratch
            if cg is not None and self.tier != "namespaces" and not out.quiescent:
                # gVisor's processes are the Sentry's, unseen from here, and its freezer takes tens
                # of ms: the sandbox ends now, as a run's does (the scratch fd keeps the upper).
                # Unless its agent said nothing but itself is left inside: then nothing can write
                # to the upper (gVisor caches no file data with --file-access=shared: writes go
                # to the host file at once), and the filler stops it, off this run's path.
                cg.kill_all()
        except BaseException:
            self._retire(got)
            raise
        self.served += 1

        def release():
            self._retire(got)                    # (the filler closes its fds: off the caller's path)
        out.changes = f"/proc/self/fd/{scratch}/u"
        out.disk_limit = spec.limits.disk
        return out, release

    def _retire(self, r: Ready) -> None:
        with self.cv:                            # stopped by the filler thread, off the run's path
            self.out -= 1
            if r.h.init_pid in self._held:       # its replacement may start now
                self._held.discard(r.h.init_pid)
                self.held -= 1
            if not self.thread_done:
                self._retired.append(r)
                self.fill.notify()
                return
        r.close()
        self.live.stop(r.h, wait=2.0)            # a run that ended after the pool was closed

    # ---- filling -------------------------------------------------------------------------------
    def _fill(self) -> None:
        while True:
            with self.cv:
                while not self._retired and (self.out > 0 if self.closed
                                             else len(self.ready) + self.starting + self.held >= self.size):
                    self.fill.wait()
                closed = self.closed
                # a start first when no sandbox is ready (a burst of runs); else used ones are
                # stopped first, so their stopping does not overlap the next runs
                start = (not closed and len(self.ready) + self.starting + self.held < self.size
                         and (not self._retired or not self.ready))
                if start:
                    self.starting += 1
                    retired = []
                else:
                    retired, self._retired = self._retired, []
            if start:
                self._start_one()
                continue
            for r in retired:
                r.close()
                if r.ahead is not None:
                    r.ahead.discard()
                self.live.stop(r.h, wait=2.0)
                key = self.links.pop(r.h.init_pid, None)
                if key is not None:                   # (never taken by a run: its link goes too)
                    self.egress().release(key)
            if closed:
                with self.cv:                    # (a run may have retired one meanwhile)
                    if not self._retired and self.out == 0:
                        self.fillers_left -= 1
                        self.thread_done = self.fillers_left == 0
                        self.cv.notify_all()
                        self.fill.notify_all()
                        return

    def _start_one(self) -> None:
        """Start a sandbox (from this filler thread: its PDEATHSIG is tied to it) and make it ready."""
        h = key = ready = None
        try:
            spec = self.template
            if self.policy is not None:
                key = f"pool-{uuid.uuid4().hex}"
                link = self.egress().attach(key, self.policy)
                spec = dataclasses.replace(spec, netns_fd=link.netns_fd, runtime_files={
                    "/etc/resolv.conf": f"nameserver {link.gateway}\n".encode()})
                try:
                    h = self.live.start(spec, LIFETIME, detach=False, tier=self.tier)
                finally:
                    link.close()
                self.links[h.init_pid] = key
            else:
                h = self.live.start(spec, LIFETIME, detach=False, tier=self.tier)
            ready = Ready(h, self.live.enter_ahead(h, relay=self.ids))
            ready.open(self.live)
        except Exception as exc:                  # noqa: BLE001 - runs fall back to a cold start
            self.error = str(exc)
            if ready is not None:
                ready.close()
                if ready.ahead is not None:
                    ready.ahead.discard()
            if h is not None:
                self.live.stop(h, wait=2.0)
            if key is not None:
                self.links.pop(getattr(h, "init_pid", None), None)
                self.egress().release(key)
            time.sleep(1.0)
            with self.cv:
                self.starting -= 1
                self.cv.notify_all()
                self.fill.notify_all()
            return
        with self.cv:
            self.starting -= 1
            if not self.closed:
                self.ready.append(ready)
                self.cv.notify_all()
                return
            self.cv.notify_all()
        ready.close()                             # closed while it started: nobody will take it
        if ready.ahead is not None:
            ready.ahead.discard()
        self.live.stop(h, wait=2.0)

    def wait_ready(self, timeout: float = D.POOL_WAIT) -> bool:
        """Until the pool is full (tests, benchmarks, and users who want a warm first run)."""
        end = time.monotonic() + timeout
        with self.cv:
            while len(self.ready) < self.size and not self.closed:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.cv.wait(left)
        return True

    def resize(self, size: int) -> None:
        with self.cv:
            self.size = size
            while len(self.ready) > size:
                self._retired.append(self.ready.pop())
            self.cv.notify_all()
            self.fill.notify_all()

    def stats(self) -> dict:
        with self.cv:
            return {"image": self.image, "size": self.size, "ready": len(self.ready), "served": self.served,
                    "misses": self.misses, "error": self.error,
                    "limits": self.template.limits.__dict__, "tier": self.tier,
                    "network": self.policy.to_json() if self.policy is not None else None}

    def close(self, wait: bool = True) -> None:
        """Stop the ready sandboxes; those runs hold are stopped as they finish (the pool drains).
        wait: until then (at most a minute)."""
        with self.cv:
            self.closed = True
            self._retired.extend(self.ready)
            self.ready.clear()
            self.cv.notify_all()
            self.fill.notify_all()
        if wait:
            end = time.monotonic() + 60
            for t in self.fillers:
                t.join(timeout=max(0.0, end - time.monotonic()))


class Pools:
    """The engine's pools, one per image (a second `pool()` call on an image resizes it)."""

    def __init__(self, store: Store, specs: RunSpecs, live: LiveTier, resolve: Callable[[str], str],
                 default_tier: Callable[[], str] = lambda: "namespaces"):
        self.store, self.specs, self.live, self.resolve = store, specs, live, resolve
        self.default_tier = default_tier
        self.by_image: dict[str, Pool] = {}
        self.draining: list[Pool] = []              # removed without waiting: joined at close
        self.egress = lambda: None                  # () -> the engine's Egress (networked pools)
        self.lock = threading.Lock()

    def create(self, ref: str, size: int, *, hostname: str = D.HOSTNAME, network=None, tier: str | None = None,
               **limits) -> dict:
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= 256:
            raise InvalidInput("pool size must be an integer from 0 to 256")
        source = self.resolve(ref)
        policy = network_option(self.store.db, source, network, None).policy
        if policy is not None:
            require_egress(self.egress())
        lim: Limits = self.specs.limits(limits)
        tier = tier or self.default_tier()
        with self.lock:
            pool = self.by_image.get(source)
            if pool is not None and pool.template.limits == lim and pool.template.hostname == hostname \
                    and pool.policy == policy and pool.tier == tier:
                pool.resize(size)
                return pool.stats()
        ok, why = self.live.available(tier)
        if not ok:
            raise RuntimeUnavailable(why, tier=tier)
        self.store.ensure_layers(self.store.image(source).layers)
        template = RunSpec(argv=["sandtree-init"], layers=self.store.image(source).layers,
                           root_meta=self.specs.root_meta(source), hostname=hostname, limits=lim)
        validate_spec(template)
        try:                                        # the ids a run gets by default (its relay's)
            dflt = run_defaults(self.store, source, env=None, cwd=None, uid=None, gid=None)
            ids = (dflt.uid, dflt.gid)
        except InvalidInput:                        # (a USER that does not resolve fails its runs)
            ids = (0, 0)
        with self.lock:
            old = self.by_image.pop(source, None)
            self.by_image[source] = Pool(self.live, source, template, size, policy, self.egress, tier, ids)
            if old is not None:
                self.draining.append(old)           # runs in it finish; joined at close
        if old is not None:
            old.close(wait=False)
        return self.by_image[source].stats()

    def get(self, image: str) -> Pool | None:
        return self.by_image.get(image)

    def list(self) -> list[dict]:
        return [p.stats() for p in list(self.by_image.values())]

    def wait_ready(self, ref: str, timeout: float = D.POOL_WAIT) -> bool:
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 <= timeout <= D.WAIT_MAX):
            raise InvalidInput(f"a pool's wait is seconds from 0 to {D.WAIT_MAX}, not {timeout!r}"[:200])
        pool = self.by_image.get(self.resolve(ref))
        return pool.wait_ready(timeout) if pool else False

    def remove(self, ref: str, wait: bool = True) -> None:
        """Forget a pool: runs no longer find it; its ready sandboxes stop, those in runs as they
        end (wait: until then; else it drains behind the caller, joined at close)."""
        with self.lock:
            pool = self.by_image.pop(self.resolve(ref), None)
            self.draining = [p for p in self.draining if not p.thread_done]
            if pool is not None and not wait:
                self.draining.append(pool)
        if pool is not None:
            pool.close(wait)

    def close(self) -> None:
        with self.lock:
            pools, self.by_image = list(self.by_image.values()) + self.draining, {}
            self.draining = []
        for p in pools:
            p.close()
