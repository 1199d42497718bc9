"""The hint a failed step earns when its output shows it tried to reach the network without one (values.py):
what a build's BuildFailed and an evaluation's failed run append (the CLI's build test sees it end to end)."""

from __future__ import annotations

from sandtree.values import NETWORK_HINT, network_hint


def test_the_resolvers_and_sockets_words_earn_the_hint():
    for out in (b"wget: bad address 'pypi.org'\n",
                b"pip._vendor.urllib3.exceptions.NewConnectionError: ... Temporary failure in name resolution",
                b"curl: (6) Could not resolve host: example.org",
                b"ssh: connect to host github.com port 22: Network is unreachable",
                b"Err:1 http://deb.debian.org bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'\n"
                b"Could not resolve 'deb.debian.org'"):
        assert network_hint(b"", out) == NETWORK_HINT, out
    assert "--network" in NETWORK_HINT


def test_other_failures_earn_none():
    for out in (b"", b"FAILED tests/test_x.py::test_add - assert 3 == 4", b"make: *** [all] Error 2",
                b"E: Unable to locate package nosuch"):
        assert network_hint(out, out) is None, out
