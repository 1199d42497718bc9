"""A live sandbox's network (a mixin of sandboxes.Sandboxes, which provides store, egress, _row,
_running, _commit_lock, _set_spec and info): its policy replaced while it runs (the egress
daemon's set_policy cuts the connections the new one forbids), and its link released when it
stops or expires. A sandbox started without network has no link to give a policy to (its
namespace is its own: only exposed ports reach it), so set_network refuses it."""

from __future__ import annotations

from ..errors import Conflict, NotFound, RuntimeUnavailable
from .netopts import network_option

__all__ = ["SandboxNetwork", "NO_NETWORK"]

# What a sandbox with a link records once its policy is off: a link still to release, nothing allowed
NO_NETWORK = {"allow_out": []}


class SandboxNetwork:
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
