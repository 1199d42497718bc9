"""A mini-swe-agent environment on sandtree, in process (no server) or through `sandtree serve`.

    environment:
      environment_class: sandtree.integrations.miniswe.SandtreeEnvironment
      image: eval/python-semver__python-semver-426     # any image ref of the store
      home: /var/lib/sandtree                          # or url: http://127.0.0.1:8080 (+ token)
      cwd: /testbed

Each command is a run on the environment's current image, and the run's result becomes the current
image: the agent's trajectory is a chain of commits in the lineage (every step citable, forkable, a
rollback target), which is what sandtree adds over a container that forgets. A run starts a fresh
process tree each time, as mini-swe-agent's docker and contree environments do (its prompts tell the
model that `cd` and exports do not persist). `image` is the current state's ID after every step and in
`serialize()`. Submission follows mini-swe-agent's convention: a command whose output starts with
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT (exit 0) raises `Submitted` with the rest as the submission."""

from __future__ import annotations

import platform
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from ..client.sdk import Sandtree, connect
from ..errors import SandtreeError

__all__ = ["SandtreeEnvironment", "SandtreeEnvironmentConfig", "SUBMIT_MARKER"]

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandtreeEnvironmentConfig(BaseModel):
    image: str
    """The image the agent starts from (an ID, a tag such as eval/<instance_id>, a branch)."""
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
