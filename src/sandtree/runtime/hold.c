/*
 * hold.c: a spawned command whose stdio stays inside the sandbox, so a hibernation keeps it
 * running (a part of sandtree-agent, agent.c, which dispatches these modes to it):
 *
 *   sandtree-agent --hold ID -- COMMAND...   (started as the command would be: its ids, cwd, env)
 *   sandtree-agent --attach ID
 *   sandtree-agent --start ID -- COMMAND...  (as --hold, but it leaves once H runs: no first R)
 *   sandtree-agent --await ID                 (as --attach, waiting a moment for H to listen)
 *   sandtree-agent --spawn                    (S: forks an H per command the engine asks for, below)
 *
 * Why: a command spawned with pipes to the engine (engine/processes/instances.py) is a child of a
 * helper outside the sandbox with its stdio leading outside, which no checkpoint can hold, so a
 * sandbox running one could not hibernate. Here the command is the child of a holder H, a process
 * of the sandbox's own (in a session of its own; R's child, adopted by the sandbox's pid 1 once R
 * is gone, as `cmd &` would be), which holds the command's stdin, stdout and stderr pipes. The
 * engine reaches H through a relay R, a process it starts in the sandbox with pipes: `--hold`'s
 * own process is the first (H uses its stdin and stdout itself while it idles); `--attach` starts
 * another, which copies bytes between its stdin/stdout and a unix socket to H, nothing more. Before
 * a hibernation the engine closes R's stdin (R ends, H keeps what the command writes meanwhile, up
 * to BACKLOG); after the resume it attaches again (held.py). Only R ever held the engine's pipes.
 * On gVisor, which kills at a restore whatever `runsc exec` started, descendants included (gVisor
 * #11544), H is started by `--start` through the agent (pid 1's descendants are kept), and R
 * (`--await`) by runsc exec.
 *
 * H listens on the abstract unix socket "sandtree-hold-ID" of the sandbox (one connection at a
 * time: a new one replaces the old) and takes only a peer of its own uid (SO_PEERCRED): another
 * user of the sandbox cannot feed the command's stdin or signal it. R likewise talks only to a
 * listener of its own uid (or root's: CRIU restores a listener as the sandbox's root).
 *
 * Frames both ways, native-endian u32 words: type len, then len bytes.
 *   to H    'i' stdin data   'c' close stdin   'k' u32 signal (to the command's process group)
 *   from H  'h' u32 H's pid, u32 the command's pid (at each connection's start)
 *           'o' stdout data  'e' stderr data   'f' u32 errno, then "exec" (it could not start)
 *           'x' u32 wait status (the last frame: H then leaves)
 * After the command's exit, what is in its pipes is passed on, then 'x'; pipes a background job
 * still holds are read and discarded till it closes them (it never meets a closed pipe). An exit
 * nobody is attached to is kept for LINGER seconds for an attach, then H leaves.
 */
#include <asm/unistd.h>
#include <linux/fcntl.h>

typedef unsigned int u32;
struct hpoll { int fd; short events, revents; };
struct sockaddr_hold { unsigned short family; char path[108]; };
struct ucred_ { int pid; u32 uid, gid; };

#define H_POLLIN 1
#define H_POLLOUT 4
#define H_EINTR 4
#define H_EAGAIN 11
#define H_ESRCH 3
#define H_SIGCHLD 17
#define H_SIGPIPE 13
#define H_AF_UNIX 1
#define H_SOCK_STREAM 1
#define H_SOCK_CLOEXEC 02000000
#define H_SOCK_NONBLOCK 04000
#define H_SOL_SOCKET 1
#define H_SO_PEERCRED 17
#define H_SHUT_WR 1
#define H_WNOHANG 1
#define H_ONB 04000
#define H_FIONREAD 0x541B
#define BACKLOG (1 << 20)              /* bytes kept while no engine is attached (the rest dropped) */
#define LINGER 600                     /* seconds an unattached exit waits for an attach */

#include "nolibc.h"

long execvpe_(char *const *av, char *const *ev);        /* agent.c */

static char hbuf[8 + (1 << 16)] __attribute__((aligned(8)));
static char ibuf[1 << 16];
static char backlog[BACKLOG];
static long blen;

static long hlen(const char *s) { long n = 0; while (s[n]) n++; return n; }

static void hsay(const char *a) { sys(__NR_write, 2, (long)a, hlen(a), 0); }

