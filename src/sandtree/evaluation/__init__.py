"""SWE-bench-style evaluation on sandtree: instances and predictions in SWE-bench's schema, each
instance's environment built once and tagged `eval/<instance_id>`, the patch applied the way the `swebench`
harness does, the tests run in a fork, and a report graded by the `swebench` package's own functions. Works over
any engine-like object (the in-process Engine or the remote client): it calls table operations only.

    from sandtree import evaluation
    summary = evaluation.evaluate(engine, "instances.jsonl", "preds.jsonl", base="debian:bookworm", run_id="r1")

The harness loads on first use (PEP 562, as the package's own names do): it imports the `swebench`
package (the `swebench` extra), which takes over a second and is not needed to import the SDK."""

import importlib

from .. import errors

__all__ = ["evaluate", "environment", "load_instances", "load_predictions", "Instance", "Prediction",
           "DEFAULT_BUILD_NETWORK", "DEFAULT_TIMEOUT", "VALIDATE_MODES"]

_LAZY = {name: "sandtree.evaluation.harness"
         for name in ("evaluate", "environment", "DEFAULT_BUILD_NETWORK", "DEFAULT_TIMEOUT", "VALIDATE_MODES")}
_LAZY.update({name: "sandtree.evaluation.inputs"
              for name in ("load_instances", "load_predictions", "Instance", "Prediction")})


def __getattr__(name: str):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'sandtree.evaluation' has no attribute {name!r}")
    try:
        # a lazy export: swebench (optional) loads only when its names are used
        value = getattr(importlib.import_module(where), name)
    except ImportError as e:                 # absent, or a swebench before 5 (no TestSpec.log_parser)
        if e.name and e.name.split(".")[0] in ("swebench", "docker", "unidiff"):
            raise errors.RuntimeUnavailable(f"sandtree eval needs the swebench package, version 5 or later "
                                            f"({e.name}: {e}): pip install 'sandtree[swebench]'") from None
        raise
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
