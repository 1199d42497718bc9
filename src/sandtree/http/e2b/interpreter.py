"""E2B's code interpreter on port 49999 of a sandbox (dispatch.py): `e2b-code-interpreter`'s
/execute and /contexts."""
