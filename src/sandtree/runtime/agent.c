/*
 * sandtree-agent: pid 1 of a live gVisor sandbox (gvisor_live.py), which starts the sandbox's
 * commands itself.
 *
 * Why: entering gVisor from the host takes `runsc exec`, a Go program's start (~20 ms of a ~30 ms
 * exec), and gVisor kills what runsc exec started when it restores a checkpoint (gVisor #11544).
 * The agent is already inside: a command is a fork and an exec in the Sentry, and its processes
 * are pid 1's descendants, which a checkpoint keeps. It holds nothing of the host's: it runs as
 * the sandbox's root with the sandbox's capabilities and no_new_privs (its OCI process), and
 * every command it starts could have been started by any process of the sandbox.
 *
 * Its stdin and stdout are pipes the helper P holds (helper/gvisor.c live_runtime) and lends to one
 * engine process at a time. Frames, native-endian u32 words:
 *   request  "STRQ" id words_len stdin_len, then words (NUL-terminated: cwd, uid, gid, n_env,
 *            n_env "K=V", then argv), then stdin_len bytes of the command's stdin (at most
 *            MAXIN: read whole first, so fd 0 is free for signal frames while it runs)
 *   signal   "STSG" id sig 0: signal the running command's process group
 *   reply    "STRS" id type len, then len bytes: 'o' stdout, 'e' stderr, 'x' the wait status
 *            (u32) and whether no other process is left in the sandbox (u32 1/0: alone(); an
 *            older agent's 'x' has the status only), 'f' a failed start (u32 errno, then "exec"
 *            or "cwd")
 * One command at a time; its exit ends its reply ('x' after all the output it wrote). Pipes a
 * background job still holds are read and discarded from then on (it never meets a closed pipe).
 * Orphans are reaped (signalfd on SIGCHLD).
 */
#include <asm/unistd.h>
#include <linux/fcntl.h>
#include <linux/prctl.h>

#define POLLIN 1
#define POLLOUT 4
#define POLLHUP 16
#define EINTR 4
#define EAGAIN 11
#define ENOENT 2
#define E2BIG 7
#define ECHILD 10
#define SIGCHLD 17
#define SIGKILL 9
#define WNOHANG 1
#define O_NONBLOCK_ 04000
#define SFD_CLOEXEC 02000000
#define MAXW 4096
#define MAXDRAIN 64

struct pollfd { int fd; short events, revents; };
typedef unsigned int u32;

#include "nolibc.h"

NOLIBC_START(agent_main)

static char words[1 << 18];        /* a request's words (the engine caps a spec well below) */
static char *argv_[MAXW], *envp[MAXW];
static char buf[1 << 16];
#define MAXIN (4 << 20)             /* a request's stdin, read whole before the command starts */
static char inbuf[MAXIN];
static int drains[MAXDRAIN];
static int ndrain;

static long slen(const char *s) { long n = 0; while (s[n]) n++; return n; }

static long num(const char *s) {
    long v = 0;
    while (*s >= '0' && *s <= '9') v = v * 10 + (*s++ - '0');
    return v;
}

static int read_full(int fd, void *p, long n) {
    for (long off = 0; off < n;) {
        long r = sys(__NR_read, fd, (long)((char *)p + off), n - off, 0);
        if (r == -EINTR) continue;
        if (r <= 0) return -1;
        off += r;
    }
    return 0;
}

static void write_full(int fd, const void *p, long n) {
    for (long off = 0; off < n;) {
        long w = sys(__NR_write, fd, (long)((const char *)p + off), n - off, 0);
        if (w == -EINTR) continue;
        if (w <= 0) return;             /* nobody reads: the engine went away */
        off += w;
    }
}

/* A reply frame is one write (the engine wakes once per frame, not once per part): its header,
 * then its data, which output reads put in place already (frame + 16). */
static char frame[16 + (1 << 16)] __attribute__((aligned(8)));

