"""Recipes: what a build is made of, parsed from a Dockerfile (dockerfile.py) or written
with the Python builder, and executed by the engine as a chain of runs cached on the image DAG."""
