"""The operation table's rows for volumes (engine/volumes.py): named persistent directories of a tenant, mounted
into live sandboxes by sandbox_start's `volumes`. Imports only defaults.py and rows.py, as the rest of the table."""

from __future__ import annotations

from .cli import Cli
from .rows import Http, Off, op, via

__all__: list[str] = []          # rows only: they register themselves in rows.OPS

_G, _P, _X = "GET", "POST", "DELETE"
_MCP = Off("volumes are made, removed and snapshotted by the token's owner (CLI, REST, SDK); an agent gets them "
           "mounted by sandbox_start")

@via("cli", Cli("volume create"))
@op("run", audit="volume create", http=Http(_P, "/volumes", body=("volume",), rename={"volume": "name"}, name="create_volume", status=201, model="VolumeIn", doc="A new, empty volume of the caller's (names are per tenant); 409 if it exists."))
@via("mcp", _MCP)
def volume_create(volume: str) -> dict:
    """Make a named volume: a persistent directory that live sandboxes mount at start (sandbox_start volumes=).
    volume: its name, 1-63 of A-Z a-z 0-9 . _ - (per tenant)"""

@via("cli", Cli("volume list"))
@op("list", caller=True, http=Http(_G, "/volumes", name="list_volumes"))
@via("mcp", _MCP)
def volume_list() -> list[dict]:
    """The caller's volumes: name, created, bytes, the live sandboxes using each, the quota's use."""

@via("cli", Cli("volume info"))
@op("list", http=Http(_G, "/volumes/{volume}", name="get_volume"))
@via("mcp", _MCP)
def volume_info(volume: str) -> dict:
    """A volume: name, created, bytes, the live sandboxes using it, its tenant's quota (used, size)."""

@via("cli", Cli("volume rm"))
@op("run", audit="volume delete", http=Http(_X, "/volumes/{volume}", name="delete_volume", status=204, doc="Remove a volume and its files; 409 (naming them) while live sandboxes mount it."))
@via("mcp", _MCP)
def volume_delete(volume: str) -> None:
    """Remove a volume and its files (refused while live sandboxes mount it)."""

@via("cli", Cli("volume snapshot", show="committed"))
@op("run", audit="volume snapshot", http=Http(_P, "/volumes/{volume}/snapshot", body=("tag",), result="image", name="snapshot_volume", status=201, model="VolumeSnapshotIn", optional_body=True))
@via("mcp", _MCP)
def volume_snapshot(volume: str, *, tag: str | None = None) -> str:
    """An image whose root holds the volume's files now (a volume is never part of a sandbox's commit)."""