static void reply(u32 id, u32 type, const void *data, u32 len) {
    u32 *h = (u32 *)frame;
    h[0] = 0x53525453 /* "STRS" */; h[1] = id; h[2] = type; h[3] = len;
    if (data != frame + 16)
        for (u32 k = 0; k < len; k++) frame[16 + k] = ((const char *)data)[k];
    write_full(1, frame, 16 + len);
}

long execvpe_(char *const *av, char *const *ev);
__attribute__((noreturn)) void hold_main(const char *id, char **av, char **ev, int relay_too);     /* hold.c */
__attribute__((noreturn)) void hold_attach(const char *id, int patient);
__attribute__((noreturn)) void spawn_main(void);

/* The command, in the child: ids, cwd, then execve along PATH (as execvpe). Never returns. A
 * failure is left in `fail` (errno, then 'i' ids, 'c' cwd or 'e' exec): the child shares our memory
 * until its execve (vfork_run), so we read it once we resume. */
static volatile u32 fail[2];

static int plain_root;              /* we are 0:0 everywhere with no groups (main): root's commands keep ours */

static void become(const char *cwd, long uid, long gid, char *const *av, char *const *ev) {
    sys(__NR_setsid, 0, 0, 0, 0);
    /* (each system call here is a round trip to the Sentry: those that would change nothing go) */
    if (!(plain_root && uid == 0 && gid == 0) &&
        (sys(__NR_setgroups, 0, 0, 0, 0) < 0 || sys(__NR_setresgid, gid, gid, gid, 0) < 0 ||
         sys(__NR_setresuid, uid, uid, uid, 0) < 0)) {
        fail[0] = 1; fail[1] = 'i';
        sys(__NR_exit_group, 126, 0, 0, 0);
    }
    long e = cwd[0] == '/' && !cwd[1] ? 0 : sys(__NR_chdir, (long)cwd, 0, 0, 0);   /* (ours is /) */
    if (e < 0) {
        fail[0] = (u32)-e; fail[1] = 'c';
        sys(__NR_exit_group, 126, 0, 0, 0);
    }
    long err = execvpe_(av, ev);
    fail[0] = (u32)-err; fail[1] = 'e';
    sys(__NR_exit_group, 127, 0, 0, 0);
}

/* execve along PATH (as execvpe); returns the error that counts (EACCES & co. win over ENOENT). */
long execvpe_(char *const *av, char *const *ev) {
    const char *path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    for (int k = 0; ev[k]; k++)
        if (ev[k][0] == 'P' && ev[k][1] == 'A' && ev[k][2] == 'T' && ev[k][3] == 'H' && ev[k][4] == '=') path = ev[k] + 5;
    long err = -ENOENT;
    const char *name = av[0];
    int slash = 0;
    for (const char *c = name; *c; c++) if (*c == '/') slash = 1;
    if (slash) {
        err = sys(__NR_execve, (long)name, (long)av, (long)ev, 0);
    } else {
        static char full[4096];
        long nl = slen(name);
        for (const char *p = path; ; ) {
            const char *end = p;
            while (*end && *end != ':') end++;
            long dl = end - p;
            if (dl + nl + 2 < (long)sizeof full) {
                long i = 0;
                for (; i < dl; i++) full[i] = p[i];
                if (dl == 0) full[i++] = '.';
                full[i++] = '/';
                for (long j = 0; j <= nl; j++) full[i + j] = name[j];
                long r = sys(__NR_execve, (long)full, (long)av, (long)ev, 0);
                if (r != -ENOENT && err == -ENOENT) err = r;   /* (EACCES & co. win over ENOENT) */
            }
            if (!*end) break;
            p = end + 1;
        }
    }
    return err;
}

/*
 * The command's process is started as vfork does (CLONE_VM | CLONE_VFORK): it shares our memory
 * until its execve, and we wait meanwhile. A fork would copy our address space, which in gVisor
 * is a new address space of the Sentry's (and its stub process on the host) plus a fault per page
 * either of us writes afterwards: ~3 ms of a command's ~10 here, vs ~0.2 ms. The child runs on its
 * own stack (cstack: ours must stay as it is for when we resume), in a copy of our fd table, with
 * its own credentials and signal mask: all it changes before its execve is its own.
 */
