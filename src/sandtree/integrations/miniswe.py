"""A mini-swe-agent environment on sandtree, in process (no server) or through `sandtree serve`.

    environment:
      environment_class: sandtree.integrations.miniswe.SandtreeEnvironment
      image: eval/python-semver__python-semver-426     # any image ref of the store
      home: /var/lib/sandtree                          # or url: http://127.0.0.1:8080 (+ token)
      cwd: /testbed

In mini-swe-agent's SWE-bench batch runner each instance starts from its own image: give an image-name
template instead of `image` (`image_template: "eval/{instance_id}"`, the tags `sandtree eval` and
`evaluation.environment` give the instances' environments; any of the instance's text fields may be
named) and run the batch through this module, which fills `image` per instance before mini-swe-agent's
own `get_sb_environment` makes the environment (that function sets `image` only for the classes it
knows: docker, singularity, contree, ...):

    python -m sandtree.integrations.miniswe --subset data/evalset/instances.jsonl --split train \
        -c swebench.yaml -c environment.environment_class=sandtree.integrations.miniswe.SandtreeEnvironment \
        -c environment.image_template='eval/{instance_id}' -m MODEL -o OUT

(the arguments are mini-swe-agent's `mini-extra swebench`'s). The tag is resolved once, when the
instance starts: the agent holds the image ID, whatever later moves the tag.

Each command is a run on the environment's current image, and the run's result becomes the current
image: the agent's trajectory is a chain of commits in the lineage (every step citable, forkable, a
rollback target), which is what sandtree adds over a container that forgets. A run starts a fresh
process tree each time, as mini-swe-agent's docker and contree environments do (its prompts tell the
model that `cd` and exports do not persist). `image` is the current state's ID after every step and in
`serialize()`. Submission follows mini-swe-agent's convention: a command whose output starts with
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT (exit 0) raises `Submitted` with the rest as the submission."""

from __future__ import annotations

import platform
import string
import sys
from typing import Any

from minisweagent.environments import get_environment_class
from minisweagent.exceptions import Submitted
from minisweagent.run.benchmarks import swebench as batch
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from ..client.sdk import Sandtree, connect
from ..errors import InvalidInput, SandtreeError

__all__ = ["SandtreeEnvironment", "SandtreeEnvironmentConfig", "SUBMIT_MARKER", "instance_image",
           "get_sb_environment", "run_swebench_batch"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandtreeEnvironmentConfig(BaseModel):
    image: str | None = None
    """The image the agent starts from (an ID, a tag such as eval/<instance_id>, a branch)."""
    image_template: str | None = None
    """In the batch runner: the image per instance, e.g. "eval/{instance_id}" (instance_image)."""
    home: str | None = None
    """The store, in process (default: $SANDTREE_HOME); ignored when `url` is given."""
    url: str | None = None
    """A `sandtree serve` to use instead of an in-process store."""
    token: str | None = None
    cwd: str = "/testbed"
    env: dict[str, str] = {}
    interpreter: list[str] = ["bash", "-c"]
    timeout: int = 60
    network: Any = None
    """A network policy for every command (README "Network egress"); none by default."""


class SandtreeEnvironment:
    def __init__(self, *, config_class: type = SandtreeEnvironmentConfig, client: Sandtree | None = None, **kwargs):
        self.config = config_class(**kwargs)
        if not self.config.image:
            raise InvalidInput("give image (or image_template through the batch runner: "
                               "python -m sandtree.integrations.miniswe ...)", field="image")
        self._owned = client is None
        if client is not None:
            self.st = client
        elif self.config.url:
            self.st = connect(self.config.url, token=self.config.token)
        else:
            self.st = Sandtree(self.config.home)
        self.start_image = self.st.image(self.config.image).id
        self.image = self.start_image          # the current state, advanced by every command that writes

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run a command on the current image; its result becomes the current image."""
        command = action.get("command", "")
        env = dict(self.config.env)         # (no forward_env: only sandtree's config module reads the host's)
        try:
            r = self.st.image(self.image).run([*self.config.interpreter, command], cwd=cwd or self.config.cwd,
                                              env=env or None, timeout=timeout or self.config.timeout,
                                              network=self.config.network)
            self.image = r.image.id
            output = {"output": (r.stdout + r.stderr).decode(errors="replace"), "returncode": r.exit_code,
                      "exception_info": ""}
            if r.timed_out:
                output["exception_info"] = f"the command timed out after {timeout or self.config.timeout} s"
                output["extra"] = {"exception_type": "TimeoutError", "image": self.image}
        except SandtreeError as e:
            output = {"output": "", "returncode": -1,
                      "exception_info": f"An error occurred while executing the command: {e}",
                      "extra": {"exception_type": type(e).__name__, "exception": str(e)}}
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict) -> None:
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission, "image": self.image}})

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), {"image_id": self.image}, kwargs)

    def serialize(self) -> dict:
        return {"info": {"config": {
            "environment": self.config.model_dump(mode="json", exclude={"token"}),
            "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}"},
            "sandtree": {"start_image": self.start_image, "image": self.image}}}

    def close(self) -> None:
        if self._owned:
            self.st.close()


def instance_image(template: str, instance: dict) -> str:
    """The image of one instance from a template naming its fields ("eval/{instance_id}"); a field
    the instance lacks (or that is not text), or a template that is not a plain one, is InvalidInput."""
    if not isinstance(template, str) or not template:
        raise InvalidInput("image_template must be a non-empty string", field="image_template")
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
        plain = all(spec == "" and conv is None for _, f, spec, conv in string.Formatter().parse(template)
                    if f is not None)
    except ValueError as e:
        raise InvalidInput(f"image_template {template!r}: {e}", field="image_template") from None
    bad = [f for f in fields if not f.isidentifier() or not isinstance(instance.get(f), str)]
    if bad or not plain or not fields:
        raise InvalidInput(f"image_template {template!r} must name the instance's text fields as {{field}} "
                           f"(e.g. {{instance_id}}); not: {', '.join(bad) or 'a format spec or conversion'}",
                           field="image_template")
    return template.format_map({f: instance[f] for f in fields})


def _is_ours(environment_class) -> bool:
    if not isinstance(environment_class, str) or not environment_class:
        return False
    try:
        return issubclass(get_environment_class(environment_class), SandtreeEnvironment)
    except ValueError:
        return False


def get_sb_environment(config: dict, instance: dict, *, _theirs=None):
    """mini-swe-agent's swebench.get_sb_environment, with `image` filled from the environment's
    `image_template` for this module's environment class; any other class is left to theirs."""
    theirs = _theirs or batch.get_sb_environment
    env = config.get("environment", {})
    if _is_ours(env.get("environment_class")) and env.get("image_template"):
        config = {**config, "environment": {**env, "image": instance_image(env["image_template"], instance)}}
    return theirs(config, instance)


def run_swebench_batch(args: list[str] | None = None) -> None:
    """mini-swe-agent's `mini-extra swebench` (its typer app, arguments unchanged) with
    get_sb_environment above in place of theirs for the run; theirs is put back after."""
    theirs = batch.get_sb_environment
    batch.get_sb_environment = lambda config, instance: get_sb_environment(config, instance, _theirs=theirs)
    try:
        batch.app(args=sys.argv[1:] if args is None else args, standalone_mode=False)
    finally:
        batch.get_sb_environment = theirs


if __name__ == "__main__":
    # this module's own name (not __main__'s copy), so `environment_class` names the same class
    from sandtree.integrations.miniswe import run_swebench_batch as _run
    _run()
