"""An image's config (issue 15) is honoured: runs, live sandboxes and pooled runs take their
default env, working directory and user from it; what the caller passes wins; the config lives in
the image (same files + same config = same ID)."""

import pytest

from sandtree.errors import InvalidInput
from sandtree.store.imageconfig import CONFIG_PATH, ImageConfig


@pytest.fixture
def eng(st, rootfs):
    st.import_image(rootfs, tag="bb")
    return st.engine


def test_no_config_is_the_empty_config_and_old_defaults(eng):
    assert eng.image_config("bb") == ImageConfig()
    r = eng.run("bb", "pwd; id -u; id -g; echo $HOME", disposable=True)
    assert r.stdout.decode().split() == ["/", "0", "0", "/root"]


def test_configure_writes_the_file_and_is_content_addressed(eng):
    cfg = ImageConfig(env={"GREETING": "hi there", "PATH": "/opt/bin:/bin"}, cwd="/work", user="user",
                      cmd=["sh"], labels={"a": "b"}, expose=("8080/tcp",))
    img = eng.configure("bb", cfg, tag="configured")
    assert eng.resolve("configured") == img
    assert eng.image_config(img) == cfg
    assert eng.read(img, CONFIG_PATH) == cfg.to_json()
    st = eng.stat(img, CONFIG_PATH)
    assert (st.mode, st.uid, st.gid) == (0o644, 0, 0)
    d = eng.stat(img, "/.sandtree")
    assert (d.mode, d.uid, d.gid) == (0o755, 0, 0)
    assert eng.stat(img, "/work").kind == "d"                 # WORKDIR makes its directory
    # the same config on the same files: the same image; configured again from itself: no change
    assert eng.configure("bb", cfg) == img
    assert eng.configure(img, cfg) == img
    # the edge is labelled like the Dockerfile instruction
    cmd = eng.parents(img)[0]["command"]
    assert "ENV GREETING=" in cmd and "WORKDIR /work" in cmd and "USER user" in cmd
    # back to empty: the file goes, and the ID is the plain image's again... plus /work
    empty = eng.configure(img, ImageConfig())
    assert eng.image_config(empty) == ImageConfig()
    assert not eng.ls(empty, "/.sandtree")


