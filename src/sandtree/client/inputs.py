"""The shapes Python users give run arguments in (E2B and Modal habits), made the engine's:
files= as a {path: bytes | str | Path} dict, per-stream output callbacks."""

from __future__ import annotations

import os

from ..errors import InvalidInput
from ..hostfiles import local_entries

__all__ = ["files_arg", "streams"]


def files_arg(files):
    """`files=` as E2B and Modal users write it, as the engine's list of {path, content, mode}:
    {"/dest": bytes | str} for one file, {"/dest": Path} for a local file (its mode kept) or a
    whole local directory (its tree under /dest). A list of dicts passes as it is."""
    if files is None or isinstance(files, (list, tuple)):
        return files
    if not isinstance(files, dict):
        raise InvalidInput("files is a list of {path, content | sha256, mode} or a {path: bytes | str | Path} dict")
    out = []
    for dest, value in files.items():
        if not isinstance(dest, str) or not dest.startswith("/"):
            raise InvalidInput(f"a file's path inside the sandbox must be absolute, not {dest!r}")
        if isinstance(value, (bytes, bytearray, str)):
            if dest.endswith("/"):
                raise InvalidInput(f"{dest!r} names a directory: give a file's path, or a local directory as a Path")
            out.append({"path": dest, "content": bytes(value) if not isinstance(value, str) else value})
        elif isinstance(value, os.PathLike):
            out += local_entries(os.fspath(value), dest)
        else:
            raise InvalidInput(f"files[{dest!r}] must be bytes, str or a path, not {type(value).__name__}")
    return out


def streams(on_output, on_stdout, on_stderr):
    """One on_output(stream, bytes) callback from E2B/Modal-style per-stream ones (None: none)."""
    if on_stdout is None and on_stderr is None:
        return on_output
    per = {"stdout": on_stdout, "stderr": on_stderr}

    def fan_out(stream: str, chunk: bytes) -> None:
        if on_output is not None:
            on_output(stream, chunk)
        if per.get(stream) is not None:
            per[stream](chunk)
    return fan_out
