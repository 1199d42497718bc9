"""Annotations (a mixin of engine.Engine): a score and small metadata attached to an image, like git
notes: stored beside the image in the store's SQLite (table `annotations`), never part of its ID. Tree
search scores nodes with them and trace export (exploration/traces.py) reads them back. Everything given
is untrusted (it may come over REST or MCP): key names, value types and sizes are checked before anything
is written, and a refused call changes nothing.

Each principal has its own (table `annotations_by`: a tenant's name, OPERATOR for the operator and admin
tokens): a write changes only what its writer reads. An image's ID is its content, so many may hold it (two
tenants importing the same tree, one re-importing another's export): shared notes would let each rewrite the
score the others' tree searches and readers rely on. A tenant with none of its own on an image reads the
default: those of whoever shared it, so a published score still reaches its readers; the operator reads
only its own (shown_annotations)."""

from __future__ import annotations

import json
import math
import re
import time

from ...errors import InvalidInput

__all__ = ["AnnotationOps", "read_annotations", "write_annotations", "shown_annotations", "OPERATOR", "KEY_RE", "MAX_KEYS", "MAX_VALUE", "MAX_META_BYTES", "check_score",
           "check_meta"]

KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}\Z")   # short, printable, no path or SQL meaning
MAX_KEYS = 64               # keys per image, after merging
MAX_VALUE = 4096            # characters of one string value
MAX_META_BYTES = 32768      # the whole metadata of an image, as JSON
OPERATOR = ""               # the operator's (and admin tokens') principal


def check_score(score) -> float | None:
    """A finite number (bool is not one), or None (leave the score as it is)."""
    if score is None:
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise InvalidInput(f"score must be a number, not {type(score).__name__}")
    value = float(score)
    if not math.isfinite(value):
        raise InvalidInput("score must be finite")
    return value


def check_meta(meta) -> dict:
    """Key -> JSON scalar (str, int, float, bool; None removes the key), each key and value checked."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise InvalidInput(f"meta must be a mapping, not {type(meta).__name__}")
    if len(meta) > MAX_KEYS:
        raise InvalidInput(f"at most {MAX_KEYS} annotation keys per image")
    for key, value in meta.items():
        if not isinstance(key, str) or not KEY_RE.match(key):
            raise InvalidInput(f"bad annotation key {key!r}: 1-64 of A-Z a-z 0-9 _ . - "
                               "(not starting with . - or a digit)")
        if value is None or isinstance(value, (bool, str)):
            if isinstance(value, str) and len(value) > MAX_VALUE:
                raise InvalidInput(f"annotation {key!r}: a string value holds at most {MAX_VALUE} characters")
        elif isinstance(value, int):
            if abs(value) > 2 ** 63 - 1:
                raise InvalidInput(f"annotation {key!r}: integer out of range")
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise InvalidInput(f"annotation {key!r}: a number must be finite")
        else:
            raise InvalidInput(f"annotation {key!r}: a value must be a string, number, boolean or null, "
                               f"not {type(value).__name__}")
    return dict(meta)


def read_annotations(db, image_id: str, principal: str = OPERATOR, default: str | None = None) -> dict:
    """`principal`'s annotations of an image: {"score": float | None, "meta": {...}} (empty when none);
    those of `default` (another principal) when it has none. image_info shows them."""
    row = db.one("SELECT score, meta FROM annotations_by WHERE principal=? AND image=?", (principal, image_id))
    if row is None and default is not None and default != principal:
        row = db.one("SELECT score, meta FROM annotations_by WHERE principal=? AND image=?", (default, image_id))
    return {"score": row[0], "meta": json.loads(row[1])} if row else {"score": None, "meta": {}}


def write_annotations(db, image: str, score, meta, principal: str = OPERATOR) -> dict:
    """Merge a score and metadata into `principal`'s annotations of `image` (an existing image's ID:
    the caller resolved it); the merged result. Checked whole before anything is written."""
    new_score, changes = check_score(score), check_meta(meta)
    with db.tx() as con:
        row = con.execute("SELECT score, meta FROM annotations_by WHERE principal=? AND image=?",
                          (principal, image)).fetchone()
        old_score, merged = (row[0], json.loads(row[1])) if row else (None, {})
        for key, value in changes.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        if len(merged) > MAX_KEYS:
            raise InvalidInput(f"at most {MAX_KEYS} annotation keys per image ({len(merged)} after merging)")
        text = json.dumps(merged, sort_keys=True, separators=(",", ":"))
        if len(text.encode()) > MAX_META_BYTES:
            raise InvalidInput(f"an image's annotations hold at most {MAX_META_BYTES} bytes of JSON")
        final = old_score if new_score is None else new_score
        con.execute("INSERT OR REPLACE INTO annotations_by(principal, image, score, meta, updated) VALUES(?,?,?,?,?)",
                    (principal, image, final, text, time.time()))
    return {"score": final, "meta": merged}


def shown_annotations(db, image_id: str, principal: str = OPERATOR) -> dict:
    """What `principal` reads of an image: its own annotations; a tenant with none reads those of
    whoever made the image public (public_images.by; NULL: the operator or an admin), if anyone did.
    The operator reads only its own: it sees every image, and a default would let a tenant that
    shares an image put its scores into the operator's reads and trace exports."""
    if principal == OPERATOR:
        return read_annotations(db, image_id)
    row = db.one("SELECT by FROM public_images WHERE image=?", (image_id,))
    return read_annotations(db, image_id, principal, None if row is None else (row[0] or OPERATOR))


class AnnotationOps:
    """Mixed into engine.Engine (which provides self.store and self.resolve): the operator's annotations
    (annotate), and any principal's (annotate_as: a tenant's view, tenancy/view.py)."""

    def annotate(self, image: str, score: float | None = None, meta: dict | None = None) -> dict:
        return self.annotate_as(OPERATOR, self.resolve(image), score, meta)

    def annotations_as(self, principal: str, image: str) -> dict:
        """What `principal` reads of the image `image` (shown_annotations)."""
        return shown_annotations(self.store.db, image, principal)

    def annotate_as(self, principal: str, image: str, score: float | None = None, meta: dict | None = None) -> dict:
        """Merge into `principal`'s annotations of the image `image` (an ID the caller resolved and may see)."""
        return write_annotations(self.store.db, image, score, meta, principal)
