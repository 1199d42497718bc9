"""Live sandboxes: started from an image, entered by many commands, committed while running
(sandboxes.py, the part the others are mixins of): their files (files.py), hibernation, lifetimes and the
reaper (lifetime.py), the commit lock (locks.py), network policy (network.py), exposed ports and their
preview origins (ports.py, previews.py), the shell session (session.py), and old sandboxes stopped off
the caller's path (retiring.py)."""
