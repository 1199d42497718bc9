"""Network policy values and verdicts (network/policy.py): pure logic, no namespaces."""

import ipaddress

import pytest

from sandtree.errors import InvalidInput
from sandtree.network.policy import Grant, Policy, Rule

ip = ipaddress.ip_address


@pytest.mark.parametrize("value", [None, False, "off", "none", "", [], {"allow_out": []}])
def test_off_values(value):
    assert Policy.from_value(value) is None


@pytest.mark.parametrize("value", [True, "all", "internet", "*", "0.0.0.0/0", {"deny_out": []} and {"allow_out": ["*"]}])
def test_public_internet_values(value):
    p = Policy.from_value(value)
    assert p.connect([], ip("8.8.8.8"), 443).allowed
    assert p.resolves("anything.example").allowed


def test_canonical_json_round_trips_and_compares():
    a = Policy.from_value({"allow_out": ["Example.org.", "*.PyPI.org:443", "10.0.0.0/8:22,80-90", "[2001:db8::]/32:443"],
                           "deny_out": ["bad.example.org"]})
    j = a.to_json()
    assert j == {"allow_out": ["example.org", "*.pypi.org:443", "10.0.0.0/8:22,80-90", "[2001:db8::]/32:443"],
                 "deny_out": ["bad.example.org"]}
    assert Policy.from_json(j) == a
    assert Policy.from_value("example.org, *.pypi.org:443") == Policy.from_value(["example.org", "*.pypi.org:443"])


@pytest.mark.parametrize("bad", ["exa mple.org", "*foo.org", "foo.*.org", "host:0", "host:70000", "host:a",
                                 "[::1", "a..b", "-a.org", 5, "", "x" * 300])
def test_bad_rules_are_typed(bad):
    with pytest.raises(InvalidInput):
        Policy.from_value([bad])


def test_bad_shapes_are_typed():
    with pytest.raises(InvalidInput, match="unknown field"):
        Policy.from_value({"allow": ["x.org"]})
    with pytest.raises(InvalidInput):
        Policy.from_value(3.5)
    with pytest.raises(InvalidInput, match="at most"):
        Policy.from_value(["a.org"] * 300)


def test_names_suffixes_and_ports():
    p = Policy.from_value(["pypi.org", "*.pythonhosted.org:443"])
    assert p.connect(["pypi.org"], ip("151.101.0.223"), 80).allowed
    assert p.connect(["files.pythonhosted.org"], ip("151.101.0.223"), 443).allowed
    v = p.connect(["files.pythonhosted.org"], ip("151.101.0.223"), 80)
    assert not v.allowed and "not in the allow-list" in v.reason
    assert not p.connect(["pythonhosted.org"], ip("151.101.0.223"), 443).allowed   # *. is subdomains only
    assert not p.connect(["evilpypi.org"], ip("151.101.0.223"), 443).allowed
    assert not p.connect([], ip("151.101.0.223"), 443).allowed                     # no name, no net rule
    assert p.resolves("PyPI.org.").allowed and not p.resolves("example.com").allowed


def test_non_public_destinations_need_a_rule_naming_them():
    p = Policy.from_value("all")
    for addr, what in [("127.0.0.1", "loopback"), ("169.254.169.254", "link-local"), ("10.1.2.3", "private"),
                       ("192.168.1.1", "private"), ("100.64.0.1", "sandbox address"), ("fd00:ec2::254", "private"),
                       ("::1", "loopback"), ("::ffff:169.254.169.254", "")]:
        v = p.connect(["allowed.example"], ip(addr), 80)
        assert not v.allowed, addr
        assert what in v.reason, (addr, v.reason)
    # a name rule never reaches a private answer (DNS rebinding)
    assert not Policy.from_value(["db.example"]).connect(["db.example"], ip("10.0.0.5"), 5432).allowed
    # an explicit network rule does, on its ports only
    q = Policy.from_value(["10.0.0.0/24:5432"])
    assert q.connect([], ip("10.0.0.5"), 5432).allowed
    assert not q.connect([], ip("10.0.0.5"), 22).allowed
    # the egress host's own addresses are refused even when public
    assert not p.connect([], ip("11.2.3.4"), 80, own=[ip("11.2.3.4")]).allowed
    # sandboxes' own range: never, even when named
    assert not Policy.from_value(["100.64.0.0/16"]).connect([], ip("100.64.0.6"), 80).allowed


def test_deny_list_wins():
    p = Policy.from_value({"deny_out": ["*.bad.example", "203.0.113.0/24"]})
    assert p.connect(["good.example"], ip("8.8.4.4"), 443).allowed
    v = p.connect(["x.bad.example"], ip("8.8.4.4"), 443)
    assert not v.allowed and "*.bad.example" in v.reason
    assert not p.resolves("x.bad.example").allowed
    assert not p.connect([], ip("203.0.113.9"), 80).allowed


