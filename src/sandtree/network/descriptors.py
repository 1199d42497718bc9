"""The egress daemon's file descriptors: one process holds every link's proxied connections (two
descriptors each), its resolver's sockets and every exposed port's listener, for every tenant.
Its soft limit is raised to the hard one at start (the one it inherits, often 1024, is a shell's),
and an exposed port, which one tenant can ask for again and again, may never take the descriptors
the links' connections need: a new listener is refused while fewer than FD_RESERVE + FD_PER_LINK
per link would stay free (the engine caps exposed ports per sandbox and per tenant first:
defaults.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import resource

from ..errors import LimitExceeded

__all__ = ["FD_RESERVE", "FD_PER_LINK", "raise_limit", "check_room", "one_more"]

FD_RESERVE = 128
FD_PER_LINK = 32


def raise_limit() -> None:
    """The soft RLIMIT_NOFILE up to the hard one (this process's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def check_room(links: int) -> None:
    """LimitExceeded unless one more descriptor leaves `links` links their reserve."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return
    keep = FD_RESERVE + FD_PER_LINK * links
    if soft - len(os.listdir("/proc/self/fd")) - 1 < keep:
        raise LimitExceeded(f"the egress daemon keeps its last {keep} file descriptors for the connections "
                            f"of its {links} link(s): no more exposed ports now", limit="egress_files",
                            max=soft - keep)


@contextlib.contextmanager
def one_more(links: int):
    """Around making one descriptor that is not a link's (an exposed port's listener): check_room
    first, and a descriptor table full all the same (the host's, ENFILE) is LimitExceeded too."""
    check_room(links)
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        raise LimitExceeded("the egress daemon has no file descriptor left for another exposed port",
                            limit="egress_files") from None
