/*
 * gvisor.c: a live gVisor sandbox. P runs `runsc run` on the root it mounted and lends the agent's
 * pipes to the engine (--live 1 --exec 1: live_runtime); commands such as `runsc exec` join its mount
 * namespace (--mnt-fd: enter_mount). The other tier's runtime, so its own file.
 */
#include "helper.h"

static volatile sig_atomic_t detach_wanted;
static void want_detach(int sig) { (void)sig; detach_wanted = 1; }

/* --live 1 --exec 1: a live gVisor sandbox. P stays in the private mount namespace that holds the
 * sandbox's root and scratch (the engine reaches both through /proc/P/root/tmp, and runsc through
 * --mnt-fd), bounded by the lifetime like a live P, and runs runsc as its child R. runsc runs
 * attached: its sandbox and gofer die with R, R with P. Pid 1 inside is sandtree-agent (agent.c):
 * its stdin and stdout are R's, pipes P holds; it says "ready" on stdout. What runsc writes on
 * stderr before that (an error) goes to the engine on a "runsc" line when it fails. Then P lends
 * the agent's pipes to one engine process at a time (--agent-fd: a listening unix socket the
 * engine made): each one accepted gets both ends by SCM_RIGHTS, the next once it hung up. */
static void send_fds(int sock, int a, int b) {
    char one = 'p';
    struct iovec iov = {.iov_base = &one, .iov_len = 1};
    union { char buf[CMSG_SPACE(2 * sizeof(int))]; struct cmsghdr align; } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    int fds[2] = {a, b};
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    sendmsg(sock, &msg, MSG_NOSIGNAL);            /* (a caller that went away: the next one) */
}

int live_runtime(struct opts *o) {
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) die_step("pipe");
    pid_t r = fork();
    if (r < 0) die_step("fork");
    if (r == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) _exit(125);
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0 || dup2(err[1], 2) < 0) _exit(125);
        if (o->agent_fd >= 0) close(o->agent_fd);
        execv(o->argv[0], o->argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (o->agent_fd >= 0) fcntl(o->agent_fd, F_SETFD, FD_CLOEXEC);
    dprintf(report_fd, "pid %d\n", r);
    char said[2048], seen[8] = {0};
    size_t len = 0;
    int ready = o->resumed, err_open = 1;
    while (!ready) {
        struct pollfd pf[2] = {{out[0], POLLIN, 0}, {err[0], err_open ? POLLIN : 0, 0}};
        if (poll(pf, 2, -1) < 0) { if (errno == EINTR) continue; break; }
        char buf[512];
        if (pf[1].revents) {
            ssize_t n = read(err[0], buf, sizeof buf);
            if (n <= 0) err_open = 0;
            for (ssize_t i = 0; i < n; i++)
                if (len < sizeof said - 1) said[len++] = (buf[i] == '\n' || buf[i] == '\r') ? ' ' : buf[i];
        }
        if (pf[0].revents) {
            ssize_t n = read(out[0], buf, 1);        /* byte by byte: nothing after "ready\n" is ours */
            if (n <= 0) break;
            memmove(seen, seen + 1, 5);
            seen[5] = buf[0];
            ready = !memcmp(seen, "ready\n", 6);
        }
    }
    if (!ready) {
        kill(r, SIGKILL);
        while (waitpid(r, NULL, 0) < 0 && errno == EINTR) {}
        said[len] = 0;
        dprintf(report_fd, "runsc %s\n", said);
        errno = ECHILD;
        die_step("runsc-run");
    }
    /* A fresh sandbox runs now; a restored one only once runsc says so: R restores with host
     * paths (the images, /proc/self/exe for the sandbox and gofer it starts), so the engine asks
     * us (SIGUSR1) once it saw the container running (gvisor_live.py). */
    if (!o->resumed && detach_host(o) < 0) die_step("detach-host");
    sigset_t usr1, waiting;                           /* SIGUSR1 lands only inside ppoll: none is missed */
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &waiting);
    sigdelset(&waiting, SIGUSR1);
    if (o->resumed) signal(SIGUSR1, want_detach);
    live_ready(o, r);
    /* Keep reading runsc's stderr: it must never write into a pipe without a reader (SIGPIPE
     * would end it, and the sandbox with it). Its EOF comes once runsc and its sandbox are gone. */
    int client = -1;
    for (;;) {
        if (detach_wanted == 1) {
            detach_wanted = 2;
            detach_host(o);                           /* (failed: the sandbox runs on, attached) */
        }
        struct pollfd pf[2] = {{err[0], POLLIN, 0}, {-1, POLLIN, 0}};
        pf[1].fd = client >= 0 ? client : o->agent_fd;
        if (ppoll(pf, 2, NULL, &waiting) < 0) { if (errno == EINTR) continue; break; }
        char buf[512];
        if (pf[0].revents) {
            ssize_t n = read(err[0], buf, sizeof buf);
            if (n == 0 || (n < 0 && errno != EINTR)) break;
        }
        if (!pf[1].revents) continue;
        if (client < 0) {
            client = accept4(o->agent_fd, NULL, NULL, SOCK_CLOEXEC);
            if (client >= 0) send_fds(client, in[1], out[0]);
        } else if (read(client, buf, sizeof buf) <= 0) {
            close(client);                            /* hung up: the next caller's turn */
            client = -1;
        }
    }
    while (waitpid(r, NULL, 0) < 0 && errno == EINTR) {}
    return 0;
}

