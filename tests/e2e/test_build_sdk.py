"""The Python builder through the public API (issue 15): st.recipe(...) sync and async, in process;
over HTTP a build is refused with its reason until REST builds exist (config reads work)."""

import asyncio

import pytest

import sandtree


@pytest.fixture
def ctx(tmp_path):
    d = tmp_path / "ctx"
    (d / "src").mkdir(parents=True)
    (d / "src" / "app.py").write_text("print('hi')\n")
    return d


def test_sdk_builder_builds_and_caches(st, rootfs, ctx):
    base = st.import_image(rootfs, tag="bb")
    r = (st.recipe(base, context=str(ctx)).env(APP="demo").workdir("/app").copy("src", ".")
         .run("echo built > stamp").cmd(["sh", "-c", "cat stamp"]))
    img = r.build(tag="app")
    assert isinstance(img, sandtree.Image) and st.image("app") == img
    assert img.read("/app/app.py") == b"print('hi')\n"
    cfg = img.config()
    assert cfg.cwd == "/app" and dict(cfg.env) == {"APP": "demo"} and cfg.cmd == ("sh", "-c", "cat stamp")
    assert img.run("pwd; echo $APP; cat stamp").stdout.split() == [b"/app", b"demo", b"built"]
    res = st.build(r)
    assert res.image == img.id and all(s.cached for s in res.steps)
    again = img.configure(cfg.replace(user="user"))
    assert again.config().user == "user" and again.run("id -u").stdout.strip() == b"1000"


def test_async_builder(tmp_path, rootfs, ctx):
    async def go():
        async with sandtree.AsyncSandtree(str(tmp_path / "home")) as st:
            base = await st.import_image(rootfs)
            r = await st.recipe(base, context=str(ctx))
            img = await r.copy("src/app.py", "/app.py").build()
            assert isinstance(img, sandtree.AsyncImage)
            return await img.read("/app.py")
    assert asyncio.run(go()) == b"print('hi')\n"


def test_a_recipe_builds_in_process_and_over_http_alike(sdk, rootfs, ctx):
    """Through connect() the recipe travels as its Dockerfile with the files it lists (issue 15
    item 7): the same steps, the same image as in process."""
    base = sdk.import_image(rootfs)
    img = sdk.recipe(base, context=str(ctx)).copy("src/app.py", "/app/").run("cp /app/app.py /app/copy.py").build()
    assert img.read("/app/copy.py") == (ctx / "src" / "app.py").read_bytes()
    again = sdk.build(sdk.recipe(base, context=str(ctx)).copy("src/app.py", "/app/").run("cp /app/app.py /app/copy.py"))
    assert again.image == img.id and all(s.cached for s in again.steps)


def test_pool_of_a_recipe(st, rootfs):
    base = st.import_image(rootfs)
    r = st.recipe(base, context=None).workdir("/tmp").env(POOLED="yes")
    stats = st.pool(r, size=1, wait=True)
    try:
        img = st.build(r).image
        assert stats["image"] == img and stats["ready"] == 1
        res = st.image(img).run("pwd; echo $POOLED", disposable=True)
        assert res.usage.get("pool") is True and res.stdout.split() == [b"/tmp", b"yes"]
    finally:
        st.pool(img, size=0)
