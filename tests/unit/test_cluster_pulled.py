"""A node's streams pulled instead of streamed (cluster/pulled.py: what a caller on Ray Client
gets, which has no generator methods): the items of real generators, in order, batched, their
end, their error after the items before it, an unpulled stream dropped. Through Ray itself:
tests/integrations/test_cluster.py test_ray_client_reaches_the_cluster."""

from __future__ import annotations

import threading
import time

import pytest

from sandtree.cluster import pulled
from sandtree.cluster.pulled import Pulled
from sandtree.errors import InvalidInput, NotFound


def _pull_all(p: Pulled, key: str) -> tuple[list, int]:
    items, pulls = [], 0
    while True:
        got, ended = p.pull(key, 5.0)
        pulls += 1
        items += got
        if ended:
            return items, pulls


def test_items_in_order_batched_then_the_end():
    gate = threading.Event()

    def gen():
        yield ("up", None)
        gate.wait(10)                       # (the first pull takes "up" alone)
        for i in range(500):
            yield ("output", [("stdout", b"%d\n" % i)])
        yield ("result", 7)
    p = Pulled()
    p.open("k", gen())
    assert p.pull("k", 5.0) == ([("up", None)], False)
    assert p.pull("k", 0.05) == ([], False)     # nothing yet: an empty answer after `wait`
    gate.set()
    items, pulls = _pull_all(p, "k")
    assert items == [("output", [("stdout", b"%d\n" % i)]) for i in range(500)] + [("result", 7)]
    assert pulls < len(items)                   # what came meanwhile comes in one answer
    with pytest.raises(NotFound):               # ended: gone
        p.pull("k", 0.05)


def test_an_error_comes_after_the_items_before_it():
    def gen():
        yield ("output", [("stdout", b"a")])
        raise InvalidInput("bad command")
    p = Pulled()
    p.open("k", gen())
    got = []
    with pytest.raises(InvalidInput, match="bad command"):
        while True:
            items, ended = p.pull("k", 5.0)
            got += items
            assert not ended
    assert got == [("output", [("stdout", b"a")])]
    with pytest.raises(NotFound):
        p.pull("k", 0.05)


def test_a_stream_nobody_pulls_is_dropped_and_closed(monkeypatch):
    closed = threading.Event()
    produced = []

    def gen():
        try:
            for i in range(1000):
                produced.append(i)
                time.sleep(0.01)
                yield i
        finally:
            closed.set()
    monkeypatch.setattr(pulled, "ABANDONED_S", 0.0)
    p = Pulled()
    p.open("old", gen())
    p.open("new", iter(()))            # (opening sweeps: "old" was not pulled for ABANDONED_S)
    with pytest.raises(NotFound):
        p.pull("old", 0.05)
    assert closed.wait(10) and len(produced) < 1000      # no longer driven
    assert p.pull("new", 5.0) == ([], True)
