"""Host-side file access inside a running sandbox's root: openat2(2) with RESOLVE_IN_ROOT.

The engine reads and writes a live sandbox's files as host root, so every step here assumes the
sandbox planted what it finds:

- Paths resolve inside the sandbox. Following /proc/<pid>/root/<path> naively would resolve an
  absolute symlink planted by the sandbox (`ln -s / /tmp/x`) against the host's root. openat2
  resolves every component, symlinks and `..` included, as if the sandbox's root were `/`, and
  refuses magic links (/proc/self/fd/N).
- Only regular files are read or written. A live sandbox's /dev/null, /dev/full, /dev/tty are
  binds of the HOST's device nodes, and a FIFO blocks an open until a writer comes. So a path is
  first opened O_PATH (no driver's open, no FIFO wait), checked with fstat on that fd, and only
  then reopened for reading through the fd itself (the same inode: no check-to-use window).
- Only the sandbox's own filesystems: its overlay root and its tmpfs mounts, as its mount table
  says (`own_mounts`), checked by the mount id of the fd itself (/proc/self/fdinfo; st_dev will
  not do: overlayfs reports the upper's or a lower's for files). Its /proc is a procfs whose
  files look regular; read as host root they would show what the sandbox itself may not read
  (kernel stacks, module addresses), and a write would reach host sysctls. The host nodes bound
  into its /dev and over masked /proc files come from devtmpfs, which statfs cannot tell from
  tmpfs; the mount table can.
- A write never writes into an existing inode and never changes one's owner or mode: it creates
  a new file (O_CREAT|O_EXCL, so nothing planted is followed), sets its owner and mode, writes
  it, and renames it over the name. A hard link to the old file keeps the old content; a device
  node, FIFO or directory at the name is refused before anything is created.
- Reads are bounded: a sparse file may claim any size.

Python has no binding for openat2 (3.11), hence ctypes; the syscall number is the same on every
architecture.
"""

from __future__ import annotations

import ctypes
import errno
import os
import secrets
import stat
import threading

from ..errors import Conflict, InvalidInput, NotRegularFile, PathNotFound, TooLarge

SYS_openat2 = 437
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10

OWN_TYPES = ("overlay", "tmpfs")    # the filesystems a sandbox's own files live on
MAX_LINKS = 40                      # as the kernel's own symlink limit
TEMP_PREFIX = ".sandtree-write-"


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def open_in_root(root_fd: int, path: str, flags: int, mode: int = 0o644) -> int:
    """openat2(root_fd, path, flags) with every component resolved inside root_fd."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    raw = path.lstrip("/").encode("utf-8", "surrogateescape") or b"."
    for _ in range(16):                  # EAGAIN: a rename raced the lookup; the kernel asks to retry
        fd = _libc.syscall(SYS_openat2, ctypes.c_int(root_fd), ctypes.c_char_p(raw), ctypes.byref(how),
                           ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return fd
        err = ctypes.get_errno()
        if err != errno.EAGAIN:
            break
    if err in (errno.ENOENT, errno.ENOTDIR):
        raise PathNotFound(f"no such file in the sandbox: {path}", path=path)
    if err == errno.EISDIR:
        raise InvalidInput(f"{path} is a directory", path=path)
    if err == errno.ELOOP:
        raise InvalidInput(f"too many levels of symbolic links: {path}", path=path)
    raise OSError(err, f"{os.strerror(err)}: {path}")


def own_mounts(mountinfo: str) -> set[int]:
    """Mount ids of every overlay and tmpfs mount in a /proc/PID/mountinfo text (the sandbox's
    root and scratch mounts; not devtmpfs, proc, devpts, nor anything else)."""
    out = set()
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, kind = left.split(), right.split()[:1]
        if sep and fields and fields[0].isdigit() and kind and kind[0] in OWN_TYPES:
            out.add(int(fields[0]))
    return out


def mount_id(fd: int) -> int | None:
    """The id of the mount an fd is on (as /proc/PID/mountinfo numbers them)."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return int(line.split()[1])
    return None


def _kind(mode: int) -> str:
    return {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
            stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link"}.get(
        stat.S_IFMT(mode), "not a regular file")


def own_filesystem(fd: int, mounts: set[int], path: str) -> None:
    if mount_id(fd) not in mounts:
        raise NotRegularFile(f"{path} is not on the sandbox's own filesystem (/proc, /sys and the like are "
                             "not read or written from outside)", path=path)


