"""The engine: store + runtime + the operations that combine them (see core.Engine)."""

from .builds.builds import BuildResult, StepResult
from .core import Engine
from .builds.dockerfiles import dockerfile_recipe, read_dockerfile
from .sandboxes.ports import port_path
from .sandboxes.previews import base_domain, check_base, parse_host, preview_url
from .warm.rollover import RecipeWatch
from ..recipe.builder import RecipeBuilder
from ..recipe.steps import Configure, ContextFile, Copy, From, Recipe, Run, Stage
from ..store.imageconfig import CONFIG_PATH, ImageConfig
from .runs.spec import default_idmap
from ..defaults import RunRecord
from ..values import DEFAULT_ENV, parse_size

__all__ = ["Engine", "RunRecord", "DEFAULT_ENV", "default_idmap", "parse_size", "BuildResult", "StepResult",
           "RecipeBuilder", "dockerfile_recipe", "Recipe", "Stage", "From", "Run", "Copy", "Configure", "ContextFile",
           "ImageConfig", "CONFIG_PATH", "read_dockerfile", "RecipeWatch", "port_path", "base_domain", "check_base",
           "parse_host", "preview_url"]
