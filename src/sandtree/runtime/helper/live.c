/*
 * live.c: a live sandbox's P once the sandbox is up: its lifetime (an alarm the engine can move),
 * "ready" to the engine, the host's mount tree detached so a live sandbox pins no host filesystem,
 * and the wait for its pid 1. Shared by a start (main.c), a resume (restore.c) and gVisor (gvisor.c).
 */
#include "helper.h"

static int g_deadline_fd = -1;
/* The lifetime is up, or the engine moved the deadline and sent SIGALRM: a deadline still ahead
 * re-arms the alarm for it (async-signal-safe: pread, clock_gettime, alarm); else the sandbox
 * goes. The file is the engine's (store/sandboxes/ID.deadline), never the sandbox's. */
static void on_alarm(int sig) {
    (void)sig;
    if (g_deadline_fd >= 0) {
        char buf[32];
        ssize_t n = pread(g_deadline_fd, buf, sizeof buf - 1, 0);
        long d = 0;
        for (ssize_t i = 0; i < n && buf[i] >= '0' && buf[i] <= '9' && d < 100000000000L; i++) d = d * 10 + (buf[i] - '0');
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        if (d > now.tv_sec) {
            long left = d - now.tv_sec;
            alarm((unsigned)(left > 400L * 86400 ? 400L * 86400 : left));
            return;
        }
    }
    if (g_pid > 0) kill(g_pid, SIGKILL);
}

/* A live P, once its sandbox is up: the lifetime's alarm (SIGKILL to c, the sandbox's root
 * process), "ready" to the engine, which is free then (its report closed, our stdio /dev/null). */
void live_ready(struct opts *o, pid_t c) {
    g_pid = c;
    g_deadline_fd = o->deadline_fd;
    if (o->lifetime > 0) {
        signal(SIGALRM, on_alarm);
        alarm((unsigned)o->lifetime);
    }
    if (dprintf(report_fd, "ready\n") < 0) {
        /* the engine is gone (killed while it started us): no one will ever know this sandbox */
        kill(c, SIGKILL);
        _exit(125);
    }
    close(report_fd);
    report_fd = -1;
    int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (fd >= 0) { dup2(fd, 0); dup2(fd, 1); dup2(fd, 2); close(fd); }
}

/* A bind of the host file `path` at the same path below the current directory (read-only). */
static int bind_host_file(const char *path) {
    char rel[4096];
    if (path[0] != '/' || strlen(path) >= sizeof rel - 1) return -1;
    snprintf(rel, sizeof rel, ".%s", path);
    for (char *q = rel + 2; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(rel, 0755) < 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    int fd = open(rel, O_CREAT | O_WRONLY | O_CLOEXEC, 0444);
    if (fd < 0) return -1;
    close(fd);
    if (mount(path, rel, NULL, MS_BIND, NULL) < 0) return -1;
    return mount(NULL, rel, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
}

/* A live P once its sandbox runs (its pid 1 has a mount namespace of its own, cloned from ours
 * and already rid of the host's tree; runsc's sandbox and gofer have theirs): our mount
 * namespace, a private copy of the host's, would pin every host filesystem mounted when the
 * sandbox started for the sandbox's whole life (the host's umount only takes the host's copy
 * away; a loop device stays busy). We need only our scratch (the engine reads the upper through
 * /proc/P/root/tmp) and the fds we hold: so our root becomes the scratch, the scratch is bound
 * again (with what is mounted in it) at /tmp, so every path under /tmp means what it meant, and
 * the host's tree is detached, as runc does with the old root after pivot_root. The overlay at
 * /r stays (its lowers are the store's layers, which the sandbox needs anyway). gVisor (--exec):
 * `runsc run` (R) goes on in this namespace, and `runsc exec`/`state`/`checkpoint` enter it
 * (--mnt-fd): runsc (static) is bound in at its path, with a proc of our own and /dev/null.
 * -1 if a step failed (we then stay where we were, or with the host's tree below /o). */

int detach_host(struct opts *o) {
    if (!o->uid_map || o->spec_fd >= 0) return 0;     /* rootless: we never left the host's namespace */
    if (chdir("/tmp") < 0) return -1;
    if ((mkdir("tmp", 0700) < 0 && errno != EEXIST) || (mkdir("o", 0700) < 0 && errno != EEXIST)) return -1;
    if (mount("/tmp", "tmp", NULL, MS_BIND | MS_REC, NULL) < 0) return -1;
    if (o->exec_runtime) {
        if (bind_host_file(o->argv[0]) < 0 || bind_host_file("/dev/null") < 0) return -1;
        if (mkdir("proc", 0555) < 0 && errno != EEXIST) return -1;
        if (mount("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0) return -1;
    }
    if (syscall(SYS_pivot_root, ".", "o") < 0) return -1;
    if (umount2("/o", MNT_DETACH) < 0) return -1;
    rmdir("/o");
    return chdir("/");
}

/* Live P waiting for its sandbox: pid 1 is C (a child), or the tree CRIU restored (adopted). */
int live_wait(struct opts *o, pid_t c) {
    live_ready(o, c);                        /* the engine is free; we stay for C */
    while (waitpid(c, NULL, 0) < 0 && errno == EINTR) {}
    return 0;
}
