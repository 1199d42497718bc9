/*
 * sandtree-drain: the reader of an `exec`'s output inside a live sandbox (helper/relay.c starts it).
 *
 * Why: an exec's command used to write straight into the engine's pipes. The exec returns when
 * the command exits, and the engine closes its ends then; a background job the command left
 * (`python3 -m http.server &`, `while :; do echo x; sleep 1; done &`) then died of SIGPIPE (or
 * EPIPE) at its next write. Now the command's stdout and stderr are pipes to this process, a
 * process of the sandbox itself: it passes what comes on to the engine until the command has
 * exited, then closes the engine's pipes (the engine reads to that EOF, so no output of the
 * command is lost) and from then on reads and discards, for as long as anything holds the
 * pipes. It exits when nothing does.
 *
 * Why a program of its own, without libc: like sandtree-init, it must be checkpointable by CRIU
 * (a hibernated sandbox keeps its background jobs, so both ends of their pipes must be inside),
 * so its executable is a copy on the sandbox's own /dev/shm that never has a name (CRIU saves it
 * as a deleted file, about 1 KB). It runs with the command's ids, capabilities,
 * no_new_privs and seccomp filter: it holds nothing the command did not hold.
 *
 * fds: 0 the command's stdout pipe, 1 and 2 the engine's stdout and stderr, 3 the command's
 * stderr pipe (0 and 3 non-blocking), 4 a unix socket on which a pidfd of the command comes
 * (SCM_RIGHTS) before the command runs: a drain may be started before its command exists (a
 * warm pool's, helper/relay.c start_relay), and one whose command never comes (EOF) exits at once.
 * SIGPIPE is ignored (set by helper/relay.c; dispositions survive execve): an engine that went away
 * only stops the forwarding.
 */
#include <asm/unistd.h>
#include <linux/prctl.h>

#define POLLIN 1
#define EINTR 4
#define EAGAIN 11
#define FIONREAD 0x541B

#define SOL_SOCKET 1
#define SCM_RIGHTS 1
#define MSG_CMSG_CLOEXEC 0x40000000
#define O_CLOEXEC 02000000

struct pollfd { int fd; short events, revents; };
struct iovec { void *base; unsigned long len; };
struct msghdr { void *name; int namelen; struct iovec *iov; unsigned long iovlen; void *control;
                unsigned long controllen; unsigned flags; };
struct cmsg_fd { unsigned long len; int level, type, fd, pad; };     /* CMSG_SPACE(sizeof(int)) */

#include "nolibc.h"

NOLIBC_START(drain_main)

/* (all zero-initialised: no .data section, which would pad the file to a page) */
static char buf[1 << 16];
static int exited;                     /* the command exited: stop forwarding */
static int broken[2];                  /* the engine's stdout, stderr no longer take data */

/* Returns 0 if the engine's end is closed (it stopped reading). */
static int pass(int sink, long n) {
    if (exited || broken[sink - 1]) return !broken[sink - 1];
    for (long off = 0; off < n;) {
        long w = sys(__NR_write, sink, (long)(buf + off), n - off, 0);
        if (w == -EINTR) continue;
        if (w <= 0) { broken[sink - 1] = 1; return 0; }
        off += w;
    }
    return 1;
}

/* One read of src; returns 0 once src is closed: at EOF (nothing holds the pipe any more), or
 * when the engine stopped reading while the command runs (popen's caller closed its end): the
 * command then meets the closed pipe itself (SIGPIPE, EPIPE), as without a relay. */
static int move(int src, int sink, long max) {
    long n = sys(__NR_read, src, (long)buf, max < (long)sizeof buf ? max : (long)sizeof buf, 0);
    if (n == 0 || (n > 0 && !pass(sink, n) && !exited)) {
        sys(__NR_close, src, 0, 0, 0);
        return 0;
    }
    return 1;
}

/* The command's pidfd, from the socket on fd 4, becomes fd 4; 0 if none comes. */
static int take_pidfd(void) {
    char one;
    struct iovec iov = {&one, 1};
    struct cmsg_fd c = {0};
    struct msghdr m = {0, 0, &iov, 1, &c, sizeof c, 0};
    long n;
    while ((n = sys(__NR_recvmsg, 4, (long)&m, MSG_CMSG_CLOEXEC, 0)) == -EINTR) {}
    if (n <= 0 || m.controllen < sizeof c - sizeof c.pad || c.level != SOL_SOCKET || c.type != SCM_RIGHTS)
        return 0;
    return sys(__NR_dup3, c.fd, 4, O_CLOEXEC, 0) == 4 && sys(__NR_close, c.fd, 0, 0, 0) == 0;
}

__attribute__((noreturn, used)) void drain_main(void) {
    int open_out = 1, open_err = 1;
    sys(__NR_prctl, PR_SET_NAME, (long)"sandtree-drain", 0, 0);
    if (!take_pidfd()) {                 /* its command never came: nothing was written */
        sys(__NR_exit, 0, 0, 0, 0);
        for (;;) {}
    }
    while (open_out || open_err) {
        struct pollfd p[3];
        int n = 0;
        if (open_out) p[n++] = (struct pollfd){0, POLLIN, 0};
        if (open_err) p[n++] = (struct pollfd){3, POLLIN, 0};
        if (!exited) p[n++] = (struct pollfd){4, POLLIN, 0};
        if (sys(__NR_ppoll, (long)p, n, 0, 0) < 0) continue;
        for (int k = 0; k < n; k++) {
            if (!p[k].revents) continue;
            if (p[k].fd == 4) {
                /* The command exited: what it wrote is in the pipes now. Pass on exactly that
                 * (a background job may write on forever), then let the engine see EOF. */
                for (int src = 0; src <= 3; src += 3) {
                    if (src == 0 ? !open_out : !open_err) continue;
                    int left = 0;
                    if (sys(__NR_ioctl, src, FIONREAD, (long)&left, 0) < 0) left = 0;
                    while (left > 0) {
                        long got = sys(__NR_read, src, (long)buf, left < (int)sizeof buf ? left : (int)sizeof buf, 0);
                        if (got <= 0) break;
                        pass(src == 0 ? 1 : 2, got);
                        left -= (int)got;
                    }
                }
                /* The pidfd first: once the engine sees EOF it may hibernate the sandbox at
                 * once, and CRIU must find nothing here but the pipes. */
                exited = 1;
                sys(__NR_close, 4, 0, 0, 0);
                sys(__NR_close, 1, 0, 0, 0);
                sys(__NR_close, 2, 0, 0, 0);
            } else if (p[k].fd == 0) {
                open_out = move(0, 1, sizeof buf);
            } else {
                open_err = move(3, 2, sizeof buf);
            }
        }
    }
    sys(__NR_exit, 0, 0, 0, 0);
    for (;;) {}
}
