"""Where settings come from: the only place (with the CLI) that reads the environment."""

from __future__ import annotations

import os


def default_home() -> str:
    home = os.environ.get("SANDTREE_HOME")
    if home:
        return home
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "sandtree")
