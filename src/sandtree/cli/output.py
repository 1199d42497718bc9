"""How a command talks back: the engine it opens, --json or human output, sizes and times for
people, progress on a terminal. The command modules (images, runs, sandboxes, inspection,
branching, admin) print through these and nothing else decides the output's form."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager

from .. import config


def open_engine(args):
    """The engine over the store (one command, one process). Imported here, not at the top: `sandtree --help`
    and a wrong command line never load it (the engine and its dependencies are most of a start-up)."""
    return engine_api().Engine(args.home or config.default_home(), warm=0)


def engine_api():
    """sandtree.engine (Engine, dockerfile_recipe, ...), imported when a verb first needs it."""
    # not at the top: the engine and its dependencies were most of a start-up (`--help` ~0.6 s before)
    from .. import engine
    return engine


def remote_engine(server: str):
    """The engine of a `sandtree serve` at `server` (its token: $SANDTREE_TOKEN)."""
    # not at the top: httpx costs ~80 ms to import, and only --server verbs use it
    from ..client.remote import RemoteEngine
    return RemoteEngine(server, config.remote_token())


def out(args, obj, human) -> None:
    """obj as one JSON line with --json, else human(obj) prints it for people."""
    if args.json:
        print(json.dumps(obj, indent=None, default=str))
    else:
        human(obj)


def fmt_size(n: int) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024


def fmt_time(t: float, seconds: bool = False) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M", time.localtime(t))


def _watched(args) -> bool:
    """Someone is looking at a terminal (not --json, not a pipe): worth drawing progress."""
    return not args.json and sys.stderr.isatty()


def rich_modules():
    """rich's console, live, progress and text modules."""
    # rich costs ~40 ms to import: loaded only when a person watches a terminal
    from rich import console, live, progress, text
    return console, live, progress, text


def _rich():
    console, _, progress, _ = rich_modules()
    return console, progress


def _quiet(args) -> bool:
    """No progress at all: --json (stdout is one document) or -q (stdout is the ID alone)."""
    return args.json or getattr(args, "quiet", False)


def _plain(label: str, fn):
    """Progress for a log, not a terminal: a line when the work starts and one with its total when it ends."""
    done, t0 = [0], time.monotonic()
    print(f"{label}...", file=sys.stderr, flush=True)

    def advance(n: int) -> None:
        done[0] += n
    result = fn(advance)
    print(f"{label}: done, {fmt_size(done[0])} in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
    return result


def with_progress(args, label: str, fn):
    """fn(progress) with a rich progress bar (bytes) when stderr is a terminal; else a line when it starts and
    one with the total when it ends (a CI log sees the phases too); none with --json or -q."""
    if _quiet(args):
        return fn(None)
    if not _watched(args):
        return _plain(label, fn)
    _, rp = _rich()
    with rp.Progress(rp.TextColumn(label), rp.BarColumn(), rp.DownloadColumn(), rp.TransferSpeedColumn(),
                     transient=True) as prog:
        task = prog.add_task(label, total=None)
        return fn(lambda n: prog.advance(task, n))


@contextmanager
def status_line(args, label: str, quiet: bool = False):
    """Yields log(line), which shows the latest line after `label` on a terminal's status line;
    not on a terminal, one line on stderr per phase (the first line of each of its first two words:
    debootstrap's "I: Retrieving", "I: Validating", "I: Extracting", ...) and one when it is done; None with
    --json or -q."""
    if quiet or _quiet(args):
        yield None
        return
    if not _watched(args):
        seen, t0 = set(), time.monotonic()

        def phase(line: str) -> None:
            key = tuple(line.split()[:2])
            if key and key not in seen:
                seen.add(key)
                print(f"{label}: {line[:100]}", file=sys.stderr, flush=True)
        yield phase
        print(f"{label}: done in {time.monotonic() - t0:.1f}s", file=sys.stderr, flush=True)
        return
    rc, _ = _rich()
    status = rc.Console(stderr=True).status(label)
    status.start()
    try:
        yield lambda line: status.update(f"{label}: {line[:100]}")
    finally:
        status.stop()
