"""`sandtree build`'s progress, in docker build's three forms, fed by Engine.build's progress events
({"step", "total", "stage", "text", "line", "status": cached|running|done|failed, "output"?, "stream"?,
"seconds"?, "error"?}):

- plain (docker's `--progress plain`): `#N [stage i/n] TEXT` when a step starts, `#N 0.512 LINE` for
  each line of its output (seconds since the step began), then `#N CACHED`, `#N DONE 0.3s` or
  `#N ERROR: ...`;
- json: each event as one JSON object a line (output as text);
- live (a terminal): rich's live view, one line per step, the running step's last lines of output
  under it, folded away when it is done (a failed step keeps its tail).

All three write to a stream of their own (stderr in the CLI), so stdout carries only the result.
"""

from __future__ import annotations

import json
import re
import threading
import time

from .output import rich_modules

__all__ = ["StepLabels", "PlainProgress", "JsonProgress", "LiveProgress", "FOLD_LINES"]

FOLD_LINES = 6              # output lines shown under a running step in the live view
_KEEP = 64 << 10            # bytes of a step's output the live view keeps
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _clean(line: str) -> str:
    """A line of a sandbox's output made safe for a terminal: control characters (escape
    sequences a build could use to rewrite the screen) shown as '?'."""
    return _CONTROL.sub("?", line)


class StepLabels:
    """`[stage i/n]` of each step, as docker writes it: the stage's name (stage-N when it has none,
    nothing for a lone unnamed stage) and the step's place in its stage. Found by (stage, line)
    in the recipe; `[step/total]` when the recipe does not know it."""

    def __init__(self, recipe=None):
        self.by_key: dict = {}
        stages = recipe.stages if recipe is not None else ()
        for si, st in enumerate(stages):
            name = st.name or ("" if len(stages) == 1 else f"stage-{si}")
            for i, step in enumerate(st.steps, 1):
                self.by_key[(st.name or str(si), step.line)] = f"{name} {i}/{len(st.steps)}".strip()

    def __call__(self, ev: dict) -> str:
        return self.by_key.get((ev.get("stage"), ev.get("line"))) or f"{ev.get('step')}/{ev.get('total')}"


class _Lines:
    """A step's output cut into lines (a partial line waits for its end)."""

    def __init__(self):
        self.partial = b""

    def feed(self, data: bytes) -> list[str]:
        data = self.partial + data
        *lines, self.partial = data.split(b"\n")
        return [_clean(ln.decode("utf-8", "replace").rstrip("\r")) for ln in lines]

    def flush(self) -> list[str]:
        rest, self.partial = self.partial, b""
        return [_clean(rest.decode("utf-8", "replace").rstrip("\r"))] if rest else []


class PlainProgress:
    def __init__(self, stream, labels: StepLabels, clock=time.monotonic):
        self.stream, self.labels, self.clock = stream, labels, clock
        self.started: dict[int, float] = {}
        self.lines: dict[int, _Lines] = {}

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _header(self, n: int, ev: dict) -> None:
        if n not in self.started:
            self.started[n] = self.clock()
            self.lines[n] = _Lines()
            self._print(f"#{n} [{self.labels(ev)}] {_clean(ev.get('text', ''))}")

    def _output(self, n: int, lines: list[str]) -> None:
        at = self.clock() - self.started[n]
        for line in lines:
            self._print(f"#{n} {at:.3f} {line}")

    def __call__(self, ev: dict) -> None:
        n, status = ev.get("step"), ev.get("status")
        self._header(n, ev)
        if status == "running":
            if ev.get("output"):
                self._output(n, self.lines[n].feed(ev["output"]))
            return
        self._output(n, self.lines[n].flush())
        if status == "cached":
            self._print(f"#{n} CACHED")
        elif status == "done":
            secs = ev.get("seconds")
            self._print(f"#{n} DONE {secs if secs is not None else self.clock() - self.started[n]:.1f}s")
        elif status == "failed":
            self._print(f"#{n} ERROR: {_clean(str(ev.get('error') or 'the step failed'))}")

    def close(self) -> None:
        pass


class JsonProgress:
    def __init__(self, stream):
        self.stream = stream

    def __call__(self, ev: dict) -> None:
        doc = dict(ev)
        if isinstance(doc.get("output"), (bytes, bytearray)):
            doc["output"] = bytes(doc["output"]).decode("utf-8", "replace")
        self.stream.write(json.dumps(doc, default=str) + "\n")
        self.stream.flush()

    def close(self) -> None:
        pass


class _Step:
    def __init__(self, n: int, label: str, text: str, started: float):
        self.n, self.label, self.text, self.started = n, label, text, started
        self.status = "running"
        self.seconds: float | None = None
        self.output = b""


def _rich():
    console, live, _, text = rich_modules()      # only when someone watches a terminal
    return console, live, text


class LiveProgress:
    """The live view: `[+] Building 3.2s (4/9)`, then `=> [stage i/n] TEXT  1.2s` per step seen."""

    def __init__(self, stream, labels: StepLabels, clock=time.monotonic, live=True):
        self.console = _rich()[0].Console(file=stream) if live else None
        self.labels, self.clock = labels, clock
        self.began = clock()
        self.steps: dict[int, _Step] = {}
        self.total = 0
        self.lock = threading.Lock()        # rich's refresh thread reads what events write
        self.live = None
        if live:
            self.live = _rich()[1].Live(self, console=self.console, refresh_per_second=8, transient=False)
            self.live.start()

    def __call__(self, ev: dict) -> None:
        n = ev.get("step")
        with self.lock:
            self.total = ev.get("total") or self.total
            st = self.steps.get(n)
            if st is None:
                st = self.steps[n] = _Step(n, self.labels(ev), ev.get("text", ""), self.clock())
            if ev.get("output"):
                st.output = (st.output + ev["output"])[-_KEEP:]
            st.status = ev.get("status", st.status)
            if st.status != "running":
                st.seconds = ev.get("seconds", self.clock() - st.started)
        if ev.get("status") != "running" and self.live is not None:
            self.live.refresh()

    def __rich__(self):
        rc, _, rt = _rich()
        Text = rt.Text
        with self.lock:
            steps = [(s.label, s.text, s.status, s.seconds, s.started, s.output) for s in self.steps.values()]
        finished = sum(1 for s in steps if s[2] != "running")
        rows = [Text(f"[+] Building {self.clock() - self.began:.1f}s ({finished}/{self.total})", style="bold")]
        for label, text, status, seconds, started, output in steps:
            secs = seconds if seconds is not None else self.clock() - started
            style = {"running": "cyan", "failed": "bold red", "cached": "blue"}.get(status, "")
            cached = "CACHED " if status == "cached" else ""
            failed = "ERROR " if status == "failed" else ""
            rows.append(Text(f" => {failed}{cached}[{label}] {_clean(text)}"[:200] + f"  {secs:.1f}s", style=style))
            if status in ("running", "failed"):
                tail = output.decode("utf-8", "replace").rstrip("\n").split("\n")[-FOLD_LINES:]
                rows += [Text(f" => => # {_clean(line)}"[:200], style="dim") for line in tail if line]
        return rc.Group(*rows)

    def close(self) -> None:
        if self.live is not None:
            self.live.refresh()
            self.live.stop()