/* --mnt-fd: a command (runsc exec, runsc ps) in a live gVisor sandbox's mount namespace, where its
 * runsc state and control socket are (see live_runtime). It runs on the host, as the engine's
 * child G; we report as for --enter-fd ("pid", then "exit" and "rusage") and forward SIGRTMIN+n
 * as n to it (runsc exec passes a signal on to its process inside). With --pty 1 its stdin (the
 * engine's terminal) becomes G's controlling terminal, so a window size set on it reaches G as
 * SIGWINCH, which runsc exec passes on to the foreground process inside (agent.c --tty). */
int enter_mount(struct opts *o) {
    if (setns(o->mnt_fd, CLONE_NEWNS) < 0) die_step("setns-mnt");
    close(o->mnt_fd);
    if (chdir("/") < 0) die_step("chdir-/");
    if (!o->argv || !o->argv[0]) { errno = EINVAL; die_step("spec"); }
    for (int s = 1; s <= 30 && SIGRTMIN + s <= SIGRTMAX; s++) signal(SIGRTMIN + s, forward_rt);
    pid_t g = fork();
    if (g < 0) die_step("fork");
    if (g == 0) {
        for (int s = 1; s <= 30 && SIGRTMIN + s <= SIGRTMAX; s++) signal(SIGRTMIN + s, SIG_DFL);
        if (o->pty) {                            /* a session of its own: its group is forward_rt's too */
            if (setsid() < 0 || ioctl(0, TIOCSCTTY, 0) < 0) _exit(126);
        } else {
            setpgid(0, 0);                       /* forward_rt signals its group */
        }
        if (report_fd >= 0) close(report_fd);
        execv(o->argv[0], o->argv);
        _exit(127);
    }
    g_pid = g;
    if (!o->pty) setpgid(g, g);
    dprintf(report_fd, "pid %d\n", g);
    close(0);
    close(1);
    close(2);
    int st;
    struct rusage ru;
    while (wait4(g, &st, 0, &ru) < 0) if (errno != EINTR) die_step("wait4");
    if (WIFEXITED(st)) dprintf(report_fd, "exit %d\n", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) dprintf(report_fd, "signal %d\n", WTERMSIG(st));
    /* runsc's own use, not the command's (the Sentry runs it): the engine leaves it out */
    dprintf(report_fd, "rusage 0 0 0\n");
    return 0;
}
