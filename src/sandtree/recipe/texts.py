"""The canonical text of each step: the instruction in Dockerfile syntax after ARG/ENV expansion.

It labels the lineage edge the step makes and is part of its cache key, so the Python builder
(builder.py) and the Dockerfile parser (dockerfile.py) must write the same thing for the same step:
the forms are listed in docs/design.md ("Builds"). Values only, no I/O.
"""

from __future__ import annotations

import json
import re

__all__ = ["quote_word", "pairs_text", "argv_text", "run_text", "copy_text", "APT_INSTALL", "PIP_INSTALL",
           "config_text", "expose_ports", "MAX_PORT_RANGE", "dest_is_dir"]

_PLAIN = re.compile(r"^[A-Za-z0-9_./:@%+,=-]+$")

# The fixed commands of the builder's apt_install/pip_install (RUN steps; a Dockerfile writing the
# same RUN line gives the same step).
APT_INSTALL = ("apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
               "{pkgs} && rm -rf /var/lib/apt/lists/*")
PIP_INSTALL = "python3 -m pip install --no-cache-dir {pkgs}"


def quote_word(v: str) -> str:
    r"""A value as ENV/LABEL write it: bare when it is plain, else in double quotes with \, " and $
    backslash-escaped (what the Dockerfile parser reads back to the same value: an unescaped $
    would expand)."""
    if v and _PLAIN.match(v):
        return v
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


_PORT = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?(?:/(tcp|udp|sctp))?$", re.I)
MAX_PORT_RANGE = 1024


def expose_ports(ports) -> tuple[str, ...]:
    """EXPOSE's words normalised as the Dockerfile parser does: `N/proto` each (tcp by default),
    a range `A-B[/proto]` expanded, in order."""
    out = []
    for p in ports:
        m = _PORT.match(str(p))
        lo = int(m.group(1)) if m else 0
        hi = int(m.group(2) or lo) if m else 0
        if not m or not 1 <= lo <= hi <= 65535:
            raise ValueError(f"{p!r} is not a port (1-65535), a range, with /tcp, /udp or /sctp")
        if hi - lo >= MAX_PORT_RANGE:
            raise ValueError(f"{p!r}: at most {MAX_PORT_RANGE} ports in a range")
        proto = (m.group(3) or "tcp").lower()
        out += [f"{n}/{proto}" for n in range(lo, hi + 1)]
    return tuple(out)


def pairs_text(instruction: str, pairs) -> str:
    """`ENV A=1 B="x y"` / `LABEL ...`: NAME=VALUE pairs in the order given."""
    return instruction + " " + " ".join(f"{k}={quote_word(v)}" for k, v in pairs)


def argv_text(instruction: str, argv) -> str:
    """The exec (JSON) form: `CMD ["python3", "-m", "app"]` (json.dumps: ", " between items)."""
    return f"{instruction} {json.dumps(list(argv), ensure_ascii=False)}"


def run_text(command) -> str:
    """`RUN cmd` (shell form, the command as written) or `RUN ["a", "b"]` (exec form). A step's
    network policy is not in its text (it is in its cache key)."""
    return argv_text("RUN", command) if isinstance(command, (list, tuple)) else f"RUN {command}"


def copy_text(sources, dest: str, *, from_stage: str | None = None, chown: str | None = None,
              chmod: int | None = None, add: bool = False) -> str:
    """`COPY [--from=S] [--chown=U] [--chmod=0644] SRC... DEST` (flags in this order; --chmod as
    four octal digits; sources and dest as written)."""
    flags = []
    if from_stage is not None:
        flags.append(f"--from={from_stage}")
    if chown is not None:
        flags.append(f"--chown={chown}")
    if chmod is not None:
        flags.append(f"--chmod={chmod:04o}")
    return " ".join(["ADD" if add else "COPY", *flags, *sources, dest])


def dest_is_dir(dest: str, nsources: int = 1) -> bool:
    """Docker's rule: a COPY destination is a directory when it ends in `/`, is `.` or `..` or ends
    in `/.`, or there are several sources."""
    return dest.endswith("/") or dest in (".", "..") or dest.endswith("/.") or nsources > 1


def config_text(field: str, value) -> str:
    """The instruction that sets one config field (a Configure step's text)."""
    if field == "env":
        return pairs_text("ENV", value)
    if field == "labels":
        return pairs_text("LABEL", value)
    if field == "cwd":
        return f"WORKDIR {value}"
    if field == "user":
        return f"USER {value}"
    if field in ("entrypoint", "cmd"):
        return argv_text(field.upper(), value)
    if field == "expose":
        return "EXPOSE " + " ".join(str(p) for p in value)
    raise ValueError(f"no instruction sets {field!r}")
