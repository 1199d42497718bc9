"""The shell session of a live sandbox, and the RunSpec of one command in it.

A string command runs in `/bin/sh` through SESSION, which restores the exported environment and
working directory the previous string command left (a file in the sandbox's /dev/shm, a tmpfs
outside the committed filesystem) and saves them when it exits. A list runs as a fresh process
with exactly the given environment. The sandboxes themselves are sandboxes.py.
"""

from __future__ import annotations

import re

from ..errors import InvalidInput
from ..runtime.base import Limits, RunSpec
from ..secrets_mask import mask_text, secret_values

# $1: the session file, $2: the command, then NAME=VALUE pairs for this command only (their
# session values come back after it). Each step says why in the comment at the top of the file.
SESSION = r'''
unset __ST_SESSION
__st_s=$1; __st_c=$2; shift 2
if [ -r "$__st_s" ]; then . "$__st_s"; fi
__st_new=; __st_had=
for __st_kv in "$@"; do
  __st_n=${__st_kv%%=*}
  if eval "[ \"\${$__st_n+set}\" = set ]"; then
    eval "__st_old_$__st_n=\$$__st_n"; __st_had="$__st_had $__st_n"
  else __st_new="$__st_new $__st_n"; fi
  export "$__st_kv"
done
[ -n "$PWD" ] && cd "$PWD" 2>/dev/null
unset __st_kv __st_n
__st_save() {
  ( for __st_n in $__st_new; do unset "$__st_n"; done
    for __st_n in $__st_had; do eval "export $__st_n=\"\$__st_old_$__st_n\""; done
    export PWD; export -p ) > "$__st_s.$$" 2>/dev/null && mv -f "$__st_s.$$" "$__st_s"
}
trap '__st_rc=$?; __st_save; exit $__st_rc' EXIT
eval "$__st_c"
'''
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

def command_spec(base: dict, command, *, env, cwd, stdin, uid, gid, limits: dict,
                 given: Limits) -> tuple[RunSpec, str]:
    """The RunSpec of one command in a live sandbox whose start spec is `base`, and the command
    as recorded (secrets masked). given: `limits` parsed; only the limits named there replace
    the sandbox's own."""
    lim = Limits(**{**base["limits"], **{k: v for k, v in given.__dict__.items()
                                         if k in limits and limits[k] is not None}})
    user_env = {str(k): str(v) for k, v in (env or {}).items()}
    if isinstance(command, str):
        if not command.strip():
            raise InvalidInput("empty command")
        for k in user_env:
            if not NAME.match(k):
                raise InvalidInput(f"bad environment variable name {k!r} for a shell command")
        if cwd is not None:
            if not isinstance(cwd, str) or not cwd.startswith("/"):
                raise InvalidInput(f"cwd must be an absolute path, not {cwd!r}")
            user_env["PWD"] = cwd
        session = f"/dev/shm/.sandtree-session-{int(uid)}"
        # the wrapper travels in the environment (and leaves it at once): `ps` shows one line
        argv = ["/bin/sh", "-c", 'eval "$__ST_SESSION"', "sandtree-session", session, command] + \
            [f"{k}={v}" for k, v in user_env.items()]
        env_out = {**base["env"], "__ST_SESSION": SESSION}
        shown = command
        run_cwd = base["cwd"]
    elif isinstance(command, (list, tuple)) and command:
        argv = [str(a) for a in command]
        env_out = {**base["env"], **user_env}
        shown = " ".join(argv)
        run_cwd = cwd or base["cwd"]
    else:
        raise InvalidInput("command must be a shell string or a non-empty list of arguments")
    if isinstance(stdin, str):
        stdin = stdin.encode()
    spec = RunSpec(argv=argv, layers=[], root_meta=(0, 0, 0), env=env_out, cwd=run_cwd, stdin=stdin,
                   uid=uid, gid=gid, limits=lim)
    return spec, mask_text(shown, secret_values(user_env))