def read_file(root_fd: int, path: str, limit: int, mounts: set[int]) -> bytes:
    """The regular file at `path` in the sandbox, whole; TooLarge above `limit` bytes. mounts:
    own_mounts() of the sandbox."""
    pfd = open_in_root(root_fd, path, os.O_PATH)      # follows symlinks, inside the root only
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is {_kind(st.st_mode)}: only regular files are read", path=path)
        own_filesystem(pfd, mounts, path)
        if st.st_size > limit:
            raise TooLarge(f"{path} has {st.st_size} bytes, over the limit of {limit}", path=path,
                           size=st.st_size, limit=limit)
        # the very inode checked above (an O_PATH fd reopened through /proc/self/fd)
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(pfd)
    try:
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:                                    # it grew while we read
        raise TooLarge(f"{path} is over the limit of {limit} bytes", path=path, limit=limit)
    return b"".join(chunks)


def _split(path: str) -> tuple[str, str]:
    """(directory, last name); the name is "" for a path ending in "/" (a directory)."""
    parent, _, name = path.rpartition("/")
    return parent or "/", name


def write_file(root_fd: int, path: str, data: bytes, mode: int, uid: int, gid: int, mounts: set[int]) -> None:
    """Make `path` in the sandbox a new regular file holding `data`, owned by host uid/gid (already
    mapped), with `mode`. Its directory must exist. A symlink at `path` is followed inside the
    sandbox; a directory, device, FIFO or socket there is refused and left as it was."""
    for _ in range(MAX_LINKS):
        parent, name = _split(path)
        if name in ("", ".", ".."):
            raise NotRegularFile(f"{path} is a directory: only regular files are written", path=path)
        dfd = open_in_root(root_fd, parent, os.O_PATH | os.O_DIRECTORY)
        try:
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dfd)
                path = target if target.startswith("/") else f"{parent.rstrip('/')}/{target}"
                continue                               # (resolved again from the root)
            if st is not None and not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{path} is {_kind(st.st_mode)}: only regular files are written", path=path)
            own_filesystem(dfd, mounts, path)              # where the new file is made
            _replace(dfd, name, path, data, mode, uid, gid)
            return
        finally:
            os.close(dfd)
    raise InvalidInput(f"too many levels of symbolic links: {path}", path=path)


def create_as(root_fd: int, directory: str, name: str, data: bytes, mode: int, uid: int, gid: int,
              mounts: set[int]) -> None:
    """Make the new file directory/name (O_EXCL) holding `data`, created by (uid, gid), host ids:
    a filesystem mounted inside the sandbox's user namespace (its /dev/shm) takes no file made by
    an id that namespace does not map (EOVERFLOW), as the engine's root is not. The ids are the
    creating thread's fsuid/fsgid (per thread in Linux): a thread of its own, which then ends."""
    dfd = open_in_root(root_fd, directory, os.O_PATH | os.O_DIRECTORY)
    failed: list[BaseException] = []

    def create() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            libc.setfsgid(gid)
            libc.setfsuid(uid)
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except BaseException as exc:           # noqa: BLE001 - raised in the caller's thread
            failed.append(exc)
    try:
        own_filesystem(dfd, mounts, directory)
        t = threading.Thread(target=create, name="sandtree-create-as")
        t.start()
        t.join()
    finally:
        os.close(dfd)
    if failed:
        raise failed[0]


def _replace(dfd: int, name: str, path: str, data: bytes, mode: int, uid: int, gid: int) -> None:
    tmp = TEMP_PREFIX + secrets.token_hex(8)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                 | os.O_CLOEXEC, 0o600, dir_fd=dfd)
    try:
        try:
            os.fchown(fd, uid, gid)                    # the file we just made, nothing else
            os.fchmod(fd, mode)                        # (after chown: chown clears setuid bits)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException as exc:
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TooLarge(f"{path}: the sandbox's disk is full ({len(data)} bytes)", path=path,
                           size=len(data)) from None
        if isinstance(exc, IsADirectoryError):         # made a directory meanwhile
            raise NotRegularFile(f"{path} is a directory: only regular files are written", path=path) from None
        raise


MAX_LISTED = 10000                  # entries one listing returns (a directory the sandbox filled)


def exists(root_fd: int, path: str) -> bool:
    """Whether `path` names anything in the sandbox (symlinks followed inside the root)."""
    try:
        os.close(open_in_root(root_fd, path, os.O_PATH))
    except PathNotFound:
        return False
    return True