struct start { int fds[3]; const char *cwd; long uid, gid; };
static char cstack[1 << 16] __attribute__((aligned(16)));

__attribute__((noreturn, used)) static void start_child(struct start *s) {
    unsigned long none = 0;
    sys(__NR_rt_sigprocmask, 2 /* SIG_SETMASK */, (long)&none, 0, sizeof none);
    for (int k = 0; k < 3; k++) sys(__NR_dup3, s->fds[k], k, 0, 0);
    become(s->cwd, s->uid, s->gid, argv_, envp);
    __builtin_unreachable();
}

/* clone(CLONE_VM | CLONE_VFORK | SIGCHLD) with `stack` (its top, 16-aligned) for the child, which
 * calls fn(arg) there and never returns; in the parent: the child's pid or -errno, once the child
 * has exec'd or exited. fn and arg travel on the child's stack (the only memory both sides see
 * that no register of the syscall clobbers). */
long vfork_run(void (*fn)(struct start *), struct start *arg, char *stack);
#if defined(__x86_64__)
__asm__(".text\n.type vfork_run,@function\nvfork_run:\n"
        " sub $16, %rdx\n mov %rdi, 8(%rdx)\n mov %rsi, (%rdx)\n mov %rdx, %rsi\n"
        " mov $0x4111, %edi\n xor %edx, %edx\n xor %r10d, %r10d\n xor %r8d, %r8d\n"
        " mov $56, %eax\n syscall\n test %rax, %rax\n jnz 1f\n"
        " pop %rdi\n pop %rax\n xor %ebp, %ebp\n call *%rax\n hlt\n"
        "1: ret\n");
#elif defined(__aarch64__)
__asm__(".text\n.type vfork_run,%function\nvfork_run:\n"
        " stp x0, x1, [x2, #-16]!\n mov x1, x2\n mov x0, #0x4111\n mov x2, xzr\n mov x3, xzr\n"
        " mov x4, xzr\n mov x8, #220\n svc 0\n cbnz x0, 1f\n"
        " ldp x9, x0, [sp], #16\n mov x29, xzr\n mov x30, xzr\n blr x9\n brk #0\n"
        "1: ret\n");
#endif

static void drain_add(int fd) {
    if (ndrain < MAXDRAIN) drains[ndrain++] = fd;
    else sys(__NR_close, fd, 0, 0, 0);
}

/* Read and discard what background jobs write (their pipes are ours till they close them). */
static void drain_poll(struct pollfd *p, int n) {
    for (int k = 0; k < n; k++) {
        if (!p[k].revents) continue;
        long r = sys(__NR_read, p[k].fd, (long)buf, sizeof buf, 0);
        if (r == 0 || (r < 0 && r != -EAGAIN && r != -EINTR)) {
            sys(__NR_close, p[k].fd, 0, 0, 0);
            for (int j = 0; j < ndrain; j++) if (drains[j] == p[k].fd) drains[j] = drains[--ndrain];
        }
    }
}

static int sigfd;
static int reap(int child, int *status) {      /* 1 once `child` has been reaped */
    int got = 0;
    char info[128];
    sys(__NR_read, sigfd, (long)info, sizeof info, 0);
    for (;;) {
        int st = 0;
        long pid = sys(__NR_wait4, -1, (long)&st, WNOHANG, 0);
        if (pid <= 0) break;
        if (pid == child) { *status = st; got = 1; }
    }
    return got;
}

/* The next command's output pipes, made while the agent waits for it (off its path): [0] ours
 * (non-blocking), [1] the command's; -1 when not made. A command given no stdin reads `nostdin`,
 * the read end of a pipe nobody can write (EOF at once), shared by all of them. */
static int nout[2] = {-1, -1}, nerr[2] = {-1, -1}, nostdin = -1;

