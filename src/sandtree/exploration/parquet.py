"""A trace (traces.py) as a Parquet file with a fixed schema: columns typed even when every value is null
(a tree with no scores yet), so `datasets` and pyarrow readers see the same columns in every export. Loaded
only for a Parquet export (pyarrow: the `traces` extra)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["TYPES", "write"]

_S, _I, _B, _F = pa.string(), pa.int64(), pa.bool_(), pa.float64()
TYPES = {"image": _S, "parent": _S, "depth": _I, "op": _S, "kind": _S, "command": _S, "exit_code": _I, "stdout": _S,
         "stderr": _S, "stdout_truncated": _B, "stderr_truncated": _B, "usage": _S, "tags": pa.list_(_S),
         "score": _F, "meta": _S, "created": _F}


def write(rows: list[dict], columns: tuple[str, ...], path: str) -> None:
    schema = pa.schema([(c, TYPES[c]) for c in columns])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
