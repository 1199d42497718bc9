"""The engine: store + runtime + the operations that combine them (see core.Engine).

Names a run does not need (recipes, Dockerfiles, ports' URLs, recipe pools and the recipe builder) load on first use
(PEP 562, through parts.py): a one-shot `sandtree run` imports what runs."""

from . import parts
from .builds.builds import BuildResult, StepResult
from .core import Engine
from ..store.imageconfig import CONFIG_PATH, ImageConfig
from .runs.spec import default_idmap
from ..defaults import RunRecord
from ..values import DEFAULT_ENV, parse_size

__all__ = ["Engine", "RunRecord", "DEFAULT_ENV", "default_idmap", "parse_size", "BuildResult", "StepResult",
           "RecipeBuilder", "dockerfile_recipe", "Recipe", "Stage", "From", "Run", "Copy", "Configure", "ContextFile",
           "ImageConfig", "CONFIG_PATH", "read_dockerfile", "RecipeWatch", "port_path", "base_domain", "check_base",
           "parse_host", "preview_url"]

# the names parts.py loads on first use
_LAZY = ("RecipeBuilder", "dockerfile_recipe", "read_dockerfile", "RecipeWatch", "port_path", "base_domain",
         "check_base", "parse_host", "preview_url", "Recipe", "Stage", "From", "Run", "Copy", "Configure",
         "ContextFile")


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'sandtree.engine' has no attribute {name!r}")
    value = getattr(parts, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