static int hwrite(int fd, const void *p, long n) {
    for (long off = 0; off < n;) {
        long w = sys(__NR_write, fd, (long)((const char *)p + off), n - off, 0);
        if (w == -H_EINTR) continue;
        if (w == -H_EAGAIN) {                  /* (a non-blocking fd: wait till it takes more) */
            struct hpoll p1 = {fd, H_POLLOUT, 0};
            sys(__NR_ppoll, (long)&p1, 1, 0, 0);
            continue;
        }
        if (w <= 0) return -1;
        off += w;
    }
    return 0;
}

static int hread(int fd, void *p, long n) {
    for (long off = 0; off < n;) {
        long r = sys(__NR_read, fd, (long)((char *)p + off), n - off, 0);
        if (r == -H_EINTR) continue;
        if (r <= 0) return -1;
        off += r;
    }
    return 0;
}

static long address(struct sockaddr_hold *a, const char *id) {
    static const char pre[] = "sandtree-hold-";
    long n = 0;
    a->family = H_AF_UNIX;
    a->path[n++] = 0;                          /* abstract: the sandbox's network namespace's */
    for (long k = 0; pre[k]; k++) a->path[n++] = pre[k];
    for (long k = 0; id[k] && n < (long)sizeof a->path; k++) a->path[n++] = id[k];
    return 2 + n;
}

/* getsockopt takes five arguments: the fifth (optlen) is passed through r8 */
static long getsockopt5(int s, int level, int name, void *val, u32 *len) {
#if defined(__x86_64__)
    long r;
    register long r10 __asm__("r10") = (long)val;
    register long r8 __asm__("r8") = (long)len;
    __asm__ volatile("syscall" : "=a"(r) : "a"(__NR_getsockopt), "D"(s), "S"(level), "d"(name), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return r;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = __NR_getsockopt, x0 __asm__("x0") = s, x1 __asm__("x1") = level,
                  x2 __asm__("x2") = name, x3 __asm__("x3") = (long)val, x4 __asm__("x4") = (long)len;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
#endif
}

static u32 peer(int s) {
    struct ucred_ c = {0, 0xffffffffu, 0};
    u32 len = sizeof c;
    if (getsockopt5(s, H_SOL_SOCKET, H_SO_PEERCRED, &c, &len) < 0) return 0xffffffffu;
    return c.uid;
}

/* ---- R: bytes between stdin/stdout and H's socket ------------------------------------------- */
/* Input waiting for the socket is kept here, and the socket is read meanwhile: H, blocked writing
 * output to us while it waits for its command to read its stdin, would otherwise wait on us as
 * we wait on it. */
static char rbuf[1 << 16];

__attribute__((noreturn)) static void relay(int s) {
    int in_open = 1, shut = 0;
    long rlen = 0, roff = 0;
    sys(__NR_fcntl, s, F_SETFL, H_ONB, 0);
    for (;;) {
        struct hpoll p[2];
        int n = 0, ii = -1;
        p[n++] = (struct hpoll){s, (short)(H_POLLIN | (rlen ? H_POLLOUT : 0)), 0};
        if (in_open && !rlen) { ii = n; p[n++] = (struct hpoll){0, H_POLLIN, 0}; }
        if (sys(__NR_ppoll, (long)p, n, 0, 0) < 0) continue;
        if (p[0].revents & ~H_POLLOUT) {
            long r = sys(__NR_read, s, (long)hbuf, sizeof hbuf, 0);
            if (r <= 0 && r != -H_EINTR && r != -H_EAGAIN) sys(__NR_exit_group, 0, 0, 0, 0);
            if (r > 0 && hwrite(1, hbuf, r) < 0) sys(__NR_exit_group, 0, 0, 0, 0);
        }
        if (ii >= 0 && p[ii].revents) {
            long r = sys(__NR_read, 0, (long)rbuf, sizeof rbuf, 0);
            if (r == 0 || (r < 0 && r != -H_EINTR && r != -H_EAGAIN)) in_open = 0;
            else if (r > 0) { rlen = r; roff = 0; }
        }
        if (rlen) {
            long w = sys(__NR_write, s, (long)(rbuf + roff), rlen - roff, 0);
            if (w > 0) roff += w;
            else if (w != -H_EAGAIN && w != -H_EINTR) sys(__NR_exit_group, 0, 0, 0, 0);
            if (roff == rlen) rlen = 0;
        }
        if (!in_open && !rlen && !shut) {
            sys(__NR_shutdown, s, H_SHUT_WR, 0, 0);   /* the engine lets go: H keeps the command */
            shut = 1;
        }
    }
}

/* `--attach ID`, or `--await ID`: the same, trying for AWAIT ms while no holder listens yet (a
 * relay started alongside the --start that makes its holder: gVisor's, held.py). */
#define AWAIT 3000

__attribute__((noreturn)) void hold_attach(const char *id, int patient) {
    sys(__NR_prctl, 15 /* PR_SET_NAME */, (long)"sandtree-hold", 0, 0);
    struct sockaddr_hold a;
    long alen = address(&a, id);
    unsigned long pipe_ = 1UL << (H_SIGPIPE - 1);
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&pipe_, 0, sizeof pipe_);
    u32 me = (u32)sys(__NR_getuid, 0, 0, 0, 0), it = 0;
    for (int tries = 0;; tries++) {
        int s = (int)sys(__NR_socket, H_AF_UNIX, H_SOCK_STREAM | H_SOCK_CLOEXEC, 0, 0);
        if (s >= 0 && sys(__NR_connect, s, (long)&a, alen, 0) == 0) {
            /* (a listener restored from a checkpoint has the restorer's credentials: the sandbox's root) */
            if ((it = peer(s)) != me && it != 0) break;
            relay(s);
        }
        if (s >= 0) sys(__NR_close, s, 0, 0, 0);
        if (!patient || tries >= AWAIT) break;
        struct { long sec, nsec; } ms = {0, 1000000};
        sys(__NR_nanosleep, (long)&ms, 0, 0, 0);
    }
    sys(__NR_exit_group, 3, 0, 0, 0);          /* no such holder (of ours): EOF, no hello */
    for (;;) {}
}

