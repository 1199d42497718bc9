"""E2B's wire shapes, in one place: its error body, what its control plane is sent (NewSandbox,
timeouts, snapshots) and answers (Sandbox, SandboxDetail, ListedSandbox, SandboxMetric,
SnapshotInfo), as the `e2b` package's REST client (e2b/api/client/models/) reads them. The fields
are E2B's; each maps onto a sandtree value (module http/e2b/__init__.py: what maps to what).

Errors: E2B's clients read {"code": <status>, "message": "..."} on every failure status; sandtree's
errors (errors.py, each with its http_status) are answered in that shape here, once."""

from __future__ import annotations

import base64
import datetime
import json
import math
import os
from typing import Any
from urllib.parse import parse_qsl, unquote

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from ...errors import InvalidInput, NotFound, SandtreeError
from ..plumbing import shaped_route

# The envd version a sandbox reports (E2B's SDKs gate features on it: e2b/envd/versions.py); envd/
# raises it as it implements more. The SDK refuses anything below 0.1.0. Processes (envd/process.py)
# need 0.5.2 (no user sent: envd's default; a command's stdin asked for and closed, CloseStdin);
# the filesystem part implements E2B's up to 0.6.4 (octet-stream uploads, file metadata, watch
# events with entries).
ENVD_VERSION = "0.6.4"
CLIENT_ID = "sandtree"              # E2B's clientID: the node a sandbox runs on; one constant here
E2B_STATES = {"running": "running", "hibernated": "paused"}    # sandtree's state -> E2B's; others have ended
ALL_TRAFFIC = "0.0.0.0/0"           # E2B's "every address" (allow_out / deny_out)
MAX_PAGE = 100                      # E2B's largest list page (its default too)


# ---- errors ---------------------------------------------------------------------------------------
def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


# Engine errors and malformed requests in E2B's error shape (a malformed body is 400)
E2BRoute = shaped_route(error)


def error_response(exc: SandtreeError) -> JSONResponse:
    """A sandtree error as E2B answers one: its status, {"code", "message"} (the sandbox apps' routes)."""
    return error(exc.http_status, exc.message)


def gone(sid: str) -> NotFound:
    """A sandbox E2B no longer knows: never started, another tenant's, or ended (killed, timed out)."""
    return NotFound(f"sandbox {sid!r} not found", sandbox=sid)


# ---- requests -------------------------------------------------------------------------------------
class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class NetworkIn(_In):
    allow_out: list[str] | None = Field(None, alias="allowOut")
    deny_out: list[str] | None = Field(None, alias="denyOut")
    allow_public_traffic: bool | None = Field(None, alias="allowPublicTraffic")
    rules: dict | None = None
    egress_proxy: dict | None = Field(None, alias="egressProxy")


class NewSandboxIn(_In):
    """NewSandbox / NewSandboxV2 (POST /sandboxes, /v2/sandboxes)."""
    template_id: str = Field(alias="templateID")
    timeout: int = 300
    auto_pause: bool = Field(False, alias="autoPause")
    allow_internet_access: bool | None = None
    network: NetworkIn | None = None
    metadata: dict[str, str] | None = None
    env_vars: dict[str, str] | None = Field(None, alias="envVars")
    secure: bool | None = None
    mcp: Any = None
    volume_mounts: list[dict] | None = Field(None, alias="volumeMounts")


class NetworkUpdateIn(NetworkIn):
    """SandboxNetworkUpdateConfig (PUT /sandboxes/{id}/network)."""
    allow_internet_access: bool | None = None


class TimeoutIn(_In):
    timeout: int


class ConnectIn(_In):
    timeout: int | None = None
    memory: bool | None = None


class SnapshotIn(_In):
    name: str | None = None
    memory: bool | None = None


def network_option(allow_internet_access: bool | None, network: NetworkIn | None, default: str) -> Any:
    """E2B's network options as a sandtree network policy (docs/network.md), None for none.
    allowOut wins over denyOut (E2B's rule), and what it does not allow is refused (sandtree's),
    so denying 0.0.0.0/0 beside an allow list says nothing more. Without an allow list:
    allow_internet_access=False or denying 0.0.0.0/0 is no network; True is the public internet
    less denyOut; nothing said is E2B's default, the internet: here the server's default policy for
    clients that ask for network without rules (`default`: SANDTREE_NETWORK_DEFAULT; "off": none)."""
    allow = [("*" if r == ALL_TRAFFIC else r) for r in (network.allow_out or [])] if network else []
    deny = [r for r in (network.deny_out or []) if r != ALL_TRAFFIC] if network else []
    if allow:
        return {"allow_out": allow, **({"deny_out": deny} if deny else {})}
    if allow_internet_access is False or (network and ALL_TRAFFIC in (network.deny_out or [])):
        return None
    if deny:
        return {"allow_out": ["*"], "deny_out": deny}
    if allow_internet_access:
        return "all"
    return None if default.strip().lower() in ("off", "none", "") else default


