"""Ephemeral images: the state a disposable run ended in, kept short-lived and unlisted.

A run with disposable="ephemeral" (engine/runs/runs.py) commits its writes like a kept run, and the
image it made, if the commit made a new one, gets a row here. Such an image is resolvable by its
ID and usable like any other (run from it, inspect it, tag it), but no listing shows it until a
tag names it, and gc (maintenance.py) drops it once it is older than EPHEMERAL_TTL and nothing
keeps it: a ref (tag, branch), a run from it within the TTL, a kept lineage child, a live sandbox.
A kept run (disposable=False) that makes or reaches the same image makes it an ordinary image.

This is what Contree's /v1 gives its clients for a disposable run (they chain runs on the result's
image); sandtree's own disposable=True keeps nothing and pays no commit.
"""

from __future__ import annotations

import time

__all__ = ["UNLISTED", "mark_writer", "keep", "collectable", "forget"]

# SQL: the images a listing leaves out (ephemeral and named by no ref); use as `id NOT IN (...)`
UNLISTED = "SELECT image FROM ephemeral_images WHERE image NOT IN (SELECT image FROM refs)"


def mark_writer(write_image, image: str):
    """The image writer of an ephemeral run's commit (commit.Committer.image_writer): writes the
    image's rows and marks the image ephemeral when this commit made it (an image that was
    already there keeps its standing). None (a commit with nothing to write) stays None."""
    if write_image is None:
        return None

    def write(con) -> bool:
        made = write_image(con)
        if made:
            con.execute("INSERT OR IGNORE INTO ephemeral_images(image, at) VALUES(?,?)", (image, time.time()))
        return made
    write.layer = write_image.layer
    return write


def keep(con, image: str) -> None:
    """`image` was asked to be kept (a kept run made or reached it): an ordinary image from now."""
    con.execute("DELETE FROM ephemeral_images WHERE image=?", (image,))


def collectable(con, now: float, ttl: float) -> set[str]:
    """Ephemeral images gc may judge: older than `ttl` and used by no operation started within it
    (refs, lineage children and live sandboxes keep them as they keep any image)."""
    used = {r[0] for r in con.execute("SELECT source FROM operations WHERE started > ? AND source IS NOT NULL",
                                      (now - ttl,))}
    return {r[0] for r in con.execute("SELECT image FROM ephemeral_images WHERE at <= ?", (now - ttl,))} - used


def forget(con) -> None:
    """Drop the rows of ephemeral images no longer in the store (after gc removed them)."""
    con.execute("DELETE FROM ephemeral_images WHERE image NOT IN (SELECT id FROM images)")
