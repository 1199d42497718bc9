"""The device policy of a run's cgroup on cgroup v2: an eBPF program (BPF_PROG_TYPE_CGROUP_DEVICE)
that allows only the nodes the runtime provides (cgroups.DEVICES) and denies every other open and
mknod, as the v1 `devices` controller does (cgroups.py writes that one).

cgroup v2 has no devices controller; the kernel runs the programs attached to a task's cgroup
(and, with BPF_F_ALLOW_MULTI, its ancestors') on every device open and mknod. Attached once when
the group is made; the kernel drops it with the group. The program is assembled here (a dozen
instructions) and loaded with bpf(2) through ctypes: no compiler, no libbpf.
"""

from __future__ import annotations

import ctypes
import os
import struct

from ..errors import RuntimeUnavailable

BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE = 15, 6
BPF_F_ALLOW_MULTI = 2              # ancestors' programs run too: all of them must allow
DEV_CHAR = 2                       # BPF_DEVCG_DEV_CHAR, low 16 bits of access_type
SYS_BPF = 321                      # x86-64

# opcodes (linux/bpf.h)
_LDXW, _AND64K, _MOV64K, _EXIT = 0x61, 0x57, 0xB7, 0x95
_JEQ, _JNE, _JLT, _JGT, _JA = 0x15, 0x55, 0xA5, 0x25, 0x05


def program(devices) -> bytes:
    """The program for `devices` [(type, major, minor or None)], as raw bpf_insn. r1 points to
    struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor}; r0 = 1 allows."""
    code: list = []                                    # (op, dst, src, off or label, imm)

    def ins(op, dst=0, src=0, off=0, imm=0):
        code.append([op, dst, src, off, imm])
    ins(_LDXW, 2, 1, 0)                                # r2 = access_type
    ins(_AND64K, 2, imm=0xFFFF)                        # r2 = device type
    ins(_LDXW, 3, 1, 4)                                # r3 = major
    ins(_LDXW, 4, 1, 8)                                # r4 = minor
    ins(_JNE, 2, off="deny", imm=DEV_CHAR)             # block devices: never
    by_major: dict[int, list] = {}
    for t, ma, mi in devices:
        if t != "c":
            raise ValueError("only character devices are provided")
        by_major.setdefault(ma, []).append(mi)
    for ma, minors in sorted(by_major.items()):
        if None in minors:                             # the whole major (devpts)
            ins(_JEQ, 3, off="allow", imm=ma)
            continue
        ins(_JNE, 3, off=f"next{ma}", imm=ma)
        for mi in minors:
            ins(_JEQ, 4, off="allow", imm=mi)
        ins(_JA, off="deny")
        code.append(f"next{ma}")
    code.append("deny")
    ins(_MOV64K, 0, imm=0)
    ins(_EXIT)
    code.append("allow")
    ins(_MOV64K, 0, imm=1)
    ins(_EXIT)
    labels, pos = {}, 0
    for c in code:
        if isinstance(c, str):
            labels[c] = pos
        else:
            pos += 1
    out, pos = bytearray(), 0
    for c in code:
        if isinstance(c, str):
            continue
        op, dst, src, off, imm = c
        if isinstance(off, str):
            off = labels[off] - pos - 1
        out += struct.pack("<BBhi", op, (src << 4) | dst, off, imm)
        pos += 1
    return bytes(out)


_libc = ctypes.CDLL(None, use_errno=True)


def _bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr, len(attr))
    r = _libc.syscall(SYS_BPF, cmd, buf, len(attr))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


def attach(cgroup_dir: str, devices) -> None:
    """Attach the device policy to a cgroup v2 directory (RuntimeUnavailable if this kernel or
    this host's hierarchy refuses it: a run never starts without its device policy)."""
    insns = program(devices)
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    # union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level, log_size,
    # log_buf, kern_version, prog_flags, prog_name[16], prog_ifindex, expected_attach_type
    prog = ctypes.create_string_buffer(insns, len(insns))
    attr = struct.pack("<IIQQIIQII16sII", BPF_PROG_TYPE_CGROUP_DEVICE, len(insns) // 8,
                       ctypes.addressof(prog), ctypes.addressof(lic), 1, len(log), ctypes.addressof(log),
                       0, 0, b"sandtree_dev", 0, BPF_CGROUP_DEVICE)
    try:
        pfd = _bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        raise RuntimeUnavailable(f"cannot load the cgroup v2 device policy (bpf): {exc.strerror}; "
                                 f"{log.value.decode(errors='replace')[-300:]}") from None
    try:
        cfd = os.open(cgroup_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # target_fd, attach_bpf_fd, attach_type, attach_flags
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIII", cfd, pfd, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI))
        except OSError as exc:
            raise RuntimeUnavailable(f"cannot attach the cgroup v2 device policy to {cgroup_dir}: "
                                     f"{exc.strerror}") from None
        finally:
            os.close(cfd)
    finally:
        os.close(pfd)                 # the attachment holds the program until the group goes
