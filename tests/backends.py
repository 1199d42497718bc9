"""The store backend conformance suite (issue 20), as dulwich runs its object-store tests on every
backend: a test_backends_*.py module imports an existing store test module's tests and fixtures
and this `store_database` fixture, so each of those tests runs on SQLite and on PostgreSQL (a
fresh database of the session's throwaway cluster, tests/pgcluster.py; skipped with the reason
only when PostgreSQL cannot start). The source modules alone keep running on SQLite only.

Objects in S3 (issue 20): a test_backends_s3_*.py module imports `s3_store_database` and
`s3_store_objects` instead, which run its tests on SQLite+S3 and PostgreSQL+S3: a fresh bucket
of the session's SeaweedFS server (tests/s3server.py), named to the test's own stores by the
`st` fixture and, for stores a test or its subprocess opens itself, by SANDTREE_OBJECTS_URL."""

import pytest

# SQLite: the source modules themselves (run on it); here PostgreSQL, so nothing runs twice on one backend
BACKENDS = ["postgresql"]


@pytest.fixture(params=BACKENDS)
def store_database(request):
    if request.param == "sqlite":
        return None
    return request.getfixturevalue("pg_cluster").new_database()


@pytest.fixture(scope="module", params=BACKENDS)
def shared_st(request, tmp_path_factory):
    """conftest's session-wide shared store, once per backend for a module that imports it."""
    import sandtree
    database = None if request.param == "sqlite" else request.getfixturevalue("pg_cluster").new_database()
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("home-shared")), database=database)
    yield st
    st.close()


@pytest.fixture(scope="module")
def bb(shared_st, rootfs):
    """The busybox image in that store (conftest's `bb`, at module scope)."""
    return shared_st.import_image(rootfs, tag="busybox")


# The store backend is what varies in these modules: each test runs on the namespaces tier only. A tier
# touches the store through the same engine calls; both tiers run on SQLite in the source modules.
@pytest.fixture
def each_tier():
    return "namespaces"


@pytest.fixture
def live_tier():
    return "namespaces"


S3_BACKENDS = ["sqlite+s3", "postgresql+s3"]


@pytest.fixture(name="store_database", params=S3_BACKENDS)
def s3_store_database(request):
    if request.param.startswith("sqlite"):
        return None
    return request.getfixturevalue("pg_cluster").new_database()


@pytest.fixture(name="store_objects")
def s3_store_objects(s3_server, monkeypatch):
    url = f"s3://{s3_server.new_bucket()}/store"
    monkeypatch.setenv("SANDTREE_OBJECTS_URL", url)    # stores the test (or its workers) open themselves
    return url


@pytest.fixture(name="shared_st", scope="module", params=S3_BACKENDS)
def s3_shared_st(request, tmp_path_factory):
    import sandtree
    database = None if request.param.startswith("sqlite") else request.getfixturevalue("pg_cluster").new_database()
    objects = f"s3://{request.getfixturevalue('s3_server').new_bucket()}/shared"
    st = sandtree.Sandtree(str(tmp_path_factory.mktemp("home-shared")), database=database, objects=objects)
    yield st
    st.close()