def list_dir(root_fd: int, path: str, mounts: set[int]) -> list[dict]:
    """The entries of a directory of the sandbox's own filesystem: name, kind, size, mode,
    permissions, host uid and gid, mtime, a link's target (at most MAX_LISTED; lstat of each, so a
    link is reported as a link, never followed)."""
    dfd = open_in_root(root_fd, path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        own_filesystem(dfd, mounts, path)
        out = []
        with os.scandir(dfd) as it:
            for e in it:
                if len(out) >= MAX_LISTED:
                    break
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue                              # removed while listed
                out.append({"name": e.name, "kind": _KINDS.get(stat.S_IFMT(st.st_mode), "other"),
                            "size": st.st_size, "mode": stat.S_IMODE(st.st_mode),
                            "permissions": stat.filemode(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
                            "mtime": st.st_mtime,
                            "target": os.readlink(e.name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else None})
        return sorted(out, key=lambda x: x["name"])
    finally:
        os.close(dfd)


_KINDS = {stat.S_IFREG: "file", stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFCHR: "char",
          stat.S_IFBLK: "block", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


def make_dirs(root_fd: int, path: str, mode: int, uid: int, gid: int, mounts: set[int]) -> None:
    """Every missing directory of `path` in the sandbox, as mkdir -p does, owned by host uid/gid
    (already mapped): each made in its parent opened inside the root (a link the sandbox puts in
    the way is resolved inside it), and only on the sandbox's own filesystem."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise InvalidInput(f"a path with '..' is refused: {path}", path=path)
    for i, name in enumerate(parts):
        parent = "/" + "/".join(parts[:i])
        dfd = open_in_root(root_fd, parent, os.O_PATH | os.O_DIRECTORY)
        try:
            try:
                # never followed here: a link's target would be looked up from the host's root (a
                # host path's kind is not the sandbox's to learn); the next step opens it inside
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    raise NotRegularFile(f"/{'/'.join(parts[:i + 1])} exists and is {_kind(st.st_mode)}",
                                         path=path)
                continue
            except FileNotFoundError:
                pass
            own_filesystem(dfd, mounts, path)
            try:
                os.mkdir(name, 0o700, dir_fd=dfd)         # 0700 until it is the owner's
            except FileExistsError:
                continue                                  # made meanwhile
            os.chown(name, uid, gid, dir_fd=dfd, follow_symlinks=False)
            _chmod_dir(dfd, name, mode)
        finally:
            os.close(dfd)


def _chmod_dir(dfd: int, name: str, mode: int) -> None:
    """chmod the directory just made, through an fd of it (never following a link put there)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def remove(root_fd: int, path: str, mounts: set[int], *, recursive: bool = False) -> None:
    """Remove a file, a link (not what it points to) or an empty directory of the sandbox's own
    filesystem. A directory with files in it is refused, not emptied, unless `recursive` (rm -r
    --one-file-system): then every directory below is opened by name below one already open, never
    through a link (O_NOFOLLOW), never into another mount (a mount point inside stays, and its
    directory), at most MAX_DEPTH deep (deeper: `exec rm -r` inside)."""
    parent, name = _split(path.rstrip("/") or "/")
    if name in ("", ".", ".."):
        raise InvalidInput(f"cannot remove {path}", path=path)
    dfd = open_in_root(root_fd, parent, os.O_PATH | os.O_DIRECTORY)
    try:
        own_filesystem(dfd, mounts, path)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise PathNotFound(f"no such file in the sandbox: {path}", path=path) from None
        try:
            if stat.S_ISDIR(st.st_mode):
                if recursive:
                    _empty(dfd, name, path, mount_id(dfd), 0)
                os.rmdir(name, dir_fd=dfd)
            else:
                os.unlink(name, dir_fd=dfd)
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                raise InvalidInput(f"{path} is a directory with files in it (remove them first, or exec rm -r)",
                                   path=path) from None
            if exc.errno == errno.EBUSY:
                raise InvalidInput(f"{path} is a mount point", path=path) from None
            raise
    finally:
        os.close(dfd)


def stat_entry(root_fd: int, path: str, mounts: set[int]) -> dict:
    """What the kernel says of `path` in the sandbox, the name itself (lstat: a link is reported as a
    link with its target as readlink says, never followed): name, kind, path, size, mode (the
    permission bits), permissions (as ls shows them), host uid/gid, mtime, target. Its directory is
    resolved inside the root; the entry must be on the sandbox's own filesystem."""
    clean = "/" + "/".join(p for p in path.split("/") if p not in ("", "."))
    if ".." in clean.split("/"):
        raise InvalidInput(f"a path with '..' is refused: {path}", path=path)
    parent, name = _split(clean)
    if not name:                                           # the root itself
        dfd = open_in_root(root_fd, "/", os.O_PATH | os.O_DIRECTORY)
        try:
            own_filesystem(dfd, mounts, path)
            st = os.fstat(dfd)
        finally:
            os.close(dfd)
        return _entry("/", "/", st, None)
    dfd = open_in_root(root_fd, parent, os.O_PATH | os.O_DIRECTORY)
    try:
        own_filesystem(dfd, mounts, path)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            raise PathNotFound(f"no such file in the sandbox: {path}", path=path) from None
        target = os.readlink(name, dir_fd=dfd) if stat.S_ISLNK(st.st_mode) else None
    finally:
        os.close(dfd)
    return _entry(name, clean, st, target)


def _entry(name: str, path: str, st: os.stat_result, target: str | None) -> dict:
    return {"name": name, "kind": _KINDS.get(stat.S_IFMT(st.st_mode), "other"), "path": path,
            "size": st.st_size, "mode": stat.S_IMODE(st.st_mode), "permissions": stat.filemode(st.st_mode),
            "uid": st.st_uid, "gid": st.st_gid, "mtime": st.st_mtime, "target": target}


RENAME_NOREPLACE = 1


def rename(root_fd: int, source: str, destination: str, mounts: set[int], replace: bool = False) -> None:
    """Move `source` to `destination` in the sandbox (a file, a link or a whole directory: rename(2),
    one step, nothing copied). Both directories are resolved inside the root and must be on its own
    filesystem (a rename across its mounts is refused, as the kernel refuses it). An existing
    destination is refused unless `replace` (then rename(2) replaces it as POSIX says: a file by
    anything but a directory, an empty directory by a directory)."""
    names = []
    for p in (source, destination):
        parent, name = _split(p.rstrip("/") or "/")
        if name in ("", ".", "..") or ".." in parent.split("/"):
            raise InvalidInput(f"cannot move {p}: name a file or directory below the root, without '..'", path=p)
        names.append((parent, name))
    (sp, sn), (dp, dn) = names
    sfd = open_in_root(root_fd, sp, os.O_PATH | os.O_DIRECTORY)
    try:
        dfd = open_in_root(root_fd, dp, os.O_PATH | os.O_DIRECTORY)
        try:
            own_filesystem(sfd, mounts, source)
            own_filesystem(dfd, mounts, destination)
            try:
                os.stat(sn, dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                raise PathNotFound(f"no such file in the sandbox: {source}", path=source) from None
            flags = 0 if replace else RENAME_NOREPLACE
            if _libc.renameat2(sfd, os.fsencode(sn), dfd, os.fsencode(dn), flags) != 0:
                _rename_error(ctypes.get_errno(), source, destination)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def _rename_error(err: int, source: str, destination: str):
    if err == errno.EEXIST:
        raise Conflict(f"{destination} exists (replace=true replaces it)", path=destination)
    if err == errno.ENOENT:
        raise PathNotFound(f"no such file in the sandbox: {source}", path=source)
    if err == errno.EXDEV:
        raise InvalidInput(f"{source} and {destination} are on different filesystems of the sandbox (a move "
                           "across its mounts is a copy: exec mv does it)", path=source)
    if err in (errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
        raise Conflict(f"cannot replace {destination}: {os.strerror(err)}", path=destination)
    if err == errno.EINVAL:
        raise InvalidInput(f"cannot move {source} into itself ({destination})", path=source)
    if err == errno.EBUSY:
        raise InvalidInput(f"{source} or {destination} is a mount point", path=source)
    raise OSError(err, f"{os.strerror(err)}: {source} -> {destination}")


MAX_DEPTH = 256                     # directories deep a tree removal goes (deeper: exec rm -r inside)


def _empty(pfd: int, name: str, path: str, mnt: int | None, depth: int) -> None:
    if depth >= MAX_DEPTH:
        raise InvalidInput(f"{path} is more than {MAX_DEPTH} directories deep (exec rm -r removes it)", path=path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=pfd)
    except FileNotFoundError:
        return
    try:
        if mount_id(fd) != mnt:
            raise InvalidInput(f"{path} holds a mount point: not removed from outside", path=path)
        with os.scandir(fd) as it:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        for child, is_dir in entries:
            try:
                if is_dir:
                    _empty(fd, child, path, mnt, depth + 1)
                    os.rmdir(child, dir_fd=fd)
                else:
                    os.unlink(child, dir_fd=fd)
            except FileNotFoundError:
                continue                                  # removed meanwhile
    finally:
        os.close(fd)
