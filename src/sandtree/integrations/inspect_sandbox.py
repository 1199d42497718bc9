"""inspect-ai's sandbox environment "sandtree": `Task(..., sandbox="sandtree")`.

Registered through the `inspect_ai` entry point (pyproject.toml), as inspect-k8s-sandbox does. A
mapping of inspect's SandboxEnvironment onto the SDK, nothing more:

    task_init       the task's image: a ref, a Dockerfile built with st.build, or the default (inspect_config.py)
    sample_init     img.start(): a live sandbox forked from that image (an overlay on its layers: O(1))
    exec            sb.exec(argv, ...) -> ExecResult; timeouts, output limits, exec failures as inspect's errors
    read/write_file sb.read / sb.write, with inspect's errors (missing, directory, too large)
    sample_cleanup  sb.commit(): the sample's final state is an image, its ID written to the sample's store
                    (key "sandtree:<environment>", shown in the eval log) and transcript; then sb.stop()
    task_cleanup    stops what this process's samples left running (--no-sandbox-cleanup keeps them)
    cli_cleanup     `inspect sandbox cleanup sandtree [ID]`: stops inspect's sandboxes in the default store
    connection      `sandtree --home H shell ID` (an interactive shell in the live sandbox)

The SDK is synchronous (sandboxes are processes; the engine's waits are blocking syscalls): each call
runs in a worker thread, as AsyncSandtree does, so samples run concurrently."""

from __future__ import annotations

import errno
import functools
import logging
import posixpath
import shlex
import time
import uuid
from typing import Any, Literal, Union, overload

import anyio
from inspect_ai.log import transcript
from inspect_ai.log._samples import sample_active     # the sample's epoch, as inspect's docker provider reads it
from inspect_ai.util import (ExecResult, OutputLimitExceededError, SandboxConnection, SandboxEnvironment,
                             SandboxEnvironmentConfigType, SandboxEnvironmentLimits, SandboxUnavailableError,
                             sandboxenv, store)

from .. import accounts
from ..client.objects import Image, Sandbox
from ..client.remote import RemoteEngine
from ..client.sdk import Sandtree
from ..errors import CommandNotFound, Conflict, NotFound, NotRegularFile, SandtreeError, TooLarge
from .inspect_config import CONFIG_FILES, SandtreeSandboxConfig, client, load_config, task_image, validate

__all__ = ["SandtreeSandboxEnvironment", "RUN", "STORE_KEY"]

_log = logging.getLogger(__name__)

RUN = uuid.uuid4().hex[:16]         # this process's samples carry it: task_cleanup stops only its own
STORE_KEY = "sandtree:{name}"       # the sample store key of an environment's record (image, sandbox, source)
_LABELS = ("inspect.run", "inspect.task", "inspect.sample")
_images: dict[str, str] = {}        # a config (as JSON) -> its task image ID, set by task_init


async def _call(fn, *args, **kwargs):
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def _key(cfg: SandtreeSandboxConfig) -> str:
    return cfg.model_dump_json()


