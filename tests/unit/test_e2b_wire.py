"""E2B's wire translations (http/e2b/wire.py) that need no server: network options onto sandtree
policies, the list's metadata and state filters, its page tokens. The SDK against a real server:
tests/e2e/test_e2b_control.py."""

import urllib.parse

import pytest

from sandtree.errors import InvalidInput
from sandtree.http.e2b.wire import NetworkIn, from_page_token, metadata_filter, network_option, page_token, states_filter


def net(**kw):
    return NetworkIn(**kw)


@pytest.mark.parametrize("internet, network, default, policy", [
    (None, None, "all", "all"),                                       # E2B's default: the server's
    (None, None, "off", None),
    (None, None, "pypi.org", "pypi.org"),
    (True, None, "off", "all"),                                       # asked for: the internet
    (False, None, "all", None),
    (None, net(allowOut=["1.1.1.1", "example.org"]), "off", {"allow_out": ["1.1.1.1", "example.org"]}),
    (False, net(allowOut=["example.org"]), "all", {"allow_out": ["example.org"]}),      # allowOut wins
    (None, net(allowOut=["example.org"], denyOut=["0.0.0.0/0"]), "all", {"allow_out": ["example.org"]}),
    (None, net(allowOut=["0.0.0.0/0"]), "off", {"allow_out": ["*"]}),
    (None, net(denyOut=["0.0.0.0/0"]), "all", None),
    (None, net(denyOut=["10.0.0.0/8"]), "off", {"allow_out": ["*"], "deny_out": ["10.0.0.0/8"]}),
    (True, net(denyOut=["bad.example.org"]), "off", {"allow_out": ["*"], "deny_out": ["bad.example.org"]}),
])
def test_network_options(internet, network, default, policy):
    assert network_option(internet, network, default) == policy


def test_metadata_filter_reads_what_the_sdk_sends():
    meta = {"user id": "a&b=c", "k/2": "ü"}
    sent = urllib.parse.urlencode({urllib.parse.quote(k): urllib.parse.quote(v) for k, v in meta.items()})
    assert metadata_filter(sent) == meta
    assert metadata_filter(None) is None and metadata_filter("") is None
    with pytest.raises(InvalidInput):
        metadata_filter("no-equals-sign")


def test_states_and_page_tokens():
    assert states_filter(None) == {"running", "paused"} and states_filter("paused") == {"paused"}
    with pytest.raises(InvalidInput):
        states_filter("running,sleeping")
    assert from_page_token(page_token(1700000000.25, "ab" * 16)) == (1700000000.25, "ab" * 16)
    for bad in ("garbage", "", "e30"):
        with pytest.raises(InvalidInput):
            from_page_token(bad)
