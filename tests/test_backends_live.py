"""tests/test_live.py (live sandboxes: start, exec, commit, hibernate, lifetimes) on every store
backend (tests/backends.py): its shared store is made once per backend."""

from backends import bb, shared_st, store_database  # noqa: F401 - fixtures per backend
from test_live import *  # noqa: F401,F403 - its tests and fixtures, collected here again
