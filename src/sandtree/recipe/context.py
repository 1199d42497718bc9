"""The build context: the host directory a Dockerfile's COPY/ADD read from, and the one place that
decides which of its entries a COPY may take.

Nothing in a context is trusted (it may be a checkout of anyone's repository):
- every source path is made relative to the context and cleaned lexically; one that climbs out of
  it (`COPY ../outside .`) is refused (PathEscape);
- the walk goes through directory file descriptors opened O_NOFOLLOW: a symlink is listed as a
  symlink (its target kept as written) and never followed on the host, neither in the middle of a
  source path nor inside a copied directory;
- a symlink named as a source itself (a COPY *source root*) whose target leaves the context (an
  absolute target, or `..` above the root) is refused: in Docker it would bring in the host's file;
- device nodes, FIFOs and sockets are refused when selected; names, path lengths, depth, the
  number of entries and their bytes are bounded; a file's sha256 is computed while it is read.

Selection follows Docker's COPY rules: a source is a path or a glob (Go's filepath.Match: `*`, `?`,
`[...]`, `\\` escapes) matched one path component at a time; a matched directory contributes its
contents, recursively. `.dockerignore` follows moby's patternmatcher: `#` comments, `!` exceptions,
`**` for any number of components, the last matching pattern wins, a pattern that matches a parent
directory matches everything under it. Ignored entries do not exist for COPY.

The result of `select` is the order the engine relies on (see `placements`): each source root in the
order given (a directory root first, then its descendants sorted by path; "." is the context
itself), roots never overlapping.
"""

from __future__ import annotations

import bz2
import errno
import hashlib
import lzma
import os
import stat
import zlib

from ..errors import InvalidInput, NotRegularFile, PathEscape, TooLarge
from ..store.names import PATH_BYTES_MAX, entry_name_problem
from .patterns import META, IgnoreRules, glob_regex, unescape, where
from .steps import ContextFile

__all__ = ["BuildContext", "read_text", "placements", "source_roots", "MAX_ENTRIES", "MAX_BYTES", "MAX_DEPTH", "MAX_IGNORE_BYTES"]

MAX_ENTRIES = 200_000          # entries one COPY may select
MAX_BYTES = 16 << 30           # bytes of files one COPY may select
MAX_DEPTH = 128                # directory levels below the context root
MAX_IGNORE_BYTES = 1 << 20     # a .dockerignore larger than this is refused
_CHUNK = 1 << 20


def _clean(path: str, line: int, what: str = "COPY source") -> str:
    """`path` relative to the context root, lexically cleaned ('.' for the root itself).
    A leading '/' means the context root, as in Docker."""
    if "\0" in path:
        raise InvalidInput(f"{where(line)}{what} {path!r} contains NUL", line=line)
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise PathEscape(f"{where(line)}{what} {path!r} is outside the build context", line=line, path=path)
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts) or "."


# ---- the context -----------------------------------------------------------------------------------

class _Budget:
    def __init__(self, line: int):
        self.entries = 0
        self.bytes = 0
        self.line = line

    def take(self, size: int) -> None:
        self.entries += 1
        self.bytes += size
        if self.entries > MAX_ENTRIES:
            raise TooLarge(f"{where(self.line)}COPY selects over {MAX_ENTRIES} entries", line=self.line,
                           limit="context_entries", max=MAX_ENTRIES)
        if self.bytes > MAX_BYTES:
            raise TooLarge(f"{where(self.line)}COPY selects over {MAX_BYTES} bytes", line=self.line,
                           limit="context_bytes", max=MAX_BYTES)


