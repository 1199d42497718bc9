"""The runtime interface (runtime/base.py): what makes a tier a tier, checked for every tier.

Two parts: the interface itself (an abstract base: a tier lacking a method, or a name, cannot be
constructed), and one conformance suite run against each tier through that interface only -
validate_spec, run, close, live - the way the engine holds them. A tier this host cannot run is
skipped with the reason its available() gives."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from sandtree.engine import Engine
from sandtree.errors import CommandNotFound, InvalidInput, NotFound, RuntimeUnavailable, SandboxError, TooLarge
from sandtree.runtime import namespaces, validate
from sandtree.runtime.base import InjectedFile, Limits, LiveTier, RunOutcome, RunSpec, Runtime
from sandtree.runtime.gvisor import GVisorRuntime
from sandtree.runtime.live import LiveRuntime
from sandtree.runtime.namespaces import NamespaceRuntime

TIERS = {"namespaces": NamespaceRuntime, "gvisor": GVisorRuntime}


def abstract(cls) -> set[str]:
    return set(cls.__abstractmethods__)


# ---- the interface -------------------------------------------------------------------------------

def test_the_interface_names_every_method_the_engine_calls():
    assert abstract(Runtime) == {"available", "validate_spec", "run", "close", "live", "take_linked"}
    assert {"available", "handle", "start", "stop", "alive", "exec", "popen", "scratch", "freeze",
            "dump"} <= abstract(LiveTier)


@pytest.mark.parametrize("missing", sorted(abstract(Runtime)))
def test_a_tier_missing_a_method_cannot_be_constructed(missing):
    body = {m: (lambda self, *a, **k: None) for m in abstract(Runtime) - {missing}}
    partial = type("Partial", (Runtime,), {"name": "partial", **body})
    with pytest.raises(TypeError, match=missing):
        partial()
    whole = type("Whole", (Runtime,), {"name": "whole", **body, missing: lambda self, *a, **k: None})
    assert isinstance(whole(), Runtime)


def test_a_tier_without_a_name_cannot_be_constructed():
    body = {m: (lambda self, *a, **k: None) for m in abstract(Runtime)}
    nameless = type("Nameless", (Runtime,), body)
    with pytest.raises(TypeError, match="without a name"):
        nameless()


@pytest.mark.parametrize("missing", ["exec", "handle", "dump"])
def test_a_live_runtime_missing_a_method_cannot_be_constructed(missing):
    body = {m: (lambda self, *a, **k: None) for m in abstract(LiveTier) - {missing}}
    with pytest.raises(TypeError, match=missing):
        type("PartialLive", (LiveTier,), body)()


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    e = Engine(str(tmp_path_factory.mktemp("rtif")), warm=0)
    yield e
    e.close()


def construct(eng, name: str) -> Runtime:
    return TIERS[name](eng.store.layers.root, eng.store.idmap, os.path.join(eng.store.home, "bin"))


@pytest.mark.parametrize("name", sorted(TIERS))
def test_both_tiers_implement_the_interface(eng, name):
    rt = construct(eng, name)
    try:
        assert isinstance(rt, Runtime) and rt.name == name
        assert not abstract(type(rt))
        ok, why = rt.available()
        assert isinstance(ok, bool) and isinstance(why, str) and (ok or why)
    finally:
        rt.close()
        rt.close()                                   # idempotent


def test_the_namespaces_tier_has_live_sandboxes(eng):
    rt = construct(eng, "namespaces")
    try:
        live = rt.live()
        assert isinstance(live, LiveTier) and isinstance(live, LiveRuntime)
        assert rt.live() is live                     # one per tier: its built helpers are kept
        assert not abstract(type(live))
    finally:
        rt.close()


def test_every_tier_has_live_sandboxes(eng):
    """Each tier's live() is a LiveTier of its own (issue 18: gVisor too), and a handle says whose."""
    for name in TIERS:
        rt = construct(eng, name)
        try:
            assert isinstance(rt.live(), LiveTier) and rt.live() is rt.live()
        finally:
            rt.close()


# ---- one suite, every tier, through the interface only --------------------------------------------

@pytest.fixture(scope="module")
def img(eng, rootfs):
    return eng.import_path(rootfs)


@pytest.fixture(params=sorted(TIERS))
def tier(request, eng) -> Runtime:
    try:
        rt = eng.tier(request.param)
    except RuntimeUnavailable as exc:
        pytest.skip(f"tier {request.param} unavailable here: {exc}")
    assert isinstance(rt, Runtime)
    return rt


def spec_for(eng, img: str, argv, **kw) -> RunSpec:
    row = eng.store.image(img)
    root = eng.store.tree(img)["."]
    kw.setdefault("env", {"PATH": "/bin:/usr/bin"})
    return RunSpec(argv=argv, layers=row.layers, root_meta=(root.mode, root.uid, root.gid), **kw)


