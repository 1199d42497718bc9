"""Isolation tiers behind one interface (base.py: Runtime, LiveTier, RunSpec, RunOutcome):
`namespaces` (namespaces.py + helper/; live sandboxes: live.py, enter.py) and `gvisor`
(gvisor.py). What the engine may hold of a tier is what base.py declares."""
