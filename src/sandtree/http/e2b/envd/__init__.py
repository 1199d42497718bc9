"""envd, E2B's in-sandbox API, served by sandtree for each live sandbox on port 49983 (dispatch.py):
Connect-RPC process.Process and filesystem.Filesystem, HTTP /files and /health. app.py composes
them: each part registers its path prefix there as it loads (imported below)."""

from . import app  # noqa: F401 - registers envd's port with dispatch.py
from . import files  # noqa: F401,E402 - registers /files with app.py
from importlib.util import find_spec as _find  # noqa: E402

if _find("connectrpc") is not None and _find("e2b") is not None:      # the `e2b` extra: the Connect services
    from . import filesystem  # noqa: F401 - registers filesystem.Filesystem with app.py
    from . import process  # noqa: F401 - registers process.Process with app.py
