"""`sandtree eval`'s progress, fed by the harness's events (evaluation/harness.py: {"instance_id",
"status": building|environment_changed|running|resolved|unresolved|error|skipped|empty_patch, "done", "total",
...} and a
last {"status": "finished", "summary"}), in the three forms `sandtree build` has:

- plain: one line per instance step, `[3/10] ID resolved 4.2s image 19758ec3e55a`, and each
  environment step that runs (not a cache hit) as `ID #N DONE 3.1s RUN ...`;
- json: each event as one JSON object a line;
- live (a terminal): rich's live view, `[+] Evaluating 12.3s (3/10)` with the counts, a line per
  instance at work (its build step or its test time) and the last ones finished.

All three write to their own stream (stderr), so stdout carries only the summary."""

from __future__ import annotations

import json
import re
import threading
import time

from .output import rich_modules

__all__ = ["PlainEval", "JsonEval", "LiveEval", "eval_view"]

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SHOWN_FINISHED = 8


def _clean(text) -> str:
    """Text from an instance (its ID is checked; a step's text or an error is not) made safe for
    a terminal: control characters shown as '?'."""
    return _CONTROL.sub("?", str(text))


def _first_line(text) -> str:
    return _clean(str(text).strip().split("\n")[0])[:200]


class PlainEval:
    def __init__(self, stream):
        self.stream = stream

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __call__(self, ev: dict) -> None:
        status, iid = ev.get("status"), ev.get("instance_id")
        head = f"[{ev.get('done')}/{ev.get('total')}] {iid}"
        if status == "building":
            step = ev.get("step")
            if step and step.get("status") in ("done", "failed"):
                what = "DONE" if step["status"] == "done" else "ERROR"
                text = _clean(step.get("text", ""))[:160]
                self._print(f"{iid} #{step.get('step')} {what} {step.get('seconds') or 0:.1f}s {text}")
        elif status == "running":
            self._print(f"{head} running on {str(ev.get('image'))[:12]}")
        elif status in ("resolved", "unresolved"):
            self._print(f"{head} {status} {ev.get('seconds', 0):.1f}s image {str(ev.get('image'))[:12]}")
        elif status == "error":
            kind = f" ({ev['kind']})" if ev.get("kind") else ""
            self._print(f"{head} error{kind}: {_first_line(ev.get('message', ''))}")
        elif status == "environment_changed":
            c = ev.get("change") or {}
            self._print(f"{iid} environment changed: {c.get('tag')} {str(c.get('old'))[:12]} -> "
                        f"{str(c.get('new'))[:12]}: {_first_line('; '.join(c.get('why') or ()))}")
        elif status in ("skipped", "empty_patch"):
            self._print(f"{head} {'skipped: it has a report' if status == 'skipped' else 'empty patch: not run'}")

    def close(self) -> None:
        pass


class JsonEval:
    def __init__(self, stream):
        self.stream = stream

    def __call__(self, ev: dict) -> None:
        self.stream.write(json.dumps(ev, default=str) + "\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class LiveEval:
    """The live view: a header with the counts, the instances at work, the last ones finished."""

    def __init__(self, stream, clock=time.monotonic):
        console, live, _, text = rich_modules()      # only when someone watches a terminal
        self.Text, self.group = text.Text, console.Group
        self.console = console.Console(file=stream)
        self.clock, self.began = clock, clock()
        self.lock = threading.Lock()                 # rich's refresh thread reads what events write
        self.active: dict[str, tuple[str, float]] = {}
        self.finished: list[tuple[str, str, float]] = []
        self.counts: dict[str, int] = {}
        self.done = self.total = 0
        self.live = live.Live(self, console=self.console, refresh_per_second=4, transient=False)
        self.live.start()

    def __call__(self, ev: dict) -> None:
        status, iid = ev.get("status"), ev.get("instance_id")
        with self.lock:
            self.done, self.total = ev.get("done", self.done), ev.get("total", self.total)
            if status == "building":
                step = ev.get("step") or {}
                what = (f"building: {step.get('step')}/{step.get('total')} {_clean(step.get('text', ''))}"
                        if step else "building")
                self.active[iid] = (what[:120], self.active.get(iid, ("", self.clock()))[1])
            elif status == "running":
                self.active[iid] = ("running the tests", self.clock())
            elif status == "environment_changed":       # a note, not an instance's end
                c = ev.get("change") or {}
                self.finished.append((iid, f"environment changed {str(c.get('old'))[:12]} -> "
                                           f"{str(c.get('new'))[:12]}", 0.0))
            elif status and status != "finished":
                self.active.pop(iid, None)
                self.counts[status] = self.counts.get(status, 0) + 1
                msg = _first_line(ev.get("message", "")) if status == "error" else ""
                self.finished.append((iid, f"{status} {msg}".strip(), ev.get("seconds") or 0.0))
        if status not in ("building", "running"):
            self.live.refresh()

    def __rich__(self):
        Text = self.Text
        with self.lock:
            counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts.items()))
            rows = [Text(f"[+] Evaluating {self.clock() - self.began:.1f}s ({self.done}/{self.total})"
                         + (f": {counts}" if counts else ""), style="bold")]
            for iid, (what, since) in self.active.items():
                rows.append(Text(f" => {iid} {what}  {self.clock() - since:.1f}s", style="cyan"))
            for iid, what, secs in self.finished[-_SHOWN_FINISHED:]:
                style = {"resolved": "green", "error": "bold red"}.get(what.split(" ")[0], "")
                rows.append(Text(f" => {iid} {what}  {secs:.1f}s"[:200], style=style))
        return self.group(*rows)

    def close(self) -> None:
        self.live.refresh()
        self.live.stop()


def eval_view(mode: str, stream, *, tty: bool | None = None):
    """The progress callback for --progress MODE (auto: live on a terminal, else plain); None: quiet."""
    tty = stream.isatty() if tty is None else tty
    if mode == "quiet":
        return None
    if mode == "json":
        return JsonEval(stream)
    if mode == "plain" or not tty:
        return PlainEval(stream)
    return LiveEval(stream)