/* ---- H ------------------------------------------------------------------------------------ */
/* The connection to the engine: R's socket (both ends the same fd), or, from the start of
 * `--hold`, R's own stdin and stdout, which H uses itself (one hop less for every byte: R idles
 * meanwhile, waiting on `life` for H to let go). */
static int conn = -1, conn_w = -1, life = -1;

static void drop_conn(void) {
    if (conn >= 0) sys(__NR_close, conn, 0, 0, 0);
    if (conn_w >= 0 && conn_w != conn) sys(__NR_close, conn_w, 0, 0, 0);
    if (life >= 0) sys(__NR_close, life, 0, 0, 0);      /* R leaves (its stdio is no longer ours) */
    conn = conn_w = life = -1;
}
static long dropped;

static void frame(u32 type, const void *data, u32 len) {
    u32 *h = (u32 *)hbuf;
    h[0] = type;
    h[1] = len;
    if (data != hbuf + 8)
        for (u32 k = 0; k < len; k++) hbuf[8 + k] = ((const char *)data)[k];
    if (conn >= 0 && hwrite(conn_w, hbuf, 8 + len) == 0) return;
    if (conn >= 0) drop_conn();
    if (type == 'h') return;
    if (blen + 8 + len <= BACKLOG) {
        for (long k = 0; k < 8 + (long)len; k++) backlog[blen + k] = hbuf[k];
        blen += 8 + len;
    } else {
        dropped += len;
    }
}

static void hello(u32 me, u32 child) {
    u32 w[2] = {me, child};
    frame('h', w, sizeof w);
    if (conn >= 0 && blen) {
        if (hwrite(conn_w, backlog, blen) == 0) blen = 0;
        else drop_conn();
    }
}

/* What the command wrote to one pipe (fd): one read, as a frame; 0 once the pipe is closed. */
static int pass(int fd, u32 type) {
    long r = sys(__NR_read, fd, (long)(hbuf + 8), 1 << 16, 0);
    if (r == -H_EAGAIN || r == -H_EINTR) return 1;
    if (r <= 0) return 0;
    frame(type, hbuf + 8, (u32)r);
    return 1;
}

/* Our command line is the command's (from `--`): blanked once the command has its copy, so that
 * what looks for the command in the process table (ps, pkill -f) finds it, not us. */
static void hide(char **av) {
    for (int k = 0; av[k]; k++)
        for (char *c = av[k]; *c; c++) *c = 0;
    sys(__NR_prctl, 15 /* PR_SET_NAME */, (long)"sandtree-hold", 0, 0);
}

