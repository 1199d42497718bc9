"""The configuration of the inspect-ai sandbox "sandtree" (inspect_sandbox.py) and what it names: the
store or server, and the task's image (an image ref, a Dockerfile built with st.build, or the default).

A task passes it as `sandbox=("sandtree", SandtreeSandboxConfig(...))`, or as a file path
`sandbox=("sandtree", "sandtree.yaml")` (YAML, JSON or TOML with the same fields; relative paths in it
are relative to the file), or a Dockerfile path `sandbox=("sandtree", "Dockerfile")`; with no config,
a `sandtree.yaml` or `Dockerfile` beside the task is found by inspect (config_files)."""

from __future__ import annotations

import json
import os
import tomllib

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from .. import defaults as D
from ..client.remote import RemoteEngine
from ..client.sdk import Sandtree
from ..errors import ImageNotFound, InvalidInput
from . import clients

__all__ = ["SandtreeSandboxConfig", "load_config", "validate", "client", "close_clients", "task_image", "CONFIG_FILES",
           "MAX_CONFIG_BYTES"]

CONFIG_FILES = ["sandtree.yaml", "sandtree.yml", "sandtree.json", "sandtree.toml", "Dockerfile"]
MAX_CONFIG_BYTES = 1 << 20           # a config file or a Dockerfile sent to a server: text, not data


class SandtreeSandboxConfig(BaseModel):
    """Where samples run and with what. Unset fields take sandtree's defaults."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = None          # an ID, ID prefix, tag or branch; "docker://HOST/NAME:TAG" is pulled
    dockerfile: str | None = None     # a Dockerfile built (cached on the image DAG) into the task's image
    context: str | None = None        # its build context (default: the Dockerfile's directory)
    build_args: dict[str, str] | None = None
    target: str | None = None         # a multi-stage Dockerfile's stage
    home: str | None = None           # an in-process store (default $SANDTREE_HOME or ~/.local/share/sandtree)
    url: str | None = None            # a `sandtree serve` instead (connect()); token: or $SANDTREE_TOKEN
    token: str | None = None
    network: str | list[str] | dict | None = None   # as img.start(network=...): "all", ["pypi.org"], ...
    memory: str | int | None = None   # the sample sandbox's limits, as img.start takes them
    pids: int | None = None
    cpus: float | None = None
    disk: str | int | None = None
    timeout: float | None = None      # seconds per command when exec() gives none (default 300)
    lifetime: float = D.INSPECT_SANDBOX_LIFETIME
    idle_timeout: float = D.INSPECT_SANDBOX_IDLE_TIMEOUT
    env: dict[str, str] | None = None
    cwd: str | None = None            # the working directory relative paths resolve to (default: the image's)
    user: str | None = None           # who exec() runs as when it names no user, and write_file's owner
    tag: str | None = None            # tag the sample's final image: a template of {task}, {sample}, {epoch}


def load_config(config) -> SandtreeSandboxConfig:
    """inspect's config value (None, our model, a file path) as a SandtreeSandboxConfig; InvalidInput
    for anything else (a compose file is Docker's, not ours)."""
    if config is None:
        return SandtreeSandboxConfig()
    if isinstance(config, SandtreeSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        raise InvalidInput(f"the sandtree sandbox takes a SandtreeSandboxConfig, not {type(config).__name__}")
    if not isinstance(config, str):
        raise InvalidInput(f"the sandtree sandbox config is a SandtreeSandboxConfig or a file path, not {config!r}")
    path = os.path.abspath(config)
    if not os.path.isfile(path):
        raise InvalidInput(f"sandtree sandbox config {config!r}: no such file")
    name = os.path.basename(path).lower()
    if name == "dockerfile" or name.endswith((".dockerfile", "-dockerfile")) or name.startswith("dockerfile."):
        return SandtreeSandboxConfig(dockerfile=path)
    text = _read_text(path)
    try:
        if name.endswith((".yaml", ".yml")):
            data = yaml.safe_load(text)
        elif name.endswith(".json"):
            data = json.loads(text)
        elif name.endswith(".toml"):
            data = tomllib.loads(text)
        else:
            raise InvalidInput(f"sandtree sandbox config {config!r}: a .yaml, .json, .toml file or a Dockerfile")
    except (yaml.YAMLError, ValueError) as e:
        raise InvalidInput(f"sandtree sandbox config {config!r} cannot be parsed: {e}") from None
    if not isinstance(data, dict):
        raise InvalidInput(f"sandtree sandbox config {config!r} must be a mapping of fields")
    base = os.path.dirname(path)
    for key in ("dockerfile", "context", "home"):          # relative to the file, as compose files do
        if isinstance(data.get(key), str) and not os.path.isabs(data[key]):
            data[key] = os.path.join(base, data[key])
    return validate(data)


def validate(data: dict) -> SandtreeSandboxConfig:
    try:
        return SandtreeSandboxConfig.model_validate(data)
    except ValidationError as e:
        raise InvalidInput(f"sandtree sandbox config: {e}") from None


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{path}: over {MAX_CONFIG_BYTES} bytes")
    return data.decode("utf-8")


def client(cfg: SandtreeSandboxConfig) -> Sandtree:
    """The process's client for this config's store or server (integrations/clients.py)."""
    return clients.shared(cfg.url, cfg.token, cfg.home)


close_clients = clients.close_all


def task_image(st: Sandtree, cfg: SandtreeSandboxConfig) -> str:
    """The task's image ID: the Dockerfile built (cached: unchanged steps cost nothing), the ref
    resolved (a docker:// ref pulled), or the default tag."""
    if cfg.dockerfile is not None:
        if cfg.image is not None:
            raise InvalidInput("sandtree sandbox config: image and dockerfile name two task images; give one")
        dockerfile = os.path.abspath(cfg.dockerfile)
        context = os.path.abspath(cfg.context or os.path.dirname(dockerfile))
        if isinstance(st.engine, RemoteEngine):     # the server builds: the context goes to it as a tar
            return st.build_context(context, text=_read_text(dockerfile), build_args=cfg.build_args,
                                    target=cfg.target).image
        recipe = st.dockerfile(context, file=dockerfile, build_args=cfg.build_args, target=cfg.target)
        return st.build(recipe).image
    if cfg.image is not None:
        if cfg.image.startswith("docker://"):
            return st.pull(cfg.image).id
        return st.image(cfg.image).id
    try:
        return st.image(D.INSPECT_IMAGE).id
    except ImageNotFound:
        raise ImageNotFound(f"the sandtree sandbox config names no image and the default {D.INSPECT_IMAGE!r} is not in "
                            f"this store: give image= or dockerfile=, or make it once with `sandtree image bootstrap "
                            f"debian:bookworm --include python3 --tag {D.INSPECT_IMAGE}`", ref=D.INSPECT_IMAGE) from None
