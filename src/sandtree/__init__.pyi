# Written by scripts/stubs.py from the classes as they run (their methods come from the operation table): do not edit.

from __future__ import annotations

from sandtree.client.sdk import Sandtree as Sandtree
from sandtree.client.objects import Image as Image
from sandtree.client.objects import RunResult as RunResult
from sandtree.client.objects import Branch as Branch
from sandtree.client.objects import MergeResult as MergeResult
from sandtree.client.objects import Sandbox as Sandbox
from sandtree.client.objects import SandboxProcess as SandboxProcess
from sandtree.client.objects import best_of as best_of
from sandtree.client.sdk import connect as connect
from sandtree.client.aio import AsyncSandtree as AsyncSandtree
from sandtree.client.aio import AsyncImage as AsyncImage
from sandtree.client.aio import AsyncRunResult as AsyncRunResult
from sandtree.client.aio import AsyncBranch as AsyncBranch
from sandtree.client.aio import AsyncSandbox as AsyncSandbox
from sandtree.defaults import Limits as Limits
from sandtree.errors import SandtreeError as SandtreeError
from sandtree.errors import NotFound as NotFound
from sandtree.errors import ImageNotFound as ImageNotFound
from sandtree.errors import PathNotFound as PathNotFound
from sandtree.errors import InvalidInput as InvalidInput
from sandtree.errors import PathEscape as PathEscape
from sandtree.errors import BadArchive as BadArchive
from sandtree.errors import CommandNotFound as CommandNotFound
from sandtree.errors import Conflict as Conflict
from sandtree.errors import RuntimeUnavailable as RuntimeUnavailable
from sandtree.errors import SandboxError as SandboxError
from sandtree.errors import StoreCorrupt as StoreCorrupt
from sandtree.errors import Unauthorized as Unauthorized
from sandtree.errors import Forbidden as Forbidden
from sandtree.errors import LimitExceeded as LimitExceeded
from sandtree.errors import NotRegularFile as NotRegularFile
from sandtree.errors import MergeConflict as MergeConflict
from sandtree.errors import TapeMiss as TapeMiss
from sandtree.errors import TooLarge as TooLarge
from sandtree.errors import RegistryError as RegistryError
from sandtree.errors import DiskFull as DiskFull
from sandtree.errors import BuildFailed as BuildFailed
from sandtree.errors import NotReady as NotReady
from sandtree.errors import Ended as Ended
from sandtree.store.imageconfig import ImageConfig as ImageConfig
from sandtree.recipe.builder import RecipeBuilder as RecipeBuilder
from sandtree.recipe.steps import Recipe as Recipe

__all__ = ['Sandtree', 'Image', 'RunResult', 'Branch', 'MergeResult', 'Sandbox', 'SandboxProcess', 'best_of', 'connect', 'AsyncSandtree', 'AsyncImage', 'AsyncRunResult', 'AsyncBranch', 'AsyncSandbox', 'Limits', 'SandtreeError', 'NotFound', 'ImageNotFound', 'PathNotFound', 'InvalidInput', 'PathEscape', 'BadArchive', 'CommandNotFound', 'Conflict', 'RuntimeUnavailable', 'SandboxError', 'StoreCorrupt', 'Unauthorized', 'Forbidden', 'LimitExceeded', 'NotRegularFile', 'MergeConflict', 'TapeMiss', 'TooLarge', 'RegistryError', 'DiskFull', 'BuildFailed', 'NotReady', 'Ended', 'ImageConfig', 'RecipeBuilder', 'Recipe']
__version__: str
