"""A deepagents sandbox (LangChain's `BaseSandbox`) on a live sandtree sandbox.

    from sandtree import Sandtree                      # or sandtree.connect(url, token=...)
    from sandtree.integrations.langchain_sandbox import SandtreeSandbox
    backend = SandtreeSandbox.start(Sandtree().image("python:3.12"))
    agent = create_deep_agent(model=..., backend=backend)

deepagents' BaseSandbox builds every file tool (ls, read, write, edit, grep, glob) on three
primitives, implemented here over the SDK: execute (a shell string in the sandbox's session, so cwd
and exported variables carry over), upload_files and download_files (host-side reads and writes of
the running sandbox: binary-safe, no shell quoting). State stays between calls; commit() makes an
image of it now (fork or roll back from there: fork(), rollback(image)).

Async: the protocol's a-methods run the sync ones in a worker thread (deepagents' own default,
the way client/aio.py makes the async SDK: one implementation), plus astart/acommit/afork/
arollback/astop here.

uid: the user commands run as (0 by default, as in Contree, Modal, Daytona). With another uid,
upload_files and download_files check what that user may do first (one batched `test` in the
sandbox), so an agent that cannot read a file through `cat` cannot download it either.
"""

from __future__ import annotations

import asyncio
import threading
import time

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from ..errors import InvalidInput, NotFound, NotRegularFile, SandtreeError

__all__ = ["DEFAULT_TIMEOUT", "TIMED_OUT_EXIT", "SandtreeSandbox"]

DEFAULT_TIMEOUT = 30 * 60          # seconds per command unless execute(timeout=) says otherwise (as the partners)
TIMED_OUT_EXIT = 124               # what deepagents' local shell (and coreutils' timeout) answer

# What `uid` may do with each path ($@), one word a line: ok, directory, missing, denied, bad_parent.
# Read: the file itself. Write: the file if it exists, else the nearest existing ancestor, which must
# be a directory the user may write into and search (parents are made as mkdir -p would).
_CAN_READ = r'''for p; do
  if [ -d "$p" ]; then echo directory; elif [ ! -e "$p" ]; then echo missing
  elif [ -r "$p" ]; then echo ok; else echo denied; fi
done'''
_CAN_WRITE = r'''for p; do
  if [ -d "$p" ]; then echo directory; continue; fi
  if [ -e "$p" ]; then if [ -w "$p" ]; then echo ok; else echo denied; fi; continue; fi
  d=${p%/*}; d=${d:-/}
  while [ ! -e "$d" ] && [ "$d" != / ]; do d=${d%/*}; d=${d:-/}; done
  if [ ! -d "$d" ]; then echo bad_parent; elif [ -w "$d" ] && [ -x "$d" ]; then echo ok; else echo denied; fi
done'''
# bad_parent (a file where a directory should be): file_not_found, what root's host-side write answers
_CHECK_ERRORS = {"directory": "is_directory", "missing": "file_not_found", "denied": "permission_denied",
                 "bad_parent": "file_not_found"}


