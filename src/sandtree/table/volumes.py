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

@via("cli", Cli("volume snapshot"))
@op("run", audit="volume snapshot", http=Http(_P, "/volumes/{volume}/snapshot", body=("tag",), result="image", name="snapshot_volume", status=201, model="VolumeSnapshotIn", optional_body=True))
@via("mcp", _MCP)
def volume_snapshot(volume: str, *, tag: str | None = None) -> str:
    """An image whose root holds the volume's files now (a volume is never part of a sandbox's commit)."""

# ---- a volume's files, from outside any sandbox (E2B's volume content API) ----------------------------
_VF = "/volumes/{volume}/file"
_MCPF = Off("an agent reads and writes a volume's files in a sandbox that mounts it (sandbox_exec)")

@via("cli", Cli("volume cat", show="bytes"))
@op("list", http=Http(_G, _VF, query=("path",), raw=True, name="read_volume_file"))
@via("mcp", _MCPF)
def volume_read(volume: str, path: str) -> bytes:
    """A regular file of a volume (resolved inside it, never outside)."""

@via("cli", Cli("volume put"))
@op("run", audit="volume write", http=Http("PUT", _VF, query=("path", "mode", "uid", "gid"), content="data", name="write_volume_file", status=204, bounds={"mode": {"ge": 0, "le": 0o7777}, "uid": {"ge": 0, "lt": 65536}, "gid": {"ge": 0, "lt": 65536}}))
@via("mcp", _MCPF)
def volume_write(volume: str, path: str, data: bytes, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> None:
    """Write a file into a volume (missing parent directories are made); LimitExceeded past the quota."""

@via("cli", Cli("volume ls", args=("volume", "path?")))
@op("list", http=Http(_G, "/volumes/{volume}/ls", query=("path", "depth"), name="list_volume_dir", bounds={"depth": {"ge": 1, "le": 64}}))
@via("mcp", _MCPF)
def volume_ls(volume: str, path: str = "/", *, depth: int = 1) -> list[dict]:
    """The entries under a directory of a volume, `depth` levels deep: name, type, path, size, mode, uid, gid, times."""

@via("cli", Cli("volume stat"))
@op("list", http=Http(_G, "/volumes/{volume}/stat", query=("path",), name="stat_volume_path"))
@via("mcp", _MCPF)
def volume_stat(volume: str, path: str) -> dict:
    """A path of a volume (a link itself): name, type, path, size, mode, uid, gid, atime, mtime, ctime, target."""

@via("cli", Cli("volume mkdir"))
@op("run", audit="volume mkdir", http=Http(_P, "/volumes/{volume}/mkdir", query=("path", "mode", "uid", "gid"), name="make_volume_dir", echo={"path": "path"}, bounds={"mode": {"ge": 0, "le": 0o7777}, "uid": {"ge": 0, "lt": 65536}, "gid": {"ge": 0, "lt": 65536}}))
@via("mcp", _MCPF)
def volume_mkdir(volume: str, path: str, *, mode: int = 0o755, uid: int = 0, gid: int = 0) -> None:
    """Make a directory of a volume and any missing parents (mkdir -p)."""

@via("cli", Cli("volume unlink"))
@op("run", audit="volume remove", http=Http(_X, _VF, query=("path",), name="remove_volume_file", status=204))
@via("mcp", _MCPF)
def volume_remove(volume: str, path: str) -> None:
    """Remove a file, a link or an empty directory of a volume."""