def test_run_takes_env_cwd_user_from_the_config(eng):
    img = eng.configure("bb", ImageConfig(env={"GREETING": "hi there", "HOME": "/tmp"}, cwd="/etc", user="user"))
    r = eng.run(img, "pwd; id -u; id -g; echo $GREETING; echo $HOME; echo $PATH", disposable=True)
    assert r.stdout.decode().splitlines() == ["/etc", "1000", "1000", "hi there", "/tmp",
                                             "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    # the caller's explicit values win
    r = eng.run(img, "pwd; id -u; id -g; echo $GREETING", cwd="/", uid=0, env={"GREETING": "mine"},
                disposable=True)
    assert r.stdout.decode().split() == ["/", "0", "0", "mine"]
    r = eng.run(img, "id -u; id -g", gid=65534, disposable=True)
    assert r.stdout.decode().split() == ["1000", "65534"]


def test_user_forms_and_unknown_names(eng):
    for user, want in (("1000", "1000 1000"), ("4242", "4242 0"), ("user:nogroup", "1000 65534"),
                       ("nobody:0", "65534 0"), ("0:user", "0 1000")):
        img = eng.configure("bb", ImageConfig(user=user))
        assert eng.run(img, "echo $(id -u) $(id -g)", disposable=True).stdout.decode().strip() == want, user
    img = eng.configure("bb", ImageConfig(user="ghost"))
    with pytest.raises(InvalidInput, match="ghost"):
        eng.run(img, "true", disposable=True)
    img = eng.configure("bb", ImageConfig(user="user:ghosts"))
    with pytest.raises(InvalidInput, match="ghosts"):
        eng.run(img, "true", disposable=True)
    # a numeric user works in an image without /etc/passwd
    bare = eng.run("bb", "rm /etc/passwd /etc/group").image
    img = eng.configure(bare, ImageConfig(user="123:456"))
    assert eng.run(img, "echo $(id -u) $(id -g)", disposable=True).stdout.decode().strip() == "123 456"


def test_bad_config_file_in_an_image_is_a_clear_error(eng):
    img = eng.run("bb", f"mkdir -p /.sandtree && echo '[1' > {CONFIG_PATH}").image
    with pytest.raises(InvalidInput, match="config.json"):
        eng.run(img, "true", disposable=True)


def test_live_sandbox_takes_the_config(eng):
    img = eng.configure("bb", ImageConfig(env={"GREETING": "hi"}, cwd="/etc", user="user"))
    info = eng.sandbox_start(img)
    try:
        assert info["cwd"] == "/etc"
        r = eng.sandbox_exec(info["id"], "pwd; id -u; echo $GREETING")
        assert r.stdout.decode().split() == ["/etc", "1000", "hi"]
        r = eng.sandbox_exec(info["id"], ["/bin/sh", "-c", "pwd; id -u; id -g"])
        assert r.stdout.decode().split() == ["/etc", "1000", "1000"]
        r = eng.sandbox_exec(info["id"], ["id", "-u"], uid=0)
        assert r.stdout.decode().split() == ["0"]
    finally:
        eng.sandbox_stop(info["id"])


def test_pooled_run_takes_the_config(eng):
    img = eng.configure("bb", ImageConfig(env={"GREETING": "pooled"}, cwd="/tmp", user="1000"))
    eng.pool_and_wait(img, 1, wait_timeout=30)
    try:
        r = eng.run(img, "pwd; id -u; echo $GREETING", disposable=True)
        assert r.usage.get("pool") is True
        assert r.stdout.decode().split() == ["/tmp", "1000", "pooled"]
    finally:
        eng.pool_remove(img)


def test_sdk_run_and_start_default_to_the_image(st, rootfs):
    base = st.import_image(rootfs)
    img = st.image(st.engine.configure(base.id, ImageConfig(cwd="/etc", env={"X": "1"})))
    assert img.run("pwd; echo $X").stdout.split() == [b"/etc", b"1"]
    sb = img.start()
    try:
        assert sb.exec("pwd").stdout.strip() == b"/etc"
    finally:
        sb.stop()


def test_fork_and_map_take_the_config(st, rootfs):
    base = st.import_image(rootfs)
    img = st.engine.configure(base.id, ImageConfig(cwd="/etc", user="1000", env={"X": "forked"}))
    recs = st.engine.fork(img, ["pwd; id -u; echo $X", ["/bin/sh", "-c", "pwd"]])
    assert recs[0].stdout.split() == [b"/etc", b"1000", b"forked"] and recs[1].stdout.strip() == b"/etc"
    results = st.map(img, ["pwd", "id -u"])
    assert [r.stdout.strip() for r in results] == [b"/etc", b"1000"]


def test_a_tenant_configures_and_builds_what_it_sees(tmp_path, rootfs):
    """image_config reads and configure makes an image from one the tenant sees (the result is
    then the tenant's, tagged in its namespace); a tenant builds from what it sees."""
    from sandtree.engine import Engine, Recipe, Stage, From
    from sandtree.errors import Forbidden, ImageNotFound
    from sandtree.tenancy.tenant import Tenant
    eng = Engine(str(tmp_path / "home"), warm=0)
    try:
        alice = eng.as_tenant(Tenant("alice", token="t-alice"))
        bob = eng.as_tenant(Tenant("bob", token="t-bob"))
        img = alice.import_path(rootfs)
        made = alice.configure(img, ImageConfig(cwd="/tmp"), tag="mine")
        assert alice.resolve("mine") == made and alice.image_config(made).cwd == "/tmp"
        assert alice.run(made, "pwd", disposable=True).stdout.strip() == b"/tmp"
        for call in (lambda: bob.image_config(made), lambda: bob.configure(img, ImageConfig())):
            with pytest.raises(ImageNotFound):
                call()                                 # not bob's to see
        # a tenant builds (scope run) from what it sees only; without the run scope it may not
        assert alice.build(Recipe((Stage(None, (From(made, "FROM x"),)),))).image == made
        with pytest.raises(ImageNotFound):
            bob.build(Recipe((Stage(None, (From(made, "FROM x"),)),)))
        with pytest.raises(Forbidden):
            eng.as_tenant(Tenant("carol", scopes=("list",))).build(Recipe((Stage(None, (From(img, "FROM x"),)),)))
    finally:
        eng.close()