def test_grants():
    assert Grant.parse(None).rules == () and not Grant.parse("off").any
    pub = Grant.parse("all")
    assert Policy.from_value(["pypi.org", "*.example.org:443"]).within(pub) is None
    assert "beyond" in Policy.from_value(["10.0.0.0/8"]).within(pub)
    assert Policy.from_value(["10.0.0.0/8"]).within(Grant.parse("any")) is None
    g = Grant.parse(["*.example.org", "pypi.org:443"])
    assert Policy.from_value(["api.example.org"]).within(g) is None
    assert Policy.from_value(["pypi.org:443"]).within(g) is None
    assert "pypi.org" in Policy.from_value(["pypi.org"]).within(g)       # every port is more than 443
    assert Policy.from_value("all").within(g) is not None
    assert Grant.parse(g.to_json()) == g


def test_rule_text_round_trips():
    for text in ["*", "*:443", "example.org", "*.example.org:80,443", "10.0.0.0/8", "[2001:db8::]/32:1-1024"]:
        assert str(Rule.parse(text)) == text


# ---- IPv6: the same refusals as IPv4, and the forms that stand for an IPv4 address ----------------

def test_ipv6_non_public_destinations_mirror_ipv4():
    p = Policy.from_value("all")
    for addr, what in [("::1", "loopback"), ("fe80::1", "link-local"), ("fd00:1::5", "unique local"),
                       ("fc00::1", "unique local"), ("::", ""), ("ff02::1", "not a public"),
                       ("2001:db8::5", "private"), ("3fff::1", "not a public"), ("fec0::1", "not a public"),
                       ("::a9fe:a9fe", "not a public"), ("100::1", ""), ("2001::1", ""),
                       ("fd5a:6e64:7472::2", "sandbox address")]:
        v = p.connect(["allowed.example"], ip(addr), 80)
        assert not v.allowed, addr
        assert what in v.reason, (addr, v.reason)
    assert p.connect(["allowed.example"], ip("2600:1f18::10"), 443).allowed       # global unicast
    # the sandboxes' IPv6 range: never, even when named
    assert not Policy.from_value(["fd5a:6e64:7472::/64"]).connect([], ip("fd5a:6e64:7472::6"), 80).allowed


def test_ipv6_addresses_and_networks_are_allowed_by_rule():
    p = Policy.from_value(["fd00:5::/64", "[2001:db8::5]:443", "2600:1f18::10"])
    assert p.connect([], ip("fd00:5::10"), 80).allowed                         # a ULA, named by its network
    assert not p.connect([], ip("fd00:6::10"), 80).allowed
    assert p.connect([], ip("2001:db8::5"), 443).allowed and not p.connect([], ip("2001:db8::5"), 80).allowed
    assert p.connect([], ip("2600:1f18::10"), 22).allowed
    assert not p.connect([], ip("2600:1f18::11"), 22).allowed                 # (a rule names one address)
    assert p.to_json()["allow_out"] == ["[fd00:5::]/64", "[2001:db8::5]/128:443", "[2600:1f18::10]/128"]


@pytest.mark.parametrize("addr,inner", [("::ffff:169.254.169.254", "169.254.169.254"),
                                        ("::ffff:127.0.0.1", "127.0.0.1"), ("::ffff:10.1.2.3", "10.1.2.3"),
                                        ("64:ff9b::a9fe:a9fe", "169.254.169.254"), ("64:ff9b::7f00:1", "127.0.0.1"),
                                        ("2002:a9fe:a9fe::1", "169.254.169.254"), ("2002:a01:203::1", "10.1.2.3")])
def test_ipv6_forms_of_ipv4_addresses_are_checked_as_that_ipv4(addr, inner):
    """::ffff:a.b.c.d (a dual-stack socket reaches a.b.c.d), NAT64's 64:ff9b::/96 and 6to4's 2002::/16
    (a gateway may turn them into IPv4) are public only when their IPv4 address is."""
    p = Policy.from_value("all")
    assert not p.connect(["public.example"], ip(addr), 80).allowed
    assert not p.connect([], ip(addr), 80).allowed
    assert p.connect([], ip(inner), 80).reason.split(" is ")[-1] in p.connect([], ip(addr), 80).reason


def test_mapped_addresses_are_their_ipv4_in_rules_and_denials():
    # a rule written as ::ffff:a.b.c.d/n is a.b.c.d/(n-96), one canonical spelling
    assert Policy.from_value(["::ffff:10.0.0.0/104"]).to_json() == {"allow_out": ["10.0.0.0/8"]}
    assert Policy.from_value(["[::ffff:10.1.2.3]:5432"]).to_json() == {"allow_out": ["10.1.2.3/32:5432"]}
    q = Policy.from_value(["10.0.0.0/8"])
    assert q.connect([], ip("::ffff:10.1.2.3"), 80).allowed                  # the same destination
    # a denied IPv4 address is not reached by an IPv6 spelling of it
    d = Policy.from_value({"deny_out": ["8.8.8.8"]})
    assert d.connect([], ip("8.8.4.4"), 80).allowed and d.connect([], ip("64:ff9b::808:404"), 80).allowed
    for addr in ("8.8.8.8", "::ffff:8.8.8.8", "64:ff9b::808:808", "2002:808:808::1"):
        v = d.connect([], ip(addr), 80)
        assert not v.allowed and "8.8.8.8/32" in v.reason, (addr, v)
