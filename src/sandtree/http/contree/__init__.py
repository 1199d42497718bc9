"""Contree's API under /v1, so Nebius Contree's own clients work unmodified against `sandtree serve`: the
routes (routes.py), a running instance's subprocesses (subprocesses.py), Contree's wire shapes
(wire.py), and what /v1 means that sandtree's own API says differently (compat.py)."""
