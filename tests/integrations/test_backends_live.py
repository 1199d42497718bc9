"""tests/kernel/test_live.py (live sandboxes: start, exec, commit, hibernate, lifetimes) on every store
backend (tests/backends.py): its shared store is made once per backend."""

from backends import bb, each_tier, live_tier, shared_st, store_database  # noqa: F401 - fixtures per backend
from test_live import *  # noqa: F401,F403 - its tests and fixtures, collected here again

# The gVisor agent's own mechanics touch the store no differently: test_live.py runs them.
del test_gvisor_commands_are_pid_1s_and_runsc_exec_still_serves, test_gvisor_commands_run_at_once_beside_a_long_one  # noqa: F821