class SandtreeSandbox(BaseSandbox):
    """deepagents' sandbox backend over a live sandtree sandbox (in process or through `sandtree
    serve`: whatever Sandtree the sandbox came from)."""

    # deepagents' capture-offload wrapper runs the command in a child shell: its cd and exports
    # would not reach the session, so it stays off (the default): large outputs come back whole.
    enable_capture_offload = False

    def __init__(self, sandbox, *, uid: int = 0, gid: int | None = None, timeout: int = DEFAULT_TIMEOUT,
                 owned: bool = False, start_options: dict | None = None):
        """Adapt a running `sandtree` Sandbox (img.start(...)). owned: stop() and leaving a `with`
        block stop it (start() sets it). start_options: what fork()/rollback() start with."""
        self._check_ids(uid, gid)
        self._timeout = self._check_timeout(timeout)
        self._sandbox = sandbox
        self._uid, self._gid = uid, (uid if gid is None else gid)
        self._owned = owned
        self._options = dict(start_options or {})
        self._lock = threading.Lock()          # rollback swaps the sandbox under concurrent calls

    # ---- making one ---------------------------------------------------------------------------
    @classmethod
    def start(cls, image, *, uid: int = 0, gid: int | None = None, timeout: int = DEFAULT_TIMEOUT,
              **start_options) -> "SandtreeSandbox":
        """Start a live sandbox on `image` (a sandtree Image; start_options as Image.start takes
        them: memory, cpus, network, env, cwd, lifetime, idle_timeout, ...), owned by the backend."""
        cls._check_ids(uid, gid)                   # bad input refused before a sandbox exists
        cls._check_timeout(timeout)
        return cls(image.start(**start_options), uid=uid, gid=gid, timeout=timeout, owned=True,
                   start_options=start_options)

    @classmethod
    async def astart(cls, image, **kwargs) -> "SandtreeSandbox":
        return await asyncio.to_thread(cls.start, image, **kwargs)

    # ---- what it is ---------------------------------------------------------------------------
    @property
    def id(self) -> str:
        """The sandtree sandbox's id (`st.sandbox(id)` finds it from any process on the store)."""
        return self._sandbox.id

    @property
    def sandbox(self):
        """The sandtree Sandbox underneath (exec with a list, popen, expose, hibernate, ...)."""
        return self._sandbox

    @property
    def image(self):
        """The image the current sandbox started from (after rollback(img): img)."""
        return self._sandbox.image

    def commit(self, *, tag: str | None = None):
        """An image of the sandbox's files now (it goes on running): run, fork or diff it, or
        rollback(it) later."""
        return self._sandbox.commit(tag=tag)

    def fork(self) -> "SandtreeSandbox":
        """A second backend on a new sandbox started from this one's files now (its own from then
        on; processes and memory are not copied)."""
        return type(self).start(self.commit(), uid=self._uid, gid=self._gid, timeout=self._timeout or 0,
                                **self._options)

    def rollback(self, image) -> None:
        """Go back to `image` (a commit of this sandbox, or any image): the current sandbox is
        stopped if this backend started it, a new one starts there, and `id` becomes the new one's."""
        new = image.start(**self._options)
        with self._lock:
            old, owned = self._sandbox, self._owned
            self._sandbox, self._owned = new, True
        if owned:
            old.stop()

    def stop(self) -> None:
        """Stop the sandbox (commit first to keep its files)."""
        self._sandbox.stop()

    async def acommit(self, *, tag: str | None = None):
        return await asyncio.to_thread(self.commit, tag=tag)

    async def afork(self) -> "SandtreeSandbox":
        return await asyncio.to_thread(self.fork)

    async def arollback(self, image) -> None:
        await asyncio.to_thread(self.rollback, image)

    async def astop(self) -> None:
        await asyncio.to_thread(self.stop)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._owned:
            self.stop()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if self._owned:
            await self.astop()

    # ---- the three primitives -----------------------------------------------------------------
    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run a shell string in the sandbox's session; stdout and stderr combined in the order
        they came. A command over its timeout is killed: exit code 124 and a line saying so."""
        limit = self._timeout if timeout is None else self._check_timeout(timeout)
        sb = self._current()
        if limit is None:                  # no limit of its own: what is left of the sandbox's lifetime
            limit = max(1.0, round(sb.info()["expires"] - time.time()))
        chunks: list[bytes] = []
        res = sb.exec(command, uid=self._uid, gid=self._gid, timeout=limit,
                      on_output=lambda _stream, data: chunks.append(data))
        output = b"".join(chunks).decode("utf-8", "replace")
        truncated = res.stdout_truncated or res.stderr_truncated
        if res.timed_out:
            sep = "\n" if output and not output.endswith("\n") else ""
            return ExecuteResponse(output=f"{output}{sep}Error: Command timed out after {limit:g} seconds.",
                                   exit_code=TIMED_OUT_EXIT, truncated=truncated)
        code = res.exit_code if res.exit_code is not None else (128 + res.signal if res.signal else None)
        return ExecuteResponse(output=output, exit_code=code, truncated=truncated)

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        """Write each file (parents made, owned by uid/gid); one response per file, in order."""
        errors = self._checked([p for p, _ in files], _CAN_WRITE)
        out = []
        for path, data in files:
            error = errors.get(path) or self._write(path, data)
            out.append(FileUploadResponse(path=path, error=error))
        return out

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        """Read each file whole; one response per path, in order."""
        errors = self._checked(paths, _CAN_READ)
        out = []
        for path in paths:
            error = errors.get(path)
            content = None
            if error is None:
                content, error = self._read(path)
            out.append(FileDownloadResponse(path=path, content=content, error=error))
        return out

    # ---- inside ---------------------------------------------------------------------------------
    def _current(self):
        with self._lock:
            return self._sandbox

    @staticmethod
    def _check_ids(uid, gid) -> None:
        for name, v in (("uid", uid), ("gid", 0 if gid is None else gid)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidInput(f"{name} must be a non-negative integer", **{name: v})

    @staticmethod
    def _check_timeout(timeout) -> float | None:
        """Seconds for one command; 0 (None back): no limit of its own, the sandbox's lifetime bounds it."""
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise InvalidInput(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        return float(timeout) if timeout else None

    @staticmethod
    def _valid(path) -> bool:
        return isinstance(path, str) and path.startswith("/") and "\0" not in path

    def _checked(self, paths: list[str], script: str) -> dict[str, str]:
        """Errors by path: invalid paths, and for a uid other than 0 what it may not do (root may
        do anything, so no command runs then)."""
        errors = {p: "invalid_path" for p in paths if not self._valid(p)}
        ask = [p for p in dict.fromkeys(paths) if p not in errors]
        if ask and self._uid != 0:
            res = self._current().exec(["/bin/sh", "-c", script, "sh", *ask], uid=self._uid, gid=self._gid)
            words = res.stdout.decode().split()
            if len(words) != len(ask):
                raise SandtreeError(f"the sandbox's permission check answered {res.stdout[:200]!r} "
                                    f"{res.stderr[:200]!r} (exit {res.exit_code})")
            errors.update({p: _CHECK_ERRORS[w] for p, w in zip(ask, words) if w != "ok"})
        return errors

    def _read(self, path: str) -> tuple[bytes | None, str | None]:
        sb = self._current()
        try:
            return sb.read(path), None
        except NotRegularFile:
            return None, "is_directory" if self._is_dir(sb, path) else "invalid_path"
        except NotFound:
            return None, "file_not_found"
        except InvalidInput:                   # PathEscape (a link out of the root) among them
            return None, "invalid_path"
        except SandtreeError as e:
            return None, f"{e.code}: {e}"

    def _write(self, path: str, data: bytes) -> str | None:
        sb = self._current()
        try:
            sb.write(path, bytes(data), uid=self._uid, gid=self._gid)
            return None
        except NotRegularFile:
            return "is_directory" if self._is_dir(sb, path) else "invalid_path"
        except NotFound:
            return "file_not_found"
        except InvalidInput:                   # PathEscape, a file where a directory should be
            return "invalid_path"
        except SandtreeError as e:
            return f"{e.code}: {e}"

    @staticmethod
    def _is_dir(sb, path: str) -> bool:
        try:
            sb.ls(path)
            return True
        except SandtreeError:
            return False
