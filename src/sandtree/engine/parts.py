"""The engine's parts made on first use, loaded on first use too (PEP 562): a process that uses one part
(a one-shot `sandtree run`: the store, the runtime, a run) does not import the others (the tenancy and the
operation table's views, live sandboxes, pools, ports, the gVisor tier, the cluster, stored secrets; merges,
diffs, bundles, registries, imports and builds), which were most of a command line's start-up. Engine's
properties make each from here (core.py); the mixins reach the modules of their rarer operations here
(`parts.merge.merge_trees(...)`)."""

from __future__ import annotations

import importlib

__all__ = ["GVisorRuntime", "Interpreter", "Operations", "Pools", "RecipePools", "SandboxPorts", "Sandboxes",
           "SecretStore", "Tenancy", "Volumes", "attach", "split", "RecipeBuilder", "RecipeWatch", "dockerfile_recipe",
           "read_dockerfile", "port_path", "base_domain", "check_base", "parse_host", "preview_url", "Recipe", "Stage",
           "From", "Run", "Copy", "Configure", "ContextFile"]

# name -> the module defining it
_LAZY = {"attach": "sandtree.engine.clustered",                 # a cluster's fabric (only with one configured)
         "GVisorRuntime": "sandtree.runtime.gvisor",
         "Tenancy": "sandtree.tenancy",
         "SecretStore": "sandtree.network.secretstore",
         "Operations": "sandtree.engine.runs.operations",
         "Sandboxes": "sandtree.engine.sandboxes.sandboxes",
         "SandboxPorts": "sandtree.engine.sandboxes.ports",
         "Interpreter": "sandtree.engine.sandboxes.interpreter",
         "Pools": "sandtree.engine.warm.pools",
         "RecipePools": "sandtree.engine.warm.rollover",
         "Volumes": "sandtree.engine.volumes",
         "split": "sandtree.engine.volumes",                   # a volume's name: (tenant, name)
         # the engine package's own names a run does not need (engine/__init__.py)
         "RecipeBuilder": "sandtree.recipe.builder",
         "RecipeWatch": "sandtree.engine.warm.rollover",
         "dockerfile_recipe": "sandtree.engine.builds.dockerfiles",
         "read_dockerfile": "sandtree.engine.builds.dockerfiles",
         "port_path": "sandtree.engine.sandboxes.ports",
         "base_domain": "sandtree.engine.sandboxes.previews",
         "check_base": "sandtree.engine.sandboxes.previews",
         "parse_host": "sandtree.engine.sandboxes.previews",
         "preview_url": "sandtree.engine.sandboxes.previews",
         **dict.fromkeys(("Recipe", "Stage", "From", "Run", "Copy", "Configure", "ContextFile"),
                         "sandtree.recipe.steps")}

# modules, by the name the engine's mixins use
_MODULES = {"diff": "sandtree.branching.diff",
            "merge": "sandtree.branching.merge",
            "bundle": "sandtree.branching.bundle",
            "registry": "sandtree.store.registry",          # an OCI registry's client (httpx when it connects)
            "ociin": "sandtree.store.ociin",
            "ociout": "sandtree.store.ociout",
            "importers": "sandtree.store.importers",        # archives, OCI layers, debootstrap
            "scan": "sandtree.store.scan",
            "steps": "sandtree.recipe.steps",               # a build's recipe (Run, Copy, ...)
            "copies": "sandtree.engine.builds.copies",
            "contexttar": "sandtree.engine.builds.contexttar"}     # a build context: its tar, its Dockerfile


def __getattr__(name: str):
    where = _LAZY.get(name) or _MODULES.get(name)
    if where is None:
        raise AttributeError(f"module 'sandtree.engine.parts' has no attribute {name!r}")
    # a part's module, loaded when the engine first makes that part (start-up time: see above)
    module = importlib.import_module(where)
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value
