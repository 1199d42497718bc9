"""The `sandtree` command: an adapter over the engine (human output by default, --json everywhere).
The verbs of one operation each are made from the operation table's rows (derive.py); the others live by
group in images.py, runs.py, sandboxes.py, inspection.py, branching.py and admin.py; parser.py assembles the
whole parser, lazy.py the part a command line needs; here errors become exit statuses.

Exit status (the one table: exits.py): `run` and `exec` exit with the command's status (128+N for a signal,
124 on timeout, 125 for a sandtree error); other commands exit 0, or 1 with `error: ...` (or a JSON error object).
"""

from __future__ import annotations

import errno
import json
import sys

from . import exits
from .. import config
from ..errors import DiskFull, SandtreeError
from .lazy import parser_for
from .parser import build_parser  # noqa: F401 - the whole parser, named here too (the tests', scripts')


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    tail = None
    if "--" in argv:                       # everything after -- is the command, options included
        i = argv.index("--")
        argv, tail = argv[:i], argv[i + 1:]
    parser = parser_for(argv)              # only the verb given is built (start-up time), the others named
    args = parser.parse_args(argv)
    args.json = getattr(args, "json", False)
    args.home = getattr(args, "home", None)
    config.use_database(getattr(args, "database", None))
    config.use_objects(getattr(args, "objects", None))
    config.use_cluster(getattr(args, "cluster", None))
    if tail is not None:
        if not getattr(args, "takes_command", False):
            parser.error("'--' is only for `sandtree run IMAGE -- CMD ...`, `exec` and `shell`")
        args.cmd = list(args.cmd) + tail
    try:
        try:
            rc = args.fn(args)
        except OSError as exc:               # a full disk outside the engine (this command's own files)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise DiskFull(f"disk full: {exc.strerror}") from None
        return rc or exits.OK
    except SandtreeError as exc:
        if args.json:
            print(json.dumps(exc.to_dict(), default=str))
        else:
            print(f"error: {exc.message}", file=sys.stderr)
        # run and exec keep 0-124 and 128+ for the command's own status
        return getattr(args, "error_status", exits.ERROR)
    except BrokenPipeError:
        return exits.OK
    except KeyboardInterrupt:
        return exits.INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
