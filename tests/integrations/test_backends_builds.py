"""tests/kernel/test_builds.py on every store backend (tests/backends.py)."""

from backends import bb, shared_st, store_database  # noqa: F401 - fixtures per backend
from test_builds import *  # noqa: F401,F403 - its tests and fixtures, collected here again
