"""What Contree's /v1 means that sandtree's own API says differently, kept apart from the routes
(contree/routes.py) and the wire shapes (contree/wire.py): `~` in an inspected path, a spawn that cannot
start, `preserve_cwd`, `networking`, and the operation list that holds image imports too.

Each follows contree-client 0.4.4's OpenAPI document (InstanceSpawnRequest, EventDataCompletion,
listOperations); where sandtree cannot do what a field asks, a clear refusal, never silence.
"""

from __future__ import annotations

import posixpath

from ...errors import InvalidInput, NotFound, SandtreeError
from ...engine import CONFIG_PATH

__all__ = ["image_path", "spawn_failure", "preserve_cwd_file", "preserve_env_files", "network_for", "list_operations"]

_MAX_PASSWD = 1 << 20


def _homes(engine, image: str) -> dict[str, str]:
    """name -> home directory, and "" -> uid 0's, from the image's /etc/passwd (none: /root)."""
    homes: dict[str, str] = {}
    try:
        data = engine.read(image, "/etc/passwd")
    except SandtreeError:
        data = b""
    for line in data[:_MAX_PASSWD].decode("utf-8", "replace").splitlines():
        f = line.split(":")
        if len(f) >= 6 and f[5].startswith("/"):
            homes.setdefault(f[0], f[5])
            if f[2] == "0":
                homes.setdefault("", f[5])                   # the first uid 0 entry
    homes.setdefault("", "/root")
    return homes


def image_path(engine, image: str, path: str) -> str:
    """A path as Contree's inspect endpoints take it: `~` and `~/x` are uid 0's home (what a run
    gets: Contree runs as uid 0 unless told otherwise), `~name` that user's; a relative path is
    relative to the image's working directory (its config's, else /)."""
    if path.startswith("~"):
        head, sep, rest = path[1:].partition("/")
        homes = _homes(engine, image)
        if head not in homes:
            raise NotFound(f"no user {head!r} in the image's /etc/passwd (for {path!r})")
        path = homes[head] + (sep + rest if sep else "")
    elif not path.startswith("/"):
        path = posixpath.join(engine.image_config(image).cwd or "/", path)
    return path


def spawn_failure(outcome: dict | None) -> str | None:
    """The error of a run whose command could not be started, as Contree words it
    (EventDataCompletion.error: "spawn failed: exec /run/entrypoint: no such file"); None for
    any other outcome."""
    outcome = outcome or {}
    if outcome.get("error") != "command_not_found":
        return None
    return f"spawn failed: {outcome.get('message', '')}"


def preserve_cwd_file(engine, image: str, cwd: str | None, disposable: bool) -> dict | None:
    """preserve_cwd: the resolved initial working directory (cwd, else the image's, else /)
    saved as the result image's default (its config file, written by the run like any injected
    file) when it differs. A disposable run keeps no image: nothing to write (as Contree says)."""
    if disposable:
        return None
    config = engine.image_config(image)
    resolved = cwd or config.cwd or "/"
    if config.cwd == resolved or (config.cwd is None and resolved == "/"):
        return None
    return {"path": CONFIG_PATH, "content": config.replace(cwd=resolved).to_json(), "mode": 0o644}


def preserve_env_files(engine, image: str, env: dict, disposable: bool, files: list) -> list:
    """preserve_env: the image's environment with the run's `env` over it (a null or empty value
    removes the name) saved as the result image's default, written like preserve_cwd's file (over
    it, if that is in `files`). Returns the run's files; a disposable run keeps no image."""
    if disposable:
        return files
    earlier = next((f for f in files if f.get("path") == CONFIG_PATH and "content" in f), None)
    config = type(engine.image_config(image)).from_json(earlier["content"]) if earlier else engine.image_config(image)
    merged = dict(config.env)
    for k, v in env.items():
        if v is None or v == "":
            merged.pop(k, None)
        else:
            merged[k] = v
    if tuple(merged.items()) == tuple(config.env):
        return files
    out = [f for f in files if f is not earlier]
    return out + [{"path": CONFIG_PATH, "content": config.replace(env=tuple(merged.items())).to_json(), "mode": 0o644}]


def network_for(enabled: bool | None, default_policy: str) -> str | None:
    """networking.enabled: the server's default policy (SANDTREE_NETWORK_DEFAULT); false or absent:
    none. A request for network on a server whose default is "off" is refused, not run offline."""
    if not enabled:
        return None
    if default_policy.strip().lower() in ("off", "none", ""):
        raise InvalidInput("networking.enabled: this server gives runs no network (SANDTREE_NETWORK_DEFAULT=off)")
    return default_policy


def list_operations(engine, kind: str | None, status: str | None, limit: int) -> list[dict]:
    """Contree's operations (instances and image imports), newest first: kind "instance", "image_import"
    or None for both."""
    kinds = {"instance": ["run"], "image_import": ["import"], None: ["run", "import"]}[kind]
    recs = [r for k in kinds for r in engine.operations.list(status=status, limit=limit, kind=k)]
    return sorted(recs, key=lambda r: r.get("started") or 0, reverse=True)[:limit]
