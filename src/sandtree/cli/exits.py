"""The `sandtree` command's exit statuses, in one table: main.py, the verbs and the docs read them here.

`run` and `exec` exit with the command's own status (0-123; 124 if it timed out, 128+N if signal N killed it),
so a sandtree error there is 125 (as timeout(1) and `docker run`); every other verb exits 0, or 1 on a sandtree
error (any class: its `code` is in the JSON error object with --json) or when its answer is "no" (a merge left
conflicts, an evaluation complained); argparse answers 2 for a wrong command line."""

from __future__ import annotations

__all__ = ["EXITS", "ERROR", "ERROR_IN_COMMAND", "INTERRUPTED", "NO", "OK", "SIGNAL", "TIMEOUT", "USAGE",
           "of_run"]

OK = 0
ERROR = 1                  # a sandtree error
NO = 1                     # the verb worked and its answer is no (merge: conflicts; evaluate: complaints)
USAGE = 2                  # argparse: the command line itself is wrong
TIMEOUT = 124              # run/exec: the command ran out of time
ERROR_IN_COMMAND = 125     # run/exec: a sandtree error (the statuses below it are the command's own)
SIGNAL = 128               # run/exec: 128+N, signal N killed the command
INTERRUPTED = 130          # Ctrl-C (128 + SIGINT)

# name -> status (docs and tests list them from here)
EXITS = {"ok": OK, "error": ERROR, "no": NO, "usage": USAGE, "timeout": TIMEOUT,
         "error_in_command": ERROR_IN_COMMAND, "signal": SIGNAL, "interrupted": INTERRUPTED}


def of_run(rec) -> int:
    """A run's record as the exit status of `run` / `exec`."""
    if rec.timed_out:
        return TIMEOUT
    if rec.signal:
        return SIGNAL + rec.signal
    return rec.exit_code or OK
