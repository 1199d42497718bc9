"""Golden pools from recipes: a recipe built (or found in the build cache) and a warm
pool (pools.py) kept of its result under a tag; a rebuild whose ID differs rolls the pool over.

Roll-over never leaves a run without a warm sandbox on purpose: the new image's pool is started
and filled first while the tag still names the old image (runs on the tag keep taking the old
pool's sandboxes), then the tag moves (runs on it now get the new image, from its full pool),
then the old pool closes: its ready sandboxes are stopped by its filler thread, a run that took
one before finishes and its sandbox is stopped after its upper is read. A run that resolved the
tag just before it moved and reaches the pool just after it closed starts cold on the old image
(correct, only not warm). A failed build changes nothing: the old pool and tag stay.

RecipeWatch is the server's `--watch`: the recipe made again (Dockerfile re-read, context listed
and hashed again) every few seconds and rolled; an unchanged recipe is all cache hits and the
same ID, so it costs a lookup per step and moves nothing.
"""

from __future__ import annotations

import hashlib
import threading
import time
from typing import Callable

from ... import defaults as D
from ...errors import InvalidInput, SandtreeError
from ...recipe.steps import Copy, Recipe
from ...store.names import check_tag

__all__ = ["RecipePools", "RecipeWatch", "default_tag"]


def default_tag(recipe: Recipe) -> str:
    """The tag of a recipe pool given none: named by what stays when a copied file changes (the
    context directory, the target and every step's text, not the files' hashes), so `st.pool(r)`
    again after an edit of a copied file rolls the same pool; a changed step names another."""
    h = hashlib.sha256(repr((recipe.context, recipe.target)).encode())
    for stage in recipe.stages:
        h.update(b"\0stage " + (stage.name or "").encode())
        for step in stage.steps:
            h.update(b"\0" + step.text.encode() + (b" copy" if isinstance(step, Copy) else b""))
    return f"pool/{h.hexdigest()[:16]}"


class RecipePools:
    """The engine's recipe pools: tag -> the image its pool is of (one roll at a time)."""

    def __init__(self, build, pool_create, pool_wait, drain, pool_list, store):
        # the engine's build and pool calls (drain(image): removed, its runs finishing behind the
        # caller), and its store: parts, not the engine (a cluster engine's pool calls are its nodes')
        self.build, self.pool_create, self.pool_wait, self.drain = build, pool_create, pool_wait, drain
        self.pool_list, self.store = pool_list, store
        self.by_tag: dict[str, str] = {}
        self.lock = threading.Lock()

    def roll(self, recipe, size: int, *, tag: str | None, wait: bool, wait_timeout: float, build_network,
             progress, **pool_opts) -> dict:
        if not isinstance(recipe, Recipe):
            raise InvalidInput("pool_recipe takes a Recipe (a Dockerfile's or a builder's .recipe())")
        tag = check_tag(tag) if tag is not None else default_tag(recipe)
        if not isinstance(wait_timeout, (int, float)) or isinstance(wait_timeout, bool) or not 0 <= wait_timeout <= 3600:
            raise InvalidInput("wait_timeout must be seconds from 0 to 3600")
        with self.lock:
            t0 = time.perf_counter()
            result = self.build(recipe, network=build_network, progress=progress)   # cache hits when unchanged
            built = time.perf_counter()
            new, old = result.image, self.by_tag.get(tag)
            stats = self.pool_create(new, size, **pool_opts)
            rolled = None
            if old is not None and old != new and size > 0:
                # filled before the tag moves: runs on the tag stay warm (old pool, then new)
                self.pool_wait(new, wait_timeout)
            elif wait:
                self.pool_wait(new, wait_timeout)
            self.store.tag(new, tag)
            self.by_tag[tag] = new
            if old is not None and old != new and old not in self.by_tag.values():
                self.drain(old)                           # drains: runs in it finish, the rest stop now
                rolled = round(time.perf_counter() - built, 6)
            stats = {**stats, **next((p for p in self.pool_list() if p["image"] == new), {})}
        return {**stats, "tag": tag, "previous": old if old != new else None, "rolled_over": rolled,
                "build_seconds": round(built - t0, 6), "steps": len(result.steps),
                "cached": sum(1 for s in result.steps if s.cached)}

    def forget(self, image: str) -> None:
        """A pool removed by hand: its tags are no recipe pool's any more."""
        with self.lock:
            for tag in [t for t, i in self.by_tag.items() if i == image]:
                del self.by_tag[tag]


class RecipeWatch:
    """Every `interval` seconds: make(), the recipe made again, rolled into the pool under `tag`.
    A failed make or build leaves the pool as it is; on_event(dict) hears of rolls and errors."""

    def __init__(self, pool_recipe, make: Callable[[], Recipe], size: int, *, tag: str, interval: float,
                 on_event: Callable[[dict], None] | None = None, **pool_opts):
        if not isinstance(interval, (int, float)) or isinstance(interval, bool) or not 0.05 <= interval <= 86400:
            raise InvalidInput("a watch interval is seconds from 0.05 to 86400")
        self.pool_recipe, self.make, self.size, self.tag, self.interval = pool_recipe, make, size, tag, interval
        self.on_event, self.pool_opts = on_event, pool_opts
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"sandtree-watch-{tag[:24]}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                got = self.pool_recipe(self.make(), self.size, tag=self.tag, **self.pool_opts)
            except SandtreeError as exc:               # the old pool keeps serving
                self._tell({"event": "pool_build_failed", "tag": self.tag, "error": exc.message})
                continue
            except Exception as exc:                  # noqa: BLE001 - a watcher must outlive a bad edit
                self._tell({"event": "pool_build_failed", "tag": self.tag, "error": str(exc)})
                continue
            if got["previous"] is not None:
                self._tell({"event": "pool_rolled_over", "tag": self.tag, "image": got["image"],
                            "previous": got["previous"], "seconds": got["rolled_over"]})

    def _tell(self, event: dict) -> None:
        if self.on_event is not None:
            self.on_event(event)

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=D.POOL_WAIT + 60)
