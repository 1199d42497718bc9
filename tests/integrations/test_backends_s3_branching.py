"""tests/kernel/test_branching.py with objects in S3 (tests/backends.py), on PostgreSQL only: branching
reads and writes objects through the same store calls on either metadata backend (SQLite+S3 runs
the store suite, test_backends_s3_store.py, and the durability moments), so one combination here
keeps make test short."""

import pytest

from backends import s3_store_objects  # noqa: F401 - the fixture that puts objects in S3
from test_branching import *  # noqa: F401,F403 - its tests and fixtures, collected here again


@pytest.fixture(name="store_database")
def pg_store_database(pg_cluster):
    return pg_cluster.new_database()
