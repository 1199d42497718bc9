"""contree-client 0.4.4 (the client generated from Contree's OpenAPI document), unmodified, against
a real `sandtree serve` on loopback: a test per client method, with the sync client (stdlib
http.client backend) and the async one (httpx backend). The scenarios are
tests/contree_client_calls.py, run in the contree venv (tests/contree-mcp-requirements.txt pins
contree-client there; the project's own dependencies stay as they are); PyPI unreachable: skipped.
"""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest
from conftest import serve_process

import sandtree
from test_contree import MCP_VENV, contree_mcp  # noqa: F401 - the venv fixture

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # tests/
CALLS = os.path.join(HERE, "contree_client_calls.py")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root")

# The client's public calls that are not requests of their own: construction and plumbing.
PLUMBING = {"request", "stream", "close", "open", "call", "build_url", "build_headers", "user_agent",
            "log_request", "log_response", "from_profile"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, rootfs):
    home = str(tmp_path_factory.mktemp("contree-client") / "home")
    st = sandtree.Sandtree(home)
    st.import_image(rootfs, tag="busybox")
    st.close()
    with serve_process(home) as url:
        yield url


@pytest.fixture(scope="module")
def venv_python(contree_mcp) -> str:     # noqa: F811 - the fixture above
    return os.path.join(MCP_VENV, "bin", "python")


def scenarios() -> list[str]:
    with open(CALLS) as f:
        return sorted(line.split("def ", 1)[1].split("(", 1)[0] for line in f.read().split("@scenario\n")[1:])


def call(python: str, url: str, mode: str, name: str) -> dict:
    out = subprocess.run([python, CALLS, url, mode, name], capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_client_method_has_a_scenario(venv_python):
    """The scenarios cover every request method of both clients (a new client method fails here)."""
    code = ("import inspect, json; from contree_client.base import ContreeSyncClient as S, ContreeAsyncClient as A; "
            "print(json.dumps([sorted(n for n, _ in inspect.getmembers(k, inspect.isfunction) "
            "if not n.startswith('_')) for k in (S, A)]))")
    sync, async_ = json.loads(subprocess.run([venv_python, "-c", code], capture_output=True, text=True,
                                             check=True).stdout)
    assert sync == async_
    assert set(sync) - PLUMBING == set(scenarios())


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("name", scenarios())
def test_client_method(server, venv_python, mode, name):
    facts = call(venv_python, server, mode, name)
    if name == "spawn_instance":      # the work happened here: its image is in our store
        assert httpx.get(f"{server}/v1/inspect/{facts['image']}/").json()["uuid"] == facts["image"]
        ops = httpx.get(f"{server}/v1/operations", params={"limit": 1000}).json()
        assert facts["op"] in {o["uuid"] for o in ops}
