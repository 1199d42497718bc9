"""Tree search and RL traces over the image DAG: scores annotated on images, a subtree exported as a
dataset (JSONL or Parquet), and best-first / beam search over fork + a scorer. Works over any engine-like object."""

__all__: list[str] = []