__attribute__((noreturn)) static void holder(int lfd, int pst, int pst_w, char **av, char **ev) {
    unsigned long chld = 1UL << (H_SIGCHLD - 1), blocked = chld | (1UL << (H_SIGPIPE - 1));
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&blocked, 0, sizeof blocked);
    int sfd = (int)sys(__NR_signalfd4, -1, (long)&chld, sizeof chld, H_SOCK_CLOEXEC | H_ONB);
    int pipes[3][2];
    for (int k = 0; k < 3; k++) pipes[k][0] = pipes[k][1] = -1;
    if (sys(__NR_pipe2, (long)pipes[0], O_CLOEXEC, 0, 0) < 0 || sys(__NR_pipe2, (long)pipes[1], O_CLOEXEC, 0, 0) < 0 ||
        sys(__NR_pipe2, (long)pipes[2], O_CLOEXEC, 0, 0) < 0) {
        u32 f[2] = {24 /* EMFILE */, 0};
        frame('f', f, 4);
        sys(__NR_exit_group, 1, 0, 0, 0);
    }
    long child = sys(__NR_clone, H_SIGCHLD, 0, 0, 0);
    if (child == 0) {
        unsigned long none = 0;
        sys(__NR_rt_sigprocmask, 2 /* SIG_SETMASK */, (long)&none, 0, sizeof none);
        sys(__NR_setsid, 0, 0, 0, 0);          /* its own group: a signal goes to it and its children */
        sys(__NR_dup3, pipes[0][0], 0, 0, 0);
        sys(__NR_dup3, pipes[1][1], 1, 0, 0);
        sys(__NR_dup3, pipes[2][1], 2, 0, 0);
        /* only the three pipes cross (every fd of ours is close-on-exec already: in case) */
        sys(436 /* close_range */, 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */, 0);
        long err = execvpe_(av, ev);
        u32 e = (u32)-err;
        sys(__NR_write, pst_w, (long)&e, 4, 0);
        sys(__NR_exit_group, 127, 0, 0, 0);
    }
    sys(__NR_close, pst_w, 0, 0, 0);
    hide(av);
    int in_w = pipes[0][1], out = pipes[1][0], err = pipes[2][0];
    sys(__NR_close, pipes[0][0], 0, 0, 0);
    sys(__NR_close, pipes[1][1], 0, 0, 0);
    sys(__NR_close, pipes[2][1], 0, 0, 0);
    u32 me = (u32)sys(__NR_getpid, 0, 0, 0, 0), uid = (u32)sys(__NR_getuid, 0, 0, 0, 0);
    hello(me, child > 0 ? (u32)child : 0);
    if (child < 0) {
        u32 f[2] = {(u32)-child, 0};
        frame('f', f, 4);
        sys(__NR_exit_group, 1, 0, 0, 0);
    }
    u32 e = 0;
    if (hread(pst, &e, 4) == 0) {              /* (EOF: its exec closed the pipe, it runs) */
        char f[8];
        u32 *fw = (u32 *)f;
        fw[0] = e;
        f[4] = 'e'; f[5] = 'x'; f[6] = 'e'; f[7] = 'c';
        frame('f', f, 8);
    }
    sys(__NR_close, pst, 0, 0, 0);
    sys(__NR_fcntl, in_w, F_SETFL, H_ONB, 0);
    sys(__NR_fcntl, out, F_SETFL, H_ONB, 0);
    sys(__NR_fcntl, err, F_SETFL, H_ONB, 0);
    int out_open = 1, err_open = 1, exited = 0, close_in = 0;
    u32 status = 0;
    long ilen = 0, ioff = 0;
    while (!exited || (conn < 0 && lfd >= 0)) {
        struct hpoll p[6];
        int n = 0, ic = -1, il = -1, io = -1, ie = -1, iw = -1, is = -1;
        if (conn >= 0 && !ilen && !exited) { ic = n; p[n++] = (struct hpoll){conn, H_POLLIN, 0}; }
        if (lfd >= 0) { il = n; p[n++] = (struct hpoll){lfd, H_POLLIN, 0}; }
        if (!exited) {
            if (out_open) { io = n; p[n++] = (struct hpoll){out, H_POLLIN, 0}; }
            if (err_open) { ie = n; p[n++] = (struct hpoll){err, H_POLLIN, 0}; }
            if (ilen && in_w >= 0) { iw = n; p[n++] = (struct hpoll){in_w, H_POLLOUT, 0}; }
            is = n; p[n++] = (struct hpoll){sfd, H_POLLIN, 0};
        }
        struct { long s, ns; } linger = {LINGER, 0};
        long pr = sys(__NR_ppoll, (long)p, n, exited ? (long)&linger : 0, 0);
        if (pr == 0) break;                    /* an exit nobody came for */
        if (pr < 0) continue;
        if (il >= 0 && p[il].revents) {
            int c = (int)sys(__NR_accept4, lfd, 0, 0, H_SOCK_CLOEXEC);
            if (c >= 0 && peer(c) != uid) {
                sys(__NR_close, c, 0, 0, 0);
            } else if (c >= 0) {
                drop_conn();
                conn = conn_w = c;
                hello(me, (u32)child);
                if (exited) frame('x', &status, 4);
            }
        }
        if (ic >= 0 && p[ic].revents) {
            u32 h[2];
            if (hread(conn, h, sizeof h) < 0 || h[1] > sizeof ibuf || hread(conn, ibuf, h[1]) < 0) {
                drop_conn();                      /* detached (or garbage): the command goes on */
            } else if (h[0] == 'i' && in_w >= 0) {
                ilen = h[1];
                ioff = 0;
            } else if (h[0] == 'c') {
                close_in = 1;
            } else if (h[0] == 'k' && h[1] == 4) {
                u32 sig = *(u32 *)ibuf;
                if (sig >= 1 && sig <= 64 && sys(__NR_kill, -child, sig, 0, 0) == -H_ESRCH)
                    sys(__NR_kill, child, sig, 0, 0);
            }
        }
        if (iw >= 0 && p[iw].revents) {
            long w = sys(__NR_write, in_w, (long)(ibuf + ioff), ilen - ioff, 0);
            if (w > 0) ioff += w;
            if (w < 0 && w != -H_EAGAIN && w != -H_EINTR) { ilen = 0; sys(__NR_close, in_w, 0, 0, 0); in_w = -1; }
            else if (ioff == ilen) ilen = 0;
        }
        if (close_in && !ilen && in_w >= 0) { sys(__NR_close, in_w, 0, 0, 0); in_w = -1; }
        if (io >= 0 && p[io].revents) out_open = pass(out, 'o');
        if (ie >= 0 && p[ie].revents) err_open = pass(err, 'e');
        if (is >= 0 && p[is].revents) {
            char info[128];
            while (sys(__NR_read, sfd, (long)info, sizeof info, 0) > 0) {}
            int st = 0;
            if (sys(__NR_wait4, child, (long)&st, H_WNOHANG, 0) == child) {
                /* what it wrote is in the pipes now: pass exactly that on, then its status */
                for (int k = 0; k < 2; k++) {
                    int fd = k ? err : out, left = 0;
                    if (!(k ? err_open : out_open)) continue;
                    if (sys(__NR_ioctl, fd, H_FIONREAD, (long)&left, 0) < 0) left = 0;
                    while (left > 0) {
                        long got = sys(__NR_read, fd, (long)(hbuf + 8), left < (1 << 16) ? left : (1 << 16), 0);
                        if (got <= 0) break;
                        frame(k ? 'e' : 'o', hbuf + 8, (u32)got);
                        left -= (int)got;
                    }
                }
                status = (u32)st;
                exited = 1;
                if (in_w >= 0) { sys(__NR_close, in_w, 0, 0, 0); in_w = -1; }
                if (conn >= 0) frame('x', &status, 4);
                if (conn >= 0) break;
            }
        }
    }
    /* told (or nobody came): the name goes; pipes a background job holds are read till it lets go */
    drop_conn();
    if (lfd >= 0) sys(__NR_close, lfd, 0, 0, 0);
    while (out_open || err_open) {
        struct hpoll p[2];
        int n = 0;
        if (out_open) p[n++] = (struct hpoll){out, H_POLLIN, 0};
        if (err_open) p[n++] = (struct hpoll){err, H_POLLIN, 0};
        if (sys(__NR_ppoll, (long)p, n, 0, 0) < 0) continue;
        for (int k = 0; k < n; k++) {
            if (!p[k].revents) continue;
            long r = sys(__NR_read, p[k].fd, (long)hbuf, sizeof hbuf, 0);
            if (r == 0 || (r < 0 && r != -H_EAGAIN && r != -H_EINTR)) {
                if (p[k].fd == out) out_open = 0; else err_open = 0;
            }
        }
    }
    sys(__NR_exit_group, 0, 0, 0, 0);
    for (;;) {}
}

