"""A build step's cache key and its network policy (issue 37): the same rules in any order and any
equivalent spelling are one key (network.policy.canonical), a different rule set is another, and
the canonical form decides every lookup and connection as the policy it came from (checked on
random policies against random destinations). The build itself on the real kernel:
tests/kernel/test_build_repro.py."""

from __future__ import annotations

import ipaddress
import random

from sandtree.engine.builds.cache import step_key
from sandtree.network.policy import Policy, canonical


def key(rules) -> str:
    return step_key("a" * 64, "RUN pip install x", network=Policy.from_value(rules), tier="namespaces")


def test_order_and_spelling_do_not_change_the_key():
    base = key(["pypi.org", "files.pythonhosted.org", "203.0.113.80:443"])
    for same in (["203.0.113.80:443", "files.pythonhosted.org", "pypi.org"],
                 ["PyPI.org.", "files.pythonhosted.org", "203.0.113.80/32:443"],        # case, root dot, /32
                 ["pypi.org", "pypi.org:443", "files.pythonhosted.org", "203.0.113.80:443,443"],   # covered, repeated
                 "files.pythonhosted.org,pypi.org,203.0.113.80:443",                     # one string
                 {"allow_out": ["pypi.org", "files.pythonhosted.org", "203.0.113.80:443"]}):
        assert key(same) == base, same
    assert key(["10.1.2.3/8", "x.org:80,81-90,443"]) == key(["x.org:443,80-90", "10.0.0.0/8"])
    assert key(["[2001:DB8::1]", "x.org:1-65535"]) == key(["x.org", "2001:db8::1/128"])
    assert key(["*"]) == key("all") == key(True) == key(["0.0.0.0/0"])


def test_a_different_rule_set_is_another_key():
    base = key(["pypi.org", "files.pythonhosted.org"])
    for other in (["pypi.org"], ["pypi.org", "files.pythonhosted.org:443"], ["pypi.org", "*.pythonhosted.org"],
                  {"allow_out": ["pypi.org", "files.pythonhosted.org"], "deny_out": ["evil.org"]}, "all"):
        assert key(other) != base, other
    assert key(None) != base
    # a deny rule with every port listed leaves the name's lookup alone; one without ports refuses it
    assert key({"deny_out": ["y.org:1-65535"]}) != key({"deny_out": ["y.org"]})


def test_canonical_spelling():
    p = Policy.from_value({"allow_out": ["x.org:443,80", "x.org:81-100", "*", "10.9.8.7/8", "A.b."],
                           "deny_out": ["z.org:22", "z.org", "y.org:1-100,101-65535"]})
    assert canonical(p).to_json() == {"allow_out": ["*", "a.b", "x.org:80-100,443", "10.0.0.0/8"],
                                      "deny_out": ["y.org:1-65535", "z.org"]}
    assert canonical(None) is None
    assert canonical(canonical(p)) == canonical(p)


NAMES = ["a.org", "b.a.org", "c.b.a.org", "x.org", "y.net"]
IPS = ["93.184.216.34", "93.184.216.99", "8.8.8.8", "10.0.0.5", "10.1.0.5", "2606:4700::1111", "2001:db8::5"]
PORTS = [22, 80, 443, 8080]


def _rule(rng) -> str:
    host = rng.choice(["a.org", "A.org.", "*.a.org", "b.a.org", "x.org", "*", "93.184.216.0/24",
                       "93.184.216.34", "10.0.0.0/8", "10.0.0.7/16", "[2606:4700::]/32", "[2001:db8::5]"])
    ports = rng.choice(["", "", ":443", ":80,443", ":80-90", ":1-65535", ":22,8000-9000"])
    if host.startswith("[") and ports:
        return host + ports
    return host + ports


def test_canonical_decides_as_the_policy_does():
    rng = random.Random(37)
    for _ in range(300):
        allow = [_rule(rng) for _ in range(rng.randint(1, 5))]
        deny = [_rule(rng) for _ in range(rng.randint(0, 3))]
        rng.shuffle(allow)
        p = Policy.from_value({"allow_out": allow, "deny_out": deny})
        c = canonical(p)
        for name in NAMES:
            assert p.resolves(name).allowed == c.resolves(name).allowed, (allow, deny, name)
        for ip in IPS:
            for port in PORTS:
                names = [rng.choice(NAMES)] if rng.random() < 0.7 else []
                addr = ipaddress.ip_address(ip)
                assert p.connect(names, addr, port).allowed == c.connect(names, addr, port).allowed, \
                    (allow, deny, names, ip, port)