def read_text(fd: int, name: str, max_bytes: int, where: str = "") -> str:
    """An open file's text (the fd is closed): a regular file of at most max_bytes, UTF-8;
    NotRegularFile, TooLarge or InvalidInput naming it otherwise."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{name!r}{where} is not a regular file", path=name)
        data = os.read(fd, max_bytes + 1)
        while len(data) <= max_bytes and (more := os.read(fd, max_bytes + 1 - len(data))):
            data += more
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TooLarge(f"{name!r} is over {max_bytes} bytes", path=name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{name!r} is not UTF-8 (byte {e.start})", path=name) from None


class BuildContext:
    """A directory on the host as a build context. `ignore_file` (relative to root) holds the
    .dockerignore patterns; None: none. The root itself is the caller's choice (opened, following a
    symlink there); below it nothing is followed."""

    def __init__(self, root: str, ignore_file: str | None = ".dockerignore"):
        self.root = os.path.abspath(root)
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InvalidInput(f"build context {root!r} does not exist") from None
        except NotADirectoryError:
            raise InvalidInput(f"build context {root!r} is not a directory") from None
        except OSError as e:
            raise InvalidInput(f"build context {root!r}: {e.strerror}") from None
        try:
            text = self._read_ignore(fd, ignore_file) if ignore_file else ""
        finally:
            os.close(fd)
        self.ignore = IgnoreRules(text)

    @staticmethod
    def _read_ignore(root_fd: int, name: str) -> str:
        rel = _clean(name, 0, "ignore file")
        try:
            fd = _open_beneath(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return ""
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotRegularFile(f"{name} in the build context is not a regular file")
            data = os.read(fd, MAX_IGNORE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_IGNORE_BYTES:
            raise TooLarge(f"{name} is over {MAX_IGNORE_BYTES} bytes")
        return data.decode("utf-8", "replace")

    def read_file(self, name: str, max_bytes: int) -> str:
        """The text of the context's file `name` (a Dockerfile inside it): cleaned, opened beneath the
        root following no symlink, a regular file of at most max_bytes, UTF-8."""
        rel = _clean(name, 0, "Dockerfile path")
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = _open_beneath(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        except FileNotFoundError:
            raise InvalidInput(f"no Dockerfile {name!r} in the build context", path=name) from None
        finally:
            os.close(root_fd)
        return read_text(fd, name, max_bytes, " in the build context")

    def is_archive(self, rel: str) -> bool:
        """Is the context file `rel` (as `select` returned it) a tar, plain or gzip/bzip2/xz
        compressed? Docker decides ADD's unpacking by content, not by name: so does this."""
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fd = _open_beneath(root_fd, rel, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            finally:
                os.close(root_fd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return False
                head = os.read(fd, 1 << 16)
            finally:
                os.close(fd)
        except OSError as e:
            raise InvalidInput(f"cannot read {rel!r} in the build context: {e.strerror}", path=rel) from None
        return _tar_header(head)

    # ---- selection ---------------------------------------------------------------------------------
    def select(self, sources: list[str], *, line: int = 0) -> tuple[ContextFile, ...]:
        """The entries COPY SOURCES... takes, in the order described in the module doc."""
        if not sources:
            raise InvalidInput(f"{where(line)}COPY needs at least one source", line=line)
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            budget = _Budget(line)
            roots: list[str] = []
            out: list[ContextFile] = []
            for src in sources:
                for rel in self._matches(root_fd, src, line):
                    if rel in roots:
                        continue
                    for other in roots:
                        if _overlaps(rel, other):
                            raise InvalidInput(f"{where(line)}COPY sources {other!r} and {rel!r} overlap "
                                               "(one is inside the other): copy them in separate COPY lines",
                                               line=line)
                    roots.append(rel)
                    out += self._root_entries(root_fd, rel, src, budget)
            return tuple(out)
        except OSError as e:       # unreadable, or changed under the walk (a dir swapped for a link)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise InvalidInput(f"{where(line)}cannot read the build context: {e.strerror}"
                               + (f" ({e.filename})" if e.filename else ""),
                               line=line) from None
        finally:
            os.close(root_fd)

    def _matches(self, root_fd: int, src: str, line: int) -> list[str]:
        """The context paths `src` names (a glob may name several), cleaned; refused when none."""
        rel = _clean(src, line)
        if not META.search(rel):
            if rel != "." and self.ignore.ignored(rel):
                raise InvalidInput(f"{where(line)}COPY source {src!r} is excluded by .dockerignore",
                                   line=line, path=src)
            self._check_names(rel, line)
            try:
                os.close(_open_beneath(root_fd, rel, os.O_PATH))
            except FileNotFoundError:
                raise InvalidInput(f"{where(line)}COPY source {src!r} not found in the build context",
                                   line=line, path=src) from None
            return [rel]
        found = [p for p in self._glob(root_fd, rel.split("/"), src, line) if not self.ignore.ignored(p)]
        if not found:
            raise InvalidInput(f"{where(line)}COPY source {src!r} matches nothing in the build context",
                               line=line, path=src)
        return sorted(found)

    def _check_names(self, rel: str, line: int) -> None:
        if len(rel.encode("utf-8", "surrogateescape")) > PATH_BYTES_MAX:
            raise InvalidInput(f"{where(line)}COPY source path is longer than {PATH_BYTES_MAX} bytes", line=line)
        for part in rel.split("/"):
            problem = entry_name_problem(part) if rel != "." else None
            if problem:
                raise InvalidInput(f"{where(line)}COPY source has {problem}", line=line)

    def _glob(self, root_fd: int, segments: list[str], src: str, line: int) -> list[str]:
        """Paths matching the glob, one component at a time; a non-final component is entered only
        when it is a real directory (never through a symlink)."""
        prefixes = [""]
        for depth, seg in enumerate(segments):
            last = depth == len(segments) - 1
            nxt = []
            for prefix in prefixes:
                if not META.search(seg):
                    names = [unescape(seg)]
                    try:
                        names = [n for n in names if _lstat_beneath(root_fd, prefix + n) is not None]
                    except InvalidInput:
                        names = []
                else:
                    rx = glob_regex(seg, src, line)
                    names = [n for n in _list(root_fd, prefix.rstrip("/") or ".") if rx.match(n)]
                for name in names:
                    path = prefix + name
                    if last:
                        nxt.append(path)
                        continue
                    st = _lstat_beneath(root_fd, path)
                    if st is not None and stat.S_ISDIR(st.st_mode):
                        nxt.append(path + "/")
            prefixes = nxt
            if len(prefixes) > MAX_ENTRIES:
                raise TooLarge(f"{where(line)}COPY source {src!r} matches over {MAX_ENTRIES} paths", line=line)
        return prefixes

    def _root_entries(self, root_fd: int, rel: str, src: str, budget: _Budget) -> list[ContextFile]:
        line = budget.line
        if rel == ".":
            st = os.fstat(root_fd)
            budget.take(0)
            return [ContextFile(".", "dir", stat.S_IMODE(st.st_mode))] + self._walk(root_fd, "", 1, budget)
        parent, _, name = rel.rpartition("/")
        dfd = _open_beneath(root_fd, parent or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            entry = self._entry(dfd, name, rel, budget)
            if entry.kind == "symlink" and _escapes(rel, entry.target):
                raise PathEscape(f"{where(line)}COPY source {src!r} is a symlink to {entry.target!r}, "
                                 "outside the build context", line=line, path=src)
            if entry.kind != "dir":
                return [entry]
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        finally:
            os.close(dfd)
        try:
            return [entry] + self._walk(sub, rel + "/", rel.count("/") + 2, budget)
        finally:
            os.close(sub)

    def _walk(self, dfd: int, prefix: str, depth: int, budget: _Budget) -> list[ContextFile]:
        """A directory's descendants (not ignored), sorted by path, symlinks not followed."""
        if depth > MAX_DEPTH:
            raise TooLarge(f"{where(budget.line)}the build context is deeper than {MAX_DEPTH} levels at "
                           f"{prefix!r}", line=budget.line, limit="context_depth", max=MAX_DEPTH)
        out: list[ContextFile] = []
        for name in sorted(os.listdir(dfd)):
            path = prefix + name
            problem = entry_name_problem(name)
            if problem:
                raise InvalidInput(f"{where(budget.line)}the build context has {problem}", line=budget.line)
            ignored = self.ignore.ignored(path)
            if ignored and not self.ignore.has_exceptions:
                continue
            st = os.lstat(name, dir_fd=dfd)
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
                except OSError as e:
                    raise OSError(e.errno, e.strerror, path) from None     # named in the context
                try:
                    below = self._walk(sub, path + "/", depth + 1, budget)
                finally:
                    os.close(sub)
                if not ignored or below:      # an ignored directory holding an exception is kept
                    budget.take(0)
                    out.append(ContextFile(path, "dir", stat.S_IMODE(st.st_mode)))
                    out += below
            elif not ignored:
                out.append(self._entry(dfd, name, path, budget))
        return out

    def _entry(self, dfd: int, name: str, path: str, budget: _Budget) -> ContextFile:
        line = budget.line
        if len(path.encode("utf-8", "surrogateescape")) > PATH_BYTES_MAX:
            raise InvalidInput(f"{where(line)}context path {path[:60]!r}... is longer than {PATH_BYTES_MAX} bytes",
                               line=line)
        st = os.lstat(name, dir_fd=dfd)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            budget.take(0)
            return ContextFile(path, "dir", mode)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dfd)
            budget.take(len(target))
            return ContextFile(path, "symlink", 0o777, len(target), target=target)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{where(line)}{path!r} in the build context is not a regular file, "
                                 "directory or symlink (device nodes, FIFOs and sockets are never copied)",
                                 line=line, path=path)
        budget.take(st.st_size)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            raise OSError(e.errno, e.strerror, path) from None
        try:
            fst = os.fstat(fd)
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
                raise InvalidInput(f"{where(line)}{path!r} changed while the context was read", line=line)
            h, size = hashlib.sha256(), 0
            while chunk := os.read(fd, _CHUNK):
                h.update(chunk)
                size += len(chunk)
                if size > st.st_size:
                    break
        finally:
            os.close(fd)
        if size != st.st_size:
            raise InvalidInput(f"{where(line)}{path!r} changed while the context was read", line=line)
        return ContextFile(path, "file", mode, size, h.hexdigest())


