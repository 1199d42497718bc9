"""Harbor's environment on sandtree: `harbor run --env sandtree.integrations.harbor:SandtreeEnvironment`
(or a job config's `environment.import_path`, with `kwargs`). Harbor needs Python >= 3.12.

A mapping of Harbor's BaseEnvironment (harbor 0.26) onto the SDK, nothing more:

    start       the task's environment/Dockerfile built with sandtree's builds (cached on the image DAG:
                an unchanged task costs a lookup per step), or its `docker_image` resolved (a store ref)
                or pulled (anything else, as docker://); then a live sandbox on it with the task's cpus,
                memory and storage as limits and the trial's network policy
    exec        a fresh `bash -c` process (`sh -c` where the image has no bash), as `docker exec` runs it
    upload/download   host-side writes and reads of the running sandbox (no tar needed in the image)
    set_network_policy   sb.set_network between Harbor's phases (agent offline, verifier online, ...)
    stop        the trial's final state committed as an image (tagged `harbor/<trial>`; its verifier's
                reward annotated on it), recorded in the trial's directory as sandtree.json, then the
                sandbox stopped

Harbor 0.26 gives an environment no field of the trial's result.json, so the record of what it made
(source image, final image, tag, sandbox, reward) is `<trial dir>/sandtree.json`, beside result.json,
keyed by the environment's session ID.

The SDK is synchronous (sandboxes are processes; the engine's waits are blocking syscalls): each call
runs in a worker thread, so Harbor's concurrent trials run concurrently."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import posixpath
import stat
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.definition import require_agent_environment_definition
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.trial.config import ResourceMode
from pydantic import Field

from .. import accounts
from .. import defaults as D
from ..client.remote import RemoteEngine
from ..client.sdk import Sandtree
from ..errors import Conflict, ImageNotFound, NotFound, SandtreeError, TooLarge
from . import clients

__all__ = ["SandtreeEnvironment", "SandtreeOptions", "network_policy", "RECORD"]

RECORD = D.HARBOR_RECORD


class SandtreeOptions(EnvironmentOptions):
    """`--ek NAME=VALUE` / a job config's environment `kwargs`. Unset: sandtree's defaults."""

    home: str | None = Field(default=None, description="An in-process store (default $SANDTREE_HOME).")
    url: str | None = Field(default=None, description="A `sandtree serve` instead; token: or $SANDTREE_TOKEN.")
    token: str | None = None
    tag: str = Field(default=D.HARBOR_TAG, description="The final image's tag: {trial}, {task}, {session}; '' none.")
    build_network: str | list[str] | dict | None = Field(
        default=None, description="The policy of the Dockerfile's RUN steps (none by default), e.g. "
        "['pypi.org', 'files.pythonhosted.org'].")
    build_args: dict[str, str] | None = None
    pids: int | None = None
    lifetime: float = D.HARBOR_SANDBOX_LIFETIME
    idle_timeout: float = D.HARBOR_SANDBOX_IDLE_TIMEOUT
    tier: str | None = Field(default=None, description="namespaces or gvisor (default: the store's).")


def network_policy(policy: NetworkPolicy):
    """Harbor's NetworkPolicy as a sandtree policy: None (off), "all", or the allow-list's rules.
    Harbor has validated and normalised the entries (hostnames, `*.` wildcards, IPv4/IPv6 addresses
    and CIDRs): each is a sandtree rule as it is, for every port."""
    if policy.network_mode == NetworkMode.NO_NETWORK:
        return None
    if policy.network_mode == NetworkMode.PUBLIC:
        return "all"
    if not policy.allowed_hosts:            # an allow-list of nothing: a link that reaches nothing
        return {"allow_out": []}
    return list(policy.allowed_hosts)


def _client(options: SandtreeOptions) -> Sandtree:
    return clients.shared(options.url, options.token, options.home)


async def _call(fn, *args, **kwargs):
    return await asyncio.to_thread(functools.partial(fn, *args, **kwargs))


class SandtreeEnvironment(BaseEnvironment):
    """A Harbor trial's environment: one live sandtree sandbox, in process or through `sandtree serve`.

    Capabilities declared True are enforced by the engine: no network, allow-lists of hostnames,
    `*.` wildcards, IPv4/IPv6 addresses and CIDRs (the egress daemon's DNS answers and proxy), a
    policy changed between phases (set_network on the live sandbox), CPU and memory limits (cgroups;
    fractional CPUs are a quota), storage (`disk=`, the sandbox's writable layer). The others are False:
    - gpus, tpus: the engine passes no devices through to a sandbox;
    - windows: sandboxes are Linux namespaces (or gVisor), Linux containers only;
    - docker_compose: one sandbox per trial, no multi-container services with their own network;
    - mounted: Harbor's log directories are copied out (download_dir), never a host bind mount, so a
      sandbox sees no host path (and a remote server has no access to Harbor's host);
    - stream: Harbor's stream mode is SSH into the environment, and Harbor refuses it for import-path
      environments anyway (`sandtree shell ID` is the interactive way in);
    - cpu_request, memory_request: sandtree limits, it does not schedule reservations."""

    options_model = SandtreeOptions

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._st: Sandtree | None = None
        self._sandbox = None
        self._source: str | None = None     # the image the sandbox started from
        self._shell = "bash"
        self._ids: dict[str, tuple[int, int]] = {}
        self.image: str | None = None       # the final state, once stop() committed it

    # ---- what Harbor asks of every environment ----
    @staticmethod
    def type() -> str:
        return "sandtree"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_wildcard_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            network_allowlist_ipv6_addresses=True,
            network_allowlist_ipv4_cidrs=True,
            network_allowlist_ipv6_cidrs=True,
            dynamic_network_policy=True,
        )

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    def _validate_definition(self):
        require_agent_environment_definition(self.environment_dir, docker_image=self.task_env_config.docker_image)

    @property
    def sandbox(self):
        """The sandtree Sandbox of this trial (None before start and after stop)."""
        return self._sandbox

    @property
    def source(self) -> str | None:
        """The ID of the image the trial's sandbox started from."""
        return self._source

    # ---- start ----
    async def start(self, force_build: bool) -> None:
        opts: SandtreeOptions = self.options             # type: ignore[assignment]
        self._st = await _call(_client, opts)
        self._source = await _call(self._image, force_build)
        cpus = self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT)
        memory = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        storage = self._effective_storage_mb
        labels = {"harbor.session": self.session_id[:256], "harbor.task": self.environment_name[:256]}
        if self.context_id is not None:
            labels["harbor.trial"] = str(self.context_id)
        self._sandbox = await _call(
            self._st.image(self._source).start, cpus=cpus, memory=f"{memory}M" if memory else None,
            disk=f"{storage}M" if storage else None, pids=opts.pids, env=self._startup_env() or None,
            cwd=self.task_env_config.workdir, network=network_policy(self.network_policy), labels=labels,
            lifetime=opts.lifetime, idle_timeout=opts.idle_timeout, tier=opts.tier)
        try:
            if not await _call(self._sandbox.exists, "/bin/bash") and \
                    not await _call(self._sandbox.exists, "/usr/bin/bash"):
                self._shell = "sh"                    # a minimal image: POSIX sh, as Harbor's sidecars get
            await self.ensure_dirs(self._mount_targets(writable_only=True))
            await self._upload_environment_dir_after_start()
        except BaseException:
            await _call(self._sandbox.stop)
            self._sandbox = None
            raise

    def _image(self, force_build: bool) -> str:
        """The environment's image ID: the Dockerfile built, or docker_image resolved (pulled when it
        names no image of the store)."""
        st, opts = self._st, self.options
        assert st is not None
        ref = self.task_env_config.docker_image
        dockerfile = self.environment_dir / "Dockerfile"
        if ref and not dockerfile.is_file():
            if ref.startswith("docker://"):
                return st.pull(ref).id
            try:
                return st.image(ref).id
            except ImageNotFound:
                return st.pull(f"docker://{ref}").id
        context = str(self.environment_dir)
        if isinstance(st.engine, RemoteEngine):     # the server builds: the context goes to it as a tar
            return st.build_context(context, build_args=opts.build_args, network=opts.build_network,
                                    no_cache=force_build).image
        recipe = st.dockerfile(context, build_args=opts.build_args, network=opts.build_network)
        return st.build(recipe, network=opts.build_network, no_cache=force_build).image

    # ---- network between phases ----
    async def _apply_network_policy(self, network_policy_: NetworkPolicy) -> None:
        sb = self._running()
        await _call(sb.set_network, network_policy(network_policy_) or "off")

    # ---- stop ----
    async def stop(self, delete: bool) -> None:
        """Commit the final state (an image, tagged, its reward annotated), record it in the trial's
        directory, then stop the sandbox (delete=False: left running until its idle timeout, for
        `sandtree shell ID`)."""
        sb = self._sandbox
        if sb is None:
            return
        record: dict[str, Any] = {"sandbox": sb.id, "source": self._source}
        try:
            tag = self._tag()
            image = await _call(sb.commit, tag=tag)
            self.image = image.id
            record.update(image=image.id, **({"tag": tag} if tag else {}))
            reward = self._reward()
            if reward:
                record.update(reward)
                await _call(image.annotate, reward.get("reward"), **self._annotation(reward))
        except SandtreeError as e:            # gone (lifetime, a crash): nothing left to commit
            record["error"] = f"{e.code}: {e.message}"
            self.logger.warning(f"sandtree sandbox {sb.id}: no final image: {e.message}")
        finally:
            if delete:
                try:
                    await _call(sb.stop)
                except (Conflict, NotFound):
                    pass
                self._sandbox = None
            self._write_record(record)

    def _tag(self) -> str | None:
        template = self.options.tag
        if not template:
            return None
        trial = self.trial_paths.trial_dir.name
        return template.format(trial=trial, task=self.environment_name, session=self.session_id)

    def _reward(self) -> dict:
        """The verifier's reward, when it has run: reward.txt's number, or reward.json's (its "reward"
        key, else its only number), with reward.json's other numbers as `rewards`."""
        d = self.trial_paths.verifier_dir
        out: dict[str, Any] = {}
        try:
            data = json.loads((d / "reward.json").read_text())
            if isinstance(data, dict):
                numbers = {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                out["rewards"] = numbers
                if "reward" in numbers or len(numbers) == 1:
                    out["reward"] = float(numbers.get("reward", next(iter(numbers.values()), 0)))
        except (OSError, ValueError):
            pass
        try:
            out["reward"] = float((d / "reward.txt").read_text().strip())
        except (OSError, ValueError):
            pass
        return out

    def _annotation(self, reward: dict) -> dict:
        meta: dict[str, Any] = {"harbor.trial": self.trial_paths.trial_dir.name[:4096],
                                "harbor.task": self.environment_name[:4096]}
        for k, v in list((reward.get("rewards") or {}).items())[:32]:
            key = f"reward.{k}"
            if len(key) <= 64 and key.replace(".", "_").replace("-", "_").isidentifier():
                meta[key] = v
        return meta

    def _write_record(self, record: dict) -> None:
        path = self.trial_paths.trial_dir / RECORD
        try:
            records = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            records = {}
        records[self.session_id] = record
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(records, indent=2))
        tmp.replace(path)

    # ---- commands ----
    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        sb = self._running()
        user = self._resolve_user(user)
        uid = gid = None
        if user is not None:
            ids = await self._user_ids(str(user))
            if ids is None:        # as `docker exec -u` reports it: a failed command, not an exception
                return ExecResult(stdout="", stderr=f"unable to find user {user}: no matching entries in passwd file\n",
                                  return_code=126)
            uid, gid = ids
        callback = self._output_callback()
        on_output, emitted = None, []
        if callback is not None:
            loop = asyncio.get_running_loop()

            def emit(stream, data):             # from the worker thread: Harbor's callbacks are coroutines
                emitted.append(asyncio.run_coroutine_threadsafe(
                    callback(data.decode("utf-8", "replace"), "stdout" if stream == "stdout" else "stderr"), loop))
            on_output = emit
        r = await _call(sb.exec, [self._shell, "-c", command], env=self._merge_env(env),
                        cwd=cwd or self.task_env_config.workdir, uid=uid, gid=gid, timeout=timeout_sec,
                        on_output=on_output)
        if emitted:                             # every chunk delivered before the command's result
            await asyncio.gather(*(asyncio.wrap_future(f) for f in emitted))
        stdout, stderr = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
        if r.timed_out:
            raise TimeoutError(f"Command timed out after {timeout_sec} seconds: {command[:200]}")
        code = r.exit_code if r.exit_code is not None else 128 + (r.signal or 0)
        return ExecResult(stdout=stdout, stderr=stderr, return_code=code)

    # ---- files: host-side reads and writes of the running sandbox, as root (as `docker cp`) ----
    async def upload_file(self, source_path: Path | str, target_path: str):
        sb = self._running()
        source = Path(source_path)
        data = await _call(source.read_bytes)
        await _call(sb.write, target_path, data, mode=stat.S_IMODE(source.stat().st_mode))

    async def upload_dir(self, source_dir: Path | str, target_dir: str):
        sb = self._running()
        await _call(self._put_tree, sb, Path(source_dir), target_dir)

    @staticmethod
    def _put_tree(sb, source: Path, target: str) -> None:
        if not source.is_dir():
            raise NotADirectoryError(f"{source} is not a directory")
        if not sb.exists(target):
            sb.mkdir(target)
        links = []
        for root, dirs, files in os.walk(source):
            rel = os.path.relpath(root, source)
            dest = target if rel == "." else posixpath.join(target, *Path(rel).parts)
            for name in list(dirs):
                p = os.path.join(root, name)
                if os.path.islink(p):                   # a link is copied as a link, never followed
                    links.append((os.readlink(p), posixpath.join(dest, name)))
                    dirs.remove(name)
                elif not sb.exists(posixpath.join(dest, name)):
                    sb.mkdir(posixpath.join(dest, name), mode=stat.S_IMODE(os.stat(p).st_mode))
            for name in files:
                p = os.path.join(root, name)
                if os.path.islink(p):
                    links.append((os.readlink(p), posixpath.join(dest, name)))
                    continue
                with open(p, "rb") as f:
                    sb.write(posixpath.join(dest, name), f.read(), mode=stat.S_IMODE(os.fstat(f.fileno()).st_mode))
        for link, path in links:
            r = sb.exec(["ln", "-sfn", link, path])
            if r.exit_code != 0:
                raise RuntimeError(f"could not make the link {path} -> {link}: {r.stderr.decode()[-300:]}")

    async def download_file(self, source_path: str, target_path: Path | str):
        sb = self._running()
        try:
            data = await _call(sb.read, source_path)
        except TooLarge:                    # over the engine's read cap
            await _call(self._read_large, sb, source_path, Path(target_path))
            return
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        await _call(target.write_bytes, data)

    @staticmethod
    def _read_large(sb, path: str, target: Path) -> None:
        """A file over the engine's read cap, in 8 MiB pieces through dd (under exec's output cap)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            for piece in range(1 << 20):
                r = sb.exec(["dd", f"if={path}", "bs=1048576", f"skip={piece * 8}", "count=8"])
                if r.exit_code != 0:
                    raise RuntimeError(f"could not read {path}: {r.stderr.decode('utf-8', 'replace')[-300:]}")
                f.write(r.stdout)
                if len(r.stdout) < 8 << 20:
                    return

    async def download_dir(self, source_dir: str, target_dir: Path | str):
        sb = self._running()
        target = Path(target_dir)
        entries = await _call(sb.ls, source_dir, depth=64)
        if len(entries) >= 10000:           # the listing's cap: a tree this big goes through a tar
            await self.download_dir_with_exclusions(source_dir=source_dir, target_dir=target, exclude=[])
            return
        await _call(self._get_tree, sb, source_dir, target, entries)

    @staticmethod
    def _get_tree(sb, source: str, target: Path, entries: list[dict]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        base = source.rstrip("/") or "/"
        for e in entries:
            rel = posixpath.relpath(e["path"], base)
            if rel.startswith("..") or os.path.isabs(rel):
                continue
            dest = target.joinpath(*rel.split("/"))
            if e["kind"] == "dir":
                dest.mkdir(parents=True, exist_ok=True)
            elif e["kind"] == "file":
                dest.parent.mkdir(parents=True, exist_ok=True)
                try:
                    dest.write_bytes(sb.read(e["path"]))
                except TooLarge:
                    SandtreeEnvironment._read_large(sb, e["path"], dest)
                if isinstance(e.get("mode"), int):      # its permission bits, as `docker cp` keeps them
                    os.chmod(dest, stat.S_IMODE(e["mode"]))
            elif e["kind"] == "symlink" and e.get("target"):
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.is_symlink() or dest.exists():
                    dest.unlink()
                os.symlink(e["target"], dest)

    # ---- helpers ----
    def _running(self):
        if self._sandbox is None:
            raise RuntimeError("the sandtree environment is not started (or already stopped)")
        return self._sandbox

    async def _user_ids(self, user: str) -> tuple[int, int] | None:
        """(uid, gid) of a user name or number, from the sandbox's own /etc/passwd (as docker exec -u
        reads it); None when no entry names it (a bare number still runs, with its own gid)."""
        if user not in self._ids:
            found = await _call(accounts.ids, self._running().read, user)
            if found is None:
                return None
            self._ids[user] = found
        return self._ids[user]
