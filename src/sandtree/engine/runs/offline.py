"""What a failed step's output says when it tried to reach the network without one: runs have no network by
default, so a build's `RUN pip install ...` or an evaluation's setup that downloads fails with a resolver's or
a socket's words; the error then carries a hint naming the option that gives it one."""

from __future__ import annotations

__all__ = ["NETWORK_HINT", "SIGNS", "network_hint"]

# The words of the usual tools (glibc, busybox, curl, wget, pip/urllib3, apt, git, npm) when no name resolves
# or no route leaves: what a sandbox with no network answers them
SIGNS = (b"temporary failure in name resolution", b"name or service not known", b"bad address '",
         b"could not resolve host", b"could not resolve", b"network is unreachable", b"no servers could be reached",
         b"getaddrinfo", b"newconnectionerror", b"failed to establish a new connection", b"eai_again",
         b"nodename nor servname", b"unable to resolve host")

NETWORK_HINT = ("hint: the step could not reach the network; runs have none by default: pass --network all or an "
                "allow-list (--network pypi.org,*.pythonhosted.org; network= in Python, RUN --network=... in a "
                "Dockerfile)")


def network_hint(*outputs: bytes) -> str | None:
    """NETWORK_HINT when a run with no network printed one of SIGNS (case ignored), else None."""
    text = b"\n".join(o or b"" for o in outputs).lower()
    return NETWORK_HINT if any(s in text for s in SIGNS) else None
