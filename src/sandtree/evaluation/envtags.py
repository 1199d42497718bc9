"""An eval environment's tag (eval/<instance_id>) is never moved silently.

A rebuild can give another image than the one the tag names (an input changed: the Dockerfile, the
base, the build's network rules; or a step that is not reproducible), and an agent that started from
the tag would then be graded on another environment than it ran in. So each environment image carries
the inputs it was made from (annotations under `eval.env.`: the Dockerfile's sha256, the base's ID,
the build network, or the image reference given), and when the tag would move the harness:

- keeps the old image under `eval/<instance_id>:<old ID's first 12>` (`:` is in no instance ID, so
  the name is no other instance's), so runs that hold its ID (every run in progress does: the
  harness and the integrations resolve the tag once) and later citations of it keep working;
- says what changed: old ID -> new ID and which recorded input differed (or that none did: a build
  step that is not reproducible), in the run's summary (`environment_changes`), as a progress event
  (`environment_changed`), in the instance's run_instance.log and in the `sandtree.evaluation` log.

Only the eval's tags are handled here; how builds key their cache is the builder's."""

from __future__ import annotations

import hashlib
import json
import logging

from ..errors import NotFound

__all__ = ["ENV_PREFIX", "inputs_of", "moved", "kept_tag", "explain"]

ENV_PREFIX = "eval.env."
_MAX_TEXT = 1024                    # a longer input is recorded by its sha256
_log = logging.getLogger("sandtree.evaluation")


def _text(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    return text if len(text) <= _MAX_TEXT else "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _rules(network):
    """A network as given, in one spelling: "a,b" (the CLI's) is the list [a, b] (the SDK's); the
    order is kept (a change of order alone is reported as such)."""
    if isinstance(network, str) and "," in network:
        return [r.strip() for r in network.split(",") if r.strip()]
    if isinstance(network, tuple):
        return list(network)
    return network


def inputs_of(environment: dict, base: str | None, network) -> dict:
    """The annotations recording what an environment image was made from."""
    if "image" in environment:
        return {f"{ENV_PREFIX}image": _text(environment["image"])}
    return {f"{ENV_PREFIX}dockerfile_sha256": hashlib.sha256(environment["dockerfile"].encode()).hexdigest(),
            f"{ENV_PREFIX}base": base or "", f"{ENV_PREFIX}network": _text(_rules(network))}


def kept_tag(tag: str, old: str) -> str:
    return f"{tag}:{old[:12]}"


def _same_rules(a: str, b: str) -> bool:
    try:
        x, y = json.loads(a), json.loads(b)
    except ValueError:
        return False
    return isinstance(x, list) and isinstance(y, list) and sorted(map(str, x)) == sorted(map(str, y))


def explain(old_meta: dict, new_inputs: dict) -> list[str]:
    """Which recorded inputs differ, one phrase each; none recorded or none differ say so."""
    recorded = {k: v for k, v in old_meta.items() if k.startswith(ENV_PREFIX)}
    if not recorded:
        return ["the old image has no recorded eval inputs (tagged by hand or by an older sandtree)"]
    if not any(k in recorded for k in new_inputs):      # one image may serve several kinds of environment
        return [f"the old image was recorded with other inputs ({', '.join(sorted(recorded))}), the new one with "
                f"{', '.join(sorted(new_inputs))}"]
    why = []
    for key in sorted(new_inputs):
        was, now = recorded.get(key), new_inputs.get(key)
        if was == now:
            continue
        name = key[len(ENV_PREFIX):]
        phrase = f"{name}: {was!r} -> {now!r}"
        if name == "network" and isinstance(was, str) and isinstance(now, str) and _same_rules(was, now):
            phrase += " (the same rules in another order)"
        why.append(phrase)
    return why or ["the same inputs built another image: a build step is not reproducible "
                   "(its output holds times, inode numbers or downloads that changed)"]


def moved(engine, tag: str, new: str, inputs: dict, *, record: bool = True) -> dict | None:
    """Point `tag` at `new`, recording `inputs` on it (record: once per environment and run is
    enough); when the tag named another image: that image kept under kept_tag, and the change
    ({"tag", "old", "new", "kept_as", "why"}) returned and logged. None when the tag was absent or
    already there."""
    try:
        old = engine.resolve(tag)
    except NotFound:
        old = None
    if old == new and not record:
        return None
    change = None
    if old is not None and old != new:
        try:
            old_meta = engine.image_info(old).get("annotations", {}).get("meta", {})
        except NotFound:
            old_meta = {}
        keep = kept_tag(tag, old)
        engine.tag(old, keep)
        change = {"tag": tag, "old": old, "new": new, "kept_as": keep, "why": explain(old_meta, inputs)}
        _log.warning("%s moved: %s -> %s (the old image kept as %s): %s", tag, old[:12], new[:12], keep,
                    "; ".join(change["why"]))
    if record:
        engine.annotate(new, None, inputs)
    if old != new:
        engine.tag(new, tag)
    return change
