"""The kernel's socket-to-socket path for decided, opaque connections (BPF sockmap): once the proxy
has decided a connection and nothing more of it is read (TLS after its SNI, TCP by a network
rule), both sockets go into a BPF SOCKHASH whose stream-verdict program (SK_SKB) redirects every
received skb to the egress of the other socket. Bytes then go socket to socket inside the kernel:
no pipe, no splice, no wake-up of the proxy per chunk (what Cilium's and Envoy's acceleration do).

The program is 19 instruction slots assembled here (no BPF library is a dependency; bpf(2) by
ctypes): it builds its own socket's 4-tuple as a key and calls bpf_sk_redirect_hash with it. The
map holds each socket under its PEER's 4-tuple, so the lookup of a socket's own tuple gives the
socket to send to. A missing key (a pair half inserted, or taken out by a cut) leaves the bytes
with their own socket (SK_PASS): never sent elsewhere.

`available()` says whether this kernel and process can (CAP_BPF, SOCKHASH, SK_SKB); the relay
(fastpath.py) falls back to splice.py where not."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import struct
import threading

__all__ = ["Sockhash", "available", "reason", "key_of", "MAX_ENTRIES"]

MAX_ENTRIES = 65536                  # sockets in the map at once (2 a connection)

# bpf(2) commands, map/program/attach types and the helper used (include/uapi/linux/bpf.h)
_SYS_BPF = 321                       # x86-64
_MAP_CREATE, _MAP_UPDATE_ELEM, _MAP_DELETE_ELEM, _PROG_LOAD, _PROG_ATTACH = 0, 2, 3, 5, 8
_MAP_TYPE_SOCKHASH = 18
_PROG_TYPE_SK_SKB = 14
_SK_SKB_STREAM_VERDICT = 5
_FUNC_SK_REDIRECT_HASH = 72
_NOEXIST = 1
_KEY = 16                            # remote_ip4, local_ip4, remote_port, local_port: 4 x u32

# struct __sk_buff offsets of the fields the key is made of
_REMOTE_IP4, _LOCAL_IP4, _REMOTE_PORT, _LOCAL_PORT = 92, 96, 132, 136


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def _program(map_fd: int) -> bytes:
    ldx_w, stx_w = 0x61, 0x63        # BPF_LDX|BPF_MEM|BPF_W, BPF_STX|BPF_MEM|BPF_W
    mov_reg, mov_imm, add_imm = 0xbf, 0xb7, 0x07   # 64-bit ALU: r = r', r = imm, r += imm
    return b"".join([
        _insn(mov_reg, 6, 1),                          # r6 = ctx (the skb): r1 is clobbered by calls
        # the key on the stack at fp-16, laid out as key_of() builds it from the socket
        _insn(ldx_w, 2, 6, _REMOTE_IP4), _insn(stx_w, 10, 2, -16),
        _insn(ldx_w, 2, 6, _LOCAL_IP4), _insn(stx_w, 10, 2, -12),
        _insn(ldx_w, 2, 6, _REMOTE_PORT), _insn(stx_w, 10, 2, -8),
        _insn(ldx_w, 2, 6, _LOCAL_PORT), _insn(stx_w, 10, 2, -4),
        _insn(mov_reg, 1, 6),                          # arg 1: the skb
        _insn(0x18, 2, 1, 0, map_fd), _insn(0),        # arg 2: the map (ld_imm64, src=BPF_PSEUDO_MAP_FD)
        _insn(mov_reg, 3, 10), _insn(add_imm, 3, 0, 0, -16),   # arg 3: &key
        _insn(mov_imm, 4, 0, 0, 0),                    # arg 4: flags 0 = the other socket's egress
        _insn(0x85, 0, 0, 0, _FUNC_SK_REDIRECT_HASH),  # r0 = SK_PASS (redirected) or SK_DROP (no key)
        # no key: pass (the bytes stay with their own socket) rather than drop what TCP acked
        _insn(0x55, 0, 0, 1, 0),                       # if r0 != 0 goto exit
        _insn(mov_imm, 0, 0, 0, 1),                    # r0 = SK_PASS
        _insn(0x95),                                   # exit
    ])


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, max(len(attr), 128))
    r = _libc.syscall(ctypes.c_long(_SYS_BPF), ctypes.c_long(cmd), buf, ctypes.c_long(len(buf)))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({cmd}): {os.strerror(e)}")
    return r


def key_of(sock: socket.socket) -> bytes:
    """`sock`'s 4-tuple as the program reads it from a received skb: the remote and local IPv4
    address in network order, the remote port in network order in a u32's upper half (the
    kernel's conversion of __sk_buff.remote_port), the local port in host order."""
    lip, lport = sock.getsockname()[:2]
    rip, rport = sock.getpeername()[:2]
    return (socket.inet_aton(rip) + socket.inet_aton(lip) + b"\0\0" + struct.pack("!H", rport)
            + struct.pack("=I", lport))


