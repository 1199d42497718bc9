"""Fork: many commands run from one image at once, one branch each, fanned out through an
operations object (the engine's, or a tenant's whose submissions take its run slots, claims and
audit). The one implementation Engine.fork and the tenant view's fork share."""

from __future__ import annotations

from concurrent.futures import wait

from ..errors import Conflict, InvalidInput, SandtreeError

__all__ = ["MAX_FORK", "FORK_REFUSED", "refuse_fork_options", "fan_out"]

MAX_FORK = 256                # commands in one fork: each is a queued operation (a row, a future)
FORK_REFUSED = ("on_output", "op_id", "cancel", "check_only")   # per-run hooks a fork cannot share


def refuse_fork_options(options: dict) -> None:
    for bad in FORK_REFUSED:
        if bad in options:
            raise InvalidInput(f"fork does not take {bad} (it is per run)")


def fan_out(operations, commands, parallel: int | None, *, check, submit) -> list:
    """The one fork: every command checked (check(command) raises on bad input) before any is
    submitted (submit(command) -> operation id, through `operations`: the engine's or a tenant's,
    whose submissions count against its run slots); at most `parallel` unfinished at once; the
    records in the commands' order. A run that fails raises its error once every other has
    ended; a fan-out interrupted while it waits cancels the runs it started."""
    if not isinstance(commands, (list, tuple)) or not commands:
        raise InvalidInput("fork takes a non-empty list of commands")
    if len(commands) > MAX_FORK:
        raise InvalidInput(f"at most {MAX_FORK} commands in one fork")
    if parallel is None:
        parallel = len(commands)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise InvalidInput("parallel must be an integer of at least 1")
    for command in commands:
        check(command)
    futures = []                          # held here: the operations' result cache may drop them
    try:
        for i, command in enumerate(commands):
            if i >= parallel:
                wait([futures[i - parallel][1]])    # at most `parallel` submitted and unfinished
            op = submit(command)
            futures.append((op, operations.future(op)))
        wait([f for _, f in futures])
    except BaseException:
        # the caller gives up (an interrupt, a failed submit): none of its runs goes on unseen
        for op, fut in futures:
            if not fut.done():
                try:
                    operations.cancel(op)
                except SandtreeError:
                    pass                    # ended meanwhile
        raise
    out, failed = [], None
    for op, fut in futures:
        if fut.cancelled():
            failed = failed or Conflict(f"fork run {op} was cancelled before it started", operation=op)
        elif fut.exception() is not None:
            failed = failed or fut.exception()
        else:
            out.append(fut.result())
    if failed is not None:
        raise failed
    return out
