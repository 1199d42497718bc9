"""MCP tools that run commands: run, fork, and the operations runs are (get, wait, list, cancel)."""

from __future__ import annotations

from .. import defaults as D
from ..errors import InvalidInput
from .toolkit import Toolkit, argv

MAX_FORK_PARALLEL = 32        # a fork's runs at once from one tool call (the engine bounds the commands)
MAX_WAIT_IDS, MAX_WAIT = 1000, 600.0       # operations one wait_operations takes, and its seconds


def register(t: Toolkit) -> None:
    engine = t.engine

    def files_arg(files: dict[str, str] | None) -> list[dict]:
        return [{"path": p, "sha256": h} for p, h in (files or {}).items()]

    @t.handler
    def run(command: str | list[str], image: str, shell: bool = True, env: dict[str, str] | None = None,
            cwd: str | None = None, uid: int | None = None, gid: int | None = None, timeout: float = D.MCP_TIMEOUT,
            disposable: bool = False, stdin: str | None = None,
            files: dict[str, str] | None = None, directory_state_id: str | None = None, wait: bool = True,
            truncate_output_at: int = D.MCP_OUTPUT_CHARS, tier: str | None = None, memory: str | None = None,
            pids: int | None = None, cpus: float | None = None, disk: str | None = None,
            labels: dict[str, str] | None = None, network: bool | str | list[str] | dict | None = None,
            secrets: dict[str, dict] | list[str] | None = None, retries: int = 0, record: bool = False,
            replay: str | dict | None = None) -> dict:
        """Run a command in a fresh sandbox on an image. What it writes is kept as a new image,
        result_image, to run, fork, diff or merge next (disposable=true keeps nothing). Returns
        exit_code, stdout, stderr (cut, with a marker), result_image, timed_out, oom_killed."""
        cmd = argv(command, shell)
        opts = dict(env=env, cwd=cwd or None, uid=uid, gid=gid, timeout=timeout, disposable=disposable,
                    stdin=stdin.encode() if stdin else None, files=files_arg(files),
                    file_set=directory_state_id, tier=tier, labels=labels, network=network,
                    secrets=secrets, retries=retries, record=record, replay=replay)
        opts.update({k: v for k, v in (("memory", memory), ("pids", pids), ("cpus", cpus), ("disk", disk))
                     if v is not None})
        if not wait:
            return {"operation_id": engine.operations.submit_run(image, cmd, **opts)}
        return t.run_result(engine.run(image, cmd, **opts), truncate_output_at)

    @t.handler
    def fork(image: str, commands: list[str | list[str]], parallel: int = D.MCP_FORK_PARALLEL,
             timeout: float = D.MCP_TIMEOUT, disposable: bool = False,
             truncate_output_at: int = D.MCP_FORK_OUTPUT_CHARS) -> list[dict]:
        """Run several commands from the same image concurrently, one branch each (a string runs with
        /bin/sh -c, a list is the argv); results in order, each branch kept as its result_image."""
        recs = engine.fork(image, commands, parallel=max(1, min(parallel, MAX_FORK_PARALLEL)), timeout=timeout,
                           disposable=disposable)
        return [dict(t.run_result(r, truncate_output_at), command=c) for c, r in zip(commands, recs, strict=True)]

    # ---- operations ---------------------------------------------------------------------------
    @t.handler
    def get_operation(operation_id: str, offset: int = 0) -> dict:
        """Status and result of an operation (run); output from byte `offset` on."""
        rec = engine.operations.get(operation_id)
        t.remember_done(operation_id)
        return t.op_view(rec, offset)

    @t.handler
    def wait_operations(operation_ids: list[str], timeout: float = D.MCP_WAIT) -> list[dict]:
        """Wait (up to timeout seconds, at most 600) for operations to finish; returns their states."""
        if len(operation_ids) > MAX_WAIT_IDS:
            raise InvalidInput(f"at most {MAX_WAIT_IDS} operation ids")
        recs = engine.operations.wait(operation_ids, max(0.0, min(float(timeout), MAX_WAIT)))
        for op in operation_ids:
            t.remember_done(op)
        return [t.op_view(r) for r in recs]

    @t.handler
    def list_operations(status: str | None = None, limit: int = D.MCP_OPERATIONS_LIMIT) -> list[dict]:
        """Recent runs, newest first; status: queued, running, done, failed, cancelled."""
        return [t.op_view(r, limit=200) for r in engine.operations.list(status=status, limit=limit)]

    @t.handler
    def cancel_operation(operation_id: str) -> dict:
        """Cancel a queued or running operation (a running sandbox is killed; nothing is committed)."""
        return t.op_view(engine.operations.cancel(operation_id))
