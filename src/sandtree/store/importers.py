"""Import sources → a staged root filesystem in the store's tmp/ (then store.scan adopts it).

Sources: a directory; a tar (plain, gzip, zstd); an OCI image layout (directory or tar) or a
docker-archive tar, whose layers are applied in order with their whiteouts; Debian bootstrap.
Tar members are checked before anything is written: absolute names, `..`, bad components (the
one name rule, store/names.py), writing through a symlink and hard links that leave the archive
are refused (BadArchive / PathEscape). Extraction never follows a symlink it made. OCI whiteout
targets pass the same name rule. Device nodes become inert placeholders (store/layers.py) and
trusted.* / overlay xattrs from an archive are dropped. What an import may expand to is capped
(ImportLimits: bytes, entries, ratio to the compressed input), checked while streaming. Staged
ids are sandbox ids; scan() shifts them to host ids.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import shutil
import stat
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from typing import Callable, IO

try:
    import zstandard        # optional (zstd archives only): absent, the other formats still import
except ImportError:         # (at module level: the inner-import budget went to the S3 client, 220 ms)
    zstandard = None

from ..errors import BadArchive, InvalidInput, PathEscape, TooLarge
from . import names
from .layers import device_marker, DEVICE_MARKER, is_recorded_xattr, make_placeholder, remove_tree

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
BZ2_MAGIC = b"BZh"


@dataclass(frozen=True)
class ImportLimits:
    """What one import may expand to. The engine passes these (a tenant limit can set them).
    max_ratio applies once the expanded bytes pass ratio_floor: a 98 KB zstd tar of zeros that
    expands to 3 GB is a bomb; a small archive of text may expand 10x and stays under the floor."""

    max_bytes: int = 32 << 30                # the decompressed tar streams (headers too), all layers
    max_entries: int = 2_000_000             # tar members, all layers together
    max_ratio: int = 100                     # expanded bytes / compressed input bytes
    ratio_floor: int = 256 << 20
    max_depth: int | None = None             # path components of a member (None: the path-length rule only)
    special: bool = True                     # device nodes (as placeholders) and FIFOs allowed; False: BadArchive


class ImportBudget:
    """Counts one import's expansion against its limits; raises TooLarge the moment one is
    passed (the caller's staging dir is then removed, so nothing is left behind)."""

    def __init__(self, limits: ImportLimits | None = None):
        self.limits = limits or ImportLimits()
        self.compressed = 0
        self.bytes = 0
        self.entries = 0
        self.counts_stream = False               # open_tar_stream counts the whole stream

    def source(self, nbytes: int) -> None:
        """Another compressed input (an archive, a layer blob) of nbytes."""
        self.compressed += max(0, nbytes)

    def wrap(self, stream):
        """A reader over a decompressed stream that charges every byte read to this budget."""
        self.counts_stream = True
        return io.BufferedReader(_Counted(stream, self), 1 << 20)

    def entry(self) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise TooLarge(f"the archive has more than {self.limits.max_entries} entries",
                           limit="entries", max=self.limits.max_entries)

    def member(self, rel: str, m: tarfile.TarInfo) -> None:
        """A member's depth and kind, against limits that bound them (a build context's)."""
        lim = self.limits
        if lim.max_depth is not None and rel.count("/") + 1 > lim.max_depth:
            raise TooLarge(f"tar member {rel[:80]!r}... is deeper than {lim.max_depth} levels",
                           limit="depth", max=lim.max_depth, member=rel)
        if not lim.special and (m.ischr() or m.isblk() or m.isfifo()):
            kind = "FIFO" if m.isfifo() else "device node"
            raise BadArchive(f"tar member {rel!r} is a {kind}: not allowed here", member=rel)

    def data(self, nbytes: int) -> None:
        self.bytes += nbytes
        lim = self.limits
        if self.bytes > lim.max_bytes:
            raise TooLarge(f"the archive expands to more than {lim.max_bytes} bytes",
                           limit="bytes", max=lim.max_bytes)
        # (compressed 0: the input's size is unknown, only the absolute caps apply)
        if self.compressed and self.bytes > lim.ratio_floor and self.bytes > lim.max_ratio * self.compressed:
            raise TooLarge(f"the archive expands more than {lim.max_ratio} times its size "
                           f"({self.compressed} bytes; refused at {self.bytes}): a decompression bomb?",
                           limit="ratio", max=lim.max_ratio)


class _Counted(io.RawIOBase):
    """The decompressed tar stream, charged to the budget as it is read: every byte tarfile
    sees (headers too: a pax header can claim gigabytes, which tarfile would hold in memory)."""

    def __init__(self, inner, budget: ImportBudget):
        self.inner, self.budget = inner, budget

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.inner.read(len(b))
        n = len(data)
        b[:n] = data
        self.budget.data(n)
        return n


def open_tar_stream(fileobj: IO[bytes], budget: ImportBudget | None = None) -> tarfile.TarFile:
    """A tar stream (plain, gzip, xz, bzip2 or zstd). With a budget, the decompression is ours
    and every decompressed byte is counted (ratio and size caps hold while streaming)."""
    head = fileobj.peek(6)[:6] if hasattr(fileobj, "peek") else b""
    if head.startswith(ZSTD_MAGIC):
        if zstandard is None:
            raise BadArchive("a zstd archive needs the zstandard package (pip install zstandard)")
        stream = zstandard.ZstdDecompressor().stream_reader(fileobj)
    elif budget is None:
        try:
            return tarfile.open(fileobj=fileobj, mode="r|*")
        except tarfile.TarError as exc:
            raise BadArchive(f"not a tar archive: {exc}") from None
    elif head.startswith(GZIP_MAGIC):
        stream = gzip.GzipFile(fileobj=fileobj, mode="rb")
    elif head.startswith(XZ_MAGIC):
        stream = lzma.LZMAFile(fileobj, "rb")
    elif head.startswith(BZ2_MAGIC):
        stream = bz2.BZ2File(fileobj, "rb")
    else:
        stream = fileobj
    if budget is not None:
        stream = budget.wrap(stream)
    try:
        return tarfile.open(fileobj=stream, mode="r|")
    except (tarfile.TarError, OSError, EOFError, lzma.LZMAError, zlib.error) as exc:
        raise BadArchive(f"not a tar archive: {exc}") from None


def clean_name(name: str) -> str:
    if name.startswith("/"):
        raise PathEscape(f"tar member has an absolute path: {name!r}", member=name)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(f"tar member escapes with '..': {name!r}", member=name)
    for p in parts:
        names.check_entry_name(p, BadArchive, "tar member")
    return names.check_path_length("/".join(parts), BadArchive, "tar member")


def _parent_fd_path(root: str, rel: str) -> str:
    """Host path of rel's parent; refuses to pass through any symlink (no escape by link)."""
    cur = root
    for part in rel.split("/")[:-1]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            continue
        if stat.S_ISLNK(st.st_mode):
            raise PathEscape(f"tar member {rel!r} is written through the symlink {part!r}", member=rel)
        if not stat.S_ISDIR(st.st_mode):
            raise BadArchive(f"tar member {rel!r}: {part!r} is not a directory", member=rel)
    return os.path.join(root, rel)


def _remove(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        remove_tree(path)
    else:
        os.unlink(path)


WHITEOUT, OPAQUE, RESERVED = ".wh.", ".wh..wh..opq", ".wh..wh."


def _whiteout_target(rel: str) -> str | None:
    """For an OCI layer member: None if it is no whiteout; OPAQUE; RESERVED (other `.wh..wh.`
    names, e.g. aufs' .wh..wh.plnk: ignored); or the name it deletes, which passes the one name
    rule (`.wh..` would delete the parent, `.wh...` the store's tmp/)."""
    parts = rel.split("/")
    if any(p.startswith(WHITEOUT) for p in parts[:-1]):
        raise BadArchive(f"OCI layer member {rel!r} puts a whiteout name in a directory path", member=rel)
    base = parts[-1]
    if not base.startswith(WHITEOUT):
        return None
    if base == OPAQUE:
        return OPAQUE
    if base.startswith(RESERVED):
        return RESERVED
    return names.check_entry_name(base[len(WHITEOUT):], BadArchive, f"whiteout {rel!r}")


def extract_tar(tar: tarfile.TarFile, root: str, *, oci_layer: bool = False, chown: bool = True,
                progress: Callable[[int], None] | None = None, budget: ImportBudget | None = None) -> None:
    """Apply one tar stream onto `root` (OCI whiteouts honoured when oci_layer)."""
    budget = budget or ImportBudget()
    dir_times: list[tuple[str, tarfile.TarInfo]] = []
    try:
        for m in tar:
            budget.entry()
            rel = clean_name(m.name)
            budget.member(rel, m)
            if not rel:
                if m.isdir():
                    _meta(root, m, chown, is_dir=True)
                continue
            target = _whiteout_target(rel) if oci_layer else None
            if target is not None:
                parent = _parent_fd_path(root, rel)
                pdir = os.path.dirname(parent)
                if target == OPAQUE:
                    for child in os.listdir(pdir):
                        _remove(os.path.join(pdir, child))
                elif target != RESERVED:
                    _remove(os.path.join(pdir, target))
                continue
            path = _parent_fd_path(root, rel)
            if os.path.lexists(path) and not (m.isdir() and os.path.isdir(path) and not os.path.islink(path)):
                _remove(path)
            if m.isdir():
                if not os.path.isdir(path):
                    os.mkdir(path, 0o755)
                dir_times.append((path, m))
                _meta(path, m, chown, is_dir=True)
                continue
            if m.isreg():
                f = tar.extractfile(m)
                with open(path, "wb") as out:
                    while chunk := f.read(1 << 20):
                        if not budget.counts_stream:
                            budget.data(len(chunk))
                        out.write(chunk)
                if progress:
                    progress(m.size)
            elif m.issym():
                os.symlink(m.linkname, path)
            elif m.islnk():
                target = clean_name(m.linkname)
                tpath = _parent_fd_path(root, target)
                if not os.path.lexists(tpath):
                    raise BadArchive(f"hard link {rel!r} points at {m.linkname!r}, not in the archive")
                if os.path.isdir(tpath) and not os.path.islink(tpath):
                    raise BadArchive(f"hard link {rel!r} points at the directory {m.linkname!r}")
                os.link(tpath, path, follow_symlinks=False)
                continue                              # the link shares its target's metadata
            elif m.ischr() or m.isblk():
                if not chown:
                    continue                          # rootless: no device nodes, nor their record
                # never a device node on the host: a placeholder that says what it stands for
                make_placeholder(path)
                os.setxattr(path, DEVICE_MARKER, device_marker("c" if m.ischr() else "b",
                                                               os.makedev(m.devmajor, m.devminor), m.mode))
            elif m.isfifo():
                os.mkfifo(path, 0o600)
            else:
                continue
            _meta(path, m, chown, is_dir=False)
    except tarfile.TarError as exc:
        raise BadArchive(f"corrupt tar archive: {exc}") from None
    except EOFError:
        raise BadArchive("truncated archive") from None
    except (zlib.error, lzma.LZMAError, gzip.BadGzipFile) as exc:
        raise BadArchive(f"corrupt compressed archive: {exc}") from None
    for path, m in reversed(dir_times):
        os.utime(path, (m.mtime, m.mtime))


def _meta(path: str, m: tarfile.TarInfo, chown: bool, *, is_dir: bool) -> None:
    if chown:
        os.lchown(path, m.uid, m.gid)
    if not m.issym() and not (m.ischr() or m.isblk()):      # a placeholder stays mode 0
        os.chmod(path, m.mode & 0o7777)
    for k, v in (m.pax_headers or {}).items():
        if k.startswith("SCHILY.xattr.") and is_recorded_xattr(k[13:]):
            try:
                os.setxattr(path, k[13:], v.encode("utf-8", "surrogateescape"), follow_symlinks=False)
            except OSError:
                pass
    if not is_dir:
        os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)


# ---- OCI image layout and docker-archive -----------------------------------------------------
def layout_file(layout: str, rel: str) -> str:
    """Path of rel inside the layout, refusing any symlink on the way (an extracted archive's
    `blobs/sha256/X -> /etc/shadow` must not read a host file) and anything not regular."""
    cur = layout
    for part in names.check_path(rel, BadArchive, "OCI layout path"):
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            raise BadArchive(f"the image layout lacks {rel!r}") from None
        if stat.S_ISLNK(st.st_mode):
            raise BadArchive(f"the image layout's {rel!r} goes through a symlink")
    if not stat.S_ISREG(os.lstat(cur).st_mode):
        raise BadArchive(f"the image layout's {rel!r} is not a regular file")
    return cur


def layout_json(layout: str, rel: str):
    try:
        with open(layout_file(layout, rel), "rb") as f:
            if os.fstat(f.fileno()).st_size > 64 << 20:
                raise BadArchive(f"{rel} is over 64 MiB")
            return json.load(f)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadArchive(f"{rel} is not JSON: {exc}") from None


def _verified(path: str, digest: str) -> str:
    algo, _, want = digest.partition(":")
    if algo != "sha256":
        raise BadArchive(f"unsupported digest algorithm {algo!r}")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if h.hexdigest() != want:
        raise BadArchive(f"blob {digest} does not match its digest")
    return path


def oci_layers(layout: str) -> list[str]:
    """Layer tar paths, bottom first, of an OCI layout dir or an extracted docker-archive."""
    def blob(digest) -> str:
        algo, _, hexd = digest.partition(":") if isinstance(digest, str) else ("", "", "")
        if algo != "sha256":
            raise BadArchive(f"unsupported digest {str(digest)[:80]!r}")
        names.check_digest(hexd, BadArchive, "OCI digest")
        return _verified(layout_file(layout, f"blobs/sha256/{hexd}"), digest)

    if os.path.lexists(os.path.join(layout, "index.json")):
        index = layout_json(layout, "index.json")
        manifests = index.get("manifests") or []
        if not manifests:
            raise BadArchive("OCI index lists no manifests")
        desc = manifests[0]
        for _ in range(4):                          # nested indexes (multi-arch): pick amd64 or first
            doc = layout_json(layout, os.path.relpath(blob(desc["digest"]), layout))
            if "manifests" not in doc:
                break
            choices = doc["manifests"]
            desc = next((m for m in choices if (m.get("platform") or {}).get("architecture") == "amd64"),
                        choices[0])
        return [blob(layer["digest"]) for layer in doc.get("layers", [])]
    if os.path.lexists(os.path.join(layout, "manifest.json")):
        manifest = layout_json(layout, "manifest.json")
        if not manifest:
            raise BadArchive("docker-archive manifest is empty")
        paths = []
        for name in manifest[0]["Layers"]:
            paths.append(layout_file(layout, clean_name(name)))
        return paths
    raise BadArchive("neither an OCI layout (index.json) nor a docker-archive (manifest.json)")


def is_image_archive(path: str) -> bool:
    """A tar whose top level looks like an OCI layout or docker-archive."""
    try:
        with tarfile.open(path, "r:*") as t:
            for m in t:
                name = clean_name(m.name) if not m.name.startswith("/") else m.name
                if name in ("oci-layout", "index.json", "manifest.json"):
                    return True
                if "/" not in name and m.isreg() and name.endswith(".json"):
                    continue
                if name.startswith("blobs/") or "/" in name:
                    return False
    except (tarfile.TarError, PathEscape):
        return False
    return False


def apply_layers(layer_paths: list[str], root: str, chown: bool, progress=None,
                 budget: ImportBudget | None = None) -> None:
    budget = budget or ImportBudget()
    for lp in layer_paths:
        with open(lp, "rb") as raw:
            budget.source(os.fstat(raw.fileno()).st_size)
            with open_tar_stream(io.BufferedReader(raw), budget) as tar:
                extract_tar(tar, root, oci_layer=True, chown=chown, progress=progress, budget=budget)


# ---- Debian bootstrap -------------------------------------------------------------------------
def debian_mirror() -> str:
    for path in ("/etc/apt/sources.list.d/debian.sources",):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("URIs:"):
                        uri = line.split()[1]
                        if "security" not in uri:
                            return uri
        except OSError:
            pass
    try:
        with open("/etc/apt/sources.list") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[1]:
                    return parts[1]
    except OSError:
        pass
    return "http://deb.debian.org/debian"


def bootstrap_debian(spec: str, root: str, include: list[str], log: Callable[[str], None] | None = None,
                     mirror: str | None = None) -> None:
    """debootstrap into `root`, in a private mount namespace so its /proc mounts die with it."""
    distro, _, suite = spec.partition(":")
    if distro != "debian" or not suite or not suite.isalnum():
        raise InvalidInput(f"bootstrap supports debian:SUITE (e.g. debian:bookworm), not {spec!r}")
    if shutil.which("debootstrap") is None:
        raise InvalidInput("debootstrap is not installed (make demo installs it)")
    if os.geteuid() != 0:
        raise InvalidInput("Debian bootstrap needs root (debootstrap); import a tar instead")
    for pkg in include:
        if not pkg.replace("-", "").replace(".", "").replace("+", "").isalnum():
            raise InvalidInput(f"bad package name {pkg!r}")
    cmd = ["unshare", "--mount", "--propagation", "private", "debootstrap", "--variant=minbase"]
    if include:
        cmd.append("--include=" + ",".join(include))
    cmd += [suite, root, mirror or debian_mirror()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = []
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        if log:
            log(line.rstrip())
    if proc.wait() != 0:
        raise InvalidInput("debootstrap failed:\n" + "\n".join(tail))
    finish_rootfs(root)


# What a bootstrapped image has instead of the files debootstrap copies from the machine that
# ran it (setup_etc: the host's /etc/resolv.conf and /etc/hostname): an image must not carry, or
# publish to every tenant, the network config of the server that built it.
NEUTRAL_ETC = {
    "hostname": b"sandtree\n",
    "resolv.conf": b"# sandtree: no nameserver is set in the image (sandboxes have no network by default)\n",
}


def finish_rootfs(root: str) -> None:
    """The last step of a bootstrap: neutral network config, no apt caches or lists."""
    etc = os.open(os.path.join(root, "etc"), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for name, data in NEUTRAL_ETC.items():
            try:
                os.unlink(name, dir_fd=etc)            # a file or a symlink: never written through
            except FileNotFoundError:
                pass
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=etc)
            try:
                os.fchmod(fd, 0o644)                       # whatever the umask
                os.write(fd, data)
            finally:
                os.close(fd)
    finally:
        os.close(etc)
    # apt caches and logs are not part of a reproducible base
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        d = os.path.join(root, sub)
        if os.path.isdir(d):
            for name in os.listdir(d):
                p = os.path.join(d, name)
                if os.path.isfile(p) and not os.path.islink(p) and name != "lock":
                    os.unlink(p)
