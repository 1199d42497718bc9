"""Runs: a command on an image in a fresh sandbox, its changes committed as a new image (runs.py). What a
run is made of (spec.py), its network option (network.py), the commit of its upper directory (commit.py),
the record of what ran (records.py), and runs started now and awaited later (operations.py), owned by
engines that keep a heartbeat (heartbeat.py)."""
