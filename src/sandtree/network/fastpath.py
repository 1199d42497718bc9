"""The opaque relay of a decided connection by the kernel (sockmap.py): both sockets are paired in
the BPF sockhash and bytes go socket to socket without the proxy; the proxy only waits, with the
sockets in an epoll of their own that wakes on an end (EPOLLRDHUP), a reset or an error, never on
data, and counts from the sockets' own TCP counters (TCP_INFO bytes_received: what arrived since
the handoff is what the program redirected).

Order is kept: the proxy has sent what it read itself (the sniffed ClientHello) before the
pairing; the client is paired first with its SO_RCVLOWAT high, so bytes arriving meanwhile wait in
its queue (TCP does not call data_ready below the low-water mark) instead of meeting a verdict
whose peer key is not in yet; then both are set back to 1, which runs the verdict on what
queued (tcp_set_rcvlowat calls tcp_data_ready). An end is passed on only once every byte before
it went out: src's FIN is followed by dst's shutdown(SHUT_WR) when dst's written bytes (acked +
SIOCOUTQ) caught up with src's received ones (the program's queue is not visible otherwise).

Off unless chosen (`choose("kernel")`: the daemon's --relay, from SANDTREE_EGRESS_RELAY): measured
here it moved the proxy's CPU into kernel workers and was not reliably faster (design.md, "The
relay, measured"). `relay()` answers False (nothing done) where it is off or the kernel cannot
(sockmap.reason()); the caller then uses splice.py's relay. Counts go into the link's usage every
SYNC_SECONDS, on an end and on a cut (Connection.close calls `stop()`)."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import select
import socket
import struct
import sys
import termios

from . import sockmap

__all__ = ["relay", "Fast", "enabled", "enable", "disable", "choose", "reason", "NOT_CHOSEN", "STATS",
           "SYNC_SECONDS", "HOLD_BYTES", "BUFFER_BYTES", "SEND_BYTES"]

SYNC_SECONDS = 1.0
BUFFER_BYTES = 32 << 20      # SO_RCVBUF / SO_SNDBUF of a kernel-relayed pair (see Fast.start)
SEND_BYTES = 32 << 20        # (a send side of its own: the two were measured apart)
_SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 32, 33   # root may pass net.core.[rw]mem_max
HOLD_BYTES = 16384           # SO_RCVLOWAT while a pair is being put in (below the initial window)
_TCP_INFO_LEN, _ACKED, _RECEIVED = 232, 120, 128    # struct tcp_info: tcpi_bytes_acked, tcpi_bytes_received
_TCP_CLOSE = 7
_FIN_RECEIVED = (6, 8, 9, 11)      # TIME_WAIT, CLOSE_WAIT, LAST_ACK, CLOSING
_EV = select.EPOLLRDHUP | select.EPOLLERR | select.EPOLLHUP
NOT_CHOSEN = "not chosen (SANDTREE_EGRESS_RELAY=kernel chooses it)"
_state: dict = {"hash": None, "off": NOT_CHOSEN}
# connections this process relayed by the kernel, and those left to splice.py (kernel path off, or
# a connection the map would not take: not established any more when its turn came)
STATS = {"kernel": 0, "splice": 0}


def disable(why: str, log: bool = True) -> None:
    """Use splice.py's relay from now on in this process (the daemon's log says why)."""
    _state["off"] = why
    if log:
        print(f"sandtree egress: kernel relay off ({why}); opaque connections use the splice relay",
              file=sys.stderr, flush=True)


def enable() -> None:
    """The kernel path from now on where it works (the daemon's --relay kernel; tests, bench)."""
    _state["off"] = None


def choose(relay: str) -> None:
    """'kernel' (checked at once: the log says if it can not be) or 'splice'."""
    if relay == "kernel":
        enable()
        enabled()
    else:
        _state["off"] = NOT_CHOSEN


def reason() -> str:
    """'' while the kernel path is on here, else why it is off."""
    enabled()
    return _state["off"] or ""


def enabled() -> bool:
    if _state["off"] is None and _state["hash"] is None:
        why = sockmap.reason()
        if why:
            disable(why)
        else:
            try:
                _state["hash"] = sockmap.Sockhash()
            except OSError as e:
                disable(str(e))
    return _state["off"] is None


def _info(s: socket.socket) -> tuple[int, int, int]:
    """(bytes acked, bytes received, TCP state)."""
    raw = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    return struct.unpack_from("=QQ", raw, _ACKED) + (raw[0],)


def _ioctl(s: socket.socket, req: int) -> int:
    return struct.unpack("i", fcntl.ioctl(s.fileno(), req, b"\0\0\0\0"))[0]


def _stable(f):
    """A value made of two reads the network may change between: read until it holds still."""
    while True:
        a, b = f(), f()
        if a == b:
            return a


def _received(s):       # bytes TCP took in (the FIN counts 1)
    return _info(s)[1]


def _written(s):        # bytes written into the socket: acked + not yet acked (SIOCOUTQ)
    return _info(s)[0] + _ioctl(s, termios.TIOCOUTQ)


def _consumed(s):       # bytes taken out by reads (received - SIOCINQ), before the pairing
    return _received(s) - _ioctl(s, termios.FIONREAD)


class Fast:
    """One connection in the kernel path: its baselines, counts and the cut."""

    def __init__(self, usage, client: socket.socket, up: socket.socket):
        self.usage, self.client, self.up = usage, client, up
        self.hash = _state["hash"]
        self.paired = False
        self.stopped = False                       # stop() was called: a cut or the end
        self.base_rx = {client: 0, up: 0}
        self.base_tx = {client: 0, up: 0}
        self.counted = {client: 0, up: 0}          # what sync() put into usage so far

    def start(self) -> None:
        c, u = self.client, self.up
        # The program's path gets no buffer autotuning (that runs in recvmsg), and the kernel's
        # worker retries a full send buffer only a jiffy later (sk_psock_backlog: EAGAIN ->
        # schedule_delayed_work(.., 1)): measured, default buffers gave 290 MB/s, 8 MiB 540,
        # 32 MiB 1.1-1.5 GB/s, 128 MiB a little more (not worth 4x the memory a stalled reader
        # pins). 32 MiB is what autotuning may give a spliced socket's receive side anyway
        # (tcp_rmem's max here); the memory is taken only while a reader is slower than its writer.
        for s in (c, u):
            s.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, BUFFER_BYTES)
            s.setsockopt(socket.SOL_SOCKET, _SO_SNDBUFFORCE, SEND_BYTES)
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, HOLD_BYTES)
        self.base_rx = {c: _stable(lambda: _consumed(c)), u: 0}
        self.base_tx = {c: _stable(lambda: _written(c)), u: _stable(lambda: _written(u))}
        # up is paired second, so nothing of it meets a missing key; what it holds is counted
        # from what the proxy had read of it (nothing: it was only written to)
        u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, HOLD_BYTES)
        self.base_rx[u] = _stable(lambda: _consumed(u))
        self.hash.pair(c, u)
        self.paired = True
        for s in (c, u):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)     # runs the verdict on what queued

    def moved(self, src: socket.socket) -> int:
        """Payload bytes src received since the handoff (its FIN not counted: the FIN is in
        bytes_received once the state says it came, both read by one getsockopt; a socket that
        had sent its own FIN goes to CLOSE on its peer's, as on a reset: there the receive side's
        shutdown tells, and a reset counts one byte less)."""
        try:
            _, received, state = _info(src)
        except OSError:
            return self.counted[src]
        fin = state in _FIN_RECEIVED or (state == _TCP_CLOSE and _ended(src))
        return received - self.base_rx[src] - fin

    def sync(self) -> None:
        for src, attr in ((self.client, "bytes_out"), (self.up, "bytes_in")):
            n = self.moved(src)
            if n > self.counted[src]:
                setattr(self.usage, attr, getattr(self.usage, attr) + n - self.counted[src])
                self.counted[src] = n

    def stop(self, count: bool = True) -> None:
        """Counted and out of the map: nothing more is redirected (a cut, or the end)."""
        self.stopped = True
        if count:
            self.sync()
        if self.paired:
            self.paired = False
            self.hash.unpair(self.client, self.up)

    def other(self, s: socket.socket) -> socket.socket:
        return self.up if s is self.client else self.client

    async def drained(self, src: socket.socket) -> bool:
        """Wait until every byte src received before its FIN went into the other socket; False
        when the other socket failed first (its bytes will not go out) or the connection was cut
        meanwhile (a reader that never reads would keep it waiting)."""
        dst = self.other(src)
        want = self.moved(src)
        delay = 0.0005
        while True:
            if self.stopped or _info(dst)[2] == _TCP_CLOSE:
                return False
            if _stable(lambda: _written(dst)) - self.base_tx[dst] >= want:
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)


