"""What each test needs, as markers (registered in pyproject.toml; tests/README.md lists them), so
`pytest -m "not gvisor"`, `-m "not postgres and not s3"` or `-m "not root"` select what a machine can run.

Derived where the test itself says it (its fixtures, its parameters, its own code naming the gVisor
tier), else from its folder or its module (the tables below): one place, not a line in every file.
conftest.py applies them before pytest's -m selection.
"""

from __future__ import annotations

import glob
import inspect
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# Every test of these folders runs sandboxes, makes namespaces or mounts, or starts a server that does.
FOLDER_MARKS = {
    "kernel": ("root",),
    "security": ("root",),
    "integrations": ("root",),
    "e2e": ("root",),
}

# What a module needs that its fixtures do not say (a module-scoped rig, a helper called in the test).
MODULE_MARKS = {
    # sandboxes on the real kernel from folders that otherwise need none
    "test_async": ("root",),
    "test_engine_parts": ("root",),
    "test_runtime_interface": ("root",),
    # network namespaces: the test-made internet (netlab, portnet), egress links and their daemon
    "test_egress_fastpath": ("network",),
    "test_egress_http": ("network",),
    "test_egress_links": ("network",),
    "test_egress_proxy": ("network",),
    "test_egress_recycle": ("network",),
    "test_egress_resolv": ("network",),
    "test_egress_warm": ("network",),
    "test_network_hibernate": ("network",),
    "test_network_pip": ("network", "slow"),
    "test_e2b_interpreter_plots": ("network", "slow"),
    "test_build_network": ("network",),
    "test_ports": ("network",),
    "test_ports_limits": ("network",),
    "test_pool_recipes": ("network",),
    "test_hardening_egress": ("network",),
    "test_hardening_egress2": ("network",),
    "test_hardening_secrets": ("network",),
    "test_hardening_netlimits": ("network",),
    "test_network_surfaces": ("network",),
    "test_secret_store": ("network",),
    "test_eval": ("network",),
    "test_miniswe": ("network",),
    "test_harbor": ("network", "slow"),
    "test_evalset_repro": ("network",),
    "test_build_repro": ("network",),
    "test_newcomer": ("slow",),                     # a clone, `make demo`, the README tour
    # the gVisor tier throughout (a module fixture starts it, or every token is forced onto it)
    "test_gvisor_hibernate": ("gvisor",),
    "test_containers": ("gvisor", "network", "slow"),   # Docker inside gVisor; its image's build reaches the mirror
    "test_tier_policy": ("gvisor",),
    # services started for the module
    "test_cluster": ("ray", "postgres", "s3", "slow"),
    "test_replicas": ("postgres",),
    "test_pgstore": ("postgres",),
    "test_missing_layer": ("postgres",),
    # a headless Chromium
    "test_webpage": ("chromium",),
    "test_webpage_demo": ("chromium", "slow"),
    "test_webpage_scale": ("chromium", "slow"),
    "test_previews": ("chromium",),
}

# A fixture (anywhere in the test's closure) -> what it starts.
FIXTURE_MARKS = {
    "pg_cluster": ("postgres",),
    "s3_server": ("s3",),
    "store_objects": (),            # (S3 only when a backends module overrides it: by parameter below)
    "bookworm": ("slow",),          # debootstrap: a minute and a half, once a session
}

# A parameter value (each_tier, live_tier, a tier= or backend parametrize) -> what it needs.
PARAM_MARKS = {
    "gvisor": ("gvisor",),
    "postgresql": ("postgres",),
    "postgresql+s3": ("postgres", "s3"),
    "sqlite+s3": ("s3",),
}


TIER_NAMES = {"namespaces", "gvisor"}


def _check_tables() -> None:
    """A module renamed or gone must not leave its marks behind silently."""
    names = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "**", "test_*.py"), recursive=True)}
    gone = sorted(set(MODULE_MARKS) - names)
    if gone:
        raise pytest.UsageError(f"tests/marks.py names modules that do not exist: {gone}")


def _names_gvisor(item) -> bool:
    """The test's own code asks for the gVisor tier (tier="gvisor", tier_or_skip(..., "gvisor"))."""
    fn = getattr(item, "function", None)
    try:
        return fn is not None and '"gvisor"' in inspect.getsource(fn)
    except (OSError, TypeError):
        return False


def marks_of(item) -> set[str]:
    path = str(item.path)
    rel = os.path.relpath(path, HERE).split(os.sep)
    got = set(FOLDER_MARKS.get(rel[0], ())) if len(rel) > 1 else set()
    got.update(MODULE_MARKS.get(os.path.basename(path)[:-3], ()))
    for name in getattr(item, "fixturenames", ()):
        got.update(FIXTURE_MARKS.get(name, ()))
    callspec = getattr(item, "callspec", None)
    params = [v for v in callspec.params.values() if isinstance(v, str)] if callspec is not None else []
    for value in params:
        got.update(PARAM_MARKS.get(value, ()))
    # a test parametrized by tier says which it is by its parameter (its code may name the other)
    if "gvisor" not in got and not set(params) & TIER_NAMES and _names_gvisor(item):
        got.add("gvisor")
    return got


def apply(items) -> None:
    _check_tables()
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for name in sorted(marks_of(item) - have):
            item.add_marker(name)
