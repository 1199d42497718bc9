"""Operations: runs started now and awaited later (wait=false in MCP, the server's queue).

An operation is a run with an ID known before it starts. Its row is written when it is
submitted (status from the row: finished NULL = queued or running), and completed by the run's
own transaction, so `sandtree op ID` and every adapter see the same record. Cancel works queued
(the run never starts) or running (the sandbox is killed; nothing is committed). An engine that
dies leaves rows unfinished: the next engine marks those of dead processes failed, never
leaving them "running" forever; an engine that runs or watches operations looks again every few
seconds, and judges owners on other machines by their heartbeats (heartbeat.py: API replicas).

What this process keeps per operation is bounded (a flooding run grew a server
by gigabytes, never freed): live output events are kept up to the run's output cap per stream (the
run itself keeps no more; the end event then says `events_truncated`), and all stream events of
a live run's processes together up to LOG_BUDGET caps (then one `size_cap` event, and no more); an ended operation's
events shrink to its end event after EVENTS_KEEP seconds, so a stream resuming with Last-Event-ID
still learns how it ended; the finished results (their full output, for get/result) are kept for
`retain_seconds` and within `retain_bytes`, oldest dropped first: after that an operation reads as
after a restart (status, exit code and image from its row, no output).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import OrderedDict, deque
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Protocol

from ...errors import InvalidInput, NotFound, SandtreeError
from ...runtime.base import Limits
from ...procid import Owner
from .heartbeat import Heartbeats
from ...store import registry
from ..processes.instances import Instances
from ..processes.spawned import fold_process, public_view
from ...store.names import check_tag
from .records import Records
from ...values import parse_size


EVENTS_KEEP = 60.0            # seconds an ended operation's events stay whole (a client reading to the end)
ENDED_MARKERS = 10000         # end events kept after that, newest first
LOG_BUDGET = 8                # a log keeps this many output caps of stream events in all (then size_cap)
RETAIN_SECONDS = 600.0        # finished results (full output) kept this long...
RETAIN_BYTES = 256 << 20      # ...and within this many bytes of output in all


class RunHost(Protocol):
    """What operations run on (engine.Engine is one): where rows go, and the calls they make."""
    records: Records
    default_limits: Limits

    def resolve(self, ref: str) -> str: ...
    def run_operation(self, ref: str, command, *, op_id: str | None = None, check_only: bool = False,
                      **options): ...
    def pull_operation(self, reference: str, *, op_id: str | None = None, **options) -> str: ...
    def registry_login(self, registry_url: str, username: str, secret: str) -> str: ...


class Operations:
    def __init__(self, host: RunHost, workers: int = 4, *, retain_seconds: float = RETAIN_SECONDS,
                 retain_bytes: int = RETAIN_BYTES):
        self.host = host
        self.records = host.records
        self.retain_seconds, self.retain_bytes = retain_seconds, retain_bytes
        self._event_caps: dict[str, int] = {}           # op -> bytes of output events kept per stream
        self._event_bytes: dict[tuple[str, str], int] = {}
        self._events_cut: set[str] = set()
        self._log_bytes: dict[str, int] = {}            # op -> bytes of stream events kept (all processes)
        self._log_capped: set[str] = set()              # ops past LOG_BUDGET (their size_cap is written)
        self._ended: OrderedDict[str, float] = OrderedDict()      # op -> when its end event came
        self._whole: deque[tuple[str, float]] = deque()  # (op, ended) whose events are not cut yet, oldest first
        self._results: OrderedDict[str, tuple[float, int]] = OrderedDict()   # op -> (finished, bytes)
        self._result_bytes = 0
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandtree-op")
        self.live: dict[str, tuple[Future, threading.Event]] = {}
        self.lock = threading.Lock()
        # Live output of this process's operations: (seq, event, data), for streams that resume.
        self.events: dict[str, list[tuple[int, str, str]]] = {}
        self.changed = threading.Condition(self.lock)
        # Counters for /metrics: submitted, finished by status, run latency (seconds) buckets.
        self.counts = {"submitted": 0, "done": 0, "failed": 0, "cancelled": 0}
        self.latency_buckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300]
        self.latency = [0] * (len(self.latency_buckets) + 1)
        self.latency_sum = 0.0
        self.instances = Instances(host, self._event)      # runs in live sandboxes (live=True)
        self.beats = Heartbeats(self.records.store.db)
        self._recover()

    def _count(self, status: str, seconds: float | None = None) -> None:
        with self.lock:
            self.counts[status] = self.counts.get(status, 0) + 1
            if seconds is not None:
                self.latency_sum += seconds
                i = next((k for k, b in enumerate(self.latency_buckets) if seconds <= b), len(self.latency_buckets))
                self.latency[i] += 1

    def queue_depth(self) -> int:
        with self.lock:
            return sum(1 for fut, _ in self.live.values() if not fut.running() and not fut.done())

    def _event(self, op: str, kind: str, data: str) -> None:
        with self.changed:
            log = self.events.setdefault(op, [])
            marker = None
            cap = self._event_caps.get(op)
            if cap is not None and _is_stream(kind, data):
                # the whole log's output (every process's streams and stdin) within LOG_BUDGET caps:
                # past it, stream events are dropped after one size_cap marker (Contree's)
                used = self._log_bytes.get(op, 0)
                if op in self._log_capped or used + len(data) > LOG_BUDGET * cap:
                    if op not in self._log_capped:
                        self._log_capped.add(op)
                        marker = json.dumps({"limit_bytes": LOG_BUDGET * cap, "file_size": used})
                        log.append((log[-1][0] + 1 if log else 1, "size_cap", marker))
                        self.changed.notify_all()
                    self._events_cut.add(op)
                    return
                self._log_bytes[op] = used + len(data)
            if kind in ("stdout", "stderr") and cap is not None:
                used = self._event_bytes.get((op, kind), 0)
                if used + len(data) > cap:
                    data = data[:max(0, cap - used)]
                    self._events_cut.add(op)
                self._event_bytes[(op, kind)] = used + len(data)
            elif kind == "end" and op in self._events_cut:
                data = json.dumps({**json.loads(data), "events_truncated": True})
            if data:
                log.append((log[-1][0] + 1 if log else 1, kind, data))
            if kind == "end":
                self._ended[op] = time.monotonic()
                self._whole.append((op, self._ended[op]))
                self._event_caps.pop(op, None)
                self._events_cut.discard(op)
                self._log_capped.discard(op)
                self._log_bytes.pop(op, None)
                for k in ("stdout", "stderr"):
                    self._event_bytes.pop((op, k), None)
                self._prune()
            self.changed.notify_all()

    def _prune(self) -> None:
        """Drop what ended operations keep beyond the bounds (module doc). Holds self.lock."""
        now = time.monotonic()
        # (only the ops not cut yet: walking every end marker at each end cost ~5 % of a
        # server's CPU under 16 clients)
        while self._whole and now - self._whole[0][1] >= EVENTS_KEEP:
            op, _ = self._whole.popleft()
            log = self.events.get(op)
            if log and len(log) > 1:
                self.events[op] = [log[-1]]             # the end event: how it ended, at its seq
        while len(self._ended) > ENDED_MARKERS:
            op, _ = self._ended.popitem(last=False)
            self.events.pop(op, None)
        while self._results:
            op, (at, size) = next(iter(self._results.items()))
            if now - at < self.retain_seconds and self._result_bytes <= self.retain_bytes:
                break
            self._results.popitem(last=False)
            self._result_bytes -= size
            self.live.pop(op, None)                     # its future holds the full output

    def _finished(self, op: str, fut: Future) -> None:
        """A done callback: account for what the finished future holds."""
        if fut.cancelled():
            return                                      # may run under self.lock (close, cancel)
        rec = fut.result() if fut.exception() is None else None
        size = len(getattr(rec, "stdout", b"") or b"") + len(getattr(rec, "stderr", b"") or b"")
        with self.lock:
            if op in self.live:
                self._results[op] = (time.monotonic(), size)
                self._result_bytes += size
                self._prune()

    def events_after(self, op: str, after: int, timeout: float) -> tuple[list[tuple[int, str, str]], bool]:
        """Events of `op` with seq > after (waiting up to timeout for some); and whether it ended."""
        with self.changed:
            end = time.monotonic() + timeout
            while True:
                log = self.events.get(op, [])
                new = [e for e in log if e[0] > after]
                ended = bool(log) and log[-1][1] == "end"
                if new or ended or time.monotonic() >= end:
                    return new, ended
                self.changed.wait(max(0.0, end - time.monotonic()))

    def _recover(self) -> None:
        dead = [op for op, spec in self.records.unfinished() if _alive(spec, self.beats) is False]
        if dead:
            self.records.interrupt(dead, {"error": "interrupted", "message": "the engine running it stopped"})

    def submit_run(self, ref: str, command, **options) -> str:
        """Queue a run; returns its operation ID at once. Option live=True: its command runs as
        process 1 of a live sandbox, which more processes may join while it runs (processes/instances.py);
        stdin_open=True: its stdin stays open for sandbox_stdin (a live run); make_cwd=True: a
        missing cwd is made, not refused (a live run)."""
        self.beats.start(self._recover)
        stdin_open = bool(options.pop("stdin_open", False))
        make_cwd = bool(options.pop("make_cwd", False))       # a missing cwd is made (Contree's)
        live = bool(options.pop("live", False)) or stdin_open or make_cwd
        source = self.host.resolve(ref)
        checked = {**options, "cwd": None} if make_cwd else options
        self.host.run_operation(ref, command, check_only=True, **checked)   # bad input fails now, not later
        op = uuid.uuid4().hex
        cancel = threading.Event()
        spec = {"command": command if isinstance(command, str) else " ".join(map(str, command)),
                **Owner.me().to_dict(), "queued": True}
        self.records.queue(op, "run", source, spec)

        def on_output(stream: str, chunk: bytes) -> None:
            self._event(op, stream, chunk.decode("utf-8", "replace"))

        out = options.get("output")
        cap = parse_size(out) if out is not None else self.host.default_limits.output

        def work():
            t0 = time.monotonic()
            if cancel.is_set():
                self.instances.forget(op)
                self._finish(op, {"cancelled": True, "message": "cancelled before it started"})
                self._event(op, "end", json.dumps({"status": "cancelled"}))
                return None
            self._event(op, "start", json.dumps({"image": source}))
            self.records.start(op, spec)
            try:
                # the ref, not the ID: a run on a branch starts from its head then, and advances it
                if live:
                    rec = self.instances.run(op, ref, command, cancel=cancel, on_output=on_output,
                                             stdin_open=stdin_open, make_cwd=make_cwd, **options)
                else:
                    rec = self.host.run_operation(ref, command, op_id=op, cancel=cancel, on_output=on_output,
                                                  **options)
            except SandtreeError as exc:
                self._finish(op, exc.to_dict())
                self._event(op, "end", json.dumps({"status": "failed", **exc.to_dict()}, default=str))
                self._count("failed", time.monotonic() - t0)
                raise
            except Exception as exc:             # noqa: BLE001 - recorded, then re-raised to the future
                self._finish(op, {"error": "internal", "message": str(exc)})
                self._event(op, "end", json.dumps({"status": "failed", "error": "internal"}))
                self._count("failed", time.monotonic() - t0)
                raise
            self._count("cancelled" if rec.cancelled else "done", time.monotonic() - t0)
            # events_truncated: the stream did not carry all the command wrote (the runtime stops a
            # command at its output cap and passes on only what it kept)
            cut = {"events_truncated": True} if rec.stdout_truncated or rec.stderr_truncated else {}
            self._event(op, "end", json.dumps({"status": "cancelled" if rec.cancelled else "done",
                                               "exit_code": rec.exit_code, "signal": rec.signal,
                                               "timed_out": rec.timed_out, "image": rec.image, **cut}))
            return rec

        if live:
            self.instances.expect(op)
        with self.lock:
            self._event_caps[op] = cap
            fut = self.pool.submit(work)
            self.live[op] = (fut, cancel)
            self.counts["submitted"] += 1
        fut.add_done_callback(lambda f: self._finished(op, f))
        return op

    def submit_pull(self, reference: str, *, tag: str | None = None,
                    credentials: tuple[str, str] | None = None, then=None, check_host=None) -> str:
        """Queue a registry pull (an import operation); returns its ID at once. The reference is
        checked now; the registry is reached by the operation, which first logs in with
        `credentials` (kept for the registry's later pulls, as registry_login does). then(image):
        called in the operation once the image is in."""
        self.beats.start(self._recover)
        ref = registry.parse(reference)
        if tag is not None:
            check_tag(tag)
        op = uuid.uuid4().hex
        cancel = threading.Event()
        spec = {"source": f"pull:{ref}", "tag": tag, **Owner.me().to_dict(), "queued": True}
        self.records.queue(op, "import", None, spec)

        def work():
            if cancel.is_set():
                self._finish(op, {"cancelled": True, "message": "cancelled before it started"})
                self._event(op, "end", json.dumps({"status": "cancelled"}))
                return None
            self._event(op, "start", json.dumps({"reference": reference}))
            self.records.start(op, spec)
            try:
                if credentials is not None:
                    self.host.registry_login(ref.registry, *credentials)
                image = self.host.pull_operation(reference, tag=tag, op_id=op, check_host=check_host)
                if then is not None:
                    then(image)                  # the caller's bookkeeping (a tenant's ownership, tag)
            except Exception as exc:             # recorded, then re-raised to the future
                info = exc.to_dict() if isinstance(exc, SandtreeError) else {"error": "internal", "message": str(exc)}
                self._finish(op, info)
                self._event(op, "end", json.dumps({"status": "failed", **info}, default=str))
                self._count("failed")
                raise
            self._count("done")
            self._event(op, "end", json.dumps({"status": "done", "image": image}))
            return image

        with self.lock:
            fut = self.pool.submit(work)
            self.live[op] = (fut, cancel)
            self.counts["submitted"] += 1
        fut.add_done_callback(lambda f: self._finished(op, f))
        return op

    def _finish(self, op: str, outcome: dict) -> None:
        self.records.finish(op, outcome)

    def get(self, op: str) -> dict:
        self.beats.start(self._recover)          # a watcher of operations sweeps for gone owners too
        rec = self.records.get(op)
        with self.lock:
            live = self.live.get(op)
        if rec["finished"] is None:
            # this process's queue knows; a row another replica runs says whether it began
            rec["status"] = ("running" if live[0].running() else "queued") if live else \
                ("queued" if rec["spec"].get("queued") else "running")
        else:
            o = rec["outcome"] or {}
            rec["status"] = ("cancelled" if o.get("cancelled") else "failed" if "error" in o else "done")
        return rec

    def wait(self, ops: list[str], timeout: float | None = None) -> list[dict]:
        deadline = None if timeout is None else time.monotonic() + timeout
        for op in ops:
            with self.lock:
                live = self.live.get(op)
            if live is None:
                self.records.get(op)                  # NotFound for an unknown id (a live one has its row)
            else:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    live[0].exception(timeout=left)
                except (TimeoutError, CancelledError):     # cancelled while queued: recorded already
                    pass
        return [self.get(op) for op in ops]

    def future(self, op: str) -> Future:
        """The future of an operation this process runs (its result, or the error it raised);
        whoever holds it keeps the result past the retention bounds (engine.fork)."""
        with self.lock:
            live = self.live.get(op)
        if live is None:
            raise NotFound(f"operation {op} is not run by this process")
        return live[0]

    def result(self, op: str):
        """The finished run's record (with its full output) if this process ran it, else None."""
        with self.lock:
            live = self.live.get(op)
        if live is None or not live[0].done() or live[0].cancelled() or live[0].exception() is not None:
            return None
        return live[0].result()

    # ---- the processes of a live run (processes/instances.py; the rows are engine.sandbox_*) --------------
    def folded_process(self, op: str, spid: int) -> dict:
        """Process `spid` of a run not running live: from its events (EVENTS_KEEP); process 1 of
        any run from its result (liveprocs.fold_process), as liveprocs.public_view."""
        with self.lock:
            log = list(self.events.get(op, []))
        return public_view(fold_process(op, spid, log, self.get(op), self.result(op)))

    def cancel(self, op: str) -> dict:
        rec = self.get(op)
        if rec["status"] not in ("queued", "running"):
            raise InvalidInput(f"operation {op} is already {rec['status']}", status=rec["status"])
        with self.lock:
            live = self.live.get(op)
        if live is None:
            raise NotFound(f"operation {op} is not run by this process")
        live[1].set()
        if live[0].cancel():                          # still queued: it never starts
            self.instances.forget(op)
            self._finish(op, {"cancelled": True, "message": "cancelled before it started"})
            self._event(op, "end", json.dumps({"status": "cancelled"}))
        return self.get(op)

    def list(self, *, status: str | None = None, limit: int = 50, kind: str = "run") -> list[dict]:
        """The newest operations of one kind (run, import, ...), newest first."""
        out = [self.get(op) for op in self.records.recent_runs(max(1, min(limit, 1000)) * (4 if status else 1), kind)]
        if status:
            out = [o for o in out if o["status"] == status]
        return out[:limit]

    def close(self) -> None:
        with self.lock:
            for fut, cancel in self.live.values():
                cancel.set()
                fut.cancel()
        self.pool.shutdown(wait=True)
        self.instances.close()
        self.beats.stop()


def _is_stream(kind: str, data: str) -> bool:
    """Whether an event carries a process's stream bytes (a run's output, a live run's process's
    stdin, stdout or stderr: processes/instances.py's "proc" events)."""
    if kind in ("stdout", "stderr"):
        return True
    return kind == "proc" and json.loads(data).get("type") in ("stdout", "stderr", "stdin")


def _alive(spec: dict, beats: Heartbeats) -> bool | None:
    """Whether the engine that owns an unfinished row still runs: (pid, start time, pid namespace),
    so a recycled pid is not mistaken for it (runtime/procid.py); on another machine (another boot
    id) by its heartbeat. None: it runs in another pid namespace here, which cannot be judged from
    here (the row is left to an engine there). A row without an owner (or an older engine's, with a
    pid alone) is judged as before."""
    owner = Owner.from_dict(spec) if isinstance(spec, dict) else None
    if owner is None:
        return False
    alive = owner.alive()
    return beats.alive(owner) if alive is None and owner.boot is not None and owner.boot != beats.owner.boot \
        else alive