struct ksigaction { unsigned long handler, flags, restorer, mask; };

static void set_sigchld(int ignored) {
    struct ksigaction a = {ignored ? 1UL /* SIG_IGN */ : 0UL /* SIG_DFL */, 0, 0, 0};
    sys(__NR_rt_sigaction, H_SIGCHLD, (long)&a, 0, 8);
}

/* `--hold ID -- COMMAND...`: starts H (adopted by the sandbox's pid 1), then is the first R.
 * `--start ID -- COMMAND...` (relay 0): starts H and leaves; an `--attach` then reaches it. */
__attribute__((noreturn)) void hold_main(const char *id, char **av, char **ev, int relay_too) {
    if (!av[0]) { hsay("sandtree-agent --hold: no command\n"); sys(__NR_exit_group, 127, 0, 0, 0); }
    unsigned long pipe_ = 1UL << (H_SIGPIPE - 1);
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&pipe_, 0, sizeof pipe_);
    struct sockaddr_hold a;
    long alen = address(&a, id);
    int lp[2] = {-1, -1}, pst[2] = {-1, -1};
    int lfd = (int)sys(__NR_socket, H_AF_UNIX, H_SOCK_STREAM | H_SOCK_CLOEXEC, 0, 0);
    if (lfd < 0 || sys(__NR_bind, lfd, (long)&a, alen, 0) < 0 || sys(__NR_listen, lfd, 4, 0, 0) < 0 ||
        sys(__NR_pipe2, (long)lp, O_CLOEXEC, 0, 0) < 0 ||
        sys(__NR_pipe2, (long)pst, O_CLOEXEC, 0, 0) < 0) {
        hsay("sandtree-agent --hold: cannot make its socket\n");
        sys(__NR_exit_group, 125, 0, 0, 0);
    }
    /* H is our child, in a session of its own (a signal to R's group spares it), adopted by the
     * sandbox's pid 1 once we are gone (before a checkpoint, we are); if it ends first, the kernel
     * reaps it (SIGCHLD ignored here) */
    set_sigchld(1);
    long k = sys(__NR_clone, H_SIGCHLD, 0, 0, 0);
    if (k == 0) {
        set_sigchld(0);                          /* (H waits for its command) */
        sys(__NR_setsid, 0, 0, 0, 0);
        sys(__NR_close, lp[0], 0, 0, 0);
        if (relay_too) {                         /* R's stdin and stdout: ours to use till we let go */
            conn = (int)sys(__NR_fcntl, 0, F_DUPFD_CLOEXEC, 3, 0);
            conn_w = (int)sys(__NR_fcntl, 1, F_DUPFD_CLOEXEC, 3, 0);
            life = lp[1];
            if (conn < 0 || conn_w < 0) drop_conn();
        } else {
            sys(__NR_close, lp[1], 0, 0, 0);
        }
        /* R's stdio is the engine's: not ours to hold */
        int nul = (int)sys(__NR_openat, AT_FDCWD, (long)"/dev/null", O_RDWR | O_CLOEXEC, 0);
        for (int fd = 0; fd < 3; fd++) {
            if (nul >= 0) sys(__NR_dup3, nul, fd, 0, 0);
            else sys(__NR_close, fd, 0, 0, 0);
        }
        if (nul > 2) sys(__NR_close, nul, 0, 0, 0);
        holder(lfd, pst[0], pst[1], av, ev);
    }
    sys(__NR_close, lp[1], 0, 0, 0);
    sys(__NR_close, lfd, 0, 0, 0);
    sys(__NR_close, pst[0], 0, 0, 0);
    sys(__NR_close, pst[1], 0, 0, 0);
    if (k < 0) { hsay("sandtree-agent --hold: cannot fork\n"); sys(__NR_exit_group, 125, 0, 0, 0); }
    hide(av);
    if (!relay_too) sys(__NR_exit_group, 0, 0, 0, 0);
    /* H talks to the engine on our stdio: we stay (the engine's end of it reads our output only
     * while we run) until H lets go (EOF on life), then leave */
    char one;
    while (sys(__NR_read, lp[0], (long)&one, 1, 0) == -H_EINTR) {}
    sys(__NR_exit_group, 0, 0, 0, 0);
    for (;;) {}
}