def metadata_filter(text: str | None) -> dict[str, str] | None:
    """The list's `metadata` query: url-encoded pairs whose names and values are url-quoted again
    (the SDK's paginator: quote each, then urlencode)."""
    if not text:
        return None
    try:
        pairs = parse_qsl(text, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise InvalidInput(f"metadata must be url-encoded key=value pairs, not {text[:80]!r}") from None
    return {unquote(k): unquote(v) for k, v in pairs}


def states_filter(text: str | None) -> set[str]:
    """The list's `state` query (running,paused); default both."""
    if not text:
        return {"running", "paused"}
    states = {s.strip() for s in text.split(",") if s.strip()}
    bad = states - {"running", "paused"}
    if bad:
        raise InvalidInput(f"state must be running or paused, not {sorted(bad)[0]!r}")
    return states


def page_token(created: float, sid: str) -> str:
    return base64.urlsafe_b64encode(json.dumps([created, sid]).encode()).decode().rstrip("=")


def from_page_token(token: str) -> tuple[float, str]:
    try:
        created, sid = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return float(created), str(sid)
    except (ValueError, TypeError):
        raise InvalidInput("nextToken is not one this server gave") from None


# ---- answers --------------------------------------------------------------------------------------
def when(ts: float) -> str:
    """An RFC 3339 time in UTC, as E2B's API writes them."""
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def sandbox(info: dict, tokens: dict) -> dict:
    """Sandbox: what create, connect and resume answer (tokens: control.access_tokens)."""
    return {"templateID": info["image"], "sandboxID": info["id"], "clientID": CLIENT_ID,
            "envdVersion": ENVD_VERSION, **tokens, "domain": None}


def listed(info: dict) -> dict:
    """ListedSandbox: one of the list's."""
    lim = info.get("limits") or {}
    return {"templateID": info["image"], "sandboxID": info["id"], "clientID": CLIENT_ID,
            "startedAt": when(info["created"]), "endAt": when(info["expires"]),
            "cpuCount": _cpus(lim), "memoryMB": int(lim.get("memory") or 0) >> 20,
            "diskSizeMB": int(lim.get("disk") or 0) >> 20, "state": E2B_STATES[info["state"]],
            "envdVersion": ENVD_VERSION, "metadata": info.get("labels") or {},
            "volumeMounts": [{"name": v["name"], "path": v["path"]} for v in info.get("volumes") or ()]}


def detail(info: dict, tokens: dict) -> dict:
    """SandboxDetail: get_info's (its network policy as E2B's allowOut/denyOut; "*" is 0.0.0.0/0)."""
    net = info.get("network") if isinstance(info.get("network"), dict) else None
    net = net if net and net.get("allow_out") else None        # (a policy set to none: {"allow_out": []})
    out = {**listed(info), **tokens, "domain": None, "allowInternetAccess": net is not None}
    if net is not None:
        out["network"] = {"allowOut": [ALL_TRAFFIC if r == "*" else r for r in net.get("allow_out") or []],
                          "denyOut": list(net.get("deny_out") or [])}
    return out


def metric(sample: dict) -> dict:
    """SandboxMetric: one sample of engine.sandbox_metrics."""
    return {"timestamp": when(sample["timestamp"]), "timestampUnix": int(sample["timestamp"]),
            "cpuCount": sample["cpu_count"], "cpuUsedPct": sample["cpu_used_pct"], "memUsed": sample["mem_used"],
            "memTotal": sample["mem_total"], "memCache": sample["mem_cache"], "diskUsed": sample["disk_used"],
            "diskTotal": sample["disk_total"]}


def snapshot(image: str, names: list[str]) -> dict:
    """SnapshotInfo: a snapshot is an image (a commit of the sandbox); its names are its tags."""
    return {"snapshotID": names[0] if names else image, "names": names}


def _cpus(limits: dict) -> int:
    c = limits.get("cpus")
    return int(math.ceil(c)) if c else (os.cpu_count() or 1)