@sandboxenv(name="sandtree")
class SandtreeSandboxEnvironment(SandboxEnvironment):
    """One sample's live sandtree sandbox."""

    def __init__(self, st: Sandtree, sandbox: Sandbox, cfg: SandtreeSandboxConfig, source: str, sample: str) -> None:
        super().__init__()
        self.st = st
        self.sandbox = sandbox
        self.source = source            # the task image it was forked from
        self.sample = sample
        self.image: str | None = None   # the final state, once sample_cleanup committed it
        self._cfg = cfg
        self._cwd = cfg.cwd             # relative paths resolve here (the sandbox's own cwd when unset)
        self._ids: dict[str, tuple[int, int]] = {}

    # ---- configuration ----
    @classmethod
    def config_files(cls) -> list[str]:
        return list(CONFIG_FILES)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> SandtreeSandboxConfig:
        return validate(config)

    # ---- task and sample lifecycle ----
    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        cfg = load_config(config)
        st = await _call(client, cfg)
        _images[_key(cfg)] = await _call(task_image, st, cfg)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        t0 = time.perf_counter()
        cfg = load_config(config)
        st = client(cfg)
        image = _images.get(_key(cfg)) or await _call(task_image, st, cfg)
        sample = str(metadata.get("__sample_id__", ""))
        labels = dict(zip(_LABELS, (RUN, task_name[:256], sample[:256])))
        sb = await _call(Image(st, image).start, timeout=cfg.timeout, memory=cfg.memory, pids=cfg.pids,
                         cpus=cfg.cpus, disk=cfg.disk, env=cfg.env, cwd=cfg.cwd, idle_timeout=cfg.idle_timeout,
                         lifetime=cfg.lifetime, labels=labels, network=cfg.network)
        ms = (time.perf_counter() - t0) * 1e3
        env = cls(st, sb, cfg, image, sample)
        store().set(STORE_KEY.format(name="default"), {"sandbox": sb.id, "source": image})
        transcript().info({"sandtree": "fork", "sandbox": sb.id, "source": image, "ms": round(ms, 2)},
                          source="sandtree")
        return {"default": env}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for name, environment in environments.items():
            await environment.as_type(cls).finish(name, task_name)

    async def finish(self, name: str, task_name: str) -> None:
        """Commit the sandbox's final state (kept as an image, its ID logged), then stop it."""
        record: dict[str, Any] = {"sandbox": self.sandbox.id, "source": self.source}
        try:
            tag = self._tag(task_name)
            self.image = (await _call(self.sandbox.commit, tag=tag)).id
            record.update(image=self.image, **({"tag": tag} if tag else {}))
        except SandtreeError as e:          # gone (lifetime, a crash): nothing left to commit
            record["error"] = f"{e.code}: {e.message}"
            _log.warning("sandtree sandbox %s: no final image: %s", self.sandbox.id, e.message)
        finally:
            try:
                await _call(self.sandbox.stop)
            except (Conflict, NotFound):
                pass
            store().set(STORE_KEY.format(name=name), record)
            transcript().info({"sandtree": "final", **record}, source="sandtree")

    def _tag(self, task_name: str) -> str | None:
        if not self._cfg.tag:
            return None
        active = sample_active()
        epoch = str(active.epoch) if active is not None else ""
        return self._cfg.tag.format(task=task_name, sample=self.sample, epoch=epoch)

    @classmethod
    async def task_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool) -> None:
        if not cleanup:
            return
        st = client(load_config(config))
        for sb in await _call(st.sandboxes, labels={"inspect.run": RUN, "inspect.task": task_name[:256]}):
            try:
                await _call(sb.stop)
            except (Conflict, NotFound):
                pass

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup sandtree [ID]`: one sandbox, or every one an inspect eval started, in
        the default store ($SANDTREE_HOME)."""
        st = client(SandtreeSandboxConfig())
        if id is not None:
            targets = [await _call(st.sandbox, id)]
        else:
            targets = [sb for sb in await _call(st.sandboxes)
                       if "inspect.run" in ((await _call(sb.info)).get("labels") or {})]
        for sb in targets:
            try:
                await _call(sb.stop)
                print(f"stopped sandtree sandbox {sb.id}")
            except (Conflict, NotFound):
                pass

    # ---- commands and files ----
    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        # timeout_retry: the engine itself kills the command's whole process tree at the timeout; there
        # is no daemon hang to retry past. concurrency: the sandbox is not a local subprocess.
        if not cmd:
            raise ValueError("exec needs a command")
        uid = gid = None
        user = user if user is not None else self._cfg.user
        if user is not None:
            ids = await self._user_ids(user)
            if ids is None:           # as `docker exec --user` reports it: a failed command, not an exception
                return ExecResult(False, 126, "", f"unable to find user {user}: no matching entries in passwd file\n")
            uid, gid = ids
        limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        try:
            r = await _call(self.sandbox.exec, [str(a) for a in cmd], env=env, stdin=input, uid=uid, gid=gid,
                            cwd=await self._path(cwd) if cwd is not None else None, timeout=timeout, output=limit)
        except CommandNotFound as e:
            if e.details.get("errno") in (errno.EACCES, errno.EPERM):
                raise PermissionError(errno.EACCES, f"Permission denied executing command: {e.message}",
                                      cmd[0]) from None
            # a missing executable is the command's result, as a shell reports it (127)
            return ExecResult(False, 127, "", f"{e.message}\n")
        except Conflict as e:         # stopped, gone, hibernated: the sandbox cannot run anything now
            raise SandboxUnavailableError(f"the sandtree sandbox {self.sandbox.id} is not running: {e.message}") \
                from None
        stdout, stderr = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
        if r.timed_out:
            err = TimeoutError(f"Command timed out after {timeout} seconds" if timeout is not None else
                               "Command timed out after the sandbox's per-command timeout")
            if stdout or stderr:
                setattr(err, "truncated_output", stdout + stderr)
            raise err
        if r.usage.get("killed_by") == "output_limit" or r.stdout_truncated or r.stderr_truncated:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, stdout + stderr)
        code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
        return ExecResult(code == 0, code, stdout, stderr)

    async def write_file(self, file: str, contents: str | bytes) -> None:
        path = await self._path(file)
        uid, gid = await self._owner()
        data = contents.encode("utf-8") if isinstance(contents, str) else bytes(contents)
        try:
            await _call(self.sandbox.write, path, data, uid=uid, gid=gid)
        except NotRegularFile as e:
            raise await self._file_error(path, file, e) from None
        except Conflict as e:
            raise SandboxUnavailableError(f"the sandtree sandbox {self.sandbox.id} is not running: {e.message}") \
                from None

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str, bytes]:
        if posixpath.basename(file.rstrip("/")) in (".", "..") or file.endswith("/"):
            raise IsADirectoryError(errno.EISDIR, "Is a directory.", file)
        path = await self._path(file)
        try:
            data = await _call(self.sandbox.read, path)
        except NotFound as e:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory.", file) from e
        except TooLarge:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None) from None
        except NotRegularFile as e:
            raise await self._file_error(path, file, e) from None
        except Conflict as e:
            raise SandboxUnavailableError(f"the sandtree sandbox {self.sandbox.id} is not running: {e.message}") \
                from None
        if len(data) > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, None)
        return data.decode("utf-8") if text else data       # bytes decode keeps \r\n as it is

    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        st = self.st
        if isinstance(st.engine, RemoteEngine):
            raise NotImplementedError("an interactive shell needs the store on this machine: on the server's "
                                      f"host, `sandtree shell {self.sandbox.id}`")
        argv = ["sandtree", "--home", st.home, "shell", self.sandbox.id]
        ids = await self._user_ids(user) if user is not None else None
        if ids is not None:
            argv += ["--uid", str(ids[0]), "--gid", str(ids[1])]
        return SandboxConnection(type="sandtree", command=shlex.join(argv), container=self.sandbox.id)

    def default_polling_interval(self) -> float:
        return 0.2

    # ---- mapping helpers ----
    async def _path(self, file: str) -> str:
        """A sandbox path: relative ones resolve to the working directory (the sandbox's, as exec uses)."""
        if file.startswith("/"):
            return file
        if self._cwd is None:
            self._cwd = (await _call(self.sandbox.info))["cwd"]
        return posixpath.join(self._cwd, file)

    async def _file_error(self, path: str, file: str, e: NotRegularFile) -> OSError:
        """A directory is IsADirectoryError; devices and /proc-like mounts are not for file calls."""
        try:
            await _call(self.sandbox.ls, path)
            return IsADirectoryError(errno.EISDIR, "Is a directory.", file)
        except SandtreeError:
            return PermissionError(errno.EACCES, f"Permission denied: {e.message}", file)

    async def _user_ids(self, user: str) -> tuple[int, int] | None:
        """(uid, gid) of a user name or number, from the sandbox's own /etc/passwd (as docker exec
        --user reads it); None when no entry names it (a bare number still runs, with its own gid)."""
        if user not in self._ids:
            found = await _call(accounts.ids, self.sandbox.read, user)
            if found is None:
                return None
            self._ids[user] = found
        return self._ids[user]

    async def _owner(self) -> tuple[int, int]:
        """write_file's owner: the configured user (as docker's write runs as the default user), else root."""
        if self._cfg.user is None:
            return (0, 0)
        ids = await self._user_ids(self._cfg.user)
        if ids is None:
            raise PermissionError(errno.EACCES, f"no user {self._cfg.user!r} in the sandbox's /etc/passwd")
        return ids
