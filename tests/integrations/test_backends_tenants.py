"""tests/e2e/test_tenants.py's server (tokens, scopes, limits, audit, sharing over HTTP) on every store
backend (tests/backends.py): `sandtree serve --database postgresql://...` and its CLI."""

import pytest

from backends import BACKENDS
from test_tenants import *  # noqa: F401,F403 - its tests and fixtures, collected here again


@pytest.fixture(scope="module", params=BACKENDS)
def server_database(request):
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("pg_cluster").new_database()
