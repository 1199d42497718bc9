"""An image's run defaults: its config (store/imageconfig.py, the file CONFIG_PATH in
the image) read, and turned into what a run, a live sandbox or a pooled run gets when its caller
leaves env, cwd or user out: DEFAULT_ENV + the config's env + the caller's; the config's working
directory (else "/"); the config's user resolved in the image's own /etc/passwd and /etc/group.

Whatever the caller passes explicitly wins. The image is untrusted: the config and the account
files are read with size caps, and a name that cannot be resolved is InvalidInput naming it."""

from __future__ import annotations

import collections
import threading

from ...errors import InvalidInput, NotFound, PathEscape
from ...store import inspect
from ...store.imageconfig import CONFIG_PATH, MAX_CONFIG_BYTES, ImageConfig
from ...store.objects import FILE
from ...store.store import Store
from ...values import DEFAULT_ENV

__all__ = ["default_command", "image_config", "resolve_user", "user_names", "RunDefaults", "run_defaults", "MAX_ACCOUNT_FILE", "MAX_ID"]

MAX_ACCOUNT_FILE = 4 << 20        # /etc/passwd or /etc/group larger than this is refused
MAX_ID = (1 << 32) - 2


def _read_capped(store: Store, image: str, path: str, cap: int) -> bytes | None:
    """A regular file's bytes (None if absent or not a regular file), refused over `cap`."""
    try:
        _, e = inspect.resolve(store, image, path)
    except (NotFound, PathEscape, InvalidInput):
        return None
    if e.kind != FILE:
        return None
    if e.size > cap:
        raise InvalidInput(f"{path} in the image is over {cap} bytes", path=path)
    with store.blobs.open(e.ref) as f:
        return f.read(cap + 1)


def image_config(store: Store, image: str) -> ImageConfig:
    """The config an image carries (the empty config when it has none)."""
    data = _read_capped(store, image, CONFIG_PATH, MAX_CONFIG_BYTES)
    return ImageConfig() if data is None else ImageConfig.from_json(data)


def _numeric(s: str) -> int | None:
    if s.isascii() and s.isdigit():
        n = int(s)
        if n > MAX_ID:
            raise InvalidInput(f"user or group id {s} is out of range")
        return n
    return None


def _accounts(store: Store, image: str, path: str) -> list[list[str]]:
    data = _read_capped(store, image, path, MAX_ACCOUNT_FILE)
    if data is None:
        return []
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()
            if line and not line.startswith("#")]


def user_names(store: Store, image: str) -> dict[int, str]:
    """uid -> name of the image's /etc/passwd (the first name of a uid)."""
    names: dict[int, str] = {}
    for fields in _accounts(store, image, "/etc/passwd"):
        uid = _numeric(fields[2]) if len(fields) >= 4 else None
        if uid is not None:
            names.setdefault(uid, fields[0])
    return names


def resolve_user(store: Store, image: str, user: str) -> tuple[int, int]:
    """(uid, gid) for "NAME|UID[:GROUP|GID]" as Docker's USER: a name must be in the image's
    /etc/passwd (a group name in /etc/group); a numeric uid works without them, its gid then
    the passwd entry's or 0."""
    name, sep, group = user.partition(":")
    if not name or (sep and not group):
        raise InvalidInput(f"bad user {user!r} (USER NAME|UID[:GROUP|GID])")
    uid = _numeric(name)
    gid = None
    passwd = _accounts(store, image, "/etc/passwd")
    for fields in passwd:
        if len(fields) >= 4 and (fields[0] == name if uid is None else fields[2] == name):
            uid, gid = _numeric(fields[2]), _numeric(fields[3])
            break
    if uid is None:
        raise InvalidInput(f"user {name!r} is not in the image's /etc/passwd", user=name)
    if sep:
        gid = _numeric(group)
        if gid is None:
            for fields in _accounts(store, image, "/etc/group"):
                if len(fields) >= 3 and fields[0] == group:
                    gid = _numeric(fields[2])
                    break
            if gid is None:
                raise InvalidInput(f"group {group!r} is not in the image's /etc/group", group=group)
    return uid, 0 if gid is None else gid


class RunDefaults:
    """What a command on an image gets: env (DEFAULT_ENV + config + caller), cwd, uid, gid."""
    __slots__ = ("env", "cwd", "uid", "gid", "config")

    def __init__(self, env: dict, cwd: str, uid: int, gid: int, config: ImageConfig):
        self.env, self.cwd, self.uid, self.gid, self.config = env, cwd, uid, gid, config


# An image ID is its content's hash: its config and the ids its USER resolves to never change, so
# they are kept per ID (every run asks; reading the two files costs ~0.3 ms, a hit ~10 us).
_CACHE: collections.OrderedDict = collections.OrderedDict()
_CACHE_MAX = 1024
_LOCK = threading.Lock()


def _image_defaults(store: Store, image: str) -> tuple[ImageConfig, tuple[int, int] | None]:
    with _LOCK:
        hit = _CACHE.get(image)
        if hit is not None:
            _CACHE.move_to_end(image)
            return hit
    cfg = image_config(store, image)
    ids = resolve_user(store, image, cfg.user) if cfg.user else None     # (an error is not kept)
    with _LOCK:
        _CACHE[image] = (cfg, ids)
        if len(_CACHE) > _CACHE_MAX:
            _CACHE.popitem(last=False)
    return cfg, ids


def run_defaults(store: Store, image: str, *, env: dict | None, cwd: str | None, uid: int | None,
                 gid: int | None) -> RunDefaults:
    """The caller's env/cwd/uid/gid over the image's defaults. An explicit uid without a gid
    keeps gid 0 (as before configs existed); a gid alone keeps the image's uid."""
    cfg, ids = _image_defaults(store, image)
    user_env = {str(k): str(v) for k, v in (env or {}).items()}
    full = {**DEFAULT_ENV, **dict(cfg.env), **user_env}
    if uid is None:
        img_uid, img_gid = ids or (0, 0)
        uid = img_uid
        gid = img_gid if gid is None else gid
    elif gid is None:
        gid = 0
    for what, v in (("uid", uid), ("gid", gid)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ID:
            raise InvalidInput(f"{what} must be an id from 0 to {MAX_ID}, not {v!r}")
    return RunDefaults(full, cwd if cwd is not None else (cfg.cwd or "/"), uid, gid, cfg)


def default_command(store: Store, image: str) -> list[str]:
    """The command a run given none runs: the image's ENTRYPOINT followed by its CMD (as `docker run IMAGE`);
    InvalidInput when the image has neither."""
    cfg, _ = _image_defaults(store, image)
    argv = list(cfg.entrypoint or ()) + list(cfg.cmd or ())
    if not argv:
        raise InvalidInput("no command given and the image has no CMD or ENTRYPOINT: give one (-- CMD ARGS)")
    return argv