static long out_pipe(int *p) {
    if (p[0] >= 0) return 0;
    long e = sys(__NR_pipe2, (long)p, O_CLOEXEC, 0, 0);
    if (e < 0) { p[0] = p[1] = -1; return e; }
    sys(__NR_fcntl, p[0], F_SETFL, O_NONBLOCK_, 0);
    return 0;
}

static void prepare(void) {
    out_pipe(nout);
    out_pipe(nerr);
    if (nostdin < 0) {
        int p[2];
        if (sys(__NR_pipe2, (long)p, O_CLOEXEC, 0, 0) == 0) { sys(__NR_close, p[1], 0, 0, 0); nostdin = p[0]; }
    }
}

/* 1 if no process but us is left in the sandbox: every process in it descends from pid 1 (orphans
 * are re-parented to us) but those `runsc exec` started, which the engine knows of. Then nothing
 * inside can write to its files any more (a pool's commit need not stop the sandbox first). */
static u32 alone(void) {
    for (;;) {
        int st;
        long r = sys(__NR_wait4, -1, (long)&st, WNOHANG, 0);
        if (r == -ECHILD) return 1;
        if (r <= 0) return 0;            /* (r > 0: one more reaped; ask again) */
    }
}

static void run(u32 id, u32 wlen, long have) {
    /* words: cwd uid gid n_env env... argv... */
    char *w = words, *end = words + wlen;
    char *field[4];
    for (int k = 0; k < 4; k++) { field[k] = w; w += slen(w) + 1; if (w > end) return; }
    long nenv = num(field[3]), ne = 0, na = 0;
    while (w < end && ne < nenv && ne < MAXW - 1) { envp[ne++] = w; w += slen(w) + 1; }
    while (w < end && na < MAXW - 1) { argv_[na++] = w; w += slen(w) + 1; }
    envp[ne] = 0;
    argv_[na] = 0;
    u32 bad[2] = {E2BIG, 'e'};
    if (!na) { reply(id, 'f', bad, sizeof bad); return; }
    int pin[2] = {nostdin, -1};
    long e = out_pipe(nout);
    if (!e) e = out_pipe(nerr);
    if (!e && (have || nostdin < 0)) e = sys(__NR_pipe2, (long)pin, O_CLOEXEC, 0, 0);
    if (e < 0) {                         /* (out of fds: a start that failed) */
        u32 f[2] = {(u32)-e, 'e'};
        reply(id, 'f', f, sizeof f);
        return;
    }
    int pout[2] = {nout[0], nout[1]}, perr[2] = {nerr[0], nerr[1]};
    nout[0] = nout[1] = nerr[0] = nerr[1] = -1;
    struct start st_ = {{pin[0], pout[1], perr[1]}, field[0], num(field[1]), num(field[2])};
    fail[0] = fail[1] = 0;
    long child = vfork_run(start_child, &st_, cstack + sizeof cstack);
    if (pin[0] != nostdin) sys(__NR_close, pin[0], 0, 0, 0);
    sys(__NR_close, pout[1], 0, 0, 0);
    sys(__NR_close, perr[1], 0, 0, 0);
    if (child < 0) {
        int fds[3] = {pin[1], pout[0], perr[0]};
        for (int k = 0; k < 3; k++) if (fds[k] >= 0) sys(__NR_close, fds[k], 0, 0, 0);
        u32 f[2] = {(u32)-child, 'e'};
        reply(id, 'f', f, sizeof f);
        return;
    }
    int in_open = pin[1] >= 0, out_open = 1, err_open = 1, done = 0, status = 0;
    long off = 0;                        /* stdin bytes written */
    if (in_open) sys(__NR_fcntl, pin[1], F_SETFL, O_NONBLOCK_, 0);
    while (!done) {
        struct pollfd p[6 + MAXDRAIN];
        int n = 0, ih = -1, ic = -1, io = -1, ie = -1, is = -1, iw = -1;
        if (in_open) { iw = n; p[n++] = (struct pollfd){pin[1], POLLOUT, 0}; }
        ic = n; p[n++] = (struct pollfd){0, POLLIN, 0};            /* signal frames */
        if (out_open) { io = n; p[n++] = (struct pollfd){pout[0], POLLIN, 0}; }
        if (err_open) { ie = n; p[n++] = (struct pollfd){perr[0], POLLIN, 0}; }
        is = n; p[n++] = (struct pollfd){sigfd, POLLIN, 0};
        ih = n;
        for (int k = 0; k < ndrain; k++) p[n++] = (struct pollfd){drains[k], POLLIN, 0};
        if (sys(__NR_ppoll, (long)p, n, 0, 0) < 0) continue;
        if (iw >= 0 && p[iw].revents) {
            long wr = sys(__NR_write, pin[1], (long)(inbuf + off), have - off, 0);
            if (wr > 0) off += wr;
            if ((wr < 0 && wr != -EAGAIN && wr != -EINTR) || off == have) {   /* (or it closed its stdin) */
                sys(__NR_close, pin[1], 0, 0, 0);
                in_open = 0;
            }
        }
        if (p[ic].revents) {
            u32 c[4];
            if (read_full(0, c, sizeof c) < 0) sys(__NR_exit_group, 0, 0, 0, 0);   /* P is gone */
            if (c[0] == 0x47535453 /* "STSG" */ && c[1] == id && c[2] >= 1 && c[2] <= 64)
                sys(__NR_kill, -child, c[2], 0, 0);
        }
        for (int k = 0; k < 2; k++) {
            int ix = k ? ie : io, fd = k ? perr[0] : pout[0];
            if (ix < 0 || !p[ix].revents) continue;
            long r = sys(__NR_read, fd, (long)(frame + 16), 1 << 16, 0);
            if (r > 0) reply(id, k ? 'e' : 'o', frame + 16, (u32)r);
            else if (r == 0) { sys(__NR_close, fd, 0, 0, 0); if (k) err_open = 0; else out_open = 0; }
        }
        if (p[is].revents && reap((int)child, &status)) done = 1;
        drain_poll(p + ih, n - ih);
    }
    /* exited: what it wrote is in the pipes now; pass exactly that on */
    for (int k = 0; k < 2; k++) {
        int fd = k ? perr[0] : pout[0];
        if (!(k ? err_open : out_open)) continue;
        for (;;) {
            long r = sys(__NR_read, fd, (long)(frame + 16), 1 << 16, 0);
            if (r <= 0) break;
            reply(id, k ? 'e' : 'o', frame + 16, (u32)r);
        }
        drain_add(fd);                   /* a background job may hold it still */
    }
    if (in_open) sys(__NR_close, pin[1], 0, 0, 0);
    if (fail[1] == 'c' || fail[1] == 'e') {
        char fb[12];
        u32 *fw = (u32 *)fb;
        fw[0] = fail[0];
        const char *step = fail[1] == 'c' ? "cwd\0\0" : "exec";
        for (int k = 0; k < 4; k++) fb[4 + k] = step[k];
        reply(id, 'f', fb, fail[1] == 'c' ? 7 : 8);
        return;
    }
    u32 x[2] = {(u32)status, alone()};
    reply(id, 'x', x, sizeof x);
}

