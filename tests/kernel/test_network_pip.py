"""A real `pip install` from the package registry this machine reaches, allowed by name (issue 14).

The egress daemon's upstream is the host's own namespace here (no SANDTREE_EGRESS_NETNS), so the
sandbox's connections leave through the host: this is the one test that reaches outside the
machine, on purpose, and only to the package registry (pypi.org, files.pythonhosted.org). It is
skipped with the reason when that registry is unreachable or debootstrap cannot build an image.

On this machine every registry name resolves to one non-public address (203.0.113.80: the
sandbox host's package gateway). A policy refuses a public name that resolves to a non-public
address (DNS rebinding), so the policy names that address besides the names, as an operator of
such a site must; the names are what the record keeps and what SNI is checked against. That
gateway's TLS certificates are signed by a CA the host trusts (its system bundle) and a fresh
Debian image does not: the run is given the host's bundle (PIP_CERT), as a user here would.
The egress path itself does not touch the TLS of a connection without secrets."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket

import pytest

from sandtree.engine import Engine


NAMES = ["pypi.org", "files.pythonhosted.org"]
HOST_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def registry_rules() -> list[str]:
    # Only a name lookup here: the registry itself is reached only through the sandbox's egress
    # path (the run below skips when that finds it unreachable).
    try:
        ips = {a[4][0] for n in NAMES for a in socket.getaddrinfo(n, 443, socket.AF_INET)}
    except OSError as e:
        pytest.skip(f"the package registry's names do not resolve on this machine: {e}")
    # names, and the registry's own addresses where they are not public (see the module doc)
    return NAMES + sorted(f"{ip}:443" for ip in ips if not ipaddress.ip_address(ip).is_global)


@pytest.fixture(scope="module")
def eng(bookworm):
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    e = Engine(bookworm[0], warm=0)             # the session's Debian store (conftest.bookworm)
    yield e
    e.egress.stop_daemon()
    e.close()


@pytest.fixture(scope="module")
def py(eng):
    rules = registry_rules()
    image = eng.resolve("debian:bookworm")      # bootstrapped once a session, with pip (conftest)
    return image, rules


@pytest.mark.parametrize("tier", ["namespaces", "gvisor"])
def test_pip_install_from_the_registry_allowed_by_name(eng, py, tier):
    image, rules = py
    if tier == "gvisor" and not eng.tier("gvisor").available()[0]:
        pytest.skip(f"tier gvisor unavailable: {eng.tier('gvisor').available()[1]}")
    cmd = ("pip install --break-system-packages --no-cache-dir --disable-pip-version-check six==1.16.0 "
           "&& python3 -c 'import six; print(\"six\", six.__version__)'")
    with open(HOST_BUNDLE, "rb") as f:
        bundle = f.read()
    rec = eng.run(image, cmd, network=rules, tier=tier, env={"PIP_CERT": "/root/host-ca.pem"},
                  files=[{"path": "/root/host-ca.pem", "content": bundle}])
    net = eng.operation(rec.op)["outcome"]["usage"]["network"]
    if rec.exit_code != 0 and not net.get("bytes_in") and not net.get("refused"):
        # ({} when the link was gone at release: said in the reason, with pip's own words)
        pytest.skip(f"the registry is unreachable through the egress path (usage {net}): {rec.stderr.decode()[-300:]}")
    assert rec.exit_code == 0, rec.stderr.decode()[-2000:]
    assert b"six 1.16.0" in rec.stdout
    op = eng.operation(rec.op)
    assert op["spec"]["network"]["allow_out"][:2] == NAMES and op["spec"]["hermetic"] is False
    net = op["outcome"]["usage"]["network"]
    assert net["bytes_in"] > 10_000 and net["connections"] >= 1, net
    hosts = {h["host"] if isinstance(h, dict) else h for h in net["allowed_hosts"]}
    assert hosts & set(NAMES), net
    # the result image has the package; a run without network on it cannot fetch anything
    again = eng.run(rec.image, "python3 -c 'import six' && pip download --no-cache-dir -d /tmp/x six 2>&1; echo rc=$?")
    assert b"rc=0" not in again.stdout
