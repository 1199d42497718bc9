"""tests/kernel/test_durability.py (kill -9 mid-import and mid-commit) with objects in S3, on SQLite and
PostgreSQL (tests/backends.py): two of its moments (mid-import, mid-commit), to keep make test short."""

import pytest

from backends import s3_store_database, s3_store_objects  # noqa: F401 - the fixtures that pick the backends
from test_durability import big_dir  # noqa: F401 - its fixture
from test_durability import test_kill_9_mid_import_and_commit as kill_9


@pytest.mark.parametrize("delay", [0.6, 1.3])
def test_kill_9_mid_import_and_commit_s3(tmp_path, rootfs, big_dir, delay, store_database, store_objects):  # noqa: F811
    kill_9(tmp_path, rootfs, big_dir, delay, store_database)     # the worker finds the bucket in SANDTREE_OBJECTS_URL
