"""tests/kernel/test_ephemeral.py on every store backend (tests/backends.py)."""

from backends import store_database  # noqa: F401 - the fixture that parametrizes the backend
from test_ephemeral import *  # noqa: F401,F403 - its tests and fixtures, collected here again
