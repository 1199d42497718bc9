"""The seccomp deny-list every sandboxed command runs under (built with libseccomp via pyseccomp).

Default allow, with a Docker-like deny list: the calls that reach kernel surface a sandbox never
needs (modules, kexec, bpf, perf, io_uring, keyrings, mount and namespace games). clone() with a
namespace flag fails; clone3 answers ENOSYS so libc falls back to clone, where flags are visible.
socket() and socketpair() take an allow-list of address families (SOCKET_FAMILIES); every other
family answers EAFNOSUPPORT, what a program sees on a kernel built without it (so it falls back).
The filter is compiled once per process and handed to the helper as a memfd of raw BPF.
Non-native system call ABIs (i386 int 0x80, x32) are killed: libseccomp's default for a bad arch.

System calls newer than libseccomp (2.5.4 names nothing after fchmodat2, 452) cannot be named in
its rules, and a default-allow filter lets them all through: statmount and listmount (457, 458),
open_tree_attr (467), and whatever the next kernel adds. A few instructions of our own run before
libseccomp's program (_prefix): they deny those by number and answer ENOSYS for every number
above KNOWN_MAX, the highest this list was checked against, so a future kernel's new calls are
refused until someone looks at them (programs treat ENOSYS as "an older kernel" and fall back).
"""

from __future__ import annotations

import errno
import os
import platform
import struct
import threading

DENIED = [
    # mounts and namespaces (the sandbox's root may hold CAP_SYS_ADMIN in its own user namespace)
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "fsopen", "fsconfig", "fsmount",
    "fspick", "move_mount", "open_tree", "mount_setattr",
    # kernel code and the whole machine
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot",
    "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "create_module", "get_kernel_syms", "query_module", "uselib", "nfsservctl", "_sysctl",
    "lookup_dcookie", "personality",
    # wide attack surface, no use in a sandbox
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key", "open_by_handle_at",
    "name_to_handle_at", "kcmp", "process_vm_readv", "process_vm_writev", "fanotify_init",
]

# Address families a sandbox may open. The network namespace covers only these: AF_VSOCK (40)
# reaches the hypervisor's services whatever the namespace (this VM's agent listens there), and
# the exotic families (AF_PACKET raw frames, AF_KCM, AF_TIPC, AF_RDS, AF_XDP, AF_ALG, AF_BLUETOOTH,
# ...) are kernel attack surface with a record of privilege escalations from user namespaces and
# no use on a loopback-only network. AF_NETLINK stays: ip(8), getifaddrs and so getaddrinfo use it.
SOCKET_FAMILIES = {
    1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK",
}
AF_MAX = 46         # linux/socket.h (AF_MCTP is 45); everything from here up is refused by range

# Calls above libseccomp's table that are denied by number (the numbers are the same on every
# architecture since 424: one table for all), and the highest number checked (file_setattr, 6.17).
DENIED_NUMBERS = {457: "statmount", 458: "listmount", 467: "open_tree_attr"}
KNOWN_MAX = 469

NS_FLAGS = 0x10000000 | 0x04000000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x00020000 | 0x02000000
# CLONE_NEWUSER | CLONE_NEWUTS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWCGROUP


_lock = threading.Lock()
_fd: int | None = None


def filter_fd() -> int:
    """A memfd holding the compiled BPF program (read with pread by each helper); built once
    per process, under a lock (concurrent first runs must agree on one fd)."""
    global _fd
    with _lock:
        if _fd is None:
            _fd = _build()
        return _fd


def _build() -> int:
    # libseccomp's ctypes binding: loaded only when a filter is first built, so importing the
    # runtime (the engine, the CLI's help) does not load libseccomp
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    try:
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)      # binary tree: every syscall of the sandbox pays it
    except (OSError, ValueError, RuntimeError):
        pass
    for name in DENIED:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except (ValueError, OSError, RuntimeError):
            pass                                  # not a syscall on this architecture
    for bit in _bits(NS_FLAGS):
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # An allow-list as deny rules (the filter allows by default): each family below AF_MAX that is
    # not allowed, by value, and the whole 64-bit range from AF_MAX up (the kernel reads the
    # argument as an int: a value with high bits set would alias a small family; GE catches it).
    for call in ("socket", "socketpair"):
        for fam in range(AF_MAX):
            if fam not in SOCKET_FAMILIES:
                f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.EQ, fam))
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, sc.Arg(0, sc.GE, AF_MAX))
    fd = os.memfd_create("sandtree-seccomp", 0)
    with os.fdopen(os.dup(fd), "wb") as out:
        out.write(_prefix())
        out.flush()                       # export_bpf writes to the fd itself, not through out
        f.export_bpf(out)
    os.set_inheritable(fd, False)
    return fd


# classic BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JGT_K, _JGE_K, _JA, _RET_K = 0x20, 0x15, 0x25, 0x35, 0x05, 0x06
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000
_NATIVE_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}   # AUDIT_ARCH_*


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _prefix() -> bytes:
    """BPF run before libseccomp's program: for the native ABI only (x32 numbers and other
    arches go on to libseccomp, which kills them), DENIED_NUMBERS answer EPERM and numbers above
    KNOWN_MAX answer ENOSYS; everything else falls through. libseccomp's program begins by
    loading the arch itself and its jumps are relative, so it runs unchanged after this."""
    arch = _NATIVE_ARCH.get(platform.machine())
    if arch is None:
        return b""            # an arch whose numbers we have not checked: libseccomp alone
    denied = sorted(DENIED_NUMBERS)
    # layout: 0 ld arch, 1 jeq arch, 2 ld nr, 3 jge x32, 4.. jeq each denied, jgt max, ja out,
    # ret EPERM, ret ENOSYS; "out" is the first instruction after the prefix
    n = 4 + len(denied) + 2 + 2
    out = n
    prog = [_insn(_LD_W_ABS, 0, 0, 4), _insn(_JEQ_K, 0, out - 2, arch),
            _insn(_LD_W_ABS, 0, 0, 0), _insn(_JGE_K, out - 4, 0, _X32_BIT)]
    eperm, enosys = n - 2, n - 1
    for i, nr in enumerate(denied):
        at = 4 + i
        prog.append(_insn(_JEQ_K, eperm - at - 1, 0, nr))
    at = 4 + len(denied)
    prog.append(_insn(_JGT_K, enosys - at - 1, 0, KNOWN_MAX))
    prog.append(_insn(_JA, 0, 0, out - (at + 1) - 1))
    prog.append(_insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    prog.append(_insn(_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))
    assert len(prog) == n
    return b"".join(prog)


def _bits(mask: int):
    b = 1
    while b <= mask:
        if mask & b:
            yield b
        b <<= 1
