/*
 * sandtree-init: pid 1 of a live sandbox, once it is set up (helper/pid1.c execs it).
 *
 * Why a program of its own, without libc: pid 1 of a live sandbox must be checkpointable by CRIU
 * (hibernate), so its executable has to be a file CRIU can find again at restore: helper/pid1.c
 * copies this binary onto the sandbox's own /dev/shm, execs it, and it unlinks itself at once
 * (CRIU saves a deleted executable as a "ghost" file). Every sandbox pays for that copy in
 * memory, so it is a few KB, not the helper's ~900 KB of static glibc.
 *
 * It is handed fd 3, the status pipe to the helper: it writes "ready\n" there and closes it,
 * then reaps whatever `--enter`ed commands leave behind (orphans are reparented to it) until the
 * sandbox is killed. SIGCHLD stays blocked and is taken with rt_sigtimedwait, so no exit is
 * missed between a reap and the wait.
 *
 * It stays dumpable after the exec: CRIU, checkpointing from inside the sandbox's user namespace,
 * cannot open a non-dumpable pid 1's namespaces. That is safe: the sandbox's processes lack
 * CAP_SYS_PTRACE and hold a strict subset of its capabilities, so they cannot ptrace it or read
 * its /proc/1 fds, and it holds nothing of the engine's. (Its /proc/1 files belong to the
 * sandbox's root, which may raise pid 1's oom_score_adj: that only gets its own sandbox killed
 * sooner; lowering it needs CAP_SYS_RESOURCE, which the sandbox lacks.)
 */
#include <asm/unistd.h>
#include <linux/fcntl.h>

#include <linux/prctl.h>

#define SIGCHLD_BIT (1UL << (17 - 1))
#define WNOHANG 1

#include "nolibc.h"

NOLIBC_START(init_main)

__attribute__((noreturn, used)) void init_main(void) {
    unsigned long chld = SIGCHLD_BIT;
    sys(__NR_unlinkat, AT_FDCWD, (long)"/dev/shm/.sandtree-init", 0, 0);
    sys(__NR_prctl, PR_SET_NAME, (long)"sandtree-init", 0, 0);
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&chld, 0, sizeof chld);
    /* fd 3: the helper's status pipe; under gVisor (runsc passes only stdio) stdout, which the
     * helper reads (helper/gvisor.c live_runtime) */
    if (sys(__NR_write, 3, (long)"ready\n", 6, 0) < 0) sys(__NR_write, 1, (long)"ready\n", 6, 0);
    sys(__NR_close, 3, 0, 0, 0);
    for (;;) {
        while (sys(__NR_wait4, -1, 0, WNOHANG, 0) > 0) {}
        sys(__NR_rt_sigtimedwait, (long)&chld, 0, 0, sizeof chld);
    }
}
