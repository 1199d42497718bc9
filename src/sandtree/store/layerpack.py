"""A layer directory as one object (S3 objects): a PAX tar whose records carry what a
plain tar loses. Exact nanosecond mtimes (SANDTREE.mtime_ns: a sandbox on another node must see
the same files as on this one, or its commits would differ), every xattr base64-encoded
(SANDTREE.xattr.NAME: overlay's opaque/whiteout markers, v3 file capabilities), sockets
(SANDTREE.kind=sock) and the store's id map (a global SANDTREE.idmap: layers hold host ids, so a
node with another id map refuses the layer instead of showing wrong owners).

unpack() trusts nothing in the tar even though its sha256 was checked: members are created by us,
one by one, under a fresh staging dir; a name must be relative, normalised, within the depth and
length caps, and its parent a directory this unpack made (so no symlink or hard link is ever
followed); duplicates, block devices, char devices other than overlay's 0/0 whiteout, hard links
(pack writes each file whole), trusted.* xattrs other than overlay's opaque marker and an import's
device-placeholder marker (inert to overlay), and more bytes or members than the caps are
BadArchive."""

from __future__ import annotations

import base64
import hashlib
import collections
import os
import stat
import tarfile
from concurrent.futures import ThreadPoolExecutor

from ..errors import BadArchive
from .layers import DEVICE_MARKER, IdMap

MAX_DEPTH = 512
MAX_NAME = 4096
MAX_MEMBERS = 2_000_000
WRITERS = 4                   # threads creating files while the tar is parsed (creates wait in the kernel)
HANDOFF_MAX = 1 << 20         # files up to this size are read into memory and written by a writer thread
INFLIGHT_MAX = 64 << 20       # bytes handed to writers and not yet written
_TRUSTED_OK = ("trusted.overlay.opaque", DEVICE_MARKER)   # opaque dirs; an import's device placeholders


class HashingWriter:
    """A file-like sink that counts and sha256-hashes what is written through it (a packed layer's
    or checkpoint's digest and size, for the row that names it)."""

    def __init__(self, f):
        self.f, self.h, self.size = f, hashlib.sha256(), 0

    def write(self, b):
        self.h.update(b)
        self.size += len(b)
        return self.f.write(b)


def pack(layer_dir: str, out, idmap: IdMap) -> None:
    """Write layer_dir as a tar to the binary file object `out` (iterative walk, sorted names)."""
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=1 << 20,
                      pax_headers={"SANDTREE.idmap": idmap_text(idmap)}) as tar:
        _add(tar, layer_dir, ".", os.lstat(layer_dir))
        todo = [""]
        while todo:
            rel = todo.pop()
            base = os.path.join(layer_dir, rel)
            for name in sorted(os.listdir(base)):
                sub = f"{rel}/{name}" if rel else name
                st = os.lstat(os.path.join(base, name))
                _add(tar, os.path.join(base, name), sub, st)
                if stat.S_ISDIR(st.st_mode):
                    todo.append(sub)


def idmap_text(idmap: IdMap) -> str:
    return f"{idmap.uid_base} {idmap.gid_base} {idmap.count}"


def _add(tar, path: str, name: str, st: os.stat_result) -> None:
    ti = tarfile.TarInfo(name)
    ti.mode, ti.uid, ti.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
    ti.mtime = st.st_mtime_ns // 10**9
    ti.uname = ti.gname = ""
    pax = {"SANDTREE.mtime_ns": str(st.st_mtime_ns)}
    try:
        for k in sorted(os.listxattr(path, follow_symlinks=False)):     # sorted: one layer, one tar
            pax["SANDTREE.xattr." + k] = base64.b64encode(os.getxattr(path, k, follow_symlinks=False)).decode()
    except OSError:
        pass
    m = st.st_mode
    f = None
    if stat.S_ISREG(m):
        ti.type, ti.size = tarfile.REGTYPE, st.st_size
        f = open(path, "rb")
    elif stat.S_ISDIR(m):
        ti.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(m):
        ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISCHR(m) or stat.S_ISBLK(m):
        ti.type = tarfile.CHRTYPE if stat.S_ISCHR(m) else tarfile.BLKTYPE
        ti.devmajor, ti.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
    elif stat.S_ISFIFO(m):
        ti.type = tarfile.FIFOTYPE
    elif stat.S_ISSOCK(m):
        ti.type = tarfile.FIFOTYPE
        pax["SANDTREE.kind"] = "sock"
    ti.pax_headers = pax
    try:
        tar.addfile(ti, f)
    finally:
        if f is not None:
            f.close()


