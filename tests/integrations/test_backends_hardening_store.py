"""tests/security/test_hardening_store.py (crafted tars, bundles, bombs, deep trees, fsck) on every store backend (tests/backends.py)."""

from backends import each_tier, live_tier, store_database  # noqa: F401 - the backend varies, the tier does not
from test_hardening_store import *  # noqa: F401,F403 - its tests and fixtures, collected here again
