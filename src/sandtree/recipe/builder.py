"""The Python builder: a recipe written in Python, in the style of Modal's Image:

    st.recipe("docker://python:3.12-slim").apt_install("git").pip_install("numpy==2.1.3") \\
        .copy("./src", "/app").env(APP_ENV="prod").workdir("/app").run("make").build(tag="app")

Immutable (each method returns a new builder), chainable, lazy: nothing is read or run until
`recipe()` (the context is listed then) or `build()`. Each method is one step with the same text a
Dockerfile writing the same instruction gets (texts.py), so both give the same image ID and share
the cache. A copy's source is one path inside the context (a file or a directory, taken whole);
globs and .dockerignore are the Dockerfile front end's (recipe/context.py).
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shlex
import stat

from ..errors import InvalidInput, PathEscape
from .steps import Configure, ContextFile, Copy, From, Recipe, Run, Stage
from .texts import (APT_INSTALL, PIP_INSTALL, argv_text, config_text, copy_text, dest_is_dir, expose_ports,
                    pairs_text, run_text)

__all__ = ["RecipeBuilder", "list_context", "MAX_ENTRIES", "MAX_DEPTH"]

MAX_ENTRIES = 200_000        # entries one copy may take
MAX_DEPTH = 128              # directory levels below the context root


def _sha256(dfd: int, name: str) -> tuple[str, int]:
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    h, n = hashlib.sha256(), 0
    with os.fdopen(fd, "rb", buffering=0) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(f"{name} changed while the context was listed")
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _entry(dfd: int, name: str, rel: str) -> ContextFile:
    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        return ContextFile(rel, "dir", mode)
    if stat.S_ISLNK(st.st_mode):
        return ContextFile(rel, "symlink", 0o777, target=os.readlink(name, dir_fd=dfd))
    if stat.S_ISREG(st.st_mode):
        digest, size = _sha256(dfd, name)
        return ContextFile(rel, "file", mode, size, digest)
    raise InvalidInput(f"{rel} in the build context is not a file, directory or symlink", path=rel)


def list_context(context: str, source: str) -> tuple[ContextFile, ...]:
    """One source of a copy, listed beneath `context` without following a symlink: the root, then
    (a directory) everything under it sorted by path. A symlink root whose target leaves the
    context is refused; a source that climbs out of it is PathEscape."""
    parts = []
    for p in source.replace("\\", "/").split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not parts:
                raise PathEscape(f"copy source {source!r} leaves the build context", path=source)
            parts.pop()
        else:
            parts.append(p)
    rel = "/".join(parts) or "."
    dfd = os.open(context, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for p in parts[:-1]:                       # every directory on the way, never a link
            try:
                nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                raise InvalidInput(f"copy source {source!r}: {p} is not a directory of the context") from None
            os.close(dfd)
            dfd = nfd
        try:
            root = _entry(dfd, parts[-1], rel) if parts else ContextFile(".", "dir", 0o755)
        except FileNotFoundError:
            raise InvalidInput(f"copy source {source!r} does not exist in the build context", path=source) from None
        if root.kind == "symlink" and (root.target.startswith("/") or
                                       posixpath.normpath(posixpath.join(posixpath.dirname(rel), root.target))
                                       .startswith("..")):
            raise PathEscape(f"copy source {source!r} is a symlink out of the build context", path=source)
        out = [root]
        if root.kind == "dir":
            top = os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=dfd) if parts else os.dup(dfd)
            _walk(top, "" if rel == "." else rel, out)
        return tuple(out)
    finally:
        os.close(dfd)


def _walk(top: int, prefix: str, out: list) -> None:
    stack = [(top, prefix, 0)]
    found = []
    while stack:
        dfd, base, depth = stack.pop()
        try:
            if depth > MAX_DEPTH:
                raise InvalidInput(f"{base}: more than {MAX_DEPTH} directory levels in the build context")
            for name in sorted(os.listdir(dfd)):
                rel = f"{base}/{name}" if base else name
                e = _entry(dfd, name, rel)
                found.append(e)
                if len(found) > MAX_ENTRIES:
                    raise InvalidInput(f"a copy takes more than {MAX_ENTRIES} entries")
                if e.kind == "dir":
                    stack.append((os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                                          dir_fd=dfd), rel, depth + 1))
        finally:
            os.close(dfd)
    out.extend(sorted(found, key=lambda f: f.path))


class RecipeBuilder:
    """An immutable chain of steps on a base ("scratch", a sandtree ref or "docker://...")."""

    def __init__(self, base: str, context: str | None = ".", *, build=None, _steps: tuple = ()):
        if not isinstance(base, str) or not base:
            raise InvalidInput("a recipe starts from an image: 'scratch', a ref or 'docker://...'")
        self._base, self._context, self._build, self._steps = base, context, build, _steps

    def _with(self, step) -> "RecipeBuilder":
        return RecipeBuilder(self._base, self._context, build=self._build, _steps=self._steps + (step,))

    def bound(self, build) -> "RecipeBuilder":
        """The same steps, built by build(recipe, tag=, no_cache=, network=, progress=)."""
        return RecipeBuilder(self._base, self._context, build=build, _steps=self._steps)

    def __repr__(self) -> str:
        return "\n".join(["RecipeBuilder:", f"FROM {self._base}"] +
                         [s.text if not isinstance(s, tuple) else copy_text(*s[1:3], **s[3]) for s in self._steps])

    # ---- steps ---------------------------------------------------------------------------------
    def run(self, command, *, network=None) -> "RecipeBuilder":
        """A RUN: a shell string, or an argv list (exec form). network: its policy (default off)."""
        if isinstance(command, list):
            command = tuple(command)
        if not command:
            raise InvalidInput("run needs a command")
        return self._with(Run(command, run_text(command), network=network))

    def apt_install(self, *packages: str, network=None) -> "RecipeBuilder":
        """RUN apt-get update && apt-get install -y --no-install-recommends PACKAGES (lists removed)."""
        return self.run(APT_INSTALL.format(pkgs=" ".join(_names(packages))), network=network)

    def pip_install(self, *packages: str, network=None) -> "RecipeBuilder":
        """RUN python3 -m pip install --no-cache-dir PACKAGES."""
        return self.run(PIP_INSTALL.format(pkgs=" ".join(_names(packages))), network=network)

    def copy(self, src: str, dest: str, *, chown: str | None = None, chmod: int | None = None) -> "RecipeBuilder":
        """COPY one file or directory of the context to `dest` (relative: to the WORKDIR; a
        directory's contents go into dest; a file goes to dest, or into it when dest ends in /)."""
        if self._context is None:
            raise InvalidInput("this recipe has no context to copy from")
        if chmod is not None and (not isinstance(chmod, int) or not 0 <= chmod <= 0o7777):
            raise InvalidInput(f"chmod must be a mode like 0o644, not {chmod!r}")
        return self._with(("copy", (src,), dest, {"chown": chown, "chmod": chmod}))

    def env(self, mapping: dict | None = None, **kv: str) -> "RecipeBuilder":
        pairs = tuple({**(mapping or {}), **kv}.items())
        return self._config("env", tuple((str(k), str(v)) for k, v in pairs), pairs_text("ENV", pairs))

    def label(self, mapping: dict | None = None, **kv: str) -> "RecipeBuilder":
        pairs = tuple({**(mapping or {}), **kv}.items())
        return self._config("labels", tuple((str(k), str(v)) for k, v in pairs), pairs_text("LABEL", pairs))

    def workdir(self, path: str) -> "RecipeBuilder":
        return self._config("cwd", path)

    def user(self, user: str | int) -> "RecipeBuilder":
        return self._config("user", str(user))

    def entrypoint(self, argv) -> "RecipeBuilder":
        """ENTRYPOINT; as Docker, it drops the base image's CMD unless this recipe set one before."""
        argv = tuple(argv)
        cmd_set = any(isinstance(s, Configure) and any(k == "cmd" for k, _ in s.changes) for s in self._steps)
        changes = (("entrypoint", argv),) + ((("cmd", None),) if not cmd_set else ())
        return self._with(Configure(changes, argv_text("ENTRYPOINT", argv)))

    def cmd(self, argv) -> "RecipeBuilder":
        return self._config("cmd", tuple(argv), argv_text("CMD", argv))

    def expose(self, *ports) -> "RecipeBuilder":
        """EXPOSE 8080 "53/udp" "8000-8002": each kept as N/proto (tcp by default), as a Dockerfile's."""
        try:
            ports = expose_ports(ports)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        return self._config("expose", ports, config_text("expose", ports))

    def _config(self, name: str, value, text: str | None = None) -> "RecipeBuilder":
        if not value and name in ("env", "labels", "expose"):
            raise InvalidInput(f"{name} needs at least one value")
        return self._with(Configure(((name, value),), text or config_text(name, value)))

    # ---- the recipe ----------------------------------------------------------------------------
    def recipe(self) -> Recipe:
        """The steps as a Recipe (the context listed now)."""
        steps = [From(self._base, f"FROM {self._base}")]
        context = os.path.abspath(self._context) if self._context is not None else None
        for s in self._steps:
            if isinstance(s, tuple):
                _, sources, dest, opts = s
                listed = tuple(f for src in sources for f in list_context(context, src))
                steps.append(Copy(listed, dest, copy_text(sources, dest, **opts), chown=opts["chown"],
                                  chmod=opts["chmod"], dest_is_dir=dest_is_dir(dest, len(sources))))
            else:
                steps.append(s)
        return Recipe((Stage(None, tuple(steps)),), context=context)

    def build(self, *, tag: str | None = None, no_cache: bool = False, network=None, progress=None):
        """Build it (the engine's build: cached steps cost a lookup)."""
        if self._build is None:
            raise InvalidInput("this builder is not bound to a store: use st.recipe(...)")
        return self._build(self.recipe(), tag=tag, no_cache=no_cache, network=network, progress=progress)


def _names(packages) -> list[str]:
    """Package names or specifiers, shell-quoted when they need it (`'numpy>=2'`)."""
    if not packages or not all(isinstance(p, str) and p.strip() and not p.startswith("-") for p in packages):
        raise InvalidInput("package names are non-empty strings (not options)")
    return [shlex.quote(p) for p in packages]