def unpack(src, dest: str, idmap: IdMap, max_bytes: int, writers: int = WRITERS) -> int:
    """Unpack a layer tar (binary file object) into the empty directory dest; returns the bytes of
    its files. Raises BadArchive on anything a layer cannot hold (see the module docstring).
    Every member is checked here, in order; small files are then created and written by `writers`
    threads (each file's parent is a directory already made here; directories get their times
    after every file is in)."""
    pool = ThreadPoolExecutor(writers, thread_name_prefix="sandtree-unpack") if writers > 1 else None
    try:
        return _unpack(src, dest, idmap, max_bytes, pool)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def unpack_verified(body, dest: str, idmap: IdMap, size: int) -> int:
    """unpack() of a VerifiedStream (S3Objects.stream) into `dest` as it downloads; the stream's
    finish() then checks the whole object's sha256 and size. A tar that fails the checks is read to
    its end first, so a damaged object is named StoreCorrupt, not only BadArchive."""
    try:
        try:
            total = unpack(body, dest, idmap, max_bytes=size)
        except (BadArchive, OSError):
            body.finish()                        # bytes other than the recorded ones: StoreCorrupt
            raise
        body.finish()
        return total
    finally:
        body.close()


class _Writes:
    """Files handed to the writer threads: bounded in bytes, their errors raised here."""

    def __init__(self, pool):
        self.pool, self.pending, self.bytes = pool, collections.deque(), 0

    def submit(self, path: str, data: bytes, ti) -> None:
        self.pending.append((self.pool.submit(_write_file, path, data, ti), len(data)))
        self.bytes += len(data)
        while self.bytes > INFLIGHT_MAX or len(self.pending) > 4096:
            self._one()

    def _one(self) -> None:
        fut, n = self.pending.popleft()
        self.bytes -= n
        fut.result()

    def drain(self) -> None:
        while self.pending:
            self._one()


def _write_file(path: str, data: bytes, ti) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        _meta(fd, ti)                            # on the fd: no path lookups
    finally:
        os.close(fd)