/* ---- S: the sandbox's spawner ------------------------------------------------------------- */
/* `--spawn`: a process of the sandbox (started once by an enter, as its root, with its
 * capabilities, seccomp filter, rlimits and no_new_privs: held.py's Spawner) that makes an H for
 * each command the engine asks for, so that a command costs a fork, not an enter and an exec.
 * fd 0 is a SOCK_SEQPACKET socket of the engine's: each message is one byte with a SCM_RIGHTS fd,
 * a stream socket whose other end the engine reads as a relay's stdout (frames as above). S forks
 * H, which reads its spec from that socket:
 *   u32 len, then len bytes of NUL-terminated words: key, cwd, uid, gid, groups (1: setgroups to
 *   the gid, 0: leave them, as an enter without a gid map), n_env, n_env "K=V", then argv
 * and becomes the command's holder with that socket as its connection: an --attach finds it
 * under the key as any other H. S answers 'r' once when it runs (a child of the enter's command,
 * which exits: S is pid 1's, as a holder is); it leaves at EOF (the engine lets it go before a
 * checkpoint, which cannot hold its socket: its end's POLLHUP says it left), its H's go on.
 * Nothing of S's crosses into a command but what any process of the sandbox's root could give
 * it: H drops to the command's ids, and the command gets only its three pipes. */
