"""tests/kernel/test_store.py with objects in S3, on SQLite and PostgreSQL (tests/backends.py)."""

from backends import s3_store_database, s3_store_objects  # noqa: F401 - the fixtures that pick the backends
from test_store import *  # noqa: F401,F403 - its tests and fixtures, collected here again
