/*
 * main.c: the entry point and P's start of a sandbox. P takes its options, then either enters
 * a live sandbox (enter.c, gvisor.c), resumes one (restore.c), or starts one: joins the run's cgroups,
 * mounts its root (mounts.c), clones C (pid1.c) into new namespaces, writes C's uid/gid maps, forwards
 * a warm start's spec, waits and reports (the protocol: helper.h). Everything else lives in the file
 * of its concern; this one holds only the order of a start.
 */
#include "helper.h"

int main(int argc, char **argv) {
    struct opts o;
    /* The engine's signal mask is not the sandbox's: a blocked signal stays blocked across fork
     * and exec, and the thread that starts us may block some (a Ray worker's threads block
     * SIGINT: a terminal's ^C on a cluster node never reached its foreground command). */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    parse(argc, argv, &o);
    report_fd = o.report_fd;
    if (o.runtime_fd >= 0) read_runtime(o.runtime_fd);
    pid_t engine = getppid();
    if (o.live && o.detach) {
        /* A live sandbox outlives its engine: no parent-death signal, a session of its own (the
         * terminal's or the engine's process-group signals do not reach it), and a fork so the
         * engine's child exits at once (nothing for it to reap later; init adopts us). */
        pid_t d = fork();
        if (d < 0) die_step("fork");
        if (d > 0) _exit(0);
        if (setsid() < 0) die_step("setsid");
    } else {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die_step("pdeathsig");
        if (getppid() != engine) _exit(125);
    }
    if (o.enter_fd >= 0) return enter_sandbox(&o);
    if (o.mnt_fd >= 0) return enter_mount(&o);
    if (o.restore) return restore_sandbox(&o);
    if (o.live && !o.exec_runtime && (!o.init || (init_fd = open(o.init, O_RDONLY | O_CLOEXEC)) < 0)) die_step("open-init");

    for (int k = 0; k < o.ncgroups; k++) write_file(o.cgroups[k], "0\n");

    int warm = o.spec_fd >= 0;
    if (o.netns_fd >= 0) {
        /* Before the clone, so the sandbox is born in it (a user namespace's child cannot join a
         * namespace of the host's); gVisor's runsc (--exec) runs its netstack on its links. A warm
         * helper may be born in one too: a link with nothing allowed yet, whose policy the engine
         * sets when a run takes the helper (runtime/warm.py, linked pools). */
        if (setns(o.netns_fd, CLONE_NEWNET) < 0) die_step("netns");
        close(o.netns_fd);
    }
    if (warm && !o.uid_map) { errno = EINVAL; die_step("warm-needs-root"); }
    if (o.uid_map) {
        if (unshare(CLONE_NEWNS) < 0) die_step("unshare-mnt");
        if (warm) {
            /* Our own peer group: what we mount after the clone propagates into the sandbox's
             * mount namespace (a slave of ours), never out to the host. */
            xmount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
            xmount(NULL, "/", NULL, MS_REC | MS_SHARED, NULL);
            warm_prepare(&o);
        } else {
            mount_root(&o);
        }
        if (o.exec_runtime) {
            /* Another runtime (gVisor's runsc) runs the sandbox on the root we mounted, inside
             * this private mount namespace; stdio, cgroups and PDEATHSIG carry over. */
            if (chdir("/") < 0) die_step("chdir-/");
            close(o.sock_fd);
            fcntl(report_fd, F_SETFD, FD_CLOEXEC);
            if (o.live) return live_runtime(&o);
            execv(o.argv[0], o.argv);
            die_step("exec-runtime");
        }
    }
    if (pipe2(sync_pipe, O_CLOEXEC) < 0 || pipe2(status_pipe, O_CLOEXEC) < 0) die_step("pipe");
    if (warm && pipe2(spec_pipe, O_CLOEXEC) < 0) die_step("pipe");
    uid_t ruid = getuid();
    gid_t rgid = getgid();
    long flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                 CLONE_NEWUTS | CLONE_NEWCGROUP | SIGCHLD;
    if (o.netns_fd >= 0) flags &= ~CLONE_NEWNET;
    /* The new user namespace's owner is our effective uid at the clone: a uid of its own per
     * sandbox (no host process runs as it), so what the kernel counts per user (inotify
     * instances and watches, ...) is counted per sandbox and never against host root. Only the
     * effective uid moves: the permitted capabilities stay, and come back with euid 0 below
     * (C's uid/gid maps need CAP_SETUID/CAP_SETGID here). Live sandboxes too: CRIU's dump
     * prlimit()s their tasks, which across a user namespace needs CAP_SYS_RESOURCE (some hosts,
     * this VM too, withhold it) or to be its owner, so the engine runs CRIU's dump as the owner
     * (criu.py: as_owner); a restore owns its namespace likewise (enter_owned_userns). */
    int owned = o.uid_map && o.owner_base > 0;
    if (owned && setresuid((uid_t)-1, (uid_t)(o.owner_base + getpid()), (uid_t)-1) < 0) die_step("userns-owner");
    pid_t c = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (c < 0) die_step("clone");
    if (c == 0) _exit(sandbox_init(&o));
    if (owned) {
        if (setresuid((uid_t)-1, 0, (uid_t)-1) < 0) die_step("userns-owner");
        /* A change of effective uid clears the parent-death signal: set it again, and check
         * the engine did not go in between. */
        if (!(o.live && o.detach)) {
            if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die_step("pdeathsig");
            if (getppid() != engine) { kill(c, SIGKILL); _exit(125); }
        }
    }

    close(sync_pipe[0]);
    close(status_pipe[1]);
    if (o.live) {
        /* From here a dead engine (its report pipe closed) must not kill us silently with
         * SIGPIPE (C is already cloned, with our dispositions): our writes fail instead, and
         * the sandbox goes with us (die_step, live_ready). */
        live_c = c;
        signal(SIGPIPE, SIG_IGN);
    }
    dprintf(report_fd, "pid %d\n", c);
    char path[64], line[64];
    if (o.uid_map) {
        snprintf(path, sizeof path, "/proc/%d/uid_map", c); write_file(path, o.uid_map);
        snprintf(path, sizeof path, "/proc/%d/gid_map", c); write_file(path, o.gid_map);
    } else {
        snprintf(path, sizeof path, "/proc/%d/setgroups", c); write_file(path, "deny");
        snprintf(line, sizeof line, "0 %u 1\n", ruid);
        snprintf(path, sizeof path, "/proc/%d/uid_map", c); write_file(path, line);
        snprintf(line, sizeof line, "0 %u 1\n", rgid);
        snprintf(path, sizeof path, "/proc/%d/gid_map", c); write_file(path, line);
    }
    if (warm) {
        if (write(sync_pipe[1], "m", 1) != 1) die_step("sync");   /* maps are written */
        /* Ready and waiting: everything above is off the run's critical path. */
        dprintf(report_fd, "ready\n");
        close(spec_pipe[0]);
        size_t len;
        char *raw = read_all(o.spec_fd, &len);
        if (len == 0) {                               /* the pool let us go unused */
            kill(c, SIGKILL);
            waitpid(c, NULL, 0);                      /* out of the cgroup before we go */
            _exit(0);
        }
        /* C gets the same spec, and reads it whole before it waits for our go: a spec is larger
         * than a pipe holds, so nothing here may wait on a reader that waits on us. Parsed from
         * our own copy afterwards (parse_spec only points into it). A C gone (EPIPE, not SIGPIPE)
         * is a setup failure the engine is told of. */
        signal(SIGPIPE, SIG_IGN);
        for (size_t off = 0; off < len;) {
            ssize_t n = write(spec_pipe[1], raw + off, len - off);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) { kill(c, SIGKILL); die_step("spec-forward"); }
            off += (size_t)n;
        }
        close(spec_pipe[1]);
        signal(SIGPIPE, SIG_DFL);
        parse_spec(raw, len, &o);
        warm_mount(&o);                               /* propagates into C's namespace */
    }
    if (write(sync_pipe[1], "g", 1) != 1) die_step("sync");
    close(sync_pipe[1]);
    if (o.live) {
        char rb[16] = {0};
        ssize_t rn;
        while ((rn = read(status_pipe[0], rb, sizeof rb - 1)) < 0 && errno == EINTR) {}
        if (rn > 0 && !strncmp(rb, "ready", 5)) {
            if (detach_host(&o) < 0) die_step("detach-host");
            return live_wait(&o, c);
        }
    }

    /* Everything below is P's bookkeeping; stdin/stdout/stderr belong to the command, and their
     * EOF tells the engine when the sandbox is gone (not when this process has exited). */
    close(0);
    close(1);
    close(2);
    int st;
    struct rusage ru;
    while (wait4(c, &st, 0, &ru) < 0) if (errno != EINTR) die_step("wait4");
    char buf[256] = {0};
    ssize_t n = read(status_pipe[0], buf, sizeof buf - 1);
    if (n > 0) {
        int gst, e; char step[32];
        if (sscanf(buf, "status %d", &gst) == 1) {
            if (WIFEXITED(gst)) dprintf(report_fd, "exit %d\n", WEXITSTATUS(gst));
            else if (WIFSIGNALED(gst)) dprintf(report_fd, "signal %d\n", WTERMSIG(gst));
        } else if (sscanf(buf, "fail %31s %d", step, &e) == 2) {
            dprintf(report_fd, "execfail %d %s\n", e, step);
        }
    } else if (WIFSIGNALED(st)) {
        dprintf(report_fd, "signal %d\n", WTERMSIG(st));   /* C itself was killed (timeout, OOM) */
    }
    dprintf(report_fd, "rusage %ld %ld %ld\n",
            (long)(ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec),
            (long)(ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec), ru.ru_maxrss);
    return 0;
}
