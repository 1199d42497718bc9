"""tests/kernel/test_run.py on every store backend (tests/backends.py)."""

from backends import bb, each_tier, live_tier, shared_st, store_database  # noqa: F401 - fixtures per backend
from test_run import *  # noqa: F401,F403 - its tests and fixtures, collected here again