#define SPEC_MAX (1 << 21)
static char spec[SPEC_MAX + 1];
static char *sav[SPEC_MAX / 2 / sizeof(char *)];

static long num_(const char *s) {
    long v = 0;
    while (*s >= '0' && *s <= '9') v = v * 10 + (*s++ - '0');
    return v;
}

/* H before its command could start: the engine hears why ('f' errno step), then 126 as an enter's. */
__attribute__((noreturn)) static void refuse(u32 err, const char *step) {
    char f[4 + 16];
    u32 n = 4;
    *(u32 *)f = err;
    for (long k = 0; step[k] && n < sizeof f; k++) f[n++] = step[k];
    hello((u32)sys(__NR_getpid, 0, 0, 0, 0), 0);
    frame('f', f, n);
    u32 st = 126 << 8;
    frame('x', &st, 4);
    sys(__NR_exit_group, 126, 0, 0, 0);
    for (;;) {}
}

__attribute__((noreturn)) static void spawn_one(int c) {
    sys(__NR_prctl, 15 /* PR_SET_NAME */, (long)"sandtree-hold", 0, 0);
    conn = conn_w = c;                       /* the engine's, for frames from the start */
    u32 len = 0;
    if (hread(c, &len, 4) < 0 || len > SPEC_MAX || hread(c, spec, len) < 0) sys(__NR_exit_group, 125, 0, 0, 0);
    spec[len] = 0;
    long n = 0;
    for (long k = 0; k < len && n < (long)(sizeof sav / sizeof sav[0]) - 2; k++)
        if (k == 0 || spec[k - 1] == 0) sav[n++] = spec + k;
    if (n < 7) refuse(22 /* EINVAL */, "spec");
    const char *key = sav[0], *cwd = sav[1];
    long uid = num_(sav[2]), gid = num_(sav[3]), groups = num_(sav[4]), nenv = num_(sav[5]);
    if (nenv < 0 || 6 + nenv >= n) refuse(22, "spec");
    /* the env, then a NULL, then argv, then a NULL: argv moves up by one */
    for (long k = n; k > 6 + nenv; k--) sav[k] = sav[k - 1];
    sav[6 + nenv] = 0;
    sav[n + 1] = 0;
    char **ev = sav + 6, **av = sav + 6 + nenv + 1;
    /* as an enter's command (helper/command.c become_command): cwd (as root), groups and ids */
    long e = sys(__NR_chdir, (long)cwd, 0, 0, 0);
    if (e < 0) refuse((u32)-e, "cwd");
    u32 g = (u32)gid;
    if ((groups && (e = sys(__NR_setgroups, 1, (long)&g, 0, 0)) < 0) ||
        (e = sys(__NR_setresgid, gid, gid, gid, 0)) < 0 || (e = sys(__NR_setresuid, uid, uid, uid, 0)) < 0)
        refuse((u32)-e, "ids");
    sys(__NR_prctl, 4 /* PR_SET_DUMPABLE */, 1, 0, 0);      /* as a holder exec'd by an enter is */
    struct sockaddr_hold a;
    long alen = address(&a, key);
    int pst[2] = {-1, -1};
    int lfd = (int)sys(__NR_socket, H_AF_UNIX, H_SOCK_STREAM | H_SOCK_CLOEXEC, 0, 0);
    if (lfd < 0 || (e = sys(__NR_bind, lfd, (long)&a, alen, 0)) < 0 || (e = sys(__NR_listen, lfd, 4, 0, 0)) < 0 ||
        (e = sys(__NR_pipe2, (long)pst, O_CLOEXEC, 0, 0)) < 0)
        refuse((u32)(lfd < 0 ? -lfd : -e), "hold");
    set_sigchld(0);                             /* (H waits for its command) */
    sys(__NR_setsid, 0, 0, 0, 0);
    holder(lfd, pst[0], pst[1], av, ev);
}

