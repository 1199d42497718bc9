/*
 * pid1.c: C, pid 1 of the sandbox. It finishes the root (/proc, /dev, hostname, pivot_root), hides
 * the host paths of its argv, then forks G (command.c) and reaps until G exits, or, in a live
 * sandbox, becomes sandtree-init (runtime/init.c). Also the pipes P, C and G share (the state of a
 * start crosses them), and the command's pid that signals are forwarded to.
 */
#include "helper.h"

int sync_pipe[2];       /* P -> C: maps written */
int exec_pipe[2] = {-1, -1}; /* G -> C: errno of a failed execve (CLOEXEC) */
int status_pipe[2];     /* C -> P: G's wait status / exec errno */
int spec_pipe[2];       /* P -> C: the run's spec (warm start) */

int init_fd = -1;        /* live: sandtree-init (init.c), opened before /tmp is covered */

/* Live C, once set up: copy sandtree-init onto the sandbox's own /dev/shm and exec it (see
 * init.c: why, and why it is safe). Nothing of the host stays open or mapped in pid 1, so CRIU
 * can checkpoint the sandbox whole. No other process exists in the sandbox yet, so nothing can
 * swap the file between the copy and the exec. */
__attribute__((noreturn)) static void become_init(void) {
    static const char path[] = "/dev/shm/.sandtree-init";
    int out = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0500);
    if (out < 0) die_step("init-copy");
    char buf[1 << 14];
    for (;;) {
        ssize_t n = read(init_fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die_step("init-copy");
        if (n == 0) break;
        if (write(out, buf, (size_t)n) != n) die_step("init-copy");
    }
    close(out);
    close(init_fd);
    setsid();                            /* the session too is the sandbox's own (CRIU) */
    int null = open("/dev/null", O_RDWR);              /* the sandbox's, not the engine's */
    if (null < 0) die_step("init-null");
    dup2(null, 0); dup2(null, 1); dup2(null, 2);
    if (dup2(status_pipe[1], 3) != 3) die_step("init-status");   /* init says "ready" on fd 3 */
    syscall(SYS_close_range, 4, ~0U, 0);
    char *args[] = {"sandtree-init", NULL}, *env[] = {NULL};
    execve(path, args, env);
    die_step("init-exec");
}

volatile pid_t g_pid = -1;
void forward(int sig) { if (g_pid > 0) kill(g_pid, sig); }

/* C: pid 1 of the sandbox. */
int sandbox_init(struct opts *o) {
    char c;
    close(sync_pipe[1]);
    close(status_pipe[0]);
    if (o->spec_fd >= 0) close(spec_pipe[1]);
    if (read(sync_pipe[0], &c, 1) != 1) _exit(125);   /* P died or failed to map */
    if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) die_step("setresuid0");
    /* After the id change: changing credentials clears the parent-death signal. If P (and so
     * the engine) goes, we go, and with us, as pid 1, the whole sandbox. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die_step("pdeathsig");
    {   /* P may have died before that (pid 1 cannot ask getppid): P holds the read end of the
         * status pipe until it exits, so a write end with no reader means P is gone. */
        struct pollfd pf = {.fd = status_pipe[1], .events = 0};
        if (poll(&pf, 1, 0) > 0 && (pf.revents & POLLERR)) _exit(125);
    }
    /* We hold the engine's report pipe (and, warm, the layers dir) until the end: the sandbox's
     * processes must never reach them through /proc/1/fd or ptrace. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) die_step("dumpable");
    int warm = o->spec_fd >= 0;
    if (warm) {
        /* Ahead of the run: our /proc (masked) and loopback, then wait for the run. */
        if (chdir("/tmp") < 0) die_step("chdir-scratch");
        setup_proc("p");
        if (o->netns_fd < 0) loopback_up();         /* a joined namespace came set up (links.py) */
        close(o->spec_fd);
        /* The run's options, forwarded by P: read whole while P writes (a spec is larger than
         * a pipe holds), then P's go once it mounted the run's root. */
        read_spec(spec_pipe[0], o);
        if (read(sync_pipe[0], &c, 1) != 1) _exit(125);
    }
    close(sync_pipe[0]);

    if (!o->uid_map) mount_root(o);   /* rootless: only the user namespace may mount */
    if (chdir("/tmp") < 0) die_step("chdir-scratch");
    /* A bind of our own: pivot_root refuses a new root that was mounted in another mount namespace. */
    xmount("r", "r", NULL, MS_BIND | MS_REC, NULL);
    if (warm) {
        xmount("p", "r/proc", NULL, MS_MOVE, NULL);
    } else {
        setup_proc("r/proc");
        if (!o->uid_map || o->live) {
            setup_dev();
            runtime_files("r/dev/sandtree", "r");
        }
        if (o->netns_fd < 0) loopback_up();     /* a joined namespace came set up (links.py) */
    }
    if (sethostname(o->hostname, strlen(o->hostname)) < 0) die_step("hostname");

    close(o->sock_fd);
    if (chdir("/tmp/r") < 0) die_step("chdir-root");
    if (syscall(SYS_pivot_root, ".", ".") < 0) die_step("pivot_root");
    if (umount2(".", MNT_DETACH) < 0) die_step("umount-old");
    if (chdir("/") < 0) die_step("chdir-/");

    /* Hide the host paths in our own argv from the sandbox's /proc/1/cmdline. */
    o->cwd = strdup(o->cwd);
    for (char **a = o->argv; *a; a++) *a = strdup(*a);   /* the command may live in our argv */
    for (int k = 0; k < o->nenv; k++) o->envp[k] = strdup(o->envp[k]);   /* its env too */
    memset(o->self_argv0, 0, (size_t)(o->argv_end - o->self_argv0));
    strcpy(o->self_argv0, "sandtree-init");
    prctl(PR_SET_NAME, "sandtree-init", 0, 0, 0);

    if (o->live) {
        /* No command: pid 1 becomes sandtree-init, which tells P "ready" and reaps. A sandbox
         * that outlives its engine must also outlive P's stand-in after a CRIU restore. */
        if (o->detach) prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
        become_init();
    }
    if (pipe2(exec_pipe, O_CLOEXEC) < 0) die_step("pipe");
    signal(SIGTERM, forward);
    signal(SIGINT, forward);
    signal(SIGHUP, forward);
    pid_t g = fork();
    if (g < 0) die_step("fork");
    if (g == 0) {
        signal(SIGTERM, SIG_DFL); signal(SIGINT, SIG_DFL); signal(SIGHUP, SIG_DFL);
        close(exec_pipe[0]);
        close(status_pipe[1]);
        become_command(o);
    }
    g_pid = g;
    close(exec_pipe[1]);
    char ebuf[64] = {0};
    ssize_t en = read(exec_pipe[0], ebuf, sizeof ebuf - 1);
    close(exec_pipe[0]);
    int st = 0;
    for (;;) {
        pid_t w = wait(&st);
        if (w == g) break;
        if (w < 0 && errno != EINTR) { st = 0; break; }
    }
    if (en > 0) dprintf(status_pipe[1], "fail %s\n", ebuf);
    else dprintf(status_pipe[1], "status %d\n", st);
    return 0;   /* pid 1 exits: the kernel kills whatever G left behind */
}
