"""MCP tools for live sandboxes: a sandbox that stays up between commands (a dev server, a REPL,
a shell's cwd), its files while it runs, committing it to an image, hibernating and resuming it."""

from __future__ import annotations

from .. import defaults as D
from .toolkit import Toolkit, argv


def register(t: Toolkit) -> None:
    engine = t.engine
    # the sandboxes this session starts are stopped when it ends (Toolkit.end_session), unless stopped before
    t.after("sandbox_start", lambda answer: t.started_here(answer["id"]))
    t.after("sandbox_stop", lambda answer: t.stopped_here(answer["id"]))

    @t.handler
    def sandbox_exec(sandbox_id: str, command: str | list[str], shell: bool = True, timeout: float | None = None,
                     stdin: str | None = None, cwd: str | None = None, env: dict[str, str] | None = None,
                     truncate_output_at: int = D.MCP_OUTPUT_CHARS) -> dict:
        """Run a command in a live sandbox: a string with shell=true runs in its shell session (cd and
        export carry over); otherwise a fresh process. Returns exit_code, stdout, stderr."""
        rec = engine.sandbox_exec(sandbox_id, argv(command, shell), timeout=timeout,
                                  stdin=stdin, cwd=cwd, env=env)
        res = t.run_result(rec, truncate_output_at)
        res.pop("result_image")
        return res

    @t.handler
    def sandbox_spawn(sandbox_id: str, command: str | list[str], shell: bool = True, stdin: str | None = None,
                      stdin_open: bool = False, cwd: str | None = None, env: dict[str, str] | None = None) -> dict:
        """Start a process in a live sandbox without waiting for it (a server, a REPL, a long job);
        returns its pid. sandbox_process then feeds its stdin, signals it and reads its output.
        stdin_open: keep its stdin open for sandbox_process(stdin=...)"""
        pid = engine.sandbox_spawn(sandbox_id, argv(command, shell), stdin=stdin,
                                   stdin_open=stdin_open, cwd=cwd, env=env)
        return {"sandbox_id": sandbox_id, "pid": pid}

    @t.handler
    def sandbox_process(sandbox_id: str, pid: int, stdin: str | None = None, close_stdin: bool = False,
                        signal: str | None = None, truncate_output_at: int = D.MCP_OUTPUT_CHARS) -> dict:
        """A process started by sandbox_spawn: first writes stdin (and closes it with close_stdin),
        then sends signal, then tells whether it runs, its exit code and its output so far.
        pid: the process's number (from sandbox_spawn)
        stdin: text written to its open stdin
        close_stdin: close its stdin (after writing stdin), so a program reading to the end goes on
        signal: a signal sent to its process group (TERM, KILL, INT, a number)
        truncate_output_at: the last characters of stdout and stderr returned"""
        if stdin is not None or close_stdin:
            engine.sandbox_stdin(sandbox_id, pid, (stdin or "").encode(), close=close_stdin)
        if signal is not None:
            engine.sandbox_signal(sandbox_id, pid, signal)
        v = engine.sandbox_process(sandbox_id, pid)
        keep = ("pid", "running", "exit_code", "signal", "timed_out", "stdin_open", "command")
        out = {k: v.get(k) for k in keep}
        for s in ("stdout", "stderr"):
            out[s] = v[s][-truncate_output_at:] if truncate_output_at else v[s]
            out[s + "_truncated"] = v[s + "_truncated"] or len(v[s]) > truncate_output_at
        return out

    @t.handler
    def sandbox_read_file(sandbox_id: str, path: str, offset: int = 0, limit: int = D.MCP_SANDBOX_READ_LIMIT) -> dict:
        """A file of a running live sandbox, as text (binary bytes replaced)."""
        data = engine.sandbox_read(sandbox_id, path)
        chunk = data[offset:offset + limit]
        return {"path": path, "size": len(data), "content": chunk.decode("utf-8", "replace"),
                "truncated": offset + limit < len(data)}

    @t.handler
    def sandbox_write_file(sandbox_id: str, path: str, content: str, mode: int = D.FILE_MODE) -> dict:
        """Write a text file into a running live sandbox (its directory must exist)."""
        engine.sandbox_write(sandbox_id, path, content.encode(), mode=mode)
        return {"path": path, "size": len(content.encode())}

    @t.handler
    def sandbox_port(sandbox_id: str, port: int, close: bool = False, url_ttl: float | None = None) -> dict:
        """Expose a TCP port of a live sandbox (a dev server, a notebook) and get its URLs: url on the
        engine's host loopback, path under the sandtree server (with the token). close=true: unexpose
        it. url_ttl: also a signed URL (signed_url) anyone may open without a token for that many seconds."""
        if close:
            engine.sandbox_unexpose(sandbox_id, port)
            return {"port": port, "exposed": False}
        entry = engine.sandbox_expose(sandbox_id, port)
        if url_ttl is not None:
            entry["signed_url"] = engine.sandbox_port_url(sandbox_id, port, ttl=url_ttl)
        return entry