def _tar_header(head: bytes) -> bool:
    """The first bytes of a file: a tar (ustar magic), possibly compressed."""
    try:
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1024)
        elif head[:3] == b"BZh":
            head = bz2.BZ2Decompressor().decompress(head, max_length=1024)
        elif head[:6] == b"\xfd7zXZ\x00":
            head = lzma.LZMADecompressor().decompress(head, max_length=1024)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError):
        return False
    return head[257:262] == b"ustar"


def source_roots(sources: tuple[ContextFile, ...]) -> list[ContextFile]:
    """The entries of a context COPY that its SOURCE arguments named (the rest lie below them)."""
    out, root = [], None
    for f in sources:
        if root is not None and (root == "." or f.path.startswith(root + "/")):
            continue
        out.append(f)
        root = f.path if f.kind == "dir" else None
    return out


def _overlaps(a: str, b: str) -> bool:
    return a == "." or b == "." or a.startswith(b + "/") or b.startswith(a + "/")


def _escapes(link_path: str, target: str) -> bool:
    """Does a symlink at `link_path` (relative to the context) with this target leave the context?"""
    if target.startswith("/"):
        return True
    depth = link_path.count("/")            # components of the link's directory
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                return True
        elif part not in ("", "."):
            depth += 1
    return False


def _open_beneath(root_fd: int, rel: str, flags: int) -> int:
    """Open `rel` (cleaned, relative) below root_fd, one component at a time, following no symlink
    (the last component too: O_NOFOLLOW, or O_PATH|O_NOFOLLOW gives the link itself)."""
    parts = [] if rel == "." else rel.split("/")
    fd = os.dup(root_fd)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nfd = os.open(part, (flags if last else os.O_PATH | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_CLOEXEC,
                              dir_fd=fd)
            except NotADirectoryError:
                st = os.lstat(part, dir_fd=fd)
                if stat.S_ISLNK(st.st_mode):
                    raise InvalidInput(f"{'/'.join(parts[:i + 1])!r} in the build context is a symlink: "
                                       "a COPY source path is never followed through a symlink") from None
                raise FileNotFoundError(rel) from None
            except OSError as e:
                if e.errno == errno.ELOOP:   # the last component is a symlink and flags lacked O_PATH
                    raise InvalidInput(f"{rel!r} in the build context is a symlink") from None
                raise
            os.close(fd)
            fd = nfd
        if not parts and flags != os.O_PATH:
            nfd = os.open(".", flags | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _lstat_beneath(root_fd: int, rel: str):
    parent, _, name = rel.rpartition("/")
    try:
        dfd = _open_beneath(root_fd, parent or ".", os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    try:
        return os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        return None
    finally:
        os.close(dfd)


def _list(root_fd: int, rel: str) -> list[str]:
    try:
        dfd = _open_beneath(root_fd, rel, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, InvalidInput):
        return []
    try:
        return sorted(os.listdir(dfd))
    finally:
        os.close(dfd)


def placements(sources: tuple[ContextFile, ...]) -> list[tuple[ContextFile, str]]:
    """Where each entry of a context COPY lands, relative to its destination, from the order
    `select` guarantees: a directory root's contents go under the destination itself (the root
    maps to ""), a file or symlink root maps to its own name (the engine puts it AT the destination
    instead when Copy.dest_is_dir is false: `COPY a.txt /b.txt`)."""
    out: list[tuple[ContextFile, str]] = []
    root: str | None = None
    for f in sources:
        if root is not None and (root == "." or f.path.startswith(root + "/")):
            out.append((f, f.path if root == "." else f.path[len(root) + 1:]))
            continue
        root = f.path if f.kind == "dir" else None
        out.append((f, "" if f.kind == "dir" else f.path.rpartition("/")[2]))
    return out
