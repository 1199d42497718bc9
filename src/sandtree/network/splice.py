"""Moving a connection's bytes without copying them through Python: splice(2) from one socket into
a pipe and from the pipe into the other socket (the pages are passed, not copied). Either until the
source ends (an opaque relay: `relay`), or exactly `limit` bytes (an HTTP body whose length the
HTTP relay, plainhttp.py, read from its framing: never a byte past it).

A transfer past BULK_BYTES goes on in one of BULK_THREADS threads (poll + splice): measured, the
event loop's wake-ups cost ~0.2 s of CPU a GB. Counts go back to the loop, which owns the link's
counters."""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["splice", "relay", "cut", "PIPE_SIZE", "F_SETPIPE_SZ", "BULK_BYTES", "BULK_THREADS"]

PIPE_SIZE = 1 << 20          # relay pipes: large, fewer splices per megabyte
F_SETPIPE_SZ = 1031
BULK_BYTES = 8 << 20          # a transfer past this is a bulk transfer (goes on in a thread)
BULK_THREADS = 16
_POOL = ThreadPoolExecutor(BULK_THREADS, thread_name_prefix="egress-bulk")
_BULK = threading.Semaphore(BULK_THREADS)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class _Ready:
    """Readiness of one fd for one direction. Registered only while waited for: epoll is
    level-triggered, so a registration left in place while the relay waits on the other side
    (a slow reader) would wake the loop on every turn."""

    def __init__(self, loop, fd: int, write: bool):
        self.loop, self.fd, self.write = loop, fd, write

    async def wait(self) -> None:
        fut = self.loop.create_future()
        add, remove = ((self.loop.add_writer, self.loop.remove_writer) if self.write
                       else (self.loop.add_reader, self.loop.remove_reader))
        add(self.fd, lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            remove(self.fd)


def cut(*socks: socket.socket) -> None:
    """End both directions of `socks` (the peers see the end; the fds stay open)."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _want(limit: int | None, moved: int) -> int:
    return PIPE_SIZE if limit is None else min(PIPE_SIZE, limit - moved)


def _thread(src: socket.socket, dst: socket.socket, r: int, w: int, flush, limit, moved: int) -> None:
    """The bulk of a long transfer, off the event loop: the same splices, waiting in poll() (the
    sockets stay non-blocking: the loop may still serve the other direction). Counts go to the loop
    every BULK_BYTES (`flush`: the link's counters belong to the loop's thread)."""
    pin, pout = select.poll(), select.poll()
    pin.register(src.fileno(), select.POLLIN)
    pout.register(dst.fileno(), select.POLLOUT)
    unflushed = 0
    try:
        while limit is None or moved < limit:
            try:
                n = os.splice(src.fileno(), w, _want(limit, moved), flags=_FLAGS)
            except BlockingIOError:
                pin.poll()
                continue
            if n == 0:
                if limit is not None:
                    raise ConnectionResetError("cut inside a body")
                break
            moved += n
            unflushed += n
            if unflushed >= BULK_BYTES:
                flush(unflushed)
                unflushed = 0
            while n:
                try:
                    n -= os.splice(r, dst.fileno(), n, flags=_FLAGS)
                except BlockingIOError:
                    pout.poll()
    finally:
        flush(unflushed)


async def splice(src: socket.socket, dst: socket.socket, count, limit: int | None = None) -> int:
    """Move src's bytes to dst: exactly `limit` bytes (ConnectionResetError when src ends first), or
    with `limit` None until src ends, then end dst's sending side. `count(n)` is called with what
    moved. An OSError cuts both sockets and propagates."""
    loop = asyncio.get_running_loop()
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    readable, writable = _Ready(loop, src.fileno(), False), None
    moved = 0
    try:
        try:
            fcntl.fcntl(w, F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass                                  # the default (64 KiB) still works
        while limit is None or moved < limit:
            if moved >= BULK_BYTES and _BULK.acquire(blocking=False):
                try:
                    job = loop.run_in_executor(_POOL, _thread, src, dst, r, w,
                                               lambda n: loop.call_soon_threadsafe(count, n), limit, moved)
                    try:
                        await asyncio.shield(job)
                    except asyncio.CancelledError:
                        cut(src, dst)            # the thread ends; its fds are closed after it
                        await asyncio.wait([job])
                        raise
                finally:
                    _BULK.release()
                moved = limit if limit is not None else moved
                break
            try:
                n = os.splice(src.fileno(), w, _want(limit, moved), flags=_FLAGS)
            except BlockingIOError:
                await readable.wait()
                continue
            if n == 0:
                if limit is not None:
                    raise ConnectionResetError("cut inside a body")
                break
            count(n)
            moved += n
            while n:
                try:
                    n -= os.splice(r, dst.fileno(), n, flags=_FLAGS)
                except BlockingIOError:
                    if writable is None:         # a slow reader: from now on registered
                        writable = _Ready(loop, dst.fileno(), True)
                    await writable.wait()
        if limit is None:
            dst.shutdown(socket.SHUT_WR)
        return moved
    except OSError:                               # a reset or a cut: end both ways
        cut(src, dst)
        raise
    finally:
        os.close(r)
        os.close(w)


async def relay(usage, client: socket.socket, up: socket.socket) -> None:
    """Both directions until both end (an opaque TCP connection, or one past an HTTP upgrade),
    counted into `usage` (bytes_out: client -> up)."""
    def out(n):
        usage.bytes_out += n

    def into(n):
        usage.bytes_in += n

    async def one(src, dst, count):
        try:
            await splice(src, dst, count)
        except OSError:
            pass
    await asyncio.gather(one(client, up, out), one(up, client, into))
