"""Processes: a process in a live sandbox or a live run. Started without waiting, its pipes pumped and its
output kept (spawned.py); shaped like subprocess.Popen for `sandbox_popen` (popen.py); and live runs whose
command is process 1 of a live sandbox that more processes join (instances.py, Contree's subprocesses).
The runtime's side (the handle naming a sandbox's processes, Popen's shape) is runtime/liveproc.py and
runtime/popenlike.py."""
