"""Branching: diff, three-way merge, branches (refs with compare-and-swap), lineage queries and
bundles. Pure functions over the store; engine.py wires them to runs and the adapters."""
