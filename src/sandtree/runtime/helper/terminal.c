/*
 * terminal.c: an enter's terminal (--pty 1). G takes a terminal of the sandbox's own
 * (take_terminal); the entering process makes the engine's terminal its own and raw, and relays
 * between the two until G exits (relay_terminal). Why a terminal of the sandbox's own: below.
 */
#include "helper.h"

/*
 * An enter's terminal (--pty 1). The engine's terminal (our stdin: a pty slave of the host's
 * devpts) is none the sandbox can name: its /dev/pts is a devpts instance of its own, so `tty`,
 * ttyname() and every program that reopens its terminal by name (ssh, sudo, script, screen) would
 * fail. So the command gets a terminal of the sandbox's own: G, once it has the command's ids (so
 * the slave is the command's, mode 0620, as a login makes it), opens the sandbox's ptmx, makes the
 * slave its stdio (where the engine's terminal was) and controlling terminal, and passes the master
 * to its entering helper, which is outside the sandbox (a host process, in none of its /proc) and
 * relays (relay_terminal). Nothing of the host's terminal stays in the sandbox.
 */
#ifndef DEVPTS_SUPER_MAGIC
#define DEVPTS_SUPER_MAGIC 0x1cd1
#endif

/* G, as the command's ids, before its seccomp filter: the new terminal (see above). The ptmx is
 * resolved in our root with no symbolic link followed and must be a devpts's ptmx (5:2): a path
 * of the sandbox's, opened by the sandbox's own user (the device policy allows just these). */
int take_terminal(int sock) {
    struct stat host, st;
    struct statfs fs;
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC), m = -1, s = -1, zero = 0;
    struct open_how how = {.flags = O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    if (root >= 0) m = (int)syscall(SYS_openat2, root, "dev/pts/ptmx", &how, sizeof how);
    if (root >= 0) close(root);
    if (m < 0) return -1;
    if (fstat(m, &st) < 0 || !S_ISCHR(st.st_mode) || st.st_rdev != makedev(5, 2) || fstatfs(m, &fs) < 0 ||
        fs.f_type != DEVPTS_SUPER_MAGIC) {
        errno = ENOTTY;
        goto fail;
    }
    unsigned short ws[4];
    if (ioctl(m, TIOCSPTLCK, &zero) < 0 || (s = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0 ||
        fstat(0, &host) < 0) goto fail;
    if (ioctl(0, TIOCGWINSZ, ws) == 0) ioctl(m, TIOCSWINSZ, ws);      /* the size it starts with */
    for (int fd = 0; fd < 3; fd++) {              /* the engine's terminal, not its pipes */
        if (fstat(fd, &st) == 0 && st.st_dev == host.st_dev && st.st_ino == host.st_ino && dup2(s, fd) < 0)
            goto fail;
    }
    if (ioctl(0, TIOCSCTTY, 0) < 0 || sendmsg_fd(sock, m, 't', MSG_NOSIGNAL) != 1) goto fail;
    close(s);
    close(m);
    close(sock);
    return 0;
fail:;
    int e = errno;
    if (s >= 0) close(s);
    close(m);
    errno = e;
    return -1;
}

/* An enter with --pty 1, before its fork: the engine's terminal becomes ours (our session's
 * controlling terminal, so its window size changes reach us as SIGWINCH and its hangup as
 * SIGHUP) and raw (the command's terminal does echo, line editing and ^C as SIGINT: this one
 * only carries bytes). 0, or the errno G reports as "tty". */
struct termios tty_saved;
int tty_restore;

int own_terminal(void) {
    if (getsid(0) != getpid() && setsid() < 0) return errno;
    if (ioctl(0, TIOCSCTTY, 0) < 0) return errno;
    struct termios raw;
    if (tcgetattr(0, &tty_saved) == 0) {
        raw = tty_saved;
        cfmakeraw(&raw);
        tty_restore = tcsetattr(0, TCSANOW, &raw) == 0;
    }
    return 0;
}

/* The master G sent (take_terminal), or -1 (it failed before, and says so on exec_pipe). */
int recv_master(int sock) {
    char tag;
    struct iovec iov = {.iov_base = &tag, .iov_len = 1};
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t n;
    while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {}
    struct cmsghdr *c = n == 1 ? CMSG_FIRSTHDR(&msg) : NULL;
    int fd = -1;
    if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
        memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return fd;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The engine's terminal (fd 0 in, `out` out) <-> the command's (master, non-blocking) until G
 * exits (sfd: a signalfd of SIGCHLD, SIGWINCH, SIGHUP). A hangup of the engine's terminal is the
 * command's terminal's (its master closes: the kernel sends its session SIGHUP). Then what the
 * command wrote is passed on, the engine's terminal gets its mode back and the master closes (a
 * background job still on the terminal is hung up, as when a terminal window closes). */
void relay_terminal(int master, int out, pid_t g, int sfd) {
    static char in[4096], buf[1 << 16];
    size_t inlen = 0, inoff = 0;
    int host = 1, quiet = 0;                     /* quiet: no one holds the command's terminal now */
    for (int done = 0; !done;) {
        struct pollfd p[3] = {{sfd, POLLIN, 0}, {-1, 0, 0}, {-1, 0, 0}};
        if (master >= 0 && !quiet) p[1] = (struct pollfd){master, (short)(POLLIN | (inoff < inlen ? POLLOUT : 0)), 0};
        if (host && master >= 0 && !quiet && inoff == inlen) p[2] = (struct pollfd){0, POLLIN, 0};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR) continue;        /* (a signal forwarded to the command) */
            break;
        }
        if (p[0].revents) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
                unsigned short ws[4];
                siginfo_t w = {0};
                if (si.ssi_signo == SIGWINCH && master >= 0 && ioctl(0, TIOCGWINSZ, ws) == 0)
                    ioctl(master, TIOCSWINSZ, ws);   /* the kernel tells the command's foreground job */
                else if (si.ssi_signo == SIGHUP)
                    host = 0;
                else if (si.ssi_signo == SIGCHLD && waitid(P_PID, (id_t)g, &w, WEXITED | WNOHANG | WNOWAIT) == 0 &&
                         w.si_pid == g)
                    done = 1;
            }
        }
        if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t got = read(master, buf, sizeof buf);
            if (got > 0 && host && write_all(out, buf, (size_t)got) < 0) host = 0;
            else if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) quiet = 1;   /* EIO */
        }
        if (p[2].revents) {
            ssize_t got = read(0, in, sizeof in);
            if (got > 0) { inlen = (size_t)got; inoff = 0; }
            else if (got == 0 || (errno != EAGAIN && errno != EINTR)) host = 0;
        }
        if (inoff < inlen && master >= 0 && !quiet && (p[2].revents || p[1].revents & POLLOUT)) {
            /* at once (a key costs one wakeup here); what the command's terminal cannot take yet
             * waits for POLLOUT, and we read no more meanwhile */
            ssize_t wr = write(master, in + inoff, inlen - inoff);
            if (wr > 0) inoff += (size_t)wr;
        }
        if (!host && master >= 0) {
            close(master);                       /* the engine's terminal hung up: so does the command's */
            master = -1;
        }
    }
    /* G exited: what it wrote before is in the master's buffer now (a read flushes the kernel's
     * queue first); a background job's endless output is not waited for */
    for (int k = 0; master >= 0 && host && k < 64; k++) {
        ssize_t got = read(master, buf, sizeof buf);
        if (got <= 0 || write_all(out, buf, (size_t)got) < 0) break;
    }
    if (tty_restore && host) tcsetattr(0, TCSANOW, &tty_saved);
    if (master >= 0) close(master);
}
