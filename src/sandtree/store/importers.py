"""Import sources → a staged root filesystem in the store's tmp/ (then store.scan adopts it).

Sources: a directory; a tar (plain, gzip, zstd); an OCI image layout (directory or tar) or a
docker-archive tar, whose layers are applied in order with their whiteouts; Debian bootstrap.
Tar members are checked before anything is written: absolute names, `..`, writing through a
symlink and hard links that leave the archive are refused (BadArchive / PathEscape). Extraction
never follows a symlink it made. Staged ids are sandbox ids; scan() shifts them to host ids.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
from typing import Callable, IO

from ..errors import BadArchive, InvalidInput, PathEscape
from .layers import remove_tree

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


def open_tar_stream(fileobj: IO[bytes]) -> tarfile.TarFile:
    head = fileobj.peek(4)[:4] if hasattr(fileobj, "peek") else b""
    if head.startswith(ZSTD_MAGIC):
        import zstandard
        return tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(fileobj), mode="r|")
    try:
        return tarfile.open(fileobj=fileobj, mode="r|*")
    except tarfile.TarError as exc:
        raise BadArchive(f"not a tar archive: {exc}") from None


def _clean_name(name: str) -> str:
    if name.startswith("/"):
        raise PathEscape(f"tar member has an absolute path: {name!r}", member=name)
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathEscape(f"tar member escapes with '..': {name!r}", member=name)
    return "/".join(parts)


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


def extract_tar(tar: tarfile.TarFile, root: str, *, oci_layer: bool = False, chown: bool = True,
                progress: Callable[[int], None] | None = None) -> None:
    """Apply one tar stream onto `root` (OCI whiteouts honoured when oci_layer)."""
    dir_times: list[tuple[str, tarfile.TarInfo]] = []
    try:
        for m in tar:
            rel = _clean_name(m.name)
            if not rel:
                if m.isdir():
                    _meta(root, m, chown, is_dir=True)
                continue
            base = rel.rsplit("/", 1)[-1]
            if oci_layer and base.startswith(".wh."):
                parent = _parent_fd_path(root, rel)
                pdir = os.path.dirname(parent)
                if base == ".wh..wh..opq":
                    for child in os.listdir(pdir):
                        _remove(os.path.join(pdir, child))
                else:
                    _remove(os.path.join(pdir, base[4:]))
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
                    shutil.copyfileobj(f, out, 1 << 20)
                if progress:
                    progress(m.size)
            elif m.issym():
                os.symlink(m.linkname, path)
            elif m.islnk():
                target = _clean_name(m.linkname)
                tpath = _parent_fd_path(root, target)
                if not os.path.lexists(tpath):
                    raise BadArchive(f"hard link {rel!r} points at {m.linkname!r}, not in the archive")
                os.link(tpath, path, follow_symlinks=False)
                continue                              # the link shares its target's metadata
            elif m.ischr() or m.isblk():
                if not chown:
                    continue                          # rootless: no device nodes
                kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
                os.mknod(path, kind | 0o600, os.makedev(m.devmajor, m.devminor))
            elif m.isfifo():
                os.mkfifo(path, 0o600)
            else:
                continue
            _meta(path, m, chown, is_dir=False)
    except tarfile.TarError as exc:
        raise BadArchive(f"corrupt tar archive: {exc}") from None
    except EOFError:
        raise BadArchive("truncated archive") from None
    for path, m in reversed(dir_times):
        os.utime(path, (m.mtime, m.mtime))


def _meta(path: str, m: tarfile.TarInfo, chown: bool, *, is_dir: bool) -> None:
    if chown:
        os.lchown(path, m.uid, m.gid)
    if not m.issym():
        os.chmod(path, m.mode & 0o7777)
    for k, v in (m.pax_headers or {}).items():
        if k.startswith("SCHILY.xattr."):
            try:
                os.setxattr(path, k[13:], v.encode("utf-8", "surrogateescape"), follow_symlinks=False)
            except OSError:
                pass
    if not is_dir:
        os.utime(path, (m.mtime, m.mtime), follow_symlinks=False)


# ---- OCI image layout and docker-archive -----------------------------------------------------
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
    def blob(digest: str) -> str:
        algo, _, hexd = digest.partition(":")
        if "/" in hexd or "/" in algo or not hexd:
            raise BadArchive(f"bad digest {digest!r}")
        return _verified(os.path.join(layout, "blobs", algo, hexd), digest)

    if os.path.exists(os.path.join(layout, "index.json")):
        with open(os.path.join(layout, "index.json")) as f:
            index = json.load(f)
        manifests = index.get("manifests") or []
        if not manifests:
            raise BadArchive("OCI index lists no manifests")
        desc = manifests[0]
        for _ in range(4):                          # nested indexes (multi-arch): pick amd64 or first
            with open(blob(desc["digest"])) as f:
                doc = json.load(f)
            if "manifests" not in doc:
                break
            choices = doc["manifests"]
            desc = next((m for m in choices if (m.get("platform") or {}).get("architecture") == "amd64"),
                        choices[0])
        return [blob(layer["digest"]) for layer in doc.get("layers", [])]
    if os.path.exists(os.path.join(layout, "manifest.json")):
        with open(os.path.join(layout, "manifest.json")) as f:
            manifest = json.load(f)
        if not manifest:
            raise BadArchive("docker-archive manifest is empty")
        paths = []
        for name in manifest[0]["Layers"]:
            rel = _clean_name(name)
            paths.append(os.path.join(layout, rel))
        return paths
    raise BadArchive("neither an OCI layout (index.json) nor a docker-archive (manifest.json)")


def is_image_archive(path: str) -> bool:
    """A tar whose top level looks like an OCI layout or docker-archive."""
    try:
        with tarfile.open(path, "r:*") as t:
            for m in t:
                name = _clean_name(m.name) if not m.name.startswith("/") else m.name
                if name in ("oci-layout", "index.json", "manifest.json"):
                    return True
                if "/" not in name and m.isreg() and name.endswith(".json"):
                    continue
                if name.startswith("blobs/") or "/" in name:
                    return False
    except (tarfile.TarError, PathEscape):
        return False
    return False


def apply_layers(layer_paths: list[str], root: str, chown: bool, progress=None) -> None:
    for lp in layer_paths:
        with open(lp, "rb") as raw:
            with open_tar_stream(io.BufferedReader(raw)) as tar:
                extract_tar(tar, root, oci_layer=True, chown=chown, progress=progress)


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
