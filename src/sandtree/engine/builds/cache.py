"""The build cache on the image DAG: a step's key -> the image it made.

The key is the sha256 of everything that decides the step's result: the parent image ID (its
files and its config), the step's text (the instruction after ARG/ENV expansion), the content
hashes, modes and paths of the files it copies (a COPY --from: the source image's ID), its network
policy (network.policy.canonical: the same rules in any order or equivalent spelling are one key),
the tier, and the build-time variables it sees (SOURCE_DATE_EPOCH among them). The row is written in
the transaction that records the step's result (records.Records.record's `also`), so a hit never
names an image whose rows are missing; a hit is used only while the image still exists (gc or
`image rm` may remove it) and is visible to the caller. A step with network is cached but marked
hermetic=0: its result depends on what the network answered then.

Rows are per principal (the tenant that built, "" the operator and admins: OPERATOR): a build hits
only its own principal's rows, and a step that runs again replaces only that principal's row. A
tenant that cannot see the operator's result of a step runs it again; were rows per key alone, its
result (whatever its RUN wrote: a token, a key it generated) would become the operator's next hit,
and a recipe pool's image. Another principal's row is not trusted even when the image is visible:
who built it decided what the step wrote.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING

from ...network.policy import Policy, canonical
from ...store.store import Store

if TYPE_CHECKING:
    from ...recipe.steps import ContextFile

__all__ = ["step_key", "lookup", "put", "Entry", "KEY_VERSION", "OPERATOR"]

KEY_VERSION = 1      # bump when what a key covers changes: old rows then never match
OPERATOR = ""        # the principal of the operator's (and an admin token's) builds


def _files(files: tuple[ContextFile, ...]) -> list:
    return sorted([f.path, f.kind, f.mode, f.sha256, f.target] for f in files)


def step_key(parent: str, text: str, *, files: tuple[ContextFile, ...] = (), network=None, tier: str = "",
             env: tuple = (), extra: dict | None = None) -> str:
    """The cache key of a step on `parent`. extra: anything else the step's result depends on
    (a COPY --from's source image and paths, chown/chmod, a Configure's changes)."""
    net = canonical(network).to_json() if isinstance(network, Policy) else network
    doc = [KEY_VERSION, parent, text, _files(files), net, tier, sorted([str(k), str(v)] for k, v in env),
           extra or {}]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def lookup(store: Store, key: str, visible=None, principal: str = OPERATOR) -> str | None:
    """The image `principal`'s step with this key made, if it still exists (and visible(image) allows it)."""
    row = store.db.one("SELECT c.image FROM build_cache_by c JOIN images i ON i.id = c.image "
                       "WHERE c.principal=? AND c.key=?", (principal, key))
    if row is None or (visible is not None and not visible(row[0])):
        return None
    return row[0]


def put(con, key: str, image: str, op: str | None, hermetic: bool, principal: str = OPERATOR) -> None:
    """Inside the transaction that records the step's result: `principal`'s row (never another's)."""
    con.execute("INSERT OR REPLACE INTO build_cache_by(principal, key, image, op, hermetic, created) "
                "VALUES(?,?,?,?,?,?)", (principal, key, image, op, 1 if hermetic else 0, time.time()))


class Entry:
    """A step's row to come: entry(con, image) puts it, inside the transaction recording the
    step's result (run_operation's in_tx). A plain object, not a closure: on a cluster the run
    and its transaction are a node's (engine/clustered.py), so this crosses to it pickled by
    reference (the database is shared: the row lands where it would here, with the result)."""

    def __init__(self, key: str, op: str | None, hermetic: bool, principal: str = OPERATOR):
        self.key, self.op, self.hermetic, self.principal = key, op, hermetic, principal

    def __call__(self, con, image: str) -> None:
        put(con, self.key, image, self.op, self.hermetic, self.principal)
