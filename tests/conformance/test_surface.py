"""Nothing that exists changes (issue 13): the Python API, /api/v1 and Contree /v1 (OpenAPI), the MCP
tools and the CLI verbs as recorded in tests/surface/ before the code was reorganised. Additions are
allowed; a lost name, a changed default, type or shape, or a newly required parameter fails."""

import json
import os

import pytest

import surface


@pytest.fixture(scope="module")
def now():
    return surface.collect()


@pytest.mark.parametrize("part", ["python", "openapi", "mcp", "cli"])
def test_surface_kept(now, part):
    with open(os.path.join(surface.SNAPSHOT, f"{part}.json")) as f:
        before = json.load(f)
    lost = surface.contains(before, json.loads(json.dumps(now[part])), part)
    assert not lost, "\n".join(lost[:40])


def test_no_new_required_parameter(now):
    before = {}
    with open(os.path.join(surface.SNAPSHOT, "python.json")) as f:
        before["python"] = json.load(f)
    assert not surface.new_required(before, now)


def test_the_comparison_catches_a_change():
    """The check itself: a lost key, a changed default and a newly required field are each found."""
    old = {"a": {"x": 1, "required": ["p"]}, "b": [{"n": "q"}]}
    assert surface.contains(old, {"a": {"x": 1, "y": 2, "required": ["p"]}, "b": [{"n": "q", "m": 1}]}) == []
    assert surface.contains(old, {"a": {"required": ["p"]}, "b": [{"n": "q"}]})
    assert surface.contains(old, {"a": {"x": 2, "required": ["p"]}, "b": [{"n": "q"}]})
    assert surface.contains(old, {"a": {"x": 1, "required": ["p", "r"]}, "b": [{"n": "q"}]})
    assert surface.contains(old, {"a": {"x": 1, "required": ["p"]}, "b": [{"n": "z"}]})
