"""RunOptions: the options of the sandbox a command runs in, which run, fork, submit_run, sandbox_start and the
warm pools share, declared once. A row takes them with `op(..., options=RunOptions.parameters())` (or a subset);
every surface derives its fields for them from the row. Imports only defaults.py (the remote client loads it)."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import ClassVar

from .. import defaults as D

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """The shared options (what each means: vocabulary.PARAMS). A value of this class is also a set of them to
    pass along: `engine.run(ref, cmd, **opts.kwargs())`."""
    env: dict | None = None
    cwd: str | None = None
    hostname: str = D.HOSTNAME
    files: object = None
    file_set: str | None = None
    tier: str | None = None
    timeout: float | None = None
    memory: object = None
    pids: int | None = None
    cpus: float | None = None
    disk: object = None
    output: object = None
    labels: dict | None = None
    network: object = None
    secrets: dict | None = None
    record: bool = False
    replay: object = None

    # What a warm pool's sandboxes are started with (env, files and secrets are a run's, not a pool's).
    LIMITS: ClassVar[tuple[str, ...]] = ("hostname", "timeout", "memory", "pids", "cpus", "disk", "output",
                                         "network", "tier")

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parameters(cls, *only: str, exclude: tuple[str, ...] = ()) -> tuple[inspect.Parameter, ...]:
        """The options as keyword-only parameters (all, or `only` these), in declaration order."""
        unknown = set(only) - set(cls.names()) | set(exclude) - set(cls.names())
        assert not unknown, unknown
        hints = {f.name: f for f in dataclasses.fields(cls)}
        return tuple(inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=hints[n].default,
                                       annotation=hints[n].type if hints[n].type != "object" else inspect.Parameter.empty)
                     for n in cls.names() if (not only or n in only) and n not in exclude)

    def kwargs(self) -> dict:
        """The options that differ from their defaults, by name."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default}
