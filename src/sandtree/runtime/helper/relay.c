/*
 * relay.c: an enter's output relay: the command's stdout and stderr go through sandtree-drain
 * (runtime/drain.c), a reader inside the sandbox, so an exec ends at the command's exit, not at the
 * EOF a background process may hold back. How and why it is started: below.
 */
#include "helper.h"

/* The output relay of an enter: the command's stdout and stderr become pipes to sandtree-drain
 * (drain.c: why), a process of the sandbox's own (adopted by its pid 1, in a session of its own so
 * a kill of the command's group spares it) with the command's ids, capabilities and seccomp
 * filter. Its executable is a copy of drain_fd (a host file opened before setns) on the sandbox's
 * /dev/shm that never has a name, reopened read-only so it can be executed. It waits on a unix
 * socket for a pidfd of its command (it forwards until that exits): the command sends its own
 * just before it execs (use_relay), then says "relay" on the report (the engine then reads to
 * EOF). A relay that never gets one (the run did not come, or went the other way) exits.
 * Started by the command's process itself (per exec), or, with --relay-ahead 1, by a helper
 * entered ahead (a warm pool's) before its spec comes, for the --uid/--gid it was given: a run
 * then pays one fork and one exec, not three forks and two (a spec with other ids or a terminal
 * closes it and starts its own). On any failure the command writes to the engine's pipes. */

void close_relay(struct relay *r) {
    if (r->out >= 0) close(r->out);
    if (r->err >= 0) close(r->err);
    if (r->sock >= 0) close(r->sock);        /* EOF: a relay still waiting exits */
    r->out = r->err = r->sock = -1;
}

int start_relay(struct opts *o, int drain_fd, struct relay *r) {
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, sp[2] = {-1, -1}, ok[2] = {-1, -1}, st = 0, ret = -1;
    char buf[1 << 12];
    ssize_t said;
    r->out = r->err = r->sock = -1;
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0 || pipe2(ok, O_CLOEXEC) < 0 ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) goto out;
    pid_t d = fork();
    if (d < 0) goto out;
    if (d == 0) {
        /* (a child: in the sandbox's pid namespace, where its /proc/self resolves; a helper
         * entered ahead is not) */
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);      /* until exec we hold the engine's fds */
        if (exec_pipe[1] >= 0) close(exec_pipe[1]);   /* its setup failing is not the command's */
        exec_pipe[1] = ok[1];                    /* become_command says so there; exec closes it */
        /* Our ids are still the host's, which the sandbox's user namespace does not map (a file
         * made so fails with EOVERFLOW): the copy is made as the sandbox's root (become_command
         * sets every id after this anyway). */
        setfsuid(0);
        setfsgid(0);
        char path[64];
        ssize_t n = 0;
        off_t off = 0;
        int tmp = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0555), exe = -1;
        if (tmp >= 0) {
            while ((n = pread(drain_fd, buf, sizeof buf, off)) > 0 && write(tmp, buf, (size_t)n) == n) off += n;
            snprintf(path, sizeof path, "/proc/self/fd/%d", tmp);
            if (n == 0 && off > 0) exe = open(path, O_RDONLY | O_CLOEXEC);
        }
        if (exe < 0) {
            dprintf(ok[1], "copy %d", errno);
            _exit(1);
        }
        close(tmp);
        pid_t x = fork();
        if (x != 0) _exit(x > 0 ? 0 : 1);        /* our pid 1 adopts the drain */
        setsid();
        signal(SIGPIPE, SIG_IGN);
        /* 0: stdout's pipe, 1 and 2: the engine's (as inherited), 3: stderr's pipe, 4: the socket */
        int a = fcntl(po[0], F_DUPFD_CLOEXEC, 10), b = fcntl(pe[0], F_DUPFD_CLOEXEC, 10);
        int c = fcntl(sp[1], F_DUPFD_CLOEXEC, 10);
        o->exec_fd = fcntl(exe, F_DUPFD_CLOEXEC, 10);
        if (o->seccomp_fd >= 0) o->seccomp_fd = fcntl(o->seccomp_fd, F_DUPFD_CLOEXEC, 10);
        if (a < 0 || b < 0 || c < 0 || o->exec_fd < 0 || dup2(a, 0) < 0 || dup2(b, 3) < 0 || dup2(c, 4) < 0) {
            dprintf(ok[1], "dup %d", errno);
            _exit(1);
        }
        fcntl(0, F_SETFL, O_NONBLOCK);
        fcntl(3, F_SETFL, O_NONBLOCK);
        static char *args[] = {"sandtree-drain", NULL}, *env[] = {NULL};
        o->argv = args;
        o->envp = env;
        o->cwd = "/";
        o->keep_fds = 5;
        become_command(o);
        _exit(1);
    }
    close(ok[1]);
    ok[1] = -1;
    while (waitpid(d, &st, 0) < 0 && errno == EINTR) {}
    while ((said = read(ok[0], buf, 1)) < 0 && errno == EINTR) {}
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || said != 0) goto out;     /* EOF alone: it runs */
    r->out = po[1];
    r->err = pe[1];
    r->sock = sp[0];
    po[1] = pe[1] = sp[0] = -1;
    ret = 0;
out:
    for (int k = 0; k < 2; k++) {
        if (po[k] >= 0) close(po[k]);
        if (pe[k] >= 0) close(pe[k]);
        if (sp[k] >= 0) close(sp[k]);            /* (the relay's end: its copy is its fd 4) */
        if (ok[k] >= 0) close(ok[k]);
    }
    return ret;
}

/* The command's process, before it becomes the command: a pidfd of itself to the relay, then
 * its stdout and stderr are the relay's pipes. */
void use_relay(struct relay *r) {
    int me = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (me >= 0 && sendmsg_fd(r->sock, me, 'p', MSG_NOSIGNAL) == 1 && dup2(r->out, 1) >= 0 && dup2(r->err, 2) >= 0)
        dprintf(report_fd, "relay\n");
    if (me >= 0) close(me);
    close_relay(r);
}
