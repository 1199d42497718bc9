"""The shell session of a live sandbox, and the RunSpec of one command in it.

A string command runs in `/bin/sh` through SESSION, which restores the exported environment and
working directory the previous string command left (files in the sandbox's /dev/shm, a tmpfs
outside the committed filesystem) and saves them when it exits. A list runs as a fresh process
with exactly the given environment. The sandboxes themselves are sandboxes.py.
"""

from __future__ import annotations

import re

from ...errors import InvalidInput
from ...runtime.base import Limits, RunSpec
from ...runtime.validate import check_command, check_env
from ...secrets_mask import mask_text, secret_values

# $1: the session's name, $2: the command, then the NAMEs of variables for this command only
# (their session values come back after it), each value in __st_v_NAME: the environment, which
# only this uid reads, not the argv, which every uid does (/proc/PID/cmdline); the script turns
# them into NAME=VALUE arguments of its own. One process, /bin/sh, does it all with builtins and few
# system calls: a process start is most of a string command's cost (gVisor: 3-8 ms each), and on
# gVisor every system call is a trip to the Sentry. A POSIX shell has no builtin rename or unlink,
# so every save is a new file, NAME.d/SEQ.PID (`export -p` plus PWD), and SEQ.PID.ok is made once
# it is whole: a reader takes the highest SEQ among the .ok files, so it never reads a save still
# being written or cut short by a kill, and two commands saving at once write two files (a SEQ
# tie goes to either; each is a whole state). NAME.d is made once (mkdir, 0700) and read only if
# this uid owns it: another uid can neither plant a save nor read one. An owner test follows
# symlinks (root owns /tmp, 1777), so __st_mine also checks that the directory it owns (the cwd
# `cd -P` reached, pinned) is NAME.d itself in /dev/shm (its physical path: getcwd in dash and
# ash; bash resolves it by name, the `-ef` tests narrow that to a race): a name another uid made
# first points nowhere root then reads or writes. The older wrapper's file is read through the descriptor it
# was checked on (a root-owned regular file, not a symlink when looked at). A reader whose pick is gone
# (a cleanup under a burst of saves; an .ok left alone) looks again without it. Cleanup is an `rm`
# of the saves more than 4 behind the newest once 16 are there: one process every ~12 saves.
# NAME itself is the file an older wrapper kept (renamed into place), read when no save exists.
# The EXIT trap (so `exit N` saves too) runs in the command's shell, which exits right after: it
# turns off the command's set -e/-u/-f/-x (noclobber: `>|`; the redirect that hides the trace of
# `set +x` only when -x is on: a redirect is 8 system calls), and `command` keeps a failing special
# builtin from exiting the shell before the save and a function the command defined from running.
SESSION = r"""
unset __ST_SESSION
__st_s=$1; __st_c=$2; shift 2
for __st_n in "$@"; do eval "set -- \"\$@\" \"\$__st_n=\$__st_v_$__st_n\""; unset "__st_v_$__st_n"; shift; done
__st_d=$__st_s.d; __st_x=; __st_f=; __st_a=0; __st_o=
__st_top() {
  __st_q=0; __st_f=; __st_k=0
  for __st_m in "$__st_d"/*.ok; do
    __st_n=${__st_m##*/}; __st_n=${__st_n%%.*}
    case $__st_n in ''|*[!0-9]*) continue;; esac
    case "$__st_x " in *" $__st_m "*) continue;; esac
    __st_k=$((__st_k+1))
    if [ ${#__st_n} -lt 16 ] && [ "$__st_n" -gt "$__st_q" ]; then __st_q=$__st_n; __st_f=${__st_m%.ok}; fi
  done
}
__st_mine() {
  __st_p=$PWD; __st_l=$OLDPWD
  cd -P "$__st_d" 2>/dev/null || return
  [ "$PWD" = "$__st_d" ] && [ -O . ] && [ .. -ef "${__st_d%/*}" ] && [ "../${__st_d##*/}" -ef . ]; __st_r=$?
  cd "$__st_p" 2>/dev/null || PWD=$__st_p
  OLDPWD=$__st_l; return $__st_r
}
if [ -O "$__st_d" ] && __st_mine; then
  __st_o=1
  while __st_top; [ -n "$__st_f" ] && ! [ -f "$__st_f" ] && [ $__st_a -lt 3 ]; do
    __st_a=$((__st_a+1)); __st_x="$__st_x $__st_f.ok"; done
fi
if [ -n "$__st_f" ]; then command . "$__st_f" 2>/dev/null
elif [ -O "$__st_s" ] && [ -f "$__st_s" ] && ! [ -h "$__st_s" ] && { exec 3<"$__st_s"; } 2>/dev/null; then
  [ -O /proc/self/fd/3 ] && [ -f /proc/self/fd/3 ] && command . /proc/self/fd/3 2>/dev/null; exec 3<&-; fi
__st_new=; __st_had=
for __st_kv in "$@"; do
  __st_n=${__st_kv%%=*}
  if eval "[ \"\${$__st_n+set}\" = set ]"; then
    eval "__st_old_$__st_n=\$$__st_n"; __st_had="$__st_had $__st_n"
  else __st_new="$__st_new $__st_n"; fi
  export "$__st_kv"
done
[ -d "$PWD" ] && cd "$PWD"
unset __st_kv __st_n __st_a
__st_save() {
  __st_i=${IFS+set}; __st_j=$IFS; IFS=' '
  for __st_n in $__st_new; do command unset "$__st_n"; done
  for __st_n in $__st_had; do eval "export $__st_n=\"\$__st_old_$__st_n\""; done
  if [ -n "$__st_i" ]; then IFS=$__st_j; else unset IFS; fi
  export PWD
  [ -n "$__st_o" ] || { [ -O "$__st_d" ] && __st_mine; } || { PATH=/usr/sbin:/usr/bin:/sbin:/bin command mkdir -m 700 "$__st_d" 2>/dev/null &&
    [ -O "$__st_d" ]; } || return
  __st_top
  __st_w=$__st_d/$((__st_q+1)).$$
  command export -p >| "$__st_w" && : >| "$__st_w.ok"
  if [ "$__st_k" -ge 16 ]; then
    set --
    for __st_m in "$__st_d"/*; do
      __st_n=${__st_m##*/}; __st_n=${__st_n%%.*}
      case $__st_n in ''|*[!0-9]*) continue;; esac
      [ ${#__st_n} -lt 16 ] && [ "$__st_n" -lt $((__st_q-4)) ] && set -- "$@" "$__st_m"
    done
    PATH=/usr/sbin:/usr/bin:/sbin:/bin command rm -f -- "$@" 2>/dev/null
  fi
}
trap 'case $- in *x*) { __st_rc=$?; set +efux; } 2>/dev/null;; *) __st_rc=$?; set +efu;; esac
  __st_save; exit $__st_rc' EXIT
eval "$__st_c"
"""
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

def command_spec(base: dict, command, *, env, cwd, stdin, uid, gid, limits: dict,
                 given: Limits) -> tuple[RunSpec, str]:
    """The RunSpec of one command in a live sandbox whose start spec is `base`, and the command
    as recorded (secrets masked). given: `limits` parsed; only the limits named there replace
    the sandbox's own."""
    lim = Limits(**{**base["limits"], **{k: v for k, v in given.__dict__.items()
                                         if k in limits and limits[k] is not None}})
    user_env = {str(k): str(v) for k, v in (env or {}).items()}
    check_env(user_env)                  # the caller's, before the session adds its own (RUNTIME_ROOM)
    if isinstance(command, str) or (isinstance(command, (list, tuple)) and command):
        check_command([command] if isinstance(command, str) else [str(a) for a in command])
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
        argv = ["/bin/sh", "-c", 'eval "$__ST_SESSION"', "sandtree-session", session, command, *user_env]
        env_out = {**base["env"], "__ST_SESSION": SESSION, **{f"__st_v_{k}": v for k, v in user_env.items()}}
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
                   uid=uid, gid=gid, limits=lim, containers=bool(base.get("containers")))
    return spec, mask_text(shown, secret_values(user_env))
