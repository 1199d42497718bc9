"""tests/test_hardening_store.py (crafted tars, bundles, bombs, deep trees, fsck) on every store backend (tests/backends.py)."""

from backends import store_database  # noqa: F401 - the fixture that parametrizes the backend
from test_hardening_store import *  # noqa: F401,F403 - its tests and fixtures, collected here again
