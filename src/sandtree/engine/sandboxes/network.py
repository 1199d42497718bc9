"""A live sandbox's network (a mixin of sandboxes.Sandboxes, which provides store, egress, _row,
_running, _commit_lock, _set_spec and info): its policy replaced while it runs (the egress
daemon's set_policy cuts the connections the new one forbids), its link kept while it is
hibernated and given back at resume, and released when it stops or expires.

A sandbox started without network is given a policy later ("network given later": an agent phase
offline, a verifier online) through its own namespace: the daemon adopts it (a veth, as an
exposed port's link: links.py `adopt`) and routes it to the router (`route`), whose ruleset sends
its connections and DNS to the proxy and resolver as a joined link's, under the same policy. The
sandbox holds no CAP_NET_ADMIN, and everything is decided outside its namespace, so this is the
same enforcement. set_network(none) takes it away again: its link released (the namespace has
only `lo` again), or, while it has exposed ports, their link left with no route and no policy.
The record says so (spec LATER). A hibernation releases that link (CRIU restores no veth whose
peer is elsewhere) and the resume gives the restored processes a new one with the same policy.
gVisor's tier cannot (its network is fixed at the start: adopt_available says why).

Hibernation keeps the link (design.md, "Hibernate"): the daemon holds it while no process is in
it (`hold`), and the resume is given its namespace again (`rejoin`), so the sandbox comes back
with the same address, policy, secret placeholders and CA, and its exposed ports' listeners
never went away. Only when the daemon lost it (restarted meanwhile) does the resume attach a new
link with the recorded policy; a sandbox with secrets cannot (their values lived only in that
daemon's memory), and stays hibernated.

A live fork (forking.py) gives each child a link of its own that is a copy of the source's
(fork_links: the daemon's attach_like, the values never passing through here), or, for a policy
given later, the policy again on the child's own namespace (relink_later), as a resume does."""

from __future__ import annotations

from ...errors import Conflict, InvalidInput, NotFound, RuntimeUnavailable
from ...network.policy import Policy
from ...store.db import dumps
from ..tapes import TapeOption
from ...store import inspect
from ...store.objects import SYMLINK
from ..runs.network import network_option, require_egress
from .ports import adopt_namespace

__all__ = ["SandboxNetwork", "NO_NETWORK", "LATER", "joined"]

# What a sandbox with a link records once its policy is off: a link still to release, nothing allowed
NO_NETWORK = {"allow_out": []}
# In a sandbox's spec: its policy was given after it started (its own namespace, adopted)
LATER = "network_later"


def joined(spec: dict) -> bool:
    """Whether the sandbox runs in a link it joined at its start (the daemon's namespace, kept
    across a hibernation): network= at the start, not a policy given later."""
    return bool(spec.get("network")) and not spec.get(LATER)


