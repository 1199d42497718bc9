"""The accounts of a sandbox's /etc/passwd: who a command or a file call acts as when a caller names
a user (E2B's envd, Harbor's and inspect-ai's exec --user). One parser for every adapter, so that a
name, a uid and a bare number mean the same everywhere; what the adapters do with a name that is not
there (refuse it, or run a bare number with its own gid) is theirs."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SandtreeError

__all__ = ["Account", "accounts", "find", "ids"]


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str


def accounts(passwd: str) -> dict[str, Account]:
    """The entries of a passwd file's text by name (the first of a name wins, as getpwnam's); root
    always, as /root, even when the file is missing or does not say so (a sandbox's image may have
    no /etc/passwd at all)."""
    found: dict[str, Account] = {}
    for line in passwd.splitlines():
        f = line.split(":")
        if len(f) >= 4 and f[2].isdigit() and f[3].isdigit():
            found.setdefault(f[0], Account(f[0], int(f[2]), int(f[3]), (f[5] if len(f) >= 6 else "") or "/"))
    found.setdefault("root", Account("root", 0, 0, "/root"))
    return found


def find(passwd: str, user: str) -> Account | None:
    """`user` as docker exec --user takes it: a name, or a uid that an entry has (the first such);
    a bare number no entry has is that uid with the same gid. None: no such user."""
    known = accounts(passwd)
    if user in known:
        return known[user]
    by_uid = next((a for a in known.values() if str(a.uid) == user), None)
    if by_uid is not None:
        return by_uid
    return Account(user, int(user), int(user), "/") if user.isdigit() else None


def ids(read, user: str) -> tuple[int, int] | None:
    """(uid, gid) of `user` (find's rules) in a sandbox whose files `read(path) -> bytes` reads
    (blocking); a sandbox without a readable /etc/passwd has root and bare numbers only."""
    try:
        passwd = read("/etc/passwd").decode("utf-8", "replace")
    except SandtreeError:
        passwd = ""
    account = find(passwd, user)
    return None if account is None else (account.uid, account.gid)
