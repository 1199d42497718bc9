"""A build's RUN with network (issue 15): `pip install` of a pinned package from the registry this
machine reaches, allowed by name, cached as a non-hermetic step; the same step without network
fails the build with the resolver's refusal in its error. The registry is reached only through the
sandbox's egress path (see test_network_pip.py for why the policy names the gateway's address and
why the host's CA bundle goes into the image); skipped with the reason when unreachable."""

from __future__ import annotations

import shutil

import pytest

from sandtree.engine import RecipeBuilder
from sandtree.errors import BuildFailed
from test_network_pip import HOST_BUNDLE, eng, registry_rules  # noqa: F401 - eng: the same fixture

PIP = ("pip install --break-system-packages --no-cache-dir --disable-pip-version-check six==1.16.0")


@pytest.fixture(scope="module")
def py(eng, tmp_path_factory):
    rules = registry_rules()
    image = eng.resolve("debian:bookworm")      # bootstrapped once a session, with pip (conftest)
    ctx = tmp_path_factory.mktemp("ctx")
    shutil.copyfile(HOST_BUNDLE, ctx / "host-ca.pem")
    base = RecipeBuilder(image, str(ctx), build=eng.build).copy("host-ca.pem", "/root/host-ca.pem") \
        .env(PIP_CERT="/root/host-ca.pem")
    return base, rules


def test_networked_run_step_installs_and_is_cached_non_hermetic(eng, py):
    base, rules = py
    r = base.run(PIP, network=rules).run("python3 -c 'import six; print(six.__version__)' > /six-version")
    try:
        res = r.build(tag="with-six")
    except BuildFailed as exc:
        op = eng.operation(exc.details["operation"])
        net = op["outcome"]["usage"].get("network", {})
        if net.get("bytes_in", 0) == 0 and not net.get("refused"):
            pytest.skip(f"the registry is unreachable through the egress path: {exc.message[-300:]}")
        raise
    assert eng.read(res.image, "/six-version") == b"1.16.0\n"
    step = res.steps[3]
    assert not step.cached and step.text == f"RUN {PIP}"
    assert eng.store.db.one("SELECT hermetic FROM build_cache_by WHERE op=?", (step.operation,))[0] == 0
    assert eng.operation(step.operation)["spec"]["hermetic"] is False
    again = r.build()
    assert again.image == res.image and all(s.cached for s in again.steps)   # no network used again


def test_the_same_step_without_network_fails_with_the_resolvers_refusal(eng, py):
    base, _ = py
    with pytest.raises(BuildFailed) as e:
        base.run(PIP + " --retries 0 --timeout 5").build(tag="no-net")
    msg = e.value.message
    assert msg.startswith("RUN pip install") and "exit code" in msg
    # pip's own words for a name that does not resolve (no network: no resolver answers)
    assert "Temporary failure in name resolution" in msg or "Name or service not known" in msg \
        or "NewConnectionError" in msg or "No matching distribution" in msg, msg[-1500:]
    assert "no-net" not in eng.tags()
