"""Who an envd call acts as, and where its relative paths start: E2B names a user per call (the
`Authorization: Basic <user:>` header of Connect calls, the `username` query of /files); its files
are made as that user and a relative path resolves against that user's home (/root for root,
/home/user for `user`, as the sandbox's own /etc/passwd says). No user named: `user` when the
sandbox has one (E2B's templates run as it), else root."""

from __future__ import annotations

import base64
import binascii
import posixpath
from dataclasses import dataclass

from ....accounts import accounts
from ....errors import InvalidInput, NotRegularFile, PathEscape, PathNotFound

DEFAULT_USERS = ("user", "root")
PASSWD_LIMIT = 1 << 20


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str

    def path(self, path: str) -> str:
        """An absolute path of the sandbox: `path` as E2B takes it (relative: against the home, `~`:
        the home); a `..` in it is refused (nothing of E2B's needs one, and it is how a path leaves
        where it was meant to stay)."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise InvalidInput("a path is needed")
        if path == "~" or path.startswith("~/"):
            path = self.home + path[1:]
        if ".." in path.split("/"):
            raise PathEscape(f"a path with '..' is refused: {path}", path=path)
        if not path.startswith("/"):
            path = posixpath.join(self.home, path)
        return posixpath.normpath(path).replace("//", "/")


def basic_user(authorization: str | None) -> str | None:
    """The user of an `Authorization: Basic base64(user:)` header (E2B's way), else None."""
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        raw = base64.b64decode(authorization.split(None, 1)[1], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, IndexError):
        raise InvalidInput("the Authorization header's user is not base64 of 'user:'") from None
    return raw.split(":", 1)[0] or None


def resolve(engine, sid: str, name: str | None) -> User:
    """The sandbox's account `name` (None: its default, see the module doc); InvalidInput when it
    has no such user. Blocking (reads the sandbox's /etc/passwd): call it in a thread."""
    try:
        text = engine.sandbox_read(sid, "/etc/passwd").decode("utf-8", "replace")
    except (PathNotFound, NotRegularFile):
        text = ""                                         # no /etc/passwd: root alone
    known = accounts(text)
    if name is None:
        name = next(n for n in DEFAULT_USERS if n in known)
    if name not in known:
        raise InvalidInput(f"error looking up user '{name}': the sandbox has no such user", user=name)
    a = known[name]
    return User(a.name, a.uid, a.gid, a.home)