def _unpack(src, dest: str, idmap: IdMap, max_bytes: int, pool) -> int:
    made_dirs = {"."}
    seen: set[str] = set()
    total = members = 0
    dir_meta = []
    writes = _Writes(pool) if pool is not None else None
    try:
        tar = tarfile.open(fileobj=src, mode="r|", bufsize=1 << 20)
    except tarfile.TarError as exc:
        raise BadArchive(f"layer object is not a tar: {exc}") from None
    with tar:
        if tar.pax_headers.get("SANDTREE.idmap") != idmap_text(idmap):
            raise BadArchive("layer object was packed by a store with another id map "
                             f"({tar.pax_headers.get('SANDTREE.idmap')!r}, here {idmap_text(idmap)!r})")
        try:
            for ti in tar:
                members += 1
                if members > MAX_MEMBERS:
                    raise BadArchive("layer object has too many members")
                name = _check_name(ti.name)
                if name in seen:
                    raise BadArchive(f"layer object repeats {name!r}")
                seen.add(name)
                parent = os.path.dirname(name) or "."
                if name != "." and parent not in made_dirs:
                    raise BadArchive(f"layer member {name!r} is not under a directory of the layer")
                path = dest if name == "." else os.path.join(dest, name)
                if ti.type == tarfile.DIRTYPE:
                    if name != ".":
                        os.mkdir(path, 0o700)
                    made_dirs.add(name)
                    dir_meta.append((path, ti))
                    continue
                if ti.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
                    total += ti.size
                    if total > max_bytes:
                        raise BadArchive("layer object holds more bytes than recorded")
                    if writes is not None and ti.size <= HANDOFF_MAX:
                        data = tar.extractfile(ti).read(ti.size)
                        if len(data) != ti.size:
                            raise BadArchive(f"layer member {name!r} is cut short")
                        writes.submit(path, data, ti)
                        continue
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                    with os.fdopen(fd, "wb") as out:
                        data = tar.extractfile(ti)
                        while chunk := data.read(1 << 20):
                            out.write(chunk)
                elif ti.type == tarfile.SYMTYPE:
                    os.symlink(ti.linkname, path)       # never followed here: parents are our dirs
                elif ti.type == tarfile.CHRTYPE and ti.devmajor == 0 and ti.devminor == 0:
                    os.mknod(path, stat.S_IFCHR | 0o600, 0)      # overlay's whiteout, the only device
                elif ti.type == tarfile.FIFOTYPE:
                    if ti.pax_headers.get("SANDTREE.kind") == "sock":
                        os.mknod(path, stat.S_IFSOCK | 0o600)
                    else:
                        os.mkfifo(path, 0o600)
                else:
                    raise BadArchive(f"layer member {name!r} has a type a layer never holds ({ti.type!r})")
                _meta(path, ti)
        except tarfile.TarError as exc:
            raise BadArchive(f"layer object is damaged: {exc}") from None
    if writes is not None:
        writes.drain()
    for path, ti in reversed(dir_meta):          # deepest last-made first: their mtimes stay
        _meta(path, ti)
    return total


def _check_name(raw: str) -> str:
    if not raw or len(raw) > MAX_NAME or "\0" in raw or raw.startswith("/"):
        raise BadArchive(f"bad layer member name {raw[:100]!r}")
    name = raw.rstrip("/")
    if name == ".":
        return name
    name = name[2:] if name.startswith("./") else name
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts) or len(parts) > MAX_DEPTH:
        raise BadArchive(f"bad layer member name {raw[:100]!r}")
    return name


def _meta(path, ti) -> None:
    """Owner, xattrs, mode and times of a member, in that order (a chown clears setuid bits and
    file capabilities). `path` may be the open fd of a regular file: no path lookups then."""
    fd = isinstance(path, int)
    if fd:
        os.chown(path, ti.uid, ti.gid)
    else:
        os.lchown(path, ti.uid, ti.gid)
    for key, value in ti.pax_headers.items():
        if not key.startswith("SANDTREE.xattr."):
            continue
        xname = key[len("SANDTREE.xattr."):]
        if xname.startswith("trusted.") and xname not in _TRUSTED_OK:
            raise BadArchive(f"layer member {ti.name!r} carries xattr {xname!r}")
        try:
            data = base64.b64decode(value, validate=True)
            if fd:
                os.setxattr(path, xname, data)
            else:
                os.setxattr(path, xname, data, follow_symlinks=False)
        except ValueError:
            raise BadArchive(f"layer member {ti.name!r}: bad xattr value") from None
    if ti.type != tarfile.SYMTYPE:
        os.chmod(path, ti.mode & 0o7777)
    try:
        ns = int(ti.pax_headers.get("SANDTREE.mtime_ns", ti.mtime * 10**9))
    except ValueError:
        raise BadArchive(f"layer member {ti.name!r}: bad mtime") from None
    if fd:
        os.utime(path, ns=(ns, ns))
    else:
        os.utime(path, ns=(ns, ns), follow_symlinks=False)
