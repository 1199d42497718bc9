"""A tenant's limits on what one run or sandbox may take of the host (tenant.limits, set by the
operator: `sandtree token create --max-...`)."""

from __future__ import annotations

from .. import defaults as D
from ..values import parse_size
from ..errors import LimitExceeded

# (option, the tenant limit capping it, how the option is read, whether the engine's default caps
# it when the operator set no limit). Memory, pids, disk and output are capped by the tenant's
# limit or, where the operator set none, by the engine's defaults: a token without limits must not
# ask for 64G of memory, 500000 pids (pid_max is 32768) or 4G of output held in the server (a
# security review found all three). Timeout and CPUs only take time and a slot of max_runs, so they are capped only
# where the operator said so.
RESOURCES = (("timeout", "max_timeout", float, False), ("output", "max_output", parse_size, True),
             ("memory", "max_memory", parse_size, True), ("pids", "max_pids", int, True),
             ("disk", "max_disk", parse_size, True), ("cpus", "max_cpus", float, False))


def capped(limits: dict, default, options: dict, keys=None) -> dict:
    """`options` with each resource in `keys` (default: all) within the tenant's limits: one not
    asked for gets the cap (or the engine's default, if lower); one asked over it is refused."""
    opts = dict(options)
    for key, cap_key, conv, default_caps in RESOURCES:
        if keys is not None and key not in keys:
            continue
        dflt = getattr(default, key)
        cap = limits.get(cap_key, dflt if default_caps else None)
        if cap is None:
            continue
        if opts.get(key) is None:
            opts[key] = cap if dflt is None else min(dflt, cap)
            continue
        try:
            asked = conv(opts[key])
        except (TypeError, ValueError):
            continue                                   # the engine refuses it with its own message
        if asked > cap:
            where = cap_key if cap_key in limits else f"the server's default; an operator raises it with {cap_key}"
            raise LimitExceeded(f"{key} {opts[key]} is over this tenant's limit ({where}: {cap:g})",
                                limit=cap_key, max=cap)
    return opts


def check_slots(tenancy, tenant) -> None:
    """Refuse a run past the tenant's max_runs (its runs queued, running or in process)."""
    cap = tenant.limits.get("max_runs")
    if cap is not None and tenancy.running(tenant.name) >= cap:
        raise LimitExceeded(f"this tenant already has {cap} run(s) going (max_runs {cap}); wait for one",
                            limit="max_runs", max=cap)


def check_ports(db, tenant, args: dict) -> None:
    """Refuse exposing a port past the tenant's max_ports: the exposed ports of its live
    sandboxes, all of them (each is a listener of the egress daemon every tenant shares); the
    same port of the same sandbox again is no new one."""
    cap = tenant.limits.get("max_ports", D.TENANT_PORTS)
    exposed = set(db.query("SELECT p.sandbox, p.port FROM sandbox_ports p JOIN tenant_blobs b ON b.id=p.sandbox "
                           "AND b.kind='sandbox' JOIN sandboxes s ON s.id=p.sandbox WHERE b.tenant=? "
                           "AND s.state IN ('running', 'hibernated')", (tenant.name,)))
    if (args["sid"], args["port"]) not in exposed and len(exposed) >= cap:
        raise LimitExceeded(f"this tenant already has {cap} exposed port(s) (max_ports {cap}); unexpose one",
                            limit="max_ports", max=cap)


# Rows whose answer a tenant limit counts: checked, and called, under the tenant's lock (sight.py)
COUNTED = {"sandbox_expose": check_ports}
