"""A matplotlib figure comes back from E2B's run_code as a PNG result, as E2B's own do: the real
`e2b-code-interpreter` against a real `sandtree serve` on loopback, on an image with matplotlib.

The bookworm image (conftest) has no matplotlib, so this module makes one: `pip install
matplotlib` in a run whose network policy allows the package registry by name, through the
egress path, as test_network_pip.py does (its module doc says why the policy also names the
registry's address here, and why pip is given the host's CA bundle). Skipped with the reason when
the registry is unreachable that way."""

from __future__ import annotations

import base64
import os
import shutil

import httpx
import pytest

from conftest import serve_process
from sandtree.engine import Engine
from test_network_pip import HOST_BUNDLE, registry_rules
from test_e2b_interpreter import connect_to

eci = pytest.importorskip("e2b_code_interpreter")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def plotting(bookworm):
    """(home, an image of bookworm with matplotlib)."""
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    home, image, _ = bookworm
    rules = registry_rules()
    eng = Engine(home, warm=0)
    try:
        with open(HOST_BUNDLE, "rb") as f:
            bundle = f.read()
        rec = eng.run(image, "pip install --break-system-packages --no-cache-dir --disable-pip-version-check "
                             "--root-user-action=ignore matplotlib", network=rules, timeout=600,
                      env={"PIP_CERT": "/root/host-ca.pem"},
                      files=[{"path": "/root/host-ca.pem", "content": bundle}])
        if rec.exit_code != 0:
            net = eng.operation(rec.op)["outcome"]["usage"].get("network", {})
            if not net.get("bytes_in"):
                pytest.skip(f"the registry is unreachable through the egress path (usage {net}): "
                            f"{rec.stderr.decode()[-300:]}")
        assert rec.exit_code == 0, rec.stderr.decode()[-2000:]
        yield home, rec.image
    finally:
        eng.egress.stop_daemon()
        eng.close()


def test_matplotlib_figures_are_png_results(plotting, monkeypatch):
    home, image = plotting
    with serve_process(home) as url:
        monkeypatch.setenv("E2B_API_URL", f"{url}/e2b")
        monkeypatch.setenv("E2B_SANDBOX_URL", f"{url}/e2b/sandbox")
        monkeypatch.setenv("E2B_API_KEY", "e2b_local")
        r = httpx.post(f"{url}/api/v1/sandboxes", json={"image": image}, timeout=60, trust_env=False)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            sbx = connect_to(eci.Sandbox, sid)
            # plt.show(): the figure is a result there and then (E2B's docs' example)
            ex = sbx.run_code("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\n"
                              "print('after show')")
            assert ex.error is None, ex.error
            (fig,) = ex.results
            assert base64.b64decode(fig.png).startswith(PNG) and not fig.is_main_result
            assert fig.text.startswith("<Figure size") and ex.logs.stdout == ["after show\n"]
            assert ex.logs.stderr == []                       # no "non-interactive backend" warning
            # a figure left open at the end of the code is shown too; then it is closed
            ex = sbx.run_code("fig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])\nax.set_title('bars')")
            pngs = [res for res in ex.results if res.png]
            assert len(pngs) == 1 and base64.b64decode(pngs[0].png).startswith(PNG)
            assert sbx.run_code("len(plt.get_fignums())").text == "0"
            # a Figure as the value of the code: its PNG, as IPython's formatter gives it
            ex = sbx.run_code("import matplotlib.figure\nf = matplotlib.figure.Figure()\n_ = f.add_subplot().plot([0, 1])\nf")
            main = [res for res in ex.results if res.is_main_result]
            assert main and base64.b64decode(main[0].png).startswith(PNG)
        finally:
            httpx.post(f"{url}/api/v1/sandboxes/{sid}/stop", timeout=30, trust_env=False)
