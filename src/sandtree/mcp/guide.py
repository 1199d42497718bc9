"""What the MCP server tells a model about itself: the guide (also the server's instructions), the
whoami and get_guide tools, the resources (an image's files, listings and lineage; the guide) and
the prompts (workflows that use several tools)."""

from __future__ import annotations

import json

from mcp.server.mcpserver.resources.templates import ResourceSecurity

from ..errors import (CommandNotFound, ImageNotFound, InvalidInput, MergeConflict, PathEscape, PathNotFound,
                      RuntimeUnavailable, SandboxError, SandtreeError)
from ..render import render_text
from .images import MAX_READ
from .toolkit import Toolkit, error_text

GUIDE = {
    "workflow": """sandtree: every filesystem state is an immutable image with a content ID.
1. Find a base: list_images (tags such as debian:bookworm). import_image only if none fits.
2. run(command, image) -> result_image: the new state (kept, as fork's branches are; disposable=true for a
   throwaway check). Chain runs on result_image.
   A run that changes nothing returns the same image ID; the same change gives the same ID.
3. Name states with set_tag ({scope}/{purpose}/{base}, e.g. me/deps/debian:bookworm).
4. Inspect without running: list_files, read_file, grep. Files in: upload/rsync, then run(files=...).
The default tool set is the everyday one; the server started with `--tools all` has every tool named here.""",
    "branching": f"""Explore safely:
- fork(image, commands) runs N variants in parallel from one image; keep the best result_image.
- diff(a, b) shows what differs; merge(ours, theirs) combines two branches (base found from lineage);
  conflicts make no image and fail the call with {MergeConflict.code} listing them, unless strategy is
  ours/theirs/markers; __pycache__/, *.pyc and .pytest_cache/ never conflict (ours taken; see ignore).
- branch_create(name, image) then run(image="branch:NAME") advances the branch; rollback(name, steps=1)
  undoes the last run; lineage(image) shows the tree of what came from an image.""",
    "async": """run(..., wait=false) returns an operation_id at once. wait_operations([ids], timeout) waits;
get_operation(id) shows status and output; cancel_operation(id) stops a queued or running one.""",
    "live": """A live sandbox stays up between commands (a dev server, a REPL, a shell's cwd):
sandbox_start(image) -> sandbox_id. sandbox_exec(sandbox_id, command) runs in its shell session: cd and
export carry over; background processes (server &) keep running. sandbox_read_file/sandbox_write_file
reach its files while it runs. sandbox_commit(sandbox_id) -> an image of it now (branch from it like any
image). sandbox_hibernate frees its CPU and memory but keeps everything (processes and memory too);
sandbox_resume continues it. sandbox_stop when done (it also stops after idle_timeout or lifetime seconds).""",
    "errors": f"""Errors name their kind: {ImageNotFound.code}, {PathNotFound.code}, {PathEscape.code} (a path leaving the image),
{InvalidInput.code} (bad arguments; nothing changed), {CommandNotFound.code}, {SandboxError.code}, {RuntimeUnavailable.code}.
A timed-out run reports timed_out=true; an out-of-memory one oom_killed=true.""",
}


def register(t: Toolkit) -> None:
    engine, server = t.engine, t.server

    # ---- about --------------------------------------------------------------------------------
    @t.handler
    def whoami() -> dict:
        """This server: embedded engine, its store, tiers, and the default limits of a run."""
        who = engine.whoami()
        res = {"user": who["tenant"], "mode": "remote" if t.remote else "embedded",
               "store": engine.home, "permissions": who["scopes"], "limits": who["limits"],
               "tiers": engine.doctor()}
        if not t.host_paths:
            res.pop("store")                # a path on the server's disk: none of an HTTP caller's business
        return res

    @t.tool
    def get_guide(section: str = "workflow") -> str:
        """How to use sandtree well: workflow, branching, async, errors."""
        if section not in GUIDE:
            raise InvalidInput(f"sections are {', '.join(GUIDE)}")
        return GUIDE[section]

    # ---- resources and prompts ----------------------------------------------------------------
    path_ok = ResourceSecurity(exempt_params=frozenset({"path"}))

    @server.resource("sandtree://image/{image}/read/{+path}", security=path_ok, mime_type="text/plain")
    def resource_read(image: str, path: str) -> str:
        """A file of an image."""
        try:
            data = engine.read(image, "/" + path, 0, MAX_READ + 1)
            text = data[:MAX_READ].decode("utf-8", "replace")
            return text + ("\n[cut at 4 MiB: read the rest with the read_file tool and an offset]"
                           if len(data) > MAX_READ else "")
        except SandtreeError as exc:
            raise ValueError(error_text(exc)) from None

    @server.resource("sandtree://image/{image}/ls/{+path}", security=path_ok, mime_type="application/json")
    def resource_ls(image: str, path: str) -> str:
        """A directory listing of an image."""
        try:
            return json.dumps([e.to_dict() for e in engine.ls(image, "/" + path)])
        except SandtreeError as exc:
            raise ValueError(error_text(exc)) from None

    @server.resource("sandtree://image/{image}/lineage", mime_type="text/plain")
    def resource_lineage(image: str) -> str:
        """The lineage tree under an image."""
        try:
            return render_text(engine.lineage_tree(image))
        except SandtreeError as exc:
            raise ValueError(error_text(exc)) from None

    @server.resource("sandtree://guide", mime_type="text/markdown")
    def resource_guide() -> str:
        """The agent guide: workflow, branching patterns, async use, errors."""
        return "\n\n".join(f"## {k}\n{v}" for k, v in GUIDE.items())

    @server.prompt()
    def prepare_environment(base: str, setup_commands: str, tag: str) -> str:
        """Build a reusable environment once and tag it."""
        return (f"Prepare a reusable environment on image {base!r}: run each of these setup commands with "
                f"disposable=false, chaining on result_image: {setup_commands}. Check the last one succeeded, "
                f"then set_tag(result_image, {tag!r}). Later work starts from {tag!r}.")

    @server.prompt()
    def tree_search_fix(image: str, test_command: str, candidates: int = 3) -> str:
        """Try several fixes in parallel branches and keep the one whose tests pass."""
        return (f"From image {image!r}, write {candidates} different candidate fixes. Use fork(image, commands) "
                f"with one command per candidate that applies it and then runs {test_command!r}. Compare exit "
                f"codes, keep the passing result_image, diff it against {image!r} to review, and set_tag it.")

    @server.prompt()
    def safe_destructive(image: str, command: str) -> str:
        """Run a risky command where it can be undone."""
        return (f"Create a branch at {image!r} (branch_create), run {command!r} on image='branch:NAME', inspect "
                f"with diff/list_files, and if anything is wrong call rollback(branch, steps=1).")