/*
 * `sandtree-agent --tty -- COMMAND...`: a terminal's command (gvisor_commands.py popen with a
 * pty), started by runsc exec with the engine's terminal as its stdio. gVisor hands that host
 * terminal to the process as its stdio but makes it no session's controlling terminal, so /dev/tty,
 * job control and ^C-as-a-signal would not work. This mode opens a terminal of gVisor's own
 * (/dev/ptmx), makes it the command's controlling terminal in a new session, puts the host
 * terminal in raw mode (the inner terminal does the line discipline: ^C becomes SIGINT there) and
 * relays both ways: window sizes on SIGWINCH (runsc exec forwards signals to the foreground group,
 * which is ours), other forwarded signals to the command's process group. It exits as the command
 * did (the same signal, else its code), with the host terminal's mode restored.
 */
#define TCGETS 0x5401
#define TCSETS 0x5402
#define TIOCSCTTY 0x540E
#define TIOCGWINSZ 0x5413
#define TIOCSWINSZ 0x5414
#define TIOCGPTN 0x80045430
#define TIOCSPTLCK 0x40045431
#define SIGWINCH 28
#define EIO 5

struct ktermios { u32 iflag, oflag, cflag, lflag; unsigned char line, cc[19]; };   /* TCGETS's */
struct sfd_info { u32 signo; char rest[124]; };                                        /* signalfd's */

