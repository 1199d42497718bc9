/*
 * enter.c: --enter-fd, a command in a live sandbox: join its cgroups and all of its namespaces
 * through a pidfd, fork the command (with its output relay, relay.c, or a terminal, terminal.c),
 * forward signals to its process group, report as P does. A warm pool's helper is entered ahead and
 * takes its spec later.
 */
#include "helper.h"

/* To its process group; right after the fork (the pid is reported before the child's setsid) there
 * is none yet, and the child alone is the command: a signal sent then would be lost. */
void forward_rt(int sig) {
    int saved = errno;
    if (g_pid > 0 && kill(-g_pid, sig - SIGRTMIN) < 0 && errno == ESRCH) kill(g_pid, sig - SIGRTMIN);
    errno = saved;
}

/* --enter-fd: run the command inside a live sandbox (see the header). */
int enter_sandbox(struct opts *o) {
    /* Our name says whether we hold a command (hibernate refuses then) or only wait for one. */
    prctl(PR_SET_NAME, o->spec_fd >= 0 ? "sandtree-ahead" : "sandtree-enter", 0, 0, 0);
    int drain_fd = o->drain ? open(o->drain, O_RDONLY | O_CLOEXEC) : -1;   /* a host file: before setns */
    for (int k = 0; k < o->ncgroups; k++) write_file(o->cgroups[k], "0\n");
    /* All namespaces at once, through a pidfd the engine checked: no pid-reuse window. Our
     * root and cwd become the sandbox's. */
    if (setns(o->enter_fd, CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                           CLONE_NEWUTS | CLONE_NEWCGROUP) < 0) die_step("setns");
    close(o->enter_fd);
    struct relay ahead = {-1, -1, -1};
    if (o->spec_fd >= 0) {
        /* Entered ahead of the command: joining a v1 memory cgroup waits for an RCU grace period
         * (milliseconds, more on an idle machine), so a warm pool pays it before the run; its
         * output relay too, for the ids the run is expected to have. */
        long uid = o->uid, gid = o->gid;
        if (drain_fd >= 0 && o->relay_ahead && start_relay(o, drain_fd, &ahead) < 0) ahead.sock = -1;
        dprintf(report_fd, "ready\n");
        int sfd = o->spec_fd;
        o->spec_fd = -1;
        read_spec(sfd, o);
        prctl(PR_SET_NAME, "sandtree-enter", 0, 0, 0);
        if (ahead.sock >= 0 && (o->pty || o->uid != uid || o->gid != gid)) {
            /* not this command's: it goes before the command starts (no process with other ids
             * beside it), and the command starts its own */
            struct pollfd gone = {.fd = ahead.sock, .events = POLLIN};
            shutdown(ahead.sock, SHUT_WR);
            while (poll(&gone, 1, 1000) < 0 && errno == EINTR) {}
            close_relay(&ahead);
        }
    }
    if (!o->argv || !o->argv[0]) { errno = EINVAL; die_step("spec"); }
    if (pipe2(exec_pipe, O_CLOEXEC) < 0) die_step("pipe");
    for (int s = 1; s <= 30 && SIGRTMIN + s <= SIGRTMAX; s++) signal(SIGRTMIN + s, forward_rt);
    signal(SIGTERM, forward);
    signal(SIGINT, forward);
    signal(SIGHUP, forward);
    int tsock[2] = {-1, -1}, sfd = -1, tty_err = 0;
    sigset_t relayed;
    sigemptyset(&relayed);
    if (o->pty) {                                /* (see take_terminal) */
        sigaddset(&relayed, SIGCHLD);
        sigaddset(&relayed, SIGWINCH);
        sigaddset(&relayed, SIGHUP);
        sigprocmask(SIG_BLOCK, &relayed, NULL);  /* before the fork: G's exit is never missed */
        if ((sfd = signalfd(-1, &relayed, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
            socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, tsock) < 0) die_step("tty-relay");
        tty_err = own_terminal();
        o->tty_sock = tsock[1];
    }
    pid_t g = fork();                            /* the child is in the sandbox's pid namespace */
    if (g < 0) die_step("fork");
    if (g == 0) {
        /* Until exec we hold the engine's fds: no process of the sandbox may attach to us. */
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        for (int s = 1; s <= 30 && SIGRTMIN + s <= SIGRTMAX; s++) signal(SIGRTMIN + s, SIG_DFL);
        signal(SIGTERM, SIG_DFL); signal(SIGINT, SIG_DFL); signal(SIGHUP, SIG_DFL);
        sigprocmask(SIG_UNBLOCK, &relayed, NULL);
        close(exec_pipe[0]);
        setsid();                                /* its own process group: signals reach all of it */
        if (tty_err) {
            dprintf(exec_pipe[1], "tty %d", tty_err);
            _exit(126);
        }
        if (o->pty) {
            close(tsock[0]);
            close(sfd);
        }
        if (ahead.sock >= 0) use_relay(&ahead);
        else if (drain_fd >= 0 && !o->pty && start_relay(o, drain_fd, &ahead) == 0) use_relay(&ahead);
        become_command(o);
    }
    close_relay(&ahead);                         /* (the command's now; its relay waits for its pidfd) */
    if (drain_fd >= 0) close(drain_fd);
    g_pid = g;
    dprintf(report_fd, "pid %d\n", g);
    close(exec_pipe[1]);
    char ebuf[64] = {0};
    ssize_t en;
    while ((en = read(exec_pipe[0], ebuf, sizeof ebuf - 1)) < 0 && errno == EINTR) {}
    close(exec_pipe[0]);
    int master = -1, out = 0;
    if (o->pty) {
        close(tsock[1]);
        master = recv_master(tsock[0]);
        close(tsock[0]);
        if (master < 0 && tty_restore) tcsetattr(0, TCSANOW, &tty_saved);
        struct stat t, f;
        for (int fd = 2; fd >= 1 && fstat(0, &t) == 0; fd--)     /* the terminal's output: its own fd */
            if (fstat(fd, &f) == 0 && f.st_dev == t.st_dev && f.st_ino == t.st_ino) out = fd;
    }
    /* The command's stdio is its own: the engine reads to the exit, not to EOF (a background
     * process may keep the pipes open). A terminal's command has the sandbox's: we relay. */
    for (int fd = 2; fd >= 0; fd--)
        if (master < 0 || (fd != 0 && fd != out)) close(fd);
    if (master >= 0) relay_terminal(master, out, g, sfd);
    int st;
    struct rusage ru;
    while (wait4(g, &st, 0, &ru) < 0) if (errno != EINTR) die_step("wait4");
    char step[32];
    int e;
    if (en > 0 && sscanf(ebuf, "%31s %d", step, &e) == 2) dprintf(report_fd, "execfail %d %s\n", e, step);
    else if (WIFEXITED(st)) dprintf(report_fd, "exit %d\n", WEXITSTATUS(st));
    else if (WIFSIGNALED(st)) dprintf(report_fd, "signal %d\n", WTERMSIG(st));
    dprintf(report_fd, "rusage %ld %ld %ld\n",
            (long)(ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec),
            (long)(ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec), ru.ru_maxrss);
    return 0;
}