BAD = [
    ("argv", dict(argv=[])),
    ("argv NUL", dict(argv=["/bin/true", "a\0b"])),
    ("timeout", dict(limits=Limits(timeout=0))),
    ("memory", dict(limits=Limits(memory=1 << 20))),
    ("cpus", dict(limits=Limits(cpus=0))),
    ("cwd", dict(cwd="relative")),
    ("hostname", dict(hostname="no spaces")),
    ("uid", dict(uid=70000)),
    ("env", dict(env={"A=B": "x"})),
]


@pytest.mark.parametrize("what,bad", BAD, ids=[b[0] for b in BAD])
def test_validate_spec_refuses_bad_input_before_anything_starts(eng, img, tier, what, bad, monkeypatch):
    bad = dict(bad)                                   # the parameter is shared by both tiers
    spec = spec_for(eng, img, bad.pop("argv", ["/bin/true"]), **bad)
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a) or pytest.fail("started"))
    with pytest.raises(InvalidInput):
        tier.validate_spec(spec)
    with pytest.raises(InvalidInput):                 # run refuses it the same way
        tier.run(spec)
    assert started == []


def test_validate_spec_refuses_files_past_the_disk(eng, img, tier):
    spec = spec_for(eng, img, ["/bin/true"], limits=Limits(disk=8192),
                    files=[InjectedFile("/big", b"x" * 20000)])
    with pytest.raises(TooLarge):
        tier.validate_spec(spec)
    tier.validate_spec(spec_for(eng, img, ["/bin/true"]))          # a good spec passes


def test_run_returns_an_outcome_with_the_changes(eng, img, tier):
    got = []
    spec = spec_for(eng, img, ["/bin/sh", "-c", "echo out; echo err >&2; echo x > /made; cat; exit 3"],
                    stdin=b"in\n", on_output=lambda stream, chunk: got.append((stream, chunk)))
    with tier.run(spec) as out:
        assert isinstance(out, RunOutcome)
        assert (out.exit_code, out.signal, out.stdout, out.stderr) == (3, None, b"out\nin\n", b"err\n")
        assert not (out.timed_out or out.oom_killed or out.cancelled)
        assert os.path.isdir(out.changes)
        with open(os.path.join(out.changes, "made"), "rb") as f:
            assert f.read() == b"x\n"
    assert out.changes is None                        # closed: the scratch is gone
    assert b"".join(c for s, c in got if s == "stdout") == b"out\nin\n"


def test_run_keeps_the_timeout_and_the_output_cap(eng, img, tier):
    spec = spec_for(eng, img, ["/bin/sleep", "30"], limits=Limits(timeout=1))
    t = time.monotonic()
    with tier.run(spec) as out:
        assert out.timed_out and out.exit_code is None and time.monotonic() - t < 15
    spec = spec_for(eng, img, ["/bin/sh", "-c", "yes"], limits=Limits(output=4096))
    with tier.run(spec) as out:
        assert out.stdout_truncated and len(out.stdout) == 4096 and not out.timed_out
        assert out.usage.get("killed_by") == "output_limit", out.usage


def test_run_raises_typed_errors(eng, img, tier):
    # (a missing cwd is not asked of the tier: runsc creates it, as OCI runtimes do; the engine
    # refuses one before choosing a tier)
    with pytest.raises(CommandNotFound):
        tier.run(spec_for(eng, img, ["/no/such/binary"]))
    gone = spec_for(eng, img, ["/bin/true"])
    gone.layers = ["0" * 64]                          # a layer that is not in the store
    with pytest.raises(SandboxError):
        tier.run(gone)


def test_live_through_the_interface(eng, img, tier):
    live = tier.live()
    ok, why = live.available()
    if not ok:
        pytest.skip(f"live sandboxes unavailable here: {why}")
    h = live.start(spec_for(eng, img, ["/bin/true"]), lifetime=60)
    try:
        assert live.alive(h) and not live.foreign(h) and h.tier == tier.name
        assert live.handle(h.to_dict()) == h                   # the stored form names it again
        out = live.exec(h, spec_for(eng, img, ["/bin/sh", "-c", "echo hi > /tmp/f; cat /tmp/f; exit 4"]))
        assert (out.exit_code, out.stdout) == (4, b"hi\n")
        end = time.monotonic() + 5                # the exec's relay leaves the group just after it
        while live.lingering(h) and time.monotonic() < end:
            time.sleep(0.05)
        assert not live.lingering(h)
        proc, rep_r, raw = live.popen(h, spec_for(eng, img, ["/bin/sh", "-c", "exit 5"]))
        proc.communicate()
        while chunk := os.read(rep_r, 4096):
            raw += chunk
        os.close(rep_r)
        assert live.returncode(bytes(raw), proc.returncode) == 5
        assert live.returncode(b"execfail 2 exec\n", 0) == 127 and live.returncode(b"signal 9\n", 0) == -9
    finally:
        live.stop(h)
    assert not live.alive(h)
    with pytest.raises(NotFound):
        live.exec(h, spec_for(eng, img, ["/bin/true"]))