static int same(const char *a, const char *b) {
    while (*a && *a == *b) { a++; b++; }
    return *a == *b;
}

static void say(const char *a, const char *b) {
    write_full(2, a, slen(a));
    write_full(2, b, slen(b));
    write_full(2, "\n", 1);
}

static void copy_winsize(int master) {
    unsigned short ws[4];
    if (sys(__NR_ioctl, 0, TIOCGWINSZ, (long)ws, 0) == 0) sys(__NR_ioctl, master, TIOCSWINSZ, (long)ws, 0);
}

__attribute__((noreturn)) static void tty_relay(char **av, char **ev) {
    if (!av[0]) { say("sandtree-agent --tty: ", "no command"); sys(__NR_exit_group, 127, 0, 0, 0); }
    int master = (int)sys(__NR_openat, AT_FDCWD, (long)"/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC, 0);
    unsigned int zero = 0, n = 0;
    if (master < 0 || sys(__NR_ioctl, master, TIOCSPTLCK, (long)&zero, 0) < 0 ||
        sys(__NR_ioctl, master, TIOCGPTN, (long)&n, 0) < 0) {
        /* no terminal of its own to give it: the command runs on the host one, as before */
        say("sandtree-agent --tty: no /dev/ptmx here, so no controlling terminal for ", av[0]);
        long err = execvpe_(av, ev);
        say("sandtree-agent --tty: cannot run ", av[0]);
        sys(__NR_exit_group, err == -ENOENT ? 127 : 126, 0, 0, 0);
    }
    char slave[32] = "/dev/pts/";
    int len = 9;
    char digits[12];
    int nd = 0;
    do { digits[nd++] = (char)('0' + n % 10); n /= 10; } while (n);
    while (nd) slave[len++] = digits[--nd];
    slave[len] = 0;
    copy_winsize(master);
    unsigned long handled = (1UL << (SIGCHLD - 1)) | (1UL << (SIGWINCH - 1)) | (1UL << (1 - 1)) /* HUP */ |
                            (1UL << (2 - 1)) /* INT */ | (1UL << (3 - 1)) /* QUIT */ | (1UL << (10 - 1)) /* USR1 */ |
                            (1UL << (12 - 1)) /* USR2 */ | (1UL << (15 - 1)) /* TERM */;
    unsigned long blocked = handled | (1UL << (13 - 1)) /* PIPE: a write to a gone reader is EPIPE */;
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&blocked, 0, sizeof blocked);
    int sfd = (int)sys(__NR_signalfd4, -1, (long)&handled, sizeof handled, SFD_CLOEXEC | O_NONBLOCK_);
    long child = sys(__NR_clone, SIGCHLD, 0, 0, 0);
    if (child == 0) {
        unsigned long none = 0;
        sys(__NR_rt_sigprocmask, 2 /* SIG_SETMASK */, (long)&none, 0, sizeof none);
        sys(__NR_setsid, 0, 0, 0, 0);
        int s = (int)sys(__NR_openat, AT_FDCWD, (long)slave, O_RDWR, 0);   /* (no O_NOCTTY: it becomes ours) */
        if (s < 0 || sys(__NR_ioctl, s, TIOCSCTTY, 0, 0) < 0) {
            say("sandtree-agent --tty: cannot open its terminal ", slave);
            sys(__NR_exit_group, 126, 0, 0, 0);
        }
        for (int fd = 0; fd < 3; fd++) sys(__NR_dup3, s, fd, 0, 0);
        if (s > 2) sys(__NR_close, s, 0, 0, 0);
        long err = execvpe_(av, ev);
        say(err == -ENOENT ? "sandtree-agent: command not found: " : "sandtree-agent: cannot run ", av[0]);
        sys(__NR_exit_group, err == -ENOENT ? 127 : 126, 0, 0, 0);
    }
    if (child < 0) { say("sandtree-agent --tty: cannot start ", av[0]); sys(__NR_exit_group, 126, 0, 0, 0); }
    struct ktermios saved, raw;
    int restore = sys(__NR_ioctl, 0, TCGETS, (long)&saved, 0) == 0;
    if (restore) {                                   /* cfmakeraw */
        raw = saved;
        raw.iflag &= ~(01 | 02 | 010 | 040 | 0100 | 0200 | 0400 | 02000);   /* IGNBRK BRKINT PARMRK ISTRIP INLCR IGNCR ICRNL IXON */
        raw.oflag &= ~01u;                                                   /* OPOST */
        raw.lflag &= ~(010 | 0100 | 02 | 01 | 0100000);                      /* ECHO ECHONL ICANON ISIG IEXTEN */
        raw.cflag = (raw.cflag & ~(060u | 0400u)) | 060u;                    /* CS8, no parity */
        raw.cc[6] = 1;                                                       /* VMIN */
        raw.cc[5] = 0;                                                       /* VTIME */
        sys(__NR_ioctl, 0, TCSETS, (long)&raw, 0);
    }
    int in_open = 1, exited = 0, status = 0;
    for (;;) {
        struct pollfd p[3];
        int k = 0, im = -1, ii = -1, is;
        im = k; p[k++] = (struct pollfd){master, POLLIN, 0};
        is = k; p[k++] = (struct pollfd){sfd, POLLIN, 0};
        if (in_open && !exited) { ii = k; p[k++] = (struct pollfd){0, POLLIN, 0}; }
        /* once the command exited: what is left on the terminal, then done (a background job that
         * keeps the terminal open would otherwise hold us forever) */
        struct { long s, ns; } now = {0, 0};
        long r = sys(__NR_ppoll, (long)p, k, exited ? (long)&now : 0, 0);
        if (r == 0) break;
        if (r < 0) continue;
        if (p[im].revents) {
            long got = sys(__NR_read, master, (long)buf, sizeof buf, 0);
            if (got > 0) write_full(1, buf, got);
            else if (got == 0 || (got != -EINTR && got != -EAGAIN)) {         /* EIO: no one has it open */
                if (exited) break;
                p[im].fd = -1;
            }
        }
        if (ii >= 0 && p[ii].revents) {
            long got = sys(__NR_read, 0, (long)buf, sizeof buf, 0);
            if (got > 0) write_full(master, buf, got);
            else if (got == 0 || (got != -EINTR && got != -EAGAIN)) {         /* the engine's end hung up */
                in_open = 0;
                sys(__NR_kill, -child, 1 /* SIGHUP */, 0, 0);
            }
        }
        if (p[is].revents) {
            struct sfd_info si;
            while (sys(__NR_read, sfd, (long)&si, sizeof si, 0) == (long)sizeof si) {
                if (si.signo == SIGWINCH) copy_winsize(master);
                else if (si.signo != SIGCHLD) sys(__NR_kill, -child, si.signo, 0, 0);
                else {
                    int st = 0;
                    while (sys(__NR_wait4, child, (long)&st, WNOHANG, 0) == child) { exited = 1; status = st; }
                }
            }
        }
    }
    if (restore) sys(__NR_ioctl, 0, TCSETS, (long)&saved, 0);
    if ((status & 0x7f) && (status & 0x7f) != 0x7f) {     /* killed by a signal: the same end */
        unsigned long all = ~0UL;
        int sig = status & 0x7f;
        sys(__NR_rt_sigprocmask, 1 /* SIG_UNBLOCK */, (long)&all, 0, sizeof all);
        sys(__NR_kill, sys(__NR_getpid, 0, 0, 0, 0), sig, 0, 0);
        sys(__NR_exit_group, 128 + sig, 0, 0, 0);
    }
    sys(__NR_exit_group, (status >> 8) & 0xff, 0, 0, 0);
}

