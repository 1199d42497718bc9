"""A run's or live sandbox's network option: the `network=` value as a Policy ("inherit":
the policy recorded on the run that produced the image), its secrets, and the link the egress
daemon gives it -- what the RunSpec gets (the link's namespace, resolv.conf, the CA bundle, the
secrets' placeholders in the env) and what the records keep (the canonical policy, secrets by name
and hosts only, never a value).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...branching.lineage import recorded_network
from ...errors import InvalidInput, NotFound, RuntimeUnavailable
from ...network.policy import Policy
from ...network.trust import IMAGE_BUNDLES, parse_secrets

__all__ = ["NetOption", "network_option", "inherited_policy", "attach_link", "require_egress"]


@dataclass
class NetOption:
    policy: Policy | None
    secrets: list = field(default_factory=list)
    tape: object = None                  # engine/tapes.TapeOption: record= / replay= (None: no tape)

    def record(self) -> dict:
        """What the operation's (or sandbox's) spec keeps: empty for no network."""
        if self.policy is None:
            return {}
        out = {"network": self.policy.to_json(), "hermetic": False}
        if self.secrets:
            out["secrets"] = {s.name: {"hosts": list(s.hosts), **({"stored": s.stored} if s.stored else {})}
                              for s in self.secrets}
        return out


def inherited_policy(db, image: str) -> Policy | None:
    """The policy recorded on the run that produced `image` (its lineage operation); None (off)
    for an image no networked run made."""
    return Policy.from_json(recorded_network(db, image))


def network_option(db, image: str, network, secrets, *, host_files: bool = False, stored=None) -> NetOption:
    """network= and secrets= as a run or start receives them; InvalidInput for bad values (nothing
    is read or started before this returns). stored(ref): a stored secret by reference (the
    tenancy's lookup: tenancy/secrets.py), for secrets that name one."""
    if isinstance(network, str) and network.strip().lower() == "inherit":
        policy = inherited_policy(db, image)
    else:
        policy = Policy.from_value(network)
    parsed = parse_secrets(secrets or None, host_files=host_files, stored=stored)
    if parsed and policy is None:
        raise InvalidInput("secrets need a network policy that reaches their hosts (network=...)")
    return NetOption(policy, parsed)


def require_egress(egress) -> None:
    """RuntimeUnavailable with the reason when no egress daemon can run here (a rootless engine:
    its sandboxes have only their own loopback, so it offers network=off and nothing else)."""
    ok, why = egress.available()
    if not ok:
        raise RuntimeUnavailable(f"network policies cannot be enforced here: {why}; this engine runs "
                                 "sandboxes without network only (network=off)")


def attach_link(egress, key: str, net: NetOption, read_image, scope: str | None = None):
    """Ask the egress daemon for `key`'s link; (link, runtime_files, env additions).
    read_image(path) -> bytes of the image's file (NotFound when it has none). scope: whose run
    it is (the link may be one that scope used before, and serve it again: Egress.attach)."""
    link = egress.attach(key, net.policy, net.secrets or None, scope=scope,
                         **({"tape": net.tape.attach()} if net.tape is not None else {}))
    image_bundle = None
    if link.ca_pem:                      # the image's trust store, which the link's CA joins
        for path in IMAGE_BUNDLES:
            try:
                image_bundle = read_image(path)
                break
            except (NotFound, InvalidInput, OSError):
                continue
    return link, link.runtime_files(image_bundle), link.env()
