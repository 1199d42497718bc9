"""Network egress of sandboxes: the policy (policy.py), the links that give a sandbox a route to
the egress side and nowhere else (links.py), and the egress daemon that enforces the policy
outside the sandbox (egress.py: transparent TCP proxy, DNS resolver; client.py: the engine's end).
See docs/design.md, "Network egress"."""
