"""Two directions of one conversation, each a coroutine, that end together: the WebSocket relays
(http/terminal.py, http/ports.py) and the secret-injecting proxy (network/intercept.py) run both
until either ends, then stop the other. Imports only the standard library (every layer may use it)."""

from __future__ import annotations

import asyncio

__all__ = ["until_first"]


async def until_first(*coros, closing=None) -> None:
    """Run the coroutines until the first one ends (or this is cancelled); cancel the others; await
    `closing()` (if given: closing what they wait on) before collecting them, whose errors are
    dropped (an end is what they were waiting for)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        try:
            if closing is not None:
                await closing()
        finally:
            await asyncio.gather(*tasks, return_exceptions=True)