__attribute__((noreturn, used)) void agent_main(long *sp) {
    char **av = (char **)(sp + 1), **ev = av + sp[0] + 1;
    if (sp[0] >= 3 && av[1][0] == '-' && av[1][1] == '-' && av[1][2] == 't' && av[1][3] == 't' && av[1][4] == 'y' &&
        !av[1][5] && av[2][0] == '-' && av[2][1] == '-' && !av[2][2])
        tty_relay(av + 3, ev);
    if (sp[0] >= 4 && same(av[1], "--hold") && same(av[3], "--")) hold_main(av[2], av + 4, ev, 1);
    if (sp[0] >= 4 && same(av[1], "--start") && same(av[3], "--")) hold_main(av[2], av + 4, ev, 0);
    if (sp[0] == 3 && same(av[1], "--attach")) hold_attach(av[2], 0);
    if (sp[0] == 3 && same(av[1], "--await")) hold_attach(av[2], 1);
    if (sp[0] == 2 && same(av[1], "--spawn")) spawn_main();
    unsigned long chld = 1UL << (SIGCHLD - 1), blocked = chld | (1UL << (13 /* SIGPIPE */ - 1));
    sys(__NR_prctl, PR_SET_NAME, (long)"sandtree-agent", 0, 0);
    /* SIGCHLD is read from a signalfd; SIGPIPE blocked: a write to a closed pipe is EPIPE */
    sys(__NR_rt_sigprocmask, 0 /* SIG_BLOCK */, (long)&blocked, 0, sizeof blocked);
    sigfd = (int)sys(__NR_signalfd4, -1, (long)&chld, sizeof chld, SFD_CLOEXEC);
    unsigned int ids[6] = {1, 1, 1, 1, 1, 1};
    sys(__NR_getresuid, (long)&ids[0], (long)&ids[1], (long)&ids[2], 0);
    sys(__NR_getresgid, (long)&ids[3], (long)&ids[4], (long)&ids[5], 0);
    plain_root = sys(__NR_getgroups, 0, 0, 0, 0) == 0;
    for (int k = 0; k < 6; k++) if (ids[k]) plain_root = 0;
    sys(__NR_chdir, (long)"/", 0, 0, 0);
    write_full(1, "ready\n", 6);
    for (;;) {
        struct pollfd p[2 + MAXDRAIN];
        int n = 0;
        prepare();
        p[n++] = (struct pollfd){0, POLLIN, 0};
        p[n++] = (struct pollfd){sigfd, POLLIN, 0};
        for (int k = 0; k < ndrain; k++) p[n++] = (struct pollfd){drains[k], POLLIN, 0};
        if (sys(__NR_ppoll, (long)p, n, 0, 0) < 0) continue;
        if (p[1].revents) { int st; reap(-2, &st); }
        drain_poll(p + 2, n - 2);
        if (!p[0].revents) continue;
        u32 h[4];
        if (read_full(0, h, sizeof h) < 0) sys(__NR_exit_group, 0, 0, 0, 0);   /* P is gone */
        if (h[0] != 0x51525453 /* "STRQ" */) continue;     /* a stale signal frame */
        if (h[2] > sizeof words || h[3] > MAXIN) {
            /* too large (the engine never sends one): consumed and refused */
            for (u32 left = h[2] + h[3]; left;) {
                long r = sys(__NR_read, 0, (long)buf, left < sizeof buf ? left : sizeof buf, 0);
                if (r <= 0 && r != -EINTR) sys(__NR_exit_group, 0, 0, 0, 0);
                if (r > 0) left -= (u32)r;
            }
            u32 f[2] = {E2BIG, 'e'};
            reply(h[1], 'f', f, sizeof f);
            continue;
        }
        if (read_full(0, words, h[2]) < 0 || read_full(0, inbuf, h[3]) < 0) sys(__NR_exit_group, 0, 0, 0, 0);
        if (h[2]) words[h[2] - 1] = 0;
        run(h[1], h[2], (long)h[3]);
    }
}
