"""One client per store or server for the whole process, shared by an integration's tasks, samples
and trials: an engine keeps its store's database and runtime open, and opening one per sample or
trial would cost more than the sandbox it starts."""

from __future__ import annotations

import os
import threading

from .. import config as settings
from ..client.sdk import Sandtree, connect

__all__ = ["shared", "close_all"]

_clients: dict[tuple, Sandtree] = {}
_lock = threading.Lock()


def shared(url: str | None = None, token: str | None = None, home: str | None = None) -> Sandtree:
    """The process's client of the server at `url` (with `token`, else the configured one), else of
    the store at `home` (else the default store)."""
    if url:
        key: tuple = ("url", url.rstrip("/"), token or settings.remote_token())
    else:
        key = ("home", os.path.abspath(home or settings.default_home()))
    with _lock:
        st = _clients.get(key)
        if st is None:
            st = connect(key[1], token=key[2]) if key[0] == "url" else Sandtree(key[1])
            _clients[key] = st
        return st


def close_all() -> None:
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for st in clients:
        st.close()
