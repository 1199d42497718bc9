"""Reproducible builds (issue 37) on the real kernel: every RUN step sees SOURCE_DATE_EPOCH (the
recipe's, else the default) and every build step's commit clamps later mtimes to it, in the
image's tree and in the files a sandbox of it sees; "" turns it off; a bad value is refused naming
the line. A RUN step's network rules in another order or spelling hit the cache (same image, no
run), a different rule set runs again (the egress daemon on a netlab internet this module made,
tests/netlab.py: the step sends nothing). Two stores building every data/evalset environment:
tests/integrations/test_evalset_repro.py."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from conftest import make_rootfs
from sandtree import defaults as D
from sandtree.engine import Engine
from sandtree.engine.builds.dockerfiles import dockerfile_recipe
from sandtree.errors import InvalidInput
from sandtree.recipe.builder import RecipeBuilder

NS = 1_000_000_000


@pytest.fixture
def eng(st, rootfs):
    st.import_image(rootfs, tag="bb")
    return st.engine


def ops_count(eng) -> int:
    return eng.store.db.one("SELECT COUNT(*) FROM operations")[0]


def build(eng, text: str, ctx, **kw):
    # (as build_context does: the parser puts the build's network into each RUN without its own)
    return eng.build(dockerfile_recipe(eng, str(ctx), text=text, **kw))


def test_steps_see_the_default_epoch_and_their_files_carry_it(eng, tmp_path):
    (tmp_path / "app.txt").write_text("v1\n")
    res = build(eng, "FROM bb\nCOPY app.txt /app/app.txt\nRUN echo $SOURCE_DATE_EPOCH > /sde && mkdir -p /d/e "
                     "&& touch /d/e/f\nENV A=1\n", tmp_path)
    img = res.image
    epoch = D.BUILD_SOURCE_DATE_EPOCH
    assert eng.read(img, "/sde") == f"{epoch}\n".encode()
    for path in ("/sde", "/d", "/d/e", "/d/e/f", "/app", "/app/app.txt", "/.sandtree/config.json"):
        assert eng.stat(img, path).mtime_ns == epoch * NS, path
    # the files a sandbox of it sees (the layers on disk), not only the tree's record
    out = eng.run(img, "stat -c %Y /d/e/f /app/app.txt /sde", disposable=True).stdout.split()
    assert out == [str(epoch).encode()] * 3
    # what the base image had keeps its times; an env the run did not get stays out of its config
    assert eng.stat(img, "/etc/greeting").mtime_ns == eng.stat("bb", "/etc/greeting").mtime_ns
    assert "SOURCE_DATE_EPOCH" not in dict(eng.image_config(img).env)
    # the rebuild: every step a hit, same image
    again = build(eng, "FROM bb\nCOPY app.txt /app/app.txt\nRUN echo $SOURCE_DATE_EPOCH > /sde && mkdir -p /d/e "
                       "&& touch /d/e/f\nENV A=1\n", tmp_path)
    assert again.image == img and all(s.cached for s in again.steps)


def test_the_recipe_sets_the_epoch_or_turns_it_off(eng, tmp_path):
    run = "RUN echo \"${SOURCE_DATE_EPOCH-unset}\" > /sde && touch /f\n"
    by_arg = build(eng, "FROM bb\n" + run, tmp_path, build_args={"SOURCE_DATE_EPOCH": "1700000000"})
    assert eng.read(by_arg.image, "/sde") == b"1700000000\n"
    assert eng.stat(by_arg.image, "/f").mtime_ns == 1700000000 * NS
    by_env = build(eng, "FROM bb\nENV SOURCE_DATE_EPOCH=1600000000\n" + run, tmp_path)
    assert eng.read(by_env.image, "/sde") == b"1600000000\n"
    assert eng.stat(by_env.image, "/f").mtime_ns == 1600000000 * NS
    py = RecipeBuilder("bb", None, build=eng.build).run("echo $SOURCE_DATE_EPOCH > /sde").build()
    assert eng.read(py.image, "/sde") == f"{D.BUILD_SOURCE_DATE_EPOCH}\n".encode()
    before = time.time_ns() - 60 * NS
    off = build(eng, "FROM bb\nARG SOURCE_DATE_EPOCH=\n" + run, tmp_path)
    assert eng.read(off.image, "/sde") == b"\n"                  # the ARG's own (empty) value: nothing added
    assert eng.stat(off.image, "/f").mtime_ns > before           # not clamped
    n = ops_count(eng)
    with pytest.raises(InvalidInput) as e:
        build(eng, "FROM bb\nARG SOURCE_DATE_EPOCH=yesterday\n" + run, tmp_path)
    assert "line 3" in e.value.message and "SOURCE_DATE_EPOCH" in e.value.message
    assert ops_count(eng) == n                                   # nothing ran


# ---- network rules in any order hit the cache ----------------------------------------------------

@pytest.fixture(scope="module")
def neteng(tmp_path_factory):
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("the netlab and the egress daemon need root and nft")
    from netlab import NetLab
    from sandtree.network.client import Egress
    lab = NetLab()
    home = str(tmp_path_factory.mktemp("reponet"))
    e = Engine(os.path.join(home, "st"), warm=0)
    e._egress = Egress(e.store.home, upstream_netns=lab.path, upstream_dns=f"{lab.dns[0]}:{lab.dns[1]}",
                       upstream_ca=lab.ca_file)
    e.import_path(make_rootfs(os.path.join(home, "root")), tag="bb")
    yield e
    e._egress.stop_daemon()
    e.close()
    lab.close()


def test_network_rules_in_another_order_or_spelling_hit_the_cache(neteng, tmp_path):
    eng = neteng
    text = "FROM bb\nRUN --network=default echo fetched > /fetched\nRUN --network=none echo after > /after\n"
    first = build(eng, text, tmp_path, network=["pypi.org", "files.pythonhosted.org", "203.0.113.80:443"])
    assert not first.steps[1].cached and eng.operation(first.steps[1].operation)["spec"]["hermetic"] is False
    n = ops_count(eng)
    for same in (["203.0.113.80:443", "files.pythonhosted.org", "pypi.org"],
                 ["FILES.pythonhosted.org.", "203.0.113.80/32:443", "pypi.org", "pypi.org:443"],
                 "files.pythonhosted.org,pypi.org,203.0.113.80:443"):
        again = build(eng, text, tmp_path, network=same)
        assert again.image == first.image and all(s.cached for s in again.steps), same
    assert ops_count(eng) == n                                   # nothing ran again
    other = build(eng, text, tmp_path, network=["pypi.org", "files.pythonhosted.org"])
    assert not other.steps[1].cached                             # another rule set: the step runs again
    assert other.image == first.image                            # (the same files: the same ID, and a hit after)
    assert ops_count(eng) == n + 1


def test_a_step_written_without_network_stays_off_when_the_build_is_given_one(neteng, tmp_path):
    """`RUN --network=none` is off even where the caller gives the build's network to the build as
    well as to the parser (st.build(st.dockerfile(..., network=X), network=X))."""
    rules = ["pypi.org"]
    text = "FROM bb\nRUN --network=none echo off > /off\nRUN echo on > /on\n"
    res = neteng.build(dockerfile_recipe(neteng, str(tmp_path), text=text, network=rules), network=rules)
    off, on = (neteng.operation(s.operation)["spec"] for s in res.steps[1:])
    assert "network" not in off and on["network"] == {"allow_out": ["pypi.org"]}, (off, on)
