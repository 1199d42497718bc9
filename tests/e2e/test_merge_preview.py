"""merge_preview (issue 19's merge preview): what merge would make, making nothing, through the
engine, a tenant's view and the remote client (the table's row over a real `sandtree serve`)."""

from __future__ import annotations

import pytest

import sandtree
from sandtree.errors import ImageNotFound
from sandtree.tenancy import Tenant

CALC = "def answer():\n    return 41\n"


@pytest.fixture(scope="module")
def three(sdk, rootfs):
    st = sdk
    base = st.import_image(rootfs)
    cp = base.run(f"mkdir -p /app && printf '{CALC}' > /app/calc.py").image
    a = cp.run("sed -i s/41/42/ /app/calc.py").image
    b = cp.run("sed -i s/41/43/ /app/calc.py").image
    c = cp.run("echo notes > /app/notes").image
    return st, cp, a, b, c


def test_preview_shows_conflicts_with_markers_and_makes_nothing(three):
    st, cp, a, b, _ = three
    before = {i["id"] for i in st.engine.images()}
    p = st.engine.merge_preview(None, a.id, b.id)
    assert p["base"] == cp.id and p["clean"] is False
    assert [(c["path"], c["kind"]) for c in p["conflicts"]] == [("/app/calc.py", "content")]
    (marked,) = p["marked"]
    assert marked["path"] == "/app/calc.py" and not marked["truncated"]
    text = marked["text"]
    assert "<<<<<<<" in text and ">>>>>>>" in text and "return 42" in text and "return 43" in text
    assert {i["id"] for i in st.engine.images()} == before            # nothing was made
    with pytest.raises(Exception):
        st.merge(cp, a, b)                                            # the real merge agrees: a conflict


def test_preview_of_a_clean_merge_and_the_merge_it_predicts(three):
    st, cp, a, _, c = three
    p = st.engine.merge_preview(cp.id, a.id, c.id)
    assert p["clean"] is True and p["conflicts"] == [] and p["marked"] == []
    assert st.merge(cp, a, c).image is not None


def test_the_sdk_previews_with_images_and_refs(three):
    """st.merge_preview (the row made into a Sandtree method): Images or refs, as st.merge takes them."""
    st, cp, a, b, _ = three
    st.tag(b, "preview-theirs")
    before = {i["id"] for i in st.engine.images()}
    p = st.merge_preview(None, a, "preview-theirs")
    assert p == st.engine.merge_preview(None, a.id, b.id)
    assert p["base"] == cp.id and not p["clean"] and [c["path"] for c in p["conflicts"]] == ["/app/calc.py"]
    assert {i["id"] for i in st.engine.images()} == before
    with pytest.raises(ImageNotFound):
        st.merge_preview(None, a, "no-such-tag")


def test_a_tenant_previews_only_what_it_sees(tmp_path, rootfs):
    st = sandtree.Sandtree(str(tmp_path / "home"))
    try:
        e = st.engine
        alice, bob = e.as_tenant(Tenant("alice")), e.as_tenant(Tenant("bob"))
        base = alice.import_path(rootfs)
        x, y = alice.run(base, "echo x > /x").image, alice.run(base, "echo y > /y").image     # engine records: IDs
        assert alice.merge_preview(None, x, y)["clean"] is True
        with pytest.raises(ImageNotFound):
            bob.merge_preview(None, x, y)
    finally:
        st.close()
