"""The `sandtree` command line (see main.build_parser)."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
