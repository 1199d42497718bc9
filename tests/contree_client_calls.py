"""Calls of contree-client 0.4.4, one scenario per client method, run by tests/integrations/test_contree_client.py
in the contree venv (.venv/contree-mcp, which has contree-client; the project's own venv does
not): `python contree_client_calls.py URL sync|async METHOD`. Each scenario calls the method as
the client's own documentation shows, checks what it got (an AssertionError fails the test) and
prints one JSON line of facts the test checks against the server.

The same scenario code drives the sync client (contree_client.http, stdlib) and the async one
(contree_client.httpx): `await do(x)` awaits x only when the async client returned a coroutine.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import io
import json
import sys
import tarfile
import time

from contree_client import models
from contree_client.exceptions import APIStatusError

SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


async def do(x):
    return await x if inspect.isawaitable(x) else x


async def items(it):
    """The items of a sync or async iterator."""
    if hasattr(it, "__aiter__"):
        return [x async for x in it]
    return list(it)


async def status_of(call) -> int:
    try:
        await do(call())
    except APIStatusError as exc:
        return exc.status
    return 200


async def run(c, command, **kw):
    """An instance run to its end: (spawn response, terminal operation)."""
    kw.setdefault("shell", True)
    spawned = await do(c.spawn_instance(command, "tag:busybox", **kw))
    return spawned, await do(c.wait_operation(spawned.uuid, timeout=60))


async def live(c, command="cat", **kw):
    """An instance whose command waits on its open stdin: a running live sandbox."""
    kw.setdefault("disposable", False)
    spawned = await do(c.spawn_instance(command, "tag:busybox", shell=True,
                                        stdin=models.ClosableStreamRepr(value="", close=False), **kw))
    for _ in range(200):
        if str((await do(c.get_operation_status(spawned.uuid))).status) == "EXECUTING":
            return spawned.uuid
        await asyncio.sleep(0.05)
    raise AssertionError("the instance never ran")


async def finish(c, op):
    await do(c.operation_subprocess_stdin(op, 1, "", close=True))
    return await do(c.wait_operation(op, timeout=60))


# ---- images ------------------------------------------------------------------------------------
@scenario
async def list_images(c):
    got = await do(c.list_images(tagged=True))
    tags = {i.tag for i in got.images}
    assert "busybox" in tags, tags
    assert [i.tag for i in (await do(c.list_images(tag="busy"))).images] == ["busybox"]
    assert (await do(c.list_images(tag="nothing-like-it"))).images == []
    return {"tags": sorted(t for t in tags if t)}


@scenario
async def iter_images(c):
    got = await items(c.iter_images(tagged=True))
    assert any(i.tag == "busybox" for i in got)
    return {"n": len(got)}


@scenario
async def resolve_image(c):
    uid = await do(c.resolve_image("tag:busybox"))
    assert await do(c.resolve_image("busybox")) == uid and await do(c.resolve_image(uid)) == uid
    return {"uuid": uid}


@scenario
async def update_image_tag(c):
    uid = await do(c.resolve_image("busybox"))
    img = await do(c.update_image_tag(uid, "client/tagged"))
    assert img.uuid == uid and img.tag == "client/tagged"
    assert await do(c.inspect_find_image_by_tag("client/tagged")) == uid
    return {"uuid": uid}


@scenario
async def delete_image_tag(c):
    uid = await do(c.resolve_image("busybox"))
    await do(c.update_image_tag(uid, "client/gone"))
    await do(c.delete_image_tag(uid, tag="client/gone"))
    assert await status_of(lambda: c.inspect_find_image_by_tag("client/gone")) == 404
    return {}


@scenario
async def import_image(c):
    # a registry this machine cannot name: the operation is accepted and then fails, saying why
    op = await do(c.import_image(models.ImageImportRegistry(url="docker://127.0.0.1:9/none/such:1"),
                                 tag="client/imported", timeout=30))
    uid = op if isinstance(op, str) else op.uuid
    done = await do(c.wait_operation(uid, timeout=60))
    assert str(done.status) == "FAILED" and done.error, done
    return {"uuid": uid}


# ---- files -------------------------------------------------------------------------------------
@scenario
async def upload_file(c):
    up = await do(c.upload_file(b"client bytes\n"))
    assert up.sha256 == hashlib.sha256(b"client bytes\n").hexdigest()
    return {"uuid": up.uuid}


@scenario
async def get_file(c):
    up = await do(c.upload_file(b"get me\n"))
    f = await do(c.get_file(up.sha256))
    assert f.sha256 == up.sha256 and f.size == 7
    return {}


@scenario
async def check_file_exists(c):
    up = await do(c.upload_file(b"exists\n"))
    assert await do(c.check_file_exists(up.sha256)) is True
    assert await do(c.check_file_exists("0" * 64)) is False
    return {}


@scenario
async def ensure_file(c):
    a = await do(c.ensure_file(b"ensured\n"))
    b = await do(c.ensure_file(b"ensured\n"))
    assert (a if isinstance(a, str) else a.uuid) == (b if isinstance(b, str) else b.uuid)
    return {}


@scenario
async def list_files(c):
    up = await do(c.upload_file(b"listed\n"))
    got = await do(c.list_files(limit=1000))
    assert up.sha256 in {f.sha256 for f in got.files}
    return {}


@scenario
async def iter_files(c):
    up = await do(c.upload_file(b"iterated\n"))
    assert up.sha256 in {f.sha256 for f in await items(c.iter_files())}
    return {}


# ---- instances and operations ------------------------------------------------------------------
@scenario
async def spawn_instance(c):
    up = await do(c.upload_file(b"from a file\n"))
    spawned, done = await run(c, "cat /in/f; echo $GREETING; pwd; id -u; hostname; exit 3",
                              env={"GREETING": "hi"}, cwd="/tmp", uid=1000, gid=1000, hostname="client-host",
                              files={"/in/f": models.FileSpec(uuid=up.uuid, mode="0644")},
                              resources_limits=models.InstanceResourcesLimits(max_layer_bytes=1 << 20),
                              timeout=30, truncate_output_at=4096, disposable=False)
    res = done.metadata.result
    assert str(done.status) == "SUCCESS" and res.state.exit_code == 3, done
    assert res.stdout.value == "from a file\nhi\n/tmp\n1000\nclient-host\n", res.stdout
    assert done.result.image                                   # not disposable: an image
    # argv (shell false), stdin, a timeout
    _, argv = await run(c, "/bin/echo", shell=False, args=["a b", "c"])
    assert argv.metadata.result.stdout.value == "a b c\n"
    # preserve_env: the result image's environment keeps GREETING (and drops what is set to null)
    _, kept = await run(c, "true", env={"GREETING": "kept", "PATH": "/usr/bin:/bin"}, preserve_env=True,
                        disposable=False)
    spawned2 = await do(c.spawn_instance("echo $GREETING", kept.result.image, shell=True))
    later = await do(c.wait_operation(spawned2.uuid, timeout=60))
    assert later.metadata.result.stdout.value == "kept\n", later
    drop = await do(c.spawn_instance("true", kept.result.image, shell=True,
                                     env={"GREETING": None}, preserve_env=True, disposable=False))
    dropped = await do(c.wait_operation(drop.uuid, timeout=60))
    again = await do(c.spawn_instance("echo x$GREETING", dropped.result.image, shell=True))
    assert (await do(c.wait_operation(again.uuid, timeout=60))).metadata.result.stdout.value == "x\n"
    _, fed = await run(c, "cat", stdin=models.ClosableStreamRepr(value="fed\n"))
    assert fed.metadata.result.stdout.value == "fed\n"
    _, slow = await run(c, "sleep 30", timeout=1)
    assert slow.metadata.result.state.timed_out is True
    return {"op": spawned.uuid, "image": done.result.image}


@scenario
async def get_operation_status(c):
    op = await live(c, "echo partial; cat")
    now = await do(c.get_operation_status(op))
    assert str(now.status) == "EXECUTING"
    done = await finish(c, op)
    got = await do(c.get_operation_status(op))
    assert str(got.status) == "SUCCESS" and got.metadata.result.stdout.value == "partial\n"
    return {}


@scenario
async def wait_operation(c):
    spawned, done = await run(c, "echo waited")
    assert str(done.status) == "SUCCESS" and done.metadata.result.stdout.value == "waited\n"
    polled = await do(c.wait_operation(spawned.uuid, follow_events=False, timeout=30))
    assert str(polled.status) == "SUCCESS"
    return {}


@scenario
async def operation_terminal(c):
    op = await live(c)
    assert await do(c.operation_terminal(op)) is False
    await finish(c, op)
    assert await do(c.operation_terminal(op)) is True
    return {}


@scenario
async def list_operations(c):
    spawned, _ = await run(c, "true")
    got = await do(c.list_operations(kind="instance", status="SUCCESS", limit=1000))
    assert spawned.uuid in {o.uuid for o in got}
    assert spawned.uuid in {o.uuid for o in await do(c.list_operations(since="1h"))}
    return {}


@scenario
async def iter_operations(c):
    spawned, _ = await run(c, "true")
    assert spawned.uuid in {o.uuid for o in await items(c.iter_operations())}
    return {}


@scenario
async def cancel_operation(c):
    op = await live(c)
    await do(c.cancel_operation(op))
    done = await do(c.wait_operation(op, timeout=60))
    assert str(done.status) == "CANCELLED", done
    assert await status_of(lambda: c.cancel_operation(op)) == 409
    return {}


@scenario
async def iter_operation_events(c):
    spawned, _ = await run(c, "echo one; echo two >&2")
    evs = await items(c.iter_operation_events(spawned.uuid))
    kinds = [e.type for e in evs]
    assert kinds[:2] == ["init", "spawn"] and kinds[-2:] == ["shutdown", "completion"], kinds
    out = "".join(e.data.value for e in evs if e.type == "stdout")
    assert out == "one\n"
    # resumable: since= the id of an event gives only what came after it
    later = await items(c.iter_operation_events(spawned.uuid, since=evs[0].id))
    assert [e.id for e in later] == [e.id for e in evs[1:]]
    only = await items(c.iter_operation_events(spawned.uuid, spid=1))
    assert all(e.spid == 1 for e in only) and only
    return {}


@scenario
async def follow_operation_events(c):
    op = await live(c, "echo first; cat; echo last")
    seen = []

    async def feed():
        await asyncio.sleep(0.5)
        await do(c.operation_subprocess_stdin(op, 1, "middle\n", close=True))
    if inspect.iscoroutinefunction(c.follow_operation_events) or hasattr(c.follow_operation_events(op), "__aiter__"):
        task = asyncio.ensure_future(feed())
        async for e in c.follow_operation_events(op, timeout=60):
            seen.append(e)
        await task
    else:
        import threading
        t = threading.Thread(target=lambda: asyncio.run(feed()))
        t.start()
        seen = list(c.follow_operation_events(op, timeout=60))
        t.join()
    out = "".join(e.data.value for e in seen if e.type == "stdout")
    assert out == "first\nmiddle\nlast\n" and seen[-1].type == "completion", out
    # resume after a drop: from the id of the second event on
    rest = await items(c.follow_operation_events(op, last_event_id=seen[1].id, timeout=30))
    assert [e.id for e in rest] == [e.id for e in seen[2:]]
    return {}


# ---- subprocesses of a running instance ----------------------------------------------------------
@scenario
async def operation_subprocess_create(c):
    op = await live(c)
    spid = await do(c.operation_subprocess_create(op, "echo sub $X; touch /from-sub", shell=True, env={"X": "2"}))
    assert spid >= 2
    spid2 = await do(c.operation_subprocess_create(op, "/bin/echo", args=["argv", "form"], cwd="/tmp"))
    assert spid2 > spid
    for _ in range(100):
        r = await do(c.operation_subprocess(op, spid2))
        if r.state.exit_code != -1:
            break
        await asyncio.sleep(0.05)
    assert r.stdout.value == "argv form\n", r
    done = await finish(c, op)
    # the subprocess's write is in the instance's image
    names = {f.path for f in (await do(c.inspect_image_list(done.result.image, "/"))).files}
    assert "from-sub" in names, names
    evs = await items(c.iter_operation_events(op, spid=spid))
    assert [e.type for e in evs] == ["spawn", "stdout", "exit"], evs
    assert evs[1].data.value == "sub 2\n"
    return {}


@scenario
async def operation_subprocess(c):
    op = await live(c)
    spid = await do(c.operation_subprocess_create(op, "echo out; echo err >&2; exit 4", shell=True))
    for _ in range(100):
        r = await do(c.operation_subprocess(op, spid))
        if r.state.exit_code != -1:
            break
        await asyncio.sleep(0.05)
    assert (r.state.exit_code, r.stdout.value, r.stderr.value) == (4, "out\n", "err\n"), r
    main = await do(c.operation_subprocess(op, 1))
    assert main.state.exit_code == -1                            # still running
    await finish(c, op)
    after = await do(c.operation_subprocess(op, spid))           # a finished instance: from its events
    assert after.state.exit_code == 4 and after.stdout.value == "out\n"
    assert await status_of(lambda: c.operation_subprocess(op, 99)) == 404
    return {}


@scenario
async def operation_subprocess_kill(c):
    op = await live(c)
    spid = await do(c.operation_subprocess_create(op, "echo up; exec sleep 60", shell=True))
    for _ in range(200):                     # signalled once it runs (see test_instances.py)
        if (await do(c.operation_subprocess(op, spid))).stdout.value == "up\n":
            break
        await asyncio.sleep(0.05)
    await do(c.operation_subprocess_kill(op, spid, signal="SIGTERM"))
    for _ in range(100):
        r = await do(c.operation_subprocess(op, spid))
        if r.state.signal != -1:
            break
        await asyncio.sleep(0.05)
    assert r.state.signal == 15, r
    assert await status_of(lambda: c.operation_subprocess_kill(op, spid)) == 404       # exited
    assert await status_of(lambda: c.operation_subprocess_kill(op, 1, signal="NOPE")) == 400
    await do(c.operation_subprocess_kill(op, 1))                   # the main process: the instance ends
    done = await do(c.wait_operation(op, timeout=60))
    assert done.metadata.result.state.signal == 9, done
    return {}


@scenario
async def operation_subprocess_stdin(c):
    op = await live(c)
    spid = await do(c.operation_subprocess_create(op, "cat", shell=True,
                                                   stdin=models.ClosableStreamRepr(value="a\n", close=False)))
    await do(c.operation_subprocess_stdin(op, spid, "Yg==", encoding="base64", close=False))
    await do(c.operation_subprocess_stdin(op, spid, "\n", close=True))
    assert await status_of(lambda: c.operation_subprocess_stdin(op, spid, "late")) == 409
    for _ in range(100):
        r = await do(c.operation_subprocess(op, spid))
        if r.state.exit_code != -1:
            break
        await asyncio.sleep(0.05)
    assert r.stdout.value == "a\nb\n", r
    await do(c.operation_subprocess_stdin(op, 1, "main\n", close=True))
    done = await do(c.wait_operation(op, timeout=60))
    assert done.metadata.result.stdout.value == "main\n"
    assert await status_of(lambda: c.operation_subprocess_stdin(op, 1, "x")) == 410       # finished: gone
    return {}


# ---- inspect -----------------------------------------------------------------------------------
async def made(c) -> str:
    _, done = await run(c, "mkdir -p /w/d && printf 'alpha\\nbeta\\n' > /w/d/f && ln -s f /w/d/l",
                        disposable=False)
    return done.result.image


@scenario
async def inspect_find_image_by_tag(c):
    uid = await do(c.inspect_find_image_by_tag("busybox"))
    assert uid == await do(c.resolve_image("busybox"))
    assert await status_of(lambda: c.inspect_find_image_by_tag("no-such-tag")) == 404
    return {}


@scenario
async def inspect_image(c):
    uid = await do(c.resolve_image("busybox"))
    img = await do(c.inspect_image(uid))
    assert img.uuid == uid and img.tag == "busybox"
    return {}


@scenario
async def inspect_image_download(c):
    img = await made(c)
    assert await do(c.inspect_image_download(img, "/w/d/f")) == b"alpha\nbeta\n"
    assert await status_of(lambda: c.inspect_image_download(img, "/w/none")) == 404
    return {}


@scenario
async def inspect_image_download_stream(c):
    img = await made(c)
    assert b"".join(await items(await do(c.inspect_image_download_stream(img, "/w/d/f")))) == b"alpha\nbeta\n"
    return {}


@scenario
async def check_image_file(c):
    img = await made(c)
    assert await do(c.check_image_file(img, "/w/d/f")) is True
    assert await do(c.check_image_file(img, "/w/none")) is False
    return {}


@scenario
async def inspect_image_archive(c):
    img = await made(c)
    data = b"".join(await items(await do(c.inspect_image_archive(img, "/w"))))
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        names = set(t.getnames())
    assert {"d/f", "d/l"} <= {n.lstrip("./") for n in names}, names
    gz = b"".join(await items(await do(c.inspect_image_archive(img, "/w", compressed=True))))
    assert gz[:2] == b"\x1f\x8b"                             # as served: gzip (the client asked for it)
    with tarfile.open(fileobj=io.BytesIO(gz), mode="r:gz") as t:
        assert {n.lstrip("./") for n in t.getnames()} == {n.lstrip("./") for n in names}
    return {}


@scenario
async def check_image_archive(c):
    img = await made(c)
    assert await do(c.check_image_archive(img, "/w")) is True
    assert await do(c.check_image_archive(img, "/none")) is False
    return {}


@scenario
async def inspect_image_list(c):
    img = await made(c)
    got = await do(c.inspect_image_list(img, "/w/d"))
    kinds = {f.path: (f.is_regular, f.is_symlink, f.symlink_to) for f in got.files}
    assert kinds == {"f": (True, False, ""), "l": (False, True, "f")}, kinds
    return {}


@scenario
async def inspect_image_grep(c):
    img = await made(c)
    got = await do(c.inspect_image_grep(img, "BET", path="/w", case="insensitive"))
    assert [(m.path, m.line_number) for m in got.matches if m.type == "match"] == [("/w/d/f", 2)], got
    ctx = await do(c.inspect_image_grep(img, "beta", path="/w", before=1))
    assert [(m.type, m.line_number) for m in ctx.matches] == [("context", 1), ("match", 2)], ctx
    return {}


@scenario
async def whoami(c):
    me = await do(c.whoami())
    assert me.permissions
    return {}


async def main(url: str, mode: str, name: str) -> dict:
    if mode == "sync":
        from contree_client.http import ContreeClient
        c = ContreeClient("fake-token", base_url=url, timeout=60)
        try:
            return await SCENARIOS[name](c)
        finally:
            c.close()
    from contree_client.httpx import ContreeAsyncClient
    c = ContreeAsyncClient("fake-token", base_url=url, timeout=60)
    try:
        return await SCENARIOS[name](c)
    finally:
        await c.close()


if __name__ == "__main__":
    if sys.argv[1] == "--list":
        print(json.dumps(sorted(SCENARIOS)))
        sys.exit(0)
    t0 = time.monotonic()
    facts = asyncio.run(main(*sys.argv[1:4]))
    print(json.dumps({**facts, "seconds": round(time.monotonic() - t0, 3)}))
