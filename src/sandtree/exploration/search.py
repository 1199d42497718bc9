"""Beam search over the image DAG: from a root image, expand(image) proposes commands, each runs in a
fork (one branch per command, concurrently), score(record) rates each result, the scores are annotated on the
resulting images (so `trace export` shows the search), and the `beam` best results are expanded next, `depth`
times. best-first is beam=1. Over any engine-like object (table operations only: fork, annotate), or a Sandtree.

    best = beam_search(st, root, expand=lambda image: [f"apply {p}" for p in patches],
                       score=lambda rec: 1.0 if rec.exit_code == 0 else 0.0, beam=2, depth=2, stop=1.0)
    best["image"], best["score"], best["path"]      # the winning image, its score, the commands that made it"""

from __future__ import annotations

import math

from ..errors import InvalidInput

__all__ = ["beam_search"]

_COMMAND_NOTE = 512          # characters of a command kept in a node's annotation


def _engine(st_or_engine):
    """An engine-like object: a Sandtree's engine, else the object itself (Engine, remote client, tenant view)."""
    return st_or_engine.engine if hasattr(st_or_engine, "image") and hasattr(st_or_engine, "engine") else st_or_engine


def _count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{name} must be a positive integer")
    return value


def beam_search(st_or_engine, root, expand, score, beam: int = 2, depth: int = 2, *, stop: float | None = None,
                label: str = "beam", **run_options) -> dict:
    """Returns {"image", "score", "path" (commands from root), "nodes" (every scored result: image, parent,
    command, depth, score, exit_code), "root"}. A result image that is its source (the command changed no file)
    is scored but not annotated (the note would be its parent's). stop: end once a score reaches it.
    run_options: fork's (timeout, env, network, ...)."""
    engine = _engine(st_or_engine)
    beam, depth = _count("beam", beam), _count("depth", depth)
    root = engine.resolve(getattr(root, "id", root))
    path_to = {root: []}
    best = {"image": root, "score": -math.inf, "path": []}
    nodes: list[dict] = []
    frontier = [root]
    for level in range(1, depth + 1):
        scored = []
        for image in frontier:
            commands = list(expand(image))
            if not commands:
                continue
            for command, rec in zip(commands, engine.fork(image, commands, **run_options)):
                if rec.image is None:                  # no result (a failed start, a cancelled run)
                    continue
                value = float(score(rec))
                if not math.isfinite(value):
                    raise InvalidInput(f"score returned {value} for {command!r}")
                if rec.image != image:
                    engine.annotate(rec.image, value, {"search": label, "depth": level,
                                                       "command": str(command)[:_COMMAND_NOTE]})
                path_to.setdefault(rec.image, path_to[image] + [command])
                node = {"image": rec.image, "parent": image, "command": command, "depth": level, "score": value,
                        "exit_code": rec.exit_code}
                nodes.append(node)
                scored.append(node)
        if not scored:
            break
        scored.sort(key=lambda n: -n["score"])                    # stable: ties keep the order commands came in
        if scored[0]["score"] > best["score"]:
            best = {"image": scored[0]["image"], "score": scored[0]["score"], "path": path_to[scored[0]["image"]]}
        if stop is not None and best["score"] >= stop:
            break
        frontier = list(dict.fromkeys(n["image"] for n in scored))[:beam]     # one slot per distinct image
    return {**best, "score": None if best["score"] == -math.inf else best["score"], "nodes": nodes, "root": root}
