"""engine/builds/dockerfiles.py: a Dockerfile on the host read safely, and the parser given the store's view
of a base image's environment (its config's ENV over BuildKit's default PATH)."""

from __future__ import annotations

import os

import pytest

from sandtree.engine.builds import dockerfiles
from sandtree.engine.builds.dockerfiles import dockerfile_recipe, read_dockerfile
from sandtree.errors import InvalidInput, NotRegularFile, TooLarge
from sandtree.store.imageconfig import ImageConfig
from sandtree.values import DEFAULT_ENV


def test_read_dockerfile_refuses_odd_files(tmp_path, monkeypatch):
    with pytest.raises(InvalidInput, match="no Dockerfile at"):
        read_dockerfile(str(tmp_path / "nope"))
    with pytest.raises(NotRegularFile):
        read_dockerfile(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(NotRegularFile):
        read_dockerfile(str(fifo))                         # opened O_NONBLOCK: no wait for a writer
    (tmp_path / "latin1").write_bytes(b"FROM x\nLABEL a=\xe9\n")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        read_dockerfile(str(tmp_path / "latin1"))
    monkeypatch.setattr(dockerfiles, "MAX_TEXT_BYTES", 16)
    (tmp_path / "big").write_text("FROM x\n" * 10)
    with pytest.raises(TooLarge):
        read_dockerfile(str(tmp_path / "big"))


def test_base_env_comes_from_the_image_config(st, rootfs, tmp_path):
    eng = st.engine
    bb = st.import_image(rootfs, tag="bb").id
    eng.configure(bb, ImageConfig(env=(("PATH", "/opt/tool/bin:/bin"), ("TOOL", "1"))), tag="tool")
    (tmp_path / "Dockerfile").write_text("FROM tool\nENV PATH=/x:$PATH T=$TOOL\nFROM bb\nENV P=$PATH\n")
    r = dockerfile_recipe(eng, str(tmp_path))
    assert dict(r.stages[0].steps[1].changes)["env"] == (("PATH", "/x:/opt/tool/bin:/bin"), ("T", "1"))
    assert dict(r.stages[1].steps[1].changes)["env"] == (("P", DEFAULT_ENV["PATH"]),)   # BuildKit's default
    assert r.context == str(tmp_path)
    with pytest.raises(InvalidInput, match="FROM nothing-here: no such image"):
        dockerfile_recipe(eng, None, text="FROM nothing-here\nENV A=$B\n")
    assert dockerfile_recipe(eng, None, text="FROM nothing-here\nENV A=1\n").context is None  # not asked
