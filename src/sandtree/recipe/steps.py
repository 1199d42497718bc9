"""The steps of a build: the one model both front ends produce (a Dockerfile's parser, the Python
builder) and the engine's build executes. Values only: no I/O here. Each step's `text` is the
instruction after ARG/ENV expansion, in Dockerfile syntax: it labels the lineage edge the step makes
and is part of its cache key, so the same step written either way is the same step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ContextFile", "From", "Run", "Copy", "Configure", "Step", "Stage", "Recipe"]


@dataclass(frozen=True)
class ContextFile:
    """One entry of the build context, checked (inside the context, not ignored) when it was listed."""
    path: str              # relative to the context root, '/'-separated, no '..'
    kind: str              # "file" | "dir" | "symlink"
    mode: int              # permission bits
    size: int = 0
    sha256: str | None = None      # a file's content hash (its part of the cache key)
    target: str | None = None      # a symlink's target (kept as written; never followed on the host)


@dataclass(frozen=True)
class From:
    base: str              # "scratch", a sandtree ref (ID, prefix, tag, branch:NAME), "docker://...", or
    text: str              # a stage: "stage:NAME" / "stage:INDEX"
    line: int = 0


@dataclass(frozen=True)
class Run:
    command: str | tuple[str, ...]   # str: /bin/sh -c (shell form); tuple: exec form
    text: str
    line: int = 0
    network: object = None           # a network policy value (network/policy.Policy.from_value); None: the
                                     # build's (off unless the build gives one); False: off whatever the build's
    env: tuple[tuple[str, str], ...] = ()   # build-time only variables (ARG) the command sees, not kept


@dataclass(frozen=True)
class Copy:
    sources: tuple[ContextFile, ...]  # from the context (from_stage None) ...
    dest: str                         # absolute, or relative to the current WORKDIR (resolved by the engine)
    text: str
    line: int = 0
    from_stage: str | None = None     # ... or paths in another stage's / image's result: `paths`
    paths: tuple[str, ...] = ()       # source paths inside from_stage (absolute)
    chown: str | None = None          # "USER[:GROUP]" names or IDs
    chmod: int | None = None
    unpack: bool = False              # ADD of a local tar: its members land under dest
    dest_is_dir: bool = False         # dest ended with '/' or there are several sources


@dataclass(frozen=True)
class Configure:
    """ENV, WORKDIR, USER, LABEL, ENTRYPOINT, CMD, EXPOSE: a change of the image's config
    (store/imageconfig.ImageConfig.replace(**changes) after merging env/labels)."""
    changes: tuple[tuple[str, object], ...]   # field -> value, e.g. (("env", (("A", "1"),)),)
    text: str
    line: int = 0


Step = From | Run | Copy | Configure


@dataclass(frozen=True)
class Stage:
    name: str | None                  # FROM ... AS name
    steps: tuple[Step, ...]           # steps[0] is its From


@dataclass(frozen=True)
class Recipe:
    stages: tuple[Stage, ...]
    target: int = -1                  # the stage that is the result (default: the last)
    context: str | None = None        # the context directory on the host (None: no COPY from it)
    args: tuple[tuple[str, str], ...] = field(default=())   # build args as given (recorded)