class SandboxNetwork:
    def _unlink_net(self, sid: str, link) -> dict:
        """Release a network= sandbox's link (at stop or when it is gone): its final usage."""
        return self.egress().release(sid) if link is not None else {}

    def set_network(self, sid: str, network) -> dict:
        """Replace the running sandbox's network policy (inherit: the policy of the run that made
        its image); its info with the new one."""
        row = self._row(sid)
        net = network_option(self.store.db, row["image"], network, None)
        with self._commit_lock(row["id"]):
            row = self._running(row["id"])
            if not row["spec"].get("network") or row["spec"].get(LATER):
                self._set_network_later(row, net.policy)
                return self.info(row["id"])
            self.egress().set_policy(row["id"], net.policy)
            self._set_spec(row["id"], {**row["spec"], "network": net.policy.to_json() if net.policy else NO_NETWORK,
                                       "hermetic": False})
        return self.info(row["id"])

    # ---- a policy given after the start ---------------------------------------------------------
    @staticmethod
    def _later_key(row: dict) -> str:
        return row["spec"].get("link_key") or row["id"]      # (the exposed ports' link: ports.py)

    def _set_network_later(self, row: dict, policy: Policy | None) -> None:
        """set_network of a sandbox started without network (or given one since): see the module doc."""
        sid, spec = row["id"], row["spec"]
        if policy is None:
            if spec.get(LATER):
                self._take_network(row)
                self._set_spec(sid, {k: v for k, v in spec.items() if k not in ("network", LATER)})
            return                                    # (never had one: nothing to take)
        ok, why = self.live.of(row["handle"]).adopt_available()
        if not ok:
            raise RuntimeUnavailable(why, sandbox=sid, tier=row["handle"].tier)
        egress = self.egress()
        require_egress(egress)
        self._give_network(row, policy)
        self._set_spec(sid, {**spec, "network": policy.to_json(), LATER: True, "hermetic": False})

    def _give_network(self, row: dict, policy: Policy) -> None:
        """The sandbox's namespace adopted (unless the daemon has its link for these processes),
        the policy set, the route on: in that order, so no packet goes out before the policy is there."""
        egress, h, key = self.egress(), row["handle"], self._later_key(row)
        for attempt in (0, 1, 2):
            try:
                egress.set_policy(key, policy)
                egress.route(key, h.init_pid, True)
                return
            except NotFound:                  # no link (or no daemon) yet
                if attempt == 2:
                    raise
            except Conflict:                  # a link for processes gone (before a resume): a new one
                if attempt == 2:
                    raise
                egress.release(key)
            adopt_namespace(self.live, egress, key, row, adopted_ok=True)   # (an expose may have meanwhile)

    def unlink_later(self, row: dict) -> None:
        """Before a checkpoint: release a later-given policy's link (a veth into the sandbox's own
        namespace, which CRIU cannot restore; exposed ports' too, as it is the same link)."""
        if row["spec"].get(LATER):
            self.egress().release(self._later_key(row))

    def relink_later(self, row: dict) -> None:
        """After a restore (or a failed checkpoint): the later-given policy again, on a new link
        for the processes now. If that fails the sandbox runs on with no network at all, and its
        record says so (it fails closed), and the error is raised."""
        if not row["spec"].get(LATER):
            return
        try:
            self._give_network(row, Policy.from_json(row["spec"]["network"]))
        except BaseException:
            self.egress().release(self._later_key(row))
            self._set_spec(row["id"], {k: v for k, v in row["spec"].items() if k not in ("network", LATER)})
            raise

    def _take_network(self, row: dict) -> None:
        """No egress at all again: the link released (every connection cut, the veth gone), or,
        while the sandbox has exposed ports, left to them with no policy and no route."""
        egress, key = self.egress(), self._later_key(row)
        try:
            # every connection cut first, while the link is there to carry the ends to the
            # sandbox (a connection whose veth went first would hang there, not end)
            egress.set_policy(key, None)
            if self.store.db.query("SELECT 1 FROM sandbox_ports WHERE sandbox=? LIMIT 1", (row["id"],)):
                egress.route(key, row["handle"].init_pid, False)
                return
        except (NotFound, Conflict):
            pass                              # (no daemon or no link for these processes: nothing goes out)
        egress.release(key)                   # ({} when the daemon had lost it)

    def release_link(self, row: dict) -> dict:
        """Its link's final usage once it stops ({} without one, or when the daemon is gone)."""
        if not row["spec"].get("network"):
            return {}
        try:
            usage = self.egress().release(row["id"])
        except (NotFound, RuntimeUnavailable):
            usage = {}
        spec = row["spec"]
        if spec.get("record") or spec.get("tape"):      # its tape into the store, its id in the row
            taped = TapeOption(bool(spec.get("record")), spec.get("tape"), spec.get("tape_rules") or {},
                               spec.get("tape_file"))
            tid, misses = taped.finish(self.store, usage, row["id"])
            if tid is not None or misses:
                new = {**spec, **({"recorded_tape": tid} if tid else {}), **({"tape_misses": misses} if misses else {})}
                with self.store.db.tx() as con:
                    con.execute("UPDATE sandboxes SET spec=? WHERE id=?", (dumps(new), row["id"]))
                row["spec"] = new
        return usage

    def hold_link(self, row: dict, held: bool) -> None:
        """Keep (or stop keeping) a networked sandbox's link while it has no processes; nothing
        when the daemon has no such link (a resume attaches a new one: resume_link)."""
        if not joined(row["spec"]):
            return
        try:
            self.egress().hold(row["id"], held)
        except (NotFound, RuntimeUnavailable):
            pass

    def resume_link(self, row: dict):
        """The Link a hibernated networked sandbox is restored into (the caller closes it), held:
        if the restore fails it is still there for the next try. None without network."""
        spec = row["spec"]
        if not joined(spec):
            return None
        egress = self.egress()
        try:
            return egress.rejoin(row["id"])
        except NotFound:
            pass
        if spec.get("secrets"):
            raise Conflict(f"sandbox {row['id'][:12]} cannot resume: the egress daemon was restarted while it was "
                           "hibernated, and its secrets' values lived only in that daemon's memory; stop it and "
                           f"start a new sandbox from its head image {row['head']} with the secrets again",
                           sandbox=row["id"], state="hibernated")
        require_egress(egress)
        link = egress.attach(row["id"], Policy.from_json(spec["network"]))
        try:
            egress.hold(row["id"])
        except BaseException:
            link.close()
            egress.release(row["id"])
            raise
        return link

    def fork_links(self, row: dict, keys: list[str]) -> dict:
        """A live fork's children's links (key -> Link, held: the caller closes them, and releases
        those it restores no child into): for a sandbox in a joined link, one per key, each a copy
        of the source's (the daemon's attach_like: the same policy, secret placeholders and CA,
        which the restored processes hold, and a new address); {} otherwise (a policy given later:
        each child is given it on its own namespace once restored, relink_later). When the daemon
        lost the source's link (restarted since its start), new links with the recorded policy;
        with secrets there are none to give (their values lived only in that daemon), so Conflict.
        Called under the source's commit lock (a stop or set_network waits), before its freeze."""
        if not joined(row["spec"]):
            return {}
        egress, links = self.egress(), {}
        try:
            for key in keys:
                try:
                    links[key] = egress.attach_like(key, row["id"])
                    continue
                except NotFound:
                    pass                           # (it runs: the caller holds its commit lock)
                if row["spec"].get("secrets"):
                    raise Conflict(f"sandbox {row['id'][:12]} cannot be forked live: the egress daemon was restarted "
                                   "since it started, and its secrets' values lived only in that daemon's memory; "
                                   "commit it and start sandboxes from the image with the secrets again",
                                   sandbox=row["id"])
                require_egress(egress)
                links[key] = egress.attach(key, Policy.from_json(row["spec"]["network"]))
                egress.hold(key)                   # (until its child is in it, as attach_like's)
        except BaseException:
            self.release_fork_links(links)
            raise
        return links

    def release_fork_links(self, links: dict) -> None:
        """Close and release links fork_links gave (a fork that failed; {} for a released one)."""
        for key, link in links.items():
            link.close()
            try:
                self.egress().release(key)
            except (NotFound, RuntimeUnavailable):
                pass

    def check_resolv_link(self, row: dict) -> None:
        """Conflict for a networked sandbox whose image has a link at /etc/resolv.conf: the runtime
        covered the link itself with the daemon's file, and CRIU restores a mount by its path,
        which would follow the link (to a file that is not there, or to one of the image's
        choosing). The sandbox cannot remove a mount point, so its base image decides."""
        if not joined(row["spec"]):
            return
        try:
            entry = inspect.resolve(self.store, row["image"], "/etc/resolv.conf", follow=False)[1]
        except (NotFound, InvalidInput):
            return
        if entry.kind == SYMLINK:
            raise Conflict(f"sandbox {row['id'][:12]} cannot hibernate: its image's /etc/resolv.conf is a link, "
                           "covered by the egress resolver's file, and a restore would follow it; start it from "
                           "an image with a regular /etc/resolv.conf (or none) to hibernate it", sandbox=row["id"])