class Sockhash:
    """The map and its attached verdict program (one per proxy). `pair(a, b)` puts both in (each
    under the other's key: a's bytes go to b and b's to a); `unpair(a, b)` takes them out (a
    socket also leaves the map when it is closed)."""

    def __init__(self):
        self.map_fd = _bpf(_MAP_CREATE, struct.pack("=IIIII", _MAP_TYPE_SOCKHASH, _KEY, 4, MAX_ENTRIES, 0))
        try:
            code = _program(self.map_fd)
            log = ctypes.create_string_buffer(4096)
            lic = ctypes.create_string_buffer(b"Dual MIT/GPL")
            code_buf = ctypes.create_string_buffer(code, len(code))
            attr = struct.pack("=IIQQIIQI", _PROG_TYPE_SK_SKB, len(code) // 8, ctypes.addressof(code_buf),
                               ctypes.addressof(lic), 1, len(log), ctypes.addressof(log), 0)
            try:
                self.prog_fd = _bpf(_PROG_LOAD, attr)
            except OSError as e:
                raise OSError(e.errno, f"{e.strerror}: {log.value.decode(errors='replace')[-300:]}") from None
            try:
                _bpf(_PROG_ATTACH, struct.pack("=IIII", self.map_fd, self.prog_fd, _SK_SKB_STREAM_VERDICT, 0))
            except BaseException:
                os.close(self.prog_fd)
                raise
        except BaseException:
            os.close(self.map_fd)
            raise

    def _update(self, key: bytes, sock: socket.socket) -> None:
        k = ctypes.create_string_buffer(key, _KEY)
        v = ctypes.c_uint32(sock.fileno())
        # BPF_NOEXIST: a key already in (two sockets with one 4-tuple, one in the router's namespace
        # and one in the upstream's: only if the host had a link's address) fails the pairing
        # (that connection goes by splice) instead of taking another connection's place
        _bpf(_MAP_UPDATE_ELEM, struct.pack("=IIQQQ", self.map_fd, 0, ctypes.addressof(k),
                                           ctypes.addressof(v), _NOEXIST))

    def _delete(self, key: bytes) -> None:
        k = ctypes.create_string_buffer(key, _KEY)
        try:
            _bpf(_MAP_DELETE_ELEM, struct.pack("=IIQ", self.map_fd, 0, ctypes.addressof(k)))
        except OSError:
            pass                     # not in (never put, or its socket closed)

    def pair(self, quiet: socket.socket, other: socket.socket) -> None:
        """Put `quiet` in first (it must hold its received bytes back meanwhile: the caller set its
        SO_RCVLOWAT high), then `other`, whose peer key then exists already."""
        kq, ko = key_of(quiet), key_of(other)
        self._update(ko, quiet)
        try:
            self._update(kq, other)
        except BaseException:
            self._delete(ko)
            raise

    def unpair(self, a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            try:
                self._delete(key_of(s))
            except OSError:
                pass                 # not connected any more: closed sockets left the map

    def close(self) -> None:
        os.close(self.prog_fd)
        os.close(self.map_fd)


_probe_lock = threading.Lock()
_probed: list = []


def reason() -> str:
    """'' when the kernel path works here, else why not (for the doctor and the daemon's log)."""
    with _probe_lock:
        if not _probed:
            try:
                Sockhash().close()
                _probed.append("")
            except OSError as e:
                _probed.append(f"BPF sockhash with an SK_SKB verdict program refused: {e.strerror or e}")
        return _probed[0]


def available() -> bool:
    return not reason()
