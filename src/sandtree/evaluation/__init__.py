"""SWE-bench-style evaluation on sandtree (issue 17): instances and predictions in SWE-bench's schema, each
instance's environment built once and tagged `eval/<instance_id>`, the patch applied the way the `swebench`
harness does, the tests run in a fork, and a report graded by the `swebench` package's own functions. Works over
any engine-like object (the in-process Engine or the remote client): it calls table operations only."""

__all__: list[str] = []