def _error(s: socket.socket, fast: Fast) -> bool:
    """Whether s's pending error is a failure. The kernel reports EPIPE on the socket a FIN's
    empty skb was redirected to (sk_psock_backlog: a send of 0 bytes counts as a broken pipe)
    after every byte before it went out: that one is the other side's end, not a failure."""
    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    return bool(err) and not (err == errno.EPIPE and _ended(fast.other(s)))


def _ended(s: socket.socket) -> bool:
    """s's peer has sent its FIN (whether or not its event was looked at yet)."""
    p = select.poll()
    p.register(s.fileno(), select.POLLRDHUP)
    return any(ev & select.POLLRDHUP for _, ev in p.poll(0))


async def _events(ep: select.epoll, timeout: float) -> list:
    loop = asyncio.get_running_loop()
    got = ep.poll(0)
    if got:
        return got
    fut = loop.create_future()
    loop.add_reader(ep.fileno(), lambda: fut.done() or fut.set_result(None))
    try:
        await asyncio.wait_for(fut, timeout)
    except asyncio.TimeoutError:
        pass
    finally:
        loop.remove_reader(ep.fileno())
    return ep.poll(0)


async def relay(usage, client: socket.socket, up: socket.socket, conn=None) -> bool:
    """Both directions of an opaque connection by the kernel until both end (or a cut); False
    without doing anything when the kernel path is off here. `conn` (proxy.Connection) gets the
    Fast as `.fast`, so its close() counts and unpairs before it cuts."""
    if not enabled() or socket.AF_INET6 in (client.family, up.family):
        STATS["splice"] += 1               # (the program's keys are IPv4 4-tuples: sockmap.key_of)
        return False
    fast = Fast(usage, client, up)
    try:
        fast.start()
    except OSError:
        # this connection only (e.g. the client's FIN came first: the map takes only established
        # sockets); nothing was redirected, so the splice relay goes on (and counts) from here
        fast.stop(count=False)
        for s in (client, up):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            except OSError:
                pass
        STATS["splice"] += 1
        return False
    STATS["kernel"] += 1
    if conn is not None:
        conn.fast = fast
    by_fd = {client.fileno(): client, up.fileno(): up}
    ep = select.epoll()
    done: set = set()                                # sockets whose end went on to the other
    try:
        for fd in by_fd:
            ep.register(fd, _EV)
        while len(done) < 2:
            events = await _events(ep, SYNC_SECONDS)
            if conn is not None and conn.closed:
                return True                          # cut by a policy change or a release
            for fd, ev in events:
                src = by_fd[fd]
                if ev & select.EPOLLERR and _error(src, fast):
                    return True                      # a reset: both are cut below
                if ev & select.EPOLLHUP and not ev & select.EPOLLRDHUP:
                    return True                      # closed without an end: a reset
                if ev & select.EPOLLRDHUP and src not in done:
                    ep.unregister(fd)
                    if not await fast.drained(src):
                        return True
                    fast.other(src).shutdown(socket.SHUT_WR)
                    done.add(src)
            fast.sync()
        return True
    except OSError:
        return True
    finally:
        ep.close()
        fast.stop()
        if len(done) < 2:
            for s in (client, up):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
