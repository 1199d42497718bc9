"""Warm: what the engine starts before a caller asks, so the call only claims it. Pools of sandboxes of
one image (pools.py) and their recipe-built rollover (rollover.py); live sandboxes started ahead of a
`sandbox_start` (sandboxes.py) and helpers entered ahead of an exec (helpers.py), both on the
want/ready machinery of kept.py. The namespaces tier's own warm helpers are runtime/warm.py."""