__attribute__((noreturn)) void spawn_main(void) {
    sys(__NR_prctl, 15 /* PR_SET_NAME */, (long)"sandtree-spawn", 0, 0);
    /* no process of the sandbox attaches to us (we hold the engine's socket); each H is made
     * dumpable again as it takes its command's ids (a checkpoint dumps it) */
    sys(__NR_prctl, 4 /* PR_SET_DUMPABLE */, 0, 0, 0);
    int ctl = (int)sys(__NR_fcntl, 0, F_DUPFD_CLOEXEC, 3, 0);
    int nul = (int)sys(__NR_openat, AT_FDCWD, (long)"/dev/null", O_RDWR | O_CLOEXEC, 0);
    for (int fd = 0; fd < 3; fd++) {
        if (nul >= 0) sys(__NR_dup3, nul, fd, 0, 0);
        else sys(__NR_close, fd, 0, 0, 0);
    }
    if (nul > 2) sys(__NR_close, nul, 0, 0, 0);
    if (ctl < 0) sys(__NR_exit_group, 125, 0, 0, 0);
    unsigned long pipe_ = 1UL << (H_SIGPIPE - 1);
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&pipe_, 0, sizeof pipe_);
    set_sigchld(1);                             /* our H's are reaped by the kernel */
    /* S itself is our child, adopted by the sandbox's pid 1 once we exit, so the enter that
     * started us ends at once (nothing of the engine's stays outside; an idle sandbox is idle) */
    long me = sys(__NR_clone, H_SIGCHLD, 0, 0, 0);
    if (me < 0) sys(__NR_exit_group, 125, 0, 0, 0);
    if (me > 0) sys(__NR_exit_group, 0, 0, 0, 0);
    char r = 'r';
    if (sys(__NR_write, ctl, (long)&r, 1, 0) != 1) sys(__NR_exit_group, 0, 0, 0, 0);
    for (;;) {
        char one;
        struct iovec_ { void *base; unsigned long len; } iov = {&one, 1};
        union { char buf[24]; unsigned long align; } cm;
        struct { void *name; u32 namelen; struct iovec_ *iov; unsigned long iovlen; void *control;
                 unsigned long controllen; int flags; } msg = {0, 0, &iov, 1, cm.buf, sizeof cm.buf, 0};
        long got = sys(__NR_recvmsg, ctl, (long)&msg, 0x40000000 /* MSG_CMSG_CLOEXEC */, 0);
        if (got == -H_EINTR) continue;
        if (got <= 0) sys(__NR_exit_group, 0, 0, 0, 0);     /* the engine let go */
        /* struct cmsghdr: u64 len, int level, int type, then the fd */
        int fd = -1;
        if (msg.controllen >= 20 && *(unsigned long *)cm.buf >= 20 && *(int *)(cm.buf + 8) == H_SOL_SOCKET &&
            *(int *)(cm.buf + 12) == 1 /* SCM_RIGHTS */)
            fd = *(int *)(cm.buf + 16);
        if (fd < 0) continue;
        long k = sys(__NR_clone, H_SIGCHLD, 0, 0, 0);
        if (k == 0) {
            sys(__NR_close, ctl, 0, 0, 0);       /* H holds its own connection, never S's */
            spawn_one(fd);
        }
        sys(__NR_close, fd, 0, 0, 0);            /* (a failed fork: the engine reads EOF, no hello) */
    }
}
