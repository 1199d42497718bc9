"""Trace export: the subtree of the image DAG under a root as a dataset, one row per image, for RL
and evaluation libraries (Hugging Face `datasets` loads both formats). Built from table operations only
(children, operation, tags, image_info), so it works over the in-process Engine and the remote client alike.

A row: image, parent (None at the root), depth, op, kind, command, exit_code, stdout, stderr (the head a run's
record keeps, cut to max_output bytes) with stdout_truncated/stderr_truncated, usage (a JSON string: its keys
vary by run), tags (list), score, meta (a JSON string), created. A merge reached from two parents is one row,
under the parent met first (breadth-first, oldest edge first)."""

from __future__ import annotations

import importlib
import json
import os
from collections import deque

from .. import defaults as D
from ..errors import InvalidInput, NotFound

__all__ = ["FORMATS", "COLUMNS", "trace_rows", "export_trace"]

FORMATS = ("jsonl", "parquet")
# The Parquet writer loads on first use, as evaluation/'s harness does: pyarrow (the `traces` extra) takes
# ~0.35 s to import, twice what importing the SDK (which imports this module) takes.
_PARQUET = "sandtree.exploration.parquet"
COLUMNS = ("image", "parent", "depth", "op", "kind", "command", "exit_code", "stdout", "stderr", "stdout_truncated",
           "stderr_truncated", "usage", "tags", "score", "meta", "created")


def _cut(outcome: dict, stream: str, limit: int) -> tuple[str | None, bool]:
    """The output head the record kept, at most `limit` bytes; truncated if anything was left out."""
    head = outcome.get(f"{stream}_head")
    if head is None:
        return None, bool(outcome.get(f"{stream}_bytes"))
    data = head.encode()
    text = data[:limit].decode("utf-8", "ignore")
    cut = outcome.get(f"{stream}_bytes", len(data)) > len(text.encode())
    return text, bool(outcome.get(f"{stream}_truncated")) or cut


def _row(engine, image: str, parent: str | None, depth: int, op: str | None, max_output: int) -> dict:
    rec = engine.operation(op) if op else {}
    spec, outcome = rec.get("spec") or {}, rec.get("outcome") or {}
    command = spec.get("command")
    stdout, out_cut = _cut(outcome, "stdout", max_output)
    stderr, err_cut = _cut(outcome, "stderr", max_output)
    info = engine.image_info(image)
    notes = info.get("annotations") or {}
    return {"image": image, "parent": parent, "depth": depth, "op": op, "kind": rec.get("kind"),
            "command": command if command is None or isinstance(command, str) else json.dumps(command),
            "exit_code": outcome.get("exit_code"), "stdout": stdout, "stderr": stderr,
            "stdout_truncated": out_cut, "stderr_truncated": err_cut,
            "usage": json.dumps(outcome.get("usage") or {}, sort_keys=True), "tags": sorted(info.get("tags") or []),
            "score": notes.get("score"), "meta": json.dumps(notes.get("meta") or {}, sort_keys=True),
            "created": info.get("created")}


def trace_rows(engine, root: str, *, max_output: int = 4096, max_nodes: int = D.LINEAGE_MAX_NODES) -> list[dict]:
    """The rows of the subtree under `root` (root first, breadth-first). max_nodes bounds the walk: more is an
    InvalidInput (export a deeper root) rather than a silently partial dataset."""
    if isinstance(max_output, bool) or not isinstance(max_output, int) or max_output < 0:
        raise InvalidInput("max_output must be a non-negative integer (bytes)")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 1:
        raise InvalidInput("max_nodes must be a positive integer")
    root = engine.resolve(root)
    rows, seen = [], {root}
    queue = deque([(root, None, 0, None)])
    while queue:
        image, parent, depth, op = queue.popleft()
        try:
            rows.append(_row(engine, image, parent, depth, op, max_output))
        except NotFound:
            if parent is None:
                raise
            continue                              # removed since (a best_of loser): neither it nor what grew from it
        for edge in engine.children(image):
            child = edge["child"]
            if child in seen:
                continue
            if len(seen) >= max_nodes:
                raise InvalidInput(f"the subtree under {root[:12]} has more than {max_nodes} images")
            seen.add(child)
            queue.append((child, image, depth + 1, edge.get("op")))
    return rows


def export_trace(engine, root: str, fmt: str = "jsonl", out: str = "trace.jsonl", max_output: int = 4096, *,
                 max_nodes: int = D.LINEAGE_MAX_NODES) -> dict:
    """Write the subtree under `root` to `out` as JSONL or Parquet (written whole, then renamed into place);
    returns {"file", "format", "rows", "root"}."""
    if fmt not in FORMATS:
        raise InvalidInput(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    rows = trace_rows(engine, root, max_output=max_output, max_nodes=max_nodes)
    tmp = f"{out}.part"
    try:
        if fmt == "jsonl":
            with open(tmp, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        else:
            # pyarrow (the parquet writer) loads only for a .parquet export
            importlib.import_module(_PARQUET).write(rows, COLUMNS, tmp)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"file": out, "format": fmt, "rows": len(rows), "root": rows[0]["image"]}
