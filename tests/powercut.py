"""A power cut, simulated: ext4 on a loop device whose backing file is on tmpfs. What the
filesystem has written to the loop device is in the backing file; what is still dirty in the
page cache above it is not. So a copy of the backing file taken at any moment (`cp
--sparse=always`) is the disk as a power cut at that moment would leave it (device-mapper's
dm-flakey / dm-log-writes would do as well; this kernel has no device-mapper).

A copy is checked as the machine would be after the cut: `e2fsck -fy` (journal replayed), then
mounted on a loop device of its own. Every mount and loop device made here is undone in every
path (umount, then losetup -d), and nothing is deleted while a mount is beneath it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile


class Unavailable(Exception):
    pass


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


def available() -> str | None:
    """Why a power cut cannot be simulated here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (loop devices, mounts)"
    for tool in ("losetup", "mkfs.ext4", "e2fsck", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.isdir("/dev/shm"):
        return "no /dev/shm (tmpfs) for the loop's backing file"
    return None


def _attach(path: str) -> str:
    return _run("losetup", "-f", "--show", path).stdout.strip()


def _detach(dev: str) -> None:
    _run("losetup", "-d", dev, check=False)


def _umount(mnt: str) -> None:
    if _run("umount", mnt, check=False).returncode != 0:
        _run("umount", "-l", mnt, check=False)


def _mounted(path: str) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == real for line in f)


class Disk:
    """An ext4 "disk": mount() it at `mnt`, cut() copies of it, close() undoes everything."""

    def __init__(self, workdir: str, size_mb: int = 512):
        self.workdir = workdir
        self.shm = tempfile.mkdtemp(prefix="sandtree-powercut-", dir="/dev/shm")
        self.backing = os.path.join(self.shm, "disk.img")
        self.mnt = os.path.join(workdir, "disk")
        self.dev: str | None = None
        self.cuts = 0
        os.makedirs(self.mnt)
        try:
            with open(self.backing, "wb") as f:
                f.truncate(size_mb << 20)
            # no lazy init: nothing of mkfs's is written in the background while the store works
            _run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", self.backing)
            self.dev = _attach(self.backing)
            _run("mount", "-t", "ext4", self.dev, self.mnt)
        except subprocess.CalledProcessError as exc:
            self.close()
            raise Unavailable(f"cannot make ext4 on a loop device: {exc.stderr.strip()}") from None

    def cut(self) -> str:
        """The disk as a power cut now leaves it: a copy of the backing file (its path)."""
        self.cuts += 1
        copy = os.path.join(self.shm, f"cut-{self.cuts}.img")
        _run("cp", "--sparse=always", self.backing, copy)
        return copy

    @contextlib.contextmanager
    def after(self, copy: str):
        """(e2fsck's exit code and output, mount point) of a cut, e2fsck'd and mounted; unmounted,
        detached and deleted after."""
        fsck = _run("e2fsck", "-fy", copy, check=False)
        mnt = os.path.join(self.workdir, f"after-{os.path.basename(copy)}")
        os.makedirs(mnt)
        dev = None
        try:
            dev = _attach(copy)
            _run("mount", "-t", "ext4", dev, mnt)
            try:
                yield fsck.returncode, fsck.stdout + fsck.stderr, mnt
            finally:
                _umount(mnt)
        finally:
            if dev is not None:
                _detach(dev)
            if not _mounted(mnt):
                os.rmdir(mnt)
                os.unlink(copy)

    def close(self) -> None:
        if _mounted(self.mnt):
            _umount(self.mnt)
        if self.dev is not None:
            _detach(self.dev)
            self.dev = None
        if not _mounted(self.mnt):
            os.rmdir(self.mnt)
            shutil.rmtree(self.shm, ignore_errors=True)     # the backing file and cuts (tmpfs; no mount)
