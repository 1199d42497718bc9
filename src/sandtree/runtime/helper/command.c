/*
 * command.c: G's last steps before the user's command (identity and capabilities): cwd, groups
 * and ids, the capability bounding set, no_new_privs, the command's resource limits, the seccomp
 * filter, the fds that cross, then exec. Shared by a start's G, an enter's command and the output
 * relay (relay.c), so each is held to the same steps in the same order.
 */
#include "helper.h"

static int cap_kept(const struct opts *o, int cap) {
    for (int i = 0; i < o->nkeep; i++) if (o->keep_caps[i] == cap) return 1;
    return 0;
}

/* The command's resource limits (soft, hard), whatever the engine's were; documented with the
 * other limits in base.py (COMMAND_RLIMITS; tests compare the two). Memory, processes, CPU time
 * and disk have cgroups, the timeout and the tmpfs: their rlimits are left unlimited. */
#define KiB 1024UL
#define MiB (1024UL * 1024)
static const struct { int resource; rlim_t soft, hard; } command_rlimits[] = {
    {RLIMIT_NOFILE, 2048, 2048},             /* 2048 soft: rm -rf of a 1,100-deep tree holds a fd per level; bounds one process's connections (loopback_up) */
    {RLIMIT_CORE, 0, 0},                     /* no core dumps land anywhere */
    {RLIMIT_MEMLOCK, 8 * MiB, 8 * MiB},      /* the kernel's default */
    {RLIMIT_RTPRIO, 0, 0},                   /* no real-time scheduling */
    {RLIMIT_NICE, 0, 0},                     /* no priority above the default */
    {RLIMIT_STACK, 8 * MiB, RLIM_INFINITY},
    {RLIMIT_MSGQUEUE, 800 * KiB, 800 * KiB}, /* the kernel's default (819200) */
    {RLIMIT_SIGPENDING, 4096, 4096},
    {RLIMIT_LOCKS, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_AS, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_DATA, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_RSS, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_FSIZE, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_CPU, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_NPROC, RLIM_INFINITY, RLIM_INFINITY},
};

/* G: becomes the user's command. Errors go to C through exec_pipe. */
void become_command(const struct opts *o) {
    int e;
    const char *step = "cwd";
    if (chdir(o->cwd) < 0) goto fail;
    step = "ids";
    gid_t g = (gid_t)o->gid;
    if (o->gid_map && setgroups(1, &g) < 0) goto fail;
    if (setresgid(g, g, g) < 0) goto fail;
    /* Bounding set first (needs CAP_SETPCAP, which root still has here). */
    for (int cap = 0; cap <= 63; cap++) {
        if (cap_kept(o, cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) { step = "capbset"; goto fail; }
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (setresuid((uid_t)o->uid, (uid_t)o->uid, (uid_t)o->uid) < 0) goto fail;
    step = "tty";
    if (o->tty_sock >= 0 && take_terminal(o->tty_sock) < 0) goto fail;
    step = "no_new_privs";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) goto fail;
    /* Every resource limit is the sandbox's own, never the engine's (base.py: COMMAND_RLIMITS,
     * same values). Only lowered: raising a hard limit needs CAP_SYS_RESOURCE on the host. */
    step = "rlimits";
    for (size_t i = 0; i < sizeof command_rlimits / sizeof command_rlimits[0]; i++) {
        struct rlimit now, want = {command_rlimits[i].soft, command_rlimits[i].hard};
        if (getrlimit(command_rlimits[i].resource, &now) < 0) goto fail;
        if (want.rlim_max > now.rlim_max) want.rlim_max = now.rlim_max;
        if (want.rlim_cur > want.rlim_max) want.rlim_cur = want.rlim_max;
        if (setrlimit(command_rlimits[i].resource, &want) < 0) goto fail;
    }
    step = "seccomp";
    if (o->seccomp_fd >= 0) {
        static char buf[1 << 16];
        ssize_t n = pread(o->seccomp_fd, buf, sizeof buf, 0);
        if (n <= 0 || n % sizeof(struct sock_filter)) { errno = EINVAL; goto fail; }
        struct sock_fprog prog = {.len = (unsigned short)(n / sizeof(struct sock_filter)), .filter = (struct sock_filter *)buf};
        /* Nothing but stdio crosses into the command (report fd, seccomp fd, ...). */
        syscall(SYS_close_range, o->keep_fds > 3 ? o->keep_fds : 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) goto fail;
    }
    if (o->seccomp_fd < 0) syscall(SYS_close_range, o->keep_fds > 3 ? o->keep_fds : 3, ~0U, 4);
    if (o->envp) environ = o->envp;             /* the command's env came as options (or the spec) */
    if (o->exec_fd > 2) syscall(SYS_execveat, o->exec_fd, "", o->argv, environ, AT_EMPTY_PATH);
    else execvp(o->argv[0], o->argv);
    e = errno;
    dprintf(exec_pipe[1], "exec %d", e);
    _exit(127);
fail:
    e = errno;
    dprintf(exec_pipe[1], "%s %d", step, e);
    _exit(126);
}
