"""A build's COPY/ADD: files from the build context or from another stage's image, written into an
edit's upper (edits.Upper) and committed as one new image.

Nothing from the context is trusted: each entry was checked when it was listed (recipe/context.py
or the Python builder's listing), and is opened again here beneath the context root with
openat2(RESOLVE_IN_ROOT), never following its last component, as a regular file only; its bytes
are hashed while they are copied and must match the listed sha256 (a file changed since it was
listed, which the cache key already counted, fails the step). A context symlink is copied as a
symlink. From another image, files, directories and symlinks are copied; device nodes, FIFOs and
sockets are skipped (never usable in an image a build makes). Ownership is 0:0 unless --chown (as
Docker); --chmod sets the mode of everything copied.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import stat
import tarfile

from ...errors import Conflict, InvalidInput, NotFound
from ...recipe.steps import ContextFile, Copy
from ...runtime.openat2 import open_in_root
from ...store import importers, inspect
from ...store.layers import remove_tree
from ...store.objects import DIR, FILE, SYMLINK
from ...store.store import Store
from ..images.edits import Upper

__all__ = ["placements", "copy_context", "copy_image", "dest_path"]


def placements(sources: tuple[ContextFile, ...]) -> list[tuple[ContextFile, str, bool]]:
    """(entry, path relative to the destination, is a source root) in the order a context
    listing gives: a directory root's contents go under the destination itself (the root maps to
    ""); a file or symlink root maps to its own name (placed AT the destination when the COPY's
    destination is not a directory)."""
    out = []
    root: str | None = None
    for f in sources:
        if root is not None and (root == "." or f.path.startswith(root + "/")):
            out.append((f, f.path if root == "." else f.path[len(root) + 1:], False))
            continue
        root = f.path if f.kind == "dir" else None
        out.append((f, "" if f.kind == "dir" else f.path.rpartition("/")[2], True))
    return out


def dest_path(dest: str, cwd: str | None) -> str:
    """A COPY destination made absolute against the WORKDIR (Docker's rule)."""
    if not isinstance(dest, str) or not dest or "\0" in dest:
        raise InvalidInput(f"bad COPY destination {dest!r}")
    return dest if dest.startswith("/") else posixpath.join(cwd or "/", dest)


def _target(dest: str, rel: str, is_root: bool, kind: str, dest_is_dir: bool) -> str:
    if is_root and kind != "dir" and not dest_is_dir:
        return dest
    return posixpath.join(dest, rel) if rel else dest


def _copy_verified(fd: int, out, expected: str | None, path: str) -> None:
    h = hashlib.sha256()
    with os.fdopen(fd, "rb", buffering=0, closefd=False) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if expected is not None and h.hexdigest() != expected:
        raise Conflict(f"{path} changed in the build context since it was listed; nothing was committed",
                       path=path)


def copy_context(up: Upper, context: str, step: Copy, dest: str, uid: int, gid: int) -> None:
    """Write a context COPY's entries into `up` (dest: absolute)."""
    if context is None:
        raise InvalidInput(f"line {step.line}: {step.text}: this build has no context to copy from", line=step.line)
    root_fd = os.open(context, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for f, rel, is_root in placements(step.sources):
            target = _target(dest, rel, is_root, f.kind, step.dest_is_dir)
            if step.unpack and is_root and f.kind == "file":
                target = dest                  # ADD's tar: its members land under DEST, not DEST/NAME
            mode = step.chmod if step.chmod is not None else f.mode
            if f.kind == "dir":
                if rel:
                    up.dir(target, mode=mode, uid=uid, gid=gid, meta=True)
                else:
                    up.dir(target, uid=uid, gid=gid)
            elif f.kind == "symlink":
                if f.target is None:
                    raise InvalidInput(f"line {step.line}: symlink {f.path} has no target", line=step.line)
                up.symlink(target, f.target, uid=uid, gid=gid)
            elif f.kind == "file":
                _context_file(up, root_fd, f, target, mode, uid, gid, step)
            else:
                raise InvalidInput(f"line {step.line}: {f.path} is a {f.kind}: only files, directories and "
                                   f"symlinks are copied", line=step.line, path=f.path)
    finally:
        os.close(root_fd)


def _open_regular(root_fd: int, path: str, line: int) -> int:
    try:
        fd = open_in_root(root_fd, path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (OSError, NotFound, InvalidInput) as exc:
        raise InvalidInput(f"line {line}: cannot read {path} from the build context ({exc})", line=line,
                           path=path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InvalidInput(f"line {line}: {path} in the build context is not a regular file", line=line, path=path)
    return fd


def _context_file(up: Upper, root_fd: int, f: ContextFile, target: str, mode: int, uid: int, gid: int,
                  step: Copy) -> None:
    fd = _open_regular(root_fd, f.path, step.line)
    try:
        if step.unpack:
            _unpack(up, fd, f, target, uid, gid, step)
            return
        up.file(target, lambda out: _copy_verified(fd, out, f.sha256, f.path), mode=mode, uid=uid, gid=gid)
    finally:
        os.close(fd)


def _unpack(up: Upper, fd: int, f: ContextFile, dest: str, uid: int, gid: int, step: Copy) -> None:
    """ADD of a local tar: its members under dest (the archive's bytes verified first; members
    extracted by the importer's bounded, path-checked extractor into a scratch dir, then copied
    with the step's ownership)."""
    scratch = up.store.layers.stage("unpack")
    try:
        archive = os.path.join(scratch, "archive")          # (on disk, not in memory: it may be large)
        with open(archive, "xb") as out:
            _copy_verified(fd, out, f.sha256, f.path)
        tree = os.path.join(scratch, "tree")
        os.mkdir(tree)
        budget = importers.ImportBudget()
        budget.source(os.path.getsize(archive))
        try:
            with open(archive, "rb") as raw, importers.open_tar_stream(io.BufferedReader(raw), budget) as t:
                importers.extract_tar(t, tree, chown=False, budget=budget)
        except tarfile.TarError as exc:
            raise InvalidInput(f"line {step.line}: {f.path} is not a tar archive ({exc})", line=step.line) from None
        up.dir(dest, uid=uid, gid=gid)
        _copy_host_tree(up, tree, dest, uid, gid, step.chmod)
    finally:
        remove_tree(scratch)


def _copy_host_tree(up: Upper, src: str, dest: str, uid: int, gid: int, chmod: int | None) -> None:
    stack = [(src, dest)]
    while stack:
        host, target = stack.pop()
        for name in sorted(os.listdir(host)):
            p, t = os.path.join(host, name), posixpath.join(target, name)
            st = os.lstat(p)
            mode = chmod if chmod is not None else stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                up.dir(t, mode=mode, uid=uid, gid=gid, meta=True)
                stack.append((p, t))
            elif stat.S_ISLNK(st.st_mode):
                up.symlink(t, os.readlink(p), uid=uid, gid=gid)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as inp:
                    up.file(t, lambda out, inp=inp: _copy_stream(inp, out), mode=mode, uid=uid, gid=gid)


def _copy_stream(inp, out) -> None:
    while chunk := inp.read(1 << 20):
        out.write(chunk)


def copy_image(up: Upper, store: Store, source: str, step: Copy, dest: str, uid: int, gid: int) -> None:
    """COPY --from: `step.paths` of image `source` into `up` (dest: absolute). A directory's
    contents go under dest; a file goes to dest (dest/NAME when dest is a directory)."""
    if not step.paths:
        raise InvalidInput(f"line {step.line}: {step.text}: no source paths", line=step.line)
    for path in step.paths:
        try:
            norm, e = inspect.resolve(store, source, path)
        except NotFound:
            raise InvalidInput(f"line {step.line}: {path} does not exist in stage {step.from_stage!r}",
                               line=step.line, path=path) from None
        mode = step.chmod if step.chmod is not None else e.mode
        if e.kind == DIR:
            up.dir(dest, uid=uid, gid=gid)
            for p, sub in inspect.walk(store, e.ref, ""):
                _image_entry(up, store, sub, posixpath.join(dest, p.lstrip("/")), step.chmod, uid, gid)
        else:
            name = norm.rpartition("/")[2]
            target = posixpath.join(dest, name) if step.dest_is_dir or len(step.paths) > 1 else dest
            _image_entry(up, store, e, target, step.chmod, uid, gid, mode)


def _image_entry(up: Upper, store: Store, e, target: str, chmod: int | None, uid: int, gid: int,
                 mode: int | None = None) -> None:
    mode = mode if mode is not None else (chmod if chmod is not None else e.mode)
    if e.kind == DIR:
        up.dir(target, mode=mode, uid=uid, gid=gid, meta=True)
    elif e.kind == SYMLINK:
        up.symlink(target, e.ref, uid=uid, gid=gid)
    elif e.kind == FILE:
        def write(out, ref=e.ref):
            with store.blobs.open(ref) as inp:
                _copy_stream(inp, out)
        up.file(target, write, mode=mode, uid=uid, gid=gid)
    # device nodes, FIFOs, sockets: skipped (see the module's docstring)
