"""A live sandbox's network (a mixin of sandboxes.Sandboxes, which provides store, egress, _row,
_running, _commit_lock, _set_spec and info): its policy replaced while it runs (the egress
daemon's set_policy cuts the connections the new one forbids), its link kept while it is
hibernated and given back at resume, and released when it stops or expires. A sandbox started
without network has no link to give a policy to (its namespace is its own: only exposed ports
reach it), so set_network refuses it.

Hibernation keeps the link (design.md, "Hibernate"): the daemon holds it while no process is in
it (`hold`), and the resume is given its namespace again (`rejoin`), so the sandbox comes back
with the same address, policy, secret placeholders and CA, and its exposed ports' listeners
never went away. Only when the daemon lost it (restarted meanwhile) does the resume attach a new
link with the recorded policy; a sandbox with secrets cannot (their values lived only in that
daemon's memory), and stays hibernated."""

from __future__ import annotations

from ...errors import Conflict, InvalidInput, NotFound, RuntimeUnavailable
from ...network.policy import Policy
from ...store import inspect
from ...store.objects import SYMLINK
from ..runs.network import network_option, require_egress

__all__ = ["SandboxNetwork", "NO_NETWORK"]

# What a sandbox with a link records once its policy is off: a link still to release, nothing allowed
NO_NETWORK = {"allow_out": []}


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
            if not row["spec"].get("network"):
                raise Conflict(f"sandbox {row['id'][:12]} was started without network, so it has no link a "
                               "policy could apply to: start one with network=...", sandbox=row["id"])
            self.egress().set_policy(row["id"], net.policy)
            self._set_spec(row["id"], {**row["spec"], "network": net.policy.to_json() if net.policy else NO_NETWORK,
                                       "hermetic": False})
        return self.info(row["id"])

    def release_link(self, row: dict) -> dict:
        """Its link's final usage once it stops ({} without one, or when the daemon is gone)."""
        if not row["spec"].get("network"):
            return {}
        try:
            return self.egress().release(row["id"])
        except (NotFound, RuntimeUnavailable):
            return {}

    def hold_link(self, row: dict, held: bool) -> None:
        """Keep (or stop keeping) a networked sandbox's link while it has no processes; nothing
        when the daemon has no such link (a resume attaches a new one: resume_link)."""
        if not row["spec"].get("network"):
            return
        try:
            self.egress().hold(row["id"], held)
        except (NotFound, RuntimeUnavailable):
            pass

    def resume_link(self, row: dict):
        """The Link a hibernated networked sandbox is restored into (the caller closes it), held:
        if the restore fails it is still there for the next try. None without network."""
        spec = row["spec"]
        if not spec.get("network"):
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

    def check_resolv_link(self, row: dict) -> None:
        """Conflict for a networked sandbox whose image has a link at /etc/resolv.conf: the runtime
        covered the link itself with the daemon's file, and CRIU restores a mount by its path,
        which would follow the link (to a file that is not there, or to one of the image's
        choosing). The sandbox cannot remove a mount point, so its base image decides."""
        if not row["spec"].get("network"):
            return
        try:
            entry = inspect.resolve(self.store, row["image"], "/etc/resolv.conf", follow=False)[1]
        except (NotFound, InvalidInput):
            return
        if entry.kind == SYMLINK:
            raise Conflict(f"sandbox {row['id'][:12]} cannot hibernate: its image's /etc/resolv.conf is a link, "
                           "covered by the egress resolver's file, and a restore would follow it; start it from "
                           "an image with a regular /etc/resolv.conf (or none) to hibernate it", sandbox=row["id"])
