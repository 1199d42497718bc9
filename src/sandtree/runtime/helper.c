/*
 * sandtree-exec: the privileged half of the `namespaces` runtime tier.
 *
 * Why C: this runs once per sandbox start, between fork and the user's exec.
 * A Python child would cost a fork of the whole engine; a tiny exec'd binary
 * costs well under a millisecond. It holds no policy: the Python runtime
 * (runtime/namespaces.py) decides limits, maps, seccomp rules and layers and
 * passes them here as options. This file only performs them, in order:
 *
 *   P (this process, host namespaces)
 *     joins the run's cgroups, clones C into new user/mnt/pid/net/ipc/uts/
 *     cgroup namespaces, writes C's uid/gid maps, waits for C, reports.
 *     As root, P clones with its effective uid set to the sandbox's own owner uid
 *     (--owner-base + P's pid): the kernel charges per-user limits that a sandbox
 *     spends (inotify instances and watches, user namespaces, ...) to the owner of
 *     its user namespace, which would otherwise be host root for every sandbox.
 *   C (pid 1 of the sandbox)
 *     tmpfs scratch (the run's upper, capped by --disk) -> overlay of the
 *     image's layers -> /proc (masked), minimal /dev, lo up, hostname ->
 *     pivot_root; sends the scratch fd to the engine (commit reads the upper
 *     through it after every namespace is gone), forks G, reaps until G exits.
 *   G (the command)
 *     cwd, ids, capability bounding set, no_new_privs, seccomp, execvpe.
 *
 * Protocol with the engine (fd --report): P writes one line
 *   "pid <C's host pid>\n" once C exists, then at the end
 *   "exit <code>\n" | "signal <n>\n" | "execfail <errno>\n" | "setupfail <errno> <step>\n"
 *   followed by "rusage <utime_us> <stime_us> <maxrss_kb>\n".
 * C sends the scratch tmpfs fd over the unix socket --sock (SCM_RIGHTS).
 *
 * Live sandboxes (--live 1): C runs no command; it reports "ready" (P forwards it to the engine
 * and closes the report) and stays as the pid namespace's reaper. P does not die with the
 * engine with --detach 1 (no PDEATHSIG, its own session, forked away), so a live sandbox outlives
 * the process that started it; --lifetime bounds it. Without --detach (a warm pool's) it dies
 * with the engine like a run. Commands enter it with `--enter-fd PIDFD`: join its cgroups, setns
 * into all of its namespaces at once through the pidfd, fork, then the same steps as G. The
 * entering process reports "pid", then "exit"/"signal"/"execfail" and "rusage" like P, and
 * forwards signal SIGRTMIN+n as signal n to the command's process group. With --pty 1 the
 * command gets a terminal of the sandbox's own devpts and the entering process relays it to the
 * engine's (take_terminal, relay_terminal).
 * Any death of P, C or the engine kills the whole sandbox (PDEATHSIG chain,
 * and the pid namespace dies with its pid 1).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAX_LIST 64

struct opts {
    int sock_fd, report_fd, seccomp_fd;
    const char *layers;         /* directory holding the layer dirs */
    long root_mode, root_uid, root_gid; /* the image root dir, host ids */
    const char *lower;          /* "a:b:c", relative to layers_fd, top first */
    const char *uid_map, *gid_map; /* NULL: map only our own ids to 0 (rootless) */
    const char *disk;           /* tmpfs size= for the upper */
    const char *inodes;         /* tmpfs nr_inodes= for the upper (files count against disk) */
    const char *hostname, *cwd;
    long uid, gid;
    long owner_base;            /* root: the user namespace's owner is owner_base + our pid (0: us) */
    const char *cgroups[MAX_LIST]; int ncgroups;
    int keep_caps[64]; int nkeep;   /* capability numbers kept in the bounding set */
    char **argv;
    char *self_argv0, *argv_end;    /* our own argv area (overwritten, see sandbox_init) */
    int inject;                 /* the engine writes files into the upper first: wait for it */
    int exec_runtime;           /* --exec 1: after the mounts, P becomes the command (runsc) */
    int spec_fd;                /* warm mode: per-run options arrive here (see below) */
    char **envp; int nenv;      /* the command's environment (--env K=V; the helper's own is empty) */
    int live;                   /* --live 1: pid 1 runs no command and waits for `--enter`s */
    int detach;                 /* live: --detach 1 outlives the engine (else it dies with it) */
    long lifetime;              /* live: seconds until the sandbox is killed (0: no limit) */
    int deadline_fd;            /* live: --deadline-fd N: the engine's deadline (epoch seconds, as
                                   text) read when the lifetime is up or on SIGALRM: a later one
                                   re-arms the alarm (the sandbox's timeout was moved) */
    const char *init;           /* live: the sandtree-init binary (init.c) */
    int restore;                /* live: --restore 1: the command is `criu restore` (see below) */
    int enter_fd;               /* --enter-fd N: a pidfd of a live sandbox's pid 1: exec in it */
    int agent_fd;               /* --agent-fd N (with --live --exec): a listening unix socket; each
                                   caller accepted gets the agent's pipes (live_runtime) */
    int resumed;                /* --resumed 1 (with --live --exec): runsc restores a checkpoint, no
                                   pid 1 says "ready" (the engine asks runsc for the state) */
    int mnt_fd;                 /* --mnt-fd N: a live gVisor sandbox's mount namespace (of its P):
                                   join it, then exec the command (runsc exec, ps, ...) */
    int pty;                    /* enter: stdin is a terminal; make it the controlling one */
    const char *drain;          /* enter: sandtree-drain (drain.c), the reader of the output */
    int relay_ahead;            /* enter with --spec-fd: start the drain before the spec comes, for
                                   --uid/--gid (start_relay) */
    int keep_fds;               /* become_command: fds below this survive the exec (0: 3) */
    int tty_sock;               /* become_command (an enter's G with --pty 1): take a terminal of the
                                   sandbox's own and send its master here (take_terminal) */
    int exec_fd;                /* become_command: execute this fd, not argv[0] (> 2) */
    int resolv_layer;           /* --resolv-layer 1: make mount_point_layer's m/ without runtime files
                                   (a networked sandbox's restore: its dumped root had one) */
    int netns_fd;               /* --netns-fd N: join this network namespace (made and wired by the
                                   egress daemon, network/links.py; owned by the host's user
                                   namespace, so root in the sandbox holds no capability over its
                                   links, routes or netfilter) instead of a new, empty one */
    int runtime_fd;             /* --runtime-fd N: the runtime files (see runtime_files) */
};

static int report_fd = -1;
static void read_spec(int fd, struct opts *o);
static char *read_all(int fd, size_t *len);
static void parse_spec(char *buf, size_t len, struct opts *o);

/* A live P's sandbox (its pid 1), once cloned: a P that fails takes it along. Its pid 1 drops
 * the parent-death signal (a sandbox outlives its engine), so without this a P that died while
 * setting up (its engine killed: the report pipe gone) left a sandbox with no P, hence no
 * lifetime, no row and no end. */
static pid_t live_c = -1;

__attribute__((noreturn)) static void die_step(const char *step) {
    int e = errno;
    if (report_fd >= 0) dprintf(report_fd, "setupfail %d %s\n", e, step);
    if (live_c > 0) kill(live_c, SIGKILL);
    _exit(125);
}

static int sync_pipe[2];       /* P -> C: maps written */
static int exec_pipe[2] = {-1, -1}; /* G -> C: errno of a failed execve (CLOEXEC) */
static int status_pipe[2];     /* C -> P: G's wait status / exec errno */
static int spec_pipe[2];       /* P -> C: the run's spec (warm start) */

static void write_file(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die_step(path);
    size_t n = strlen(data);
    if (write(fd, data, n) != (ssize_t)n) die_step(path);
    close(fd);
}

static void xmount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
    if (mount(src, dst, type, flags, data) < 0) die_step(dst);
}

static void touch(const char *path, mode_t mode) {
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, mode);
    if (fd < 0) die_step(path);
    close(fd);
}

static void mkdir_p_one(const char *path, mode_t mode) {
    if (mkdir(path, mode) < 0 && errno != EEXIST) die_step(path);
}

/* /proc entries that leak host information or offer host-wide knobs. */
static const char *proc_null[] = {"kcore", "keys", "latency_stats", "timer_list",
                                  "sched_debug", "sysrq-trigger", "kallsyms", "kmsg", NULL};
static const char *proc_empty[] = {"acpi", "scsi", "asound", "firmware", NULL};
static const char *proc_ro[] = {"sys", "bus", "fs", "irq", NULL};

static void setup_proc(const char *base) {
    char p[256];
    xmount("proc", base, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    for (const char **e = proc_null; *e; e++) {
        snprintf(p, sizeof p, "%s/%s", base, *e);
        if (access(p, F_OK) == 0) xmount("/dev/null", p, NULL, MS_BIND, NULL);
    }
    for (const char **e = proc_empty; *e; e++) {
        snprintf(p, sizeof p, "%s/%s", base, *e);
        if (access(p, F_OK) == 0) xmount("tmpfs", p, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=0");
    }
    for (const char **e = proc_ro; *e; e++) {
        snprintf(p, sizeof p, "%s/%s", base, *e);
        if (access(p, F_OK) != 0) continue;
        xmount(p, p, NULL, MS_BIND | MS_REC, NULL);
        xmount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    }
}

/* A tmpfs at `dir` with the host's six harmless device nodes bound in (files, not mknod: a user
 * namespace may bind them, and CRIU can restore binds). */
static const char *dev_nodes[] = {"null", "zero", "full", "random", "urandom", "tty", NULL};
static void bind_dev_nodes(const char *dir) {
    char p[128], h[128];
    /* nodev: the binds are mounts of their own (the host's devtmpfs flags); nothing else here opens */
    xmount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, "mode=0755,size=64k");
    for (const char **n = dev_nodes; *n; n++) {
        snprintf(p, sizeof p, "%s/%s", dir, *n);
        snprintf(h, sizeof h, "/dev/%s", *n);
        touch(p, 0666);
        xmount(h, p, NULL, MS_BIND, NULL);
    }
}

/* The sandbox's /dev/shm: 64 MiB, and one inode per 4 KiB of it (tmpfs's default is half of
 * RAM in pages: empty files there would cost kernel memory without bound). */
#define DEV_SHM_OPTS "mode=1777,size=64m,nr_inodes=16384"

static void setup_dev(void) {
    bind_dev_nodes("r/dev");
    mkdir_p_one("r/dev/pts", 0755);
    xmount("devpts", "r/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
    mkdir_p_one("r/dev/shm", 01777);
    xmount("tmpfs", "r/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, DEV_SHM_OPTS);
    if (symlink("pts/ptmx", "r/dev/ptmx") < 0) die_step("ptmx");
    if (symlink("/proc/self/fd", "r/dev/fd") < 0) die_step("fd");
    if (symlink("/proc/self/fd/0", "r/dev/stdin") < 0) die_step("stdin");
    if (symlink("/proc/self/fd/1", "r/dev/stdout") < 0) die_step("stdout");
    if (symlink("/proc/self/fd/2", "r/dev/stderr") < 0) die_step("stderr");
}

/* Root mode: P (init user namespace) builds /dev with real device nodes: one tmpfs instead of
 * a bind mount per node. Device nodes cannot be created from inside a user namespace, and
 * these six are the only ones made. */
static void setup_dev_root(const struct opts *o, const char *base) {
    static const struct { const char *name; int maj, min; } nodes[] = {
        {"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
    char p[96], q[96];
    /* The one mount without nodev: it holds the runtime's own nodes. Its root is host root's
     * (unmapped in the sandbox), so nothing of the sandbox can add to it. */
    xmount("tmpfs", base, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k");
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", base, nodes[i].name);
        if (mknod(p, S_IFCHR | 0666, makedev(nodes[i].maj, nodes[i].min)) < 0) die_step(p);
        if (chmod(p, 0666) < 0 || lchown(p, (uid_t)o->root_uid, (gid_t)o->root_gid) < 0) die_step(p);
    }
    snprintf(p, sizeof p, "%s/pts", base);
    mkdir_p_one(p, 0755);
    xmount("devpts", p, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
    snprintf(p, sizeof p, "%s/shm", base);
    mkdir_p_one(p, 01777);
    xmount("tmpfs", p, "tmpfs", MS_NOSUID | MS_NODEV, DEV_SHM_OPTS);
    if (chown(p, (uid_t)o->root_uid, (gid_t)o->root_gid) < 0) die_step("shm");
    static const char *links[][2] = {{"pts/ptmx", "ptmx"}, {"/proc/self/fd", "fd"},
        {"/proc/self/fd/0", "stdin"}, {"/proc/self/fd/1", "stdout"}, {"/proc/self/fd/2", "stderr"}};
    for (size_t i = 0; i < 5; i++) {
        snprintf(q, sizeof q, "%s/%s", base, links[i][1]);
        if (symlink(links[i][0], q) < 0) die_step(q);
    }
}

/* The sandbox's network namespace, before anything of the command runs: loopback up, and small
 * TCP buffer maxima. On cgroup v1 TCP buffers sit outside the run's memory limit; the group's
 * kmem.tcp limit (cgroups.py) only puts its sockets under pressure, and the kernel still lets
 * every socket queue an skb each way past it. Measured with 64 MiB (kmem.tcp 16 MiB), a process
 * filling loopback pairs without reading: 131 KB per pair with the host's maxima, 65 KB with
 * these: 134 MB at 4096 fds, half that at 2048 (RLIMIT_NOFILE, become_command); it was 388 MB. The rmem
 * maximum made no difference there (64 vs 256 KiB); 256 KiB keeps egress downloads usable.
 * These files are per network namespace; the command cannot raise them (its /proc/sys is
 * read-only, and it lacks CAP_NET_ADMIN, which SO_{RCV,SND}BUFFORCE need). SO_RCVBUF/SO_SNDBUF
 * stay capped by the host's net.core.rmem_max/wmem_max, not per namespace here: a socket that
 * sets them locks its buffer size, and under the kmem.tcp limit that queued less (12 KB a pair). */
static const char *net_sysctls[][2] = {
    {"/proc/sys/net/ipv4/tcp_rmem", "4096 65536 262144"},
    {"/proc/sys/net/ipv4/tcp_wmem", "4096 16384 65536"},
};

static void loopback_up(void) {
    for (size_t i = 0; i < sizeof net_sysctls / sizeof net_sysctls[0]; i++) {
        int f = open(net_sysctls[i][0], O_WRONLY | O_CLOEXEC);
        size_t len = strlen(net_sysctls[i][1]);
        if (f < 0 || write(f, net_sysctls[i][1], len) != (ssize_t)len) die_step(net_sysctls[i][0]);
        close(f);
    }
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) die_step("socket");
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) die_step("SIOCGIFFLAGS");
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) die_step("SIOCSIFFLAGS");
    close(s);
}

/* One byte `tag` with `fd` attached (SCM_RIGHTS); sendmsg's answer. */
static ssize_t sendmsg_fd(int sock, int fd, char tag, int flags) {
    struct iovec iov = {.iov_base = &tag, .iov_len = 1};
    union { char buf[CMSG_SPACE(sizeof(int))]; struct cmsghdr align; } u;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &msg, flags);
}

static void send_fd(int sock, int fd) {
    if (sendmsg_fd(sock, fd, 'u', 0) < 0) die_step("sendmsg");
}

static int cap_kept(const struct opts *o, int cap) {
    for (int i = 0; i < o->nkeep; i++) if (o->keep_caps[i] == cap) return 1;
    return 0;
}

/* The command's resource limits (soft, hard), whatever the engine's were; documented with the
 * other limits in base.py (COMMAND_RLIMITS; tests compare the two). Memory, processes, CPU time
 * and disk have cgroups, the timeout and the tmpfs: their rlimits are left unlimited. */
#define KiB 1024UL
#define MiB (1024UL * 1024)
static const struct { int resource; rlim_t soft, hard; } command_rlimits[] = {
    {RLIMIT_NOFILE, 2048, 2048},             /* 2048 soft: rm -rf of a 1,100-deep tree holds a fd per level; bounds one process's connections (loopback_up) */
    {RLIMIT_CORE, 0, 0},                     /* no core dumps land anywhere */
    {RLIMIT_MEMLOCK, 8 * MiB, 8 * MiB},      /* the kernel's default */
    {RLIMIT_RTPRIO, 0, 0},                   /* no real-time scheduling */
    {RLIMIT_NICE, 0, 0},                     /* no priority above the default */
    {RLIMIT_STACK, 8 * MiB, RLIM_INFINITY},
    {RLIMIT_MSGQUEUE, 800 * KiB, 800 * KiB}, /* the kernel's default (819200) */
    {RLIMIT_SIGPENDING, 4096, 4096},
    {RLIMIT_LOCKS, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_AS, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_DATA, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_RSS, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_FSIZE, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_CPU, RLIM_INFINITY, RLIM_INFINITY},
    {RLIMIT_NPROC, RLIM_INFINITY, RLIM_INFINITY},
};

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
static int take_terminal(int sock) {
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

/* G: becomes the user's command. Errors go to C through exec_pipe. */
static void become_command(const struct opts *o) {
    int e;
    const char *step = "cwd";
    if (chdir(o->cwd) < 0) goto fail;
    step = "ids";
    gid_t g = (gid_t)o->gid;
    if (o->gid_map && setgroups(1, &g) < 0) goto fail;
    if (setresgid(g, g, g) < 0) goto fail;
    /* Bounding set first (needs CAP_SETPCAP, which root still has here). */
    for (int cap = 0; cap <= 63; cap++) {
        if (cap_kept(o, cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL) { step = "capbset"; goto fail; }
    }
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if (setresuid((uid_t)o->uid, (uid_t)o->uid, (uid_t)o->uid) < 0) goto fail;
    step = "tty";
    if (o->tty_sock >= 0 && take_terminal(o->tty_sock) < 0) goto fail;
    step = "no_new_privs";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) goto fail;
    /* Every resource limit is the sandbox's own, never the engine's (base.py: COMMAND_RLIMITS,
     * same values). Only lowered: raising a hard limit needs CAP_SYS_RESOURCE on the host. */
    step = "rlimits";
    for (size_t i = 0; i < sizeof command_rlimits / sizeof command_rlimits[0]; i++) {
        struct rlimit now, want = {command_rlimits[i].soft, command_rlimits[i].hard};
        if (getrlimit(command_rlimits[i].resource, &now) < 0) goto fail;
        if (want.rlim_max > now.rlim_max) want.rlim_max = now.rlim_max;
        if (want.rlim_cur > want.rlim_max) want.rlim_cur = want.rlim_max;
        if (setrlimit(command_rlimits[i].resource, &want) < 0) goto fail;
    }
    step = "seccomp";
    if (o->seccomp_fd >= 0) {
        static char buf[1 << 16];
        ssize_t n = pread(o->seccomp_fd, buf, sizeof buf, 0);
        if (n <= 0 || n % sizeof(struct sock_filter)) { errno = EINVAL; goto fail; }
        struct sock_fprog prog = {.len = (unsigned short)(n / sizeof(struct sock_filter)), .filter = (struct sock_filter *)buf};
        /* Nothing but stdio crosses into the command (report fd, seccomp fd, ...). */
        syscall(SYS_close_range, o->keep_fds > 3 ? o->keep_fds : 3, ~0U, 4 /* CLOSE_RANGE_CLOEXEC */);
        if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) < 0) goto fail;
    }
    if (o->seccomp_fd < 0) syscall(SYS_close_range, o->keep_fds > 3 ? o->keep_fds : 3, ~0U, 4);
    if (o->envp) environ = o->envp;             /* the command's env came as options (or the spec) */
    if (o->exec_fd > 2) syscall(SYS_execveat, o->exec_fd, "", o->argv, environ, AT_EMPTY_PATH);
    else execvp(o->argv[0], o->argv);
    e = errno;
    dprintf(exec_pipe[1], "exec %d", e);
    _exit(127);
fail:
    e = errno;
    dprintf(exec_pipe[1], "%s %d", step, e);
    _exit(126);
}

static int init_fd = -1;        /* live: sandtree-init (init.c), opened before /tmp is covered */

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

static volatile pid_t g_pid = -1;
static void forward(int sig) { if (g_pid > 0) kill(g_pid, sig); }

/* The run's root: a tmpfs scratch (upper + work, so --disk caps the run's writes, and
 * commit reads the upper through the fd sent to the engine, after every namespace is gone)
 * and the overlay of the image's layers on scratch/r. Done by P in a private mount
 * namespace when we are root (a host overlay: trusted.* xattrs, whiteouts as 0/0 devices),
 * or by C inside the user namespace when rootless (userxattr). Paths, not fds: overlay
 * refuses lowers that belong to another mount namespace. */
/* Runtime files (RunSpec.runtime_files, --runtime-fd N): files the runtime shows the sandbox
 * read-only and never commits: a link's resolv.conf and CA bundle. The fd holds records of
 * (u32 path length, path, u32 data length, data), native byte order. Each file goes into a
 * tmpfs of its own at /dev/sandtree (made read-only once written: the sandbox cannot add to it,
 * and nothing there is in the overlay's upper, so a commit never holds them); "/etc/resolv.conf"
 * is written there as resolv.conf and bound over the image's /etc/resolv.conf (bind_resolv):
 * over a regular file, over a symbolic link itself (never followed: its target is the image's to
 * choose), and where the image has none over an empty file of a lowest overlay layer of the
 * helper's own (mount_point_layer), so nothing of it is ever in the upper. */
static char *rt_buf;
static size_t rt_len;

static void read_runtime(int fd) {
    struct stat st;
    if (fstat(fd, &st) < 0) die_step("runtime-files");
    if (st.st_size > (64 << 20)) { errno = EFBIG; die_step("runtime-files"); }
    rt_len = (size_t)st.st_size;
    rt_buf = malloc(rt_len + 1);
    if (!rt_buf) die_step("runtime-files");
    for (size_t got = 0; got < rt_len;) {
        ssize_t n = pread(fd, rt_buf + got, rt_len - got, (off_t)got);
        if (n <= 0) { if (n == 0) errno = EIO; die_step("runtime-files"); }
        got += (size_t)n;
    }
    close(fd);
}

static const char *rt_field(size_t *off, size_t *len) {
    uint32_t n;
    if (rt_len - *off < 4) { errno = EINVAL; die_step("runtime-files"); }
    memcpy(&n, rt_buf + *off, 4);
    *off += 4;
    if (rt_len - *off < n) { errno = EINVAL; die_step("runtime-files"); }
    const char *f = rt_buf + *off;
    *off += n;
    *len = n;
    return f;
}

/* The file name under /dev/sandtree for a runtime path (validate.py checks them first). */
static void rt_name(const char *path, size_t plen, char *out, size_t cap) {
    static const char dev[] = "/dev/sandtree/";
    const char *name = NULL;
    size_t nlen = 0;
    if (plen == 16 && !memcmp(path, "/etc/resolv.conf", 16)) { name = "resolv.conf"; nlen = 11; }
    else if (plen > sizeof dev - 1 && !memcmp(path, dev, sizeof dev - 1)) {
        name = path + sizeof dev - 1; nlen = plen - (sizeof dev - 1);
    }
    if (!name || nlen >= cap || memchr(name, '/', nlen) || memchr(name, 0, nlen) ||
        (nlen == 1 && name[0] == '.') || (nlen == 2 && !memcmp(name, "..", 2))) {
        errno = EINVAL; die_step("runtime-path");
    }
    memcpy(out, name, nlen);
    out[nlen] = 0;
}

/* The entry at etc/resolv.conf in `root`: its parents resolved inside the root (no magic links,
 * no mount crossed), the last component itself (O_NOFOLLOW: a link is opened, not followed).
 * A regular file or a link gets `src` bound over it (over a link, through its O_PATH fd: the link
 * is covered, its target never looked at); anything else, or nothing, none. only_link: a link
 * only (gVisor: runsc binds over a regular file itself, but would follow a link). */
static void bind_resolv(const char *root, const char *src, int only_link) {
    int rfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) die_step("runtime-root");
    struct open_how how = {.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
    int fd = (int)syscall(SYS_openat2, rfd, "etc/resolv.conf", &how, sizeof how);
    close(rfd);
    if (fd < 0) return;                         /* none (a whiteout, an opaque /etc above ours): no bind */
    struct stat st;
    char target[64];
    if (fstat(fd, &st) == 0 && (S_ISLNK(st.st_mode) || (!only_link && S_ISREG(st.st_mode)))) {
        snprintf(target, sizeof target, "/proc/self/fd/%d", fd);
        xmount(src, target, NULL, MS_BIND, NULL);   /* read-only: runtime_files' tmpfs (gVisor: runsc covers m/) */
    }
    close(fd);
}

/* Whether the runtime files hold /etc/resolv.conf. */
static int rt_has_resolv(void) {
    size_t off = 0, n, len;
    while (rt_buf && off < rt_len) {
        const char *path = rt_field(&off, &n);
        rt_field(&off, &len);
        if (n == 16 && !memcmp(path, "/etc/resolv.conf", 16)) return 1;
    }
    return 0;
}

/* A lowest overlay layer of the helper's own in the scratch (m/, outside the upper): etc/ and an
 * empty etc/resolv.conf, the mount point bind_resolv covers where the image has no resolv.conf
 * (an image's own etc/ above it keeps its attributes: the top-most layer's win). The sandbox never
 * writes it (the bind is read-only, and a mount point cannot be removed or renamed), so the upper
 * and a commit never see it. Returns the lowerdir suffix (":/tmp/m"), "" without a resolv.conf. */
static const char *mount_point_layer(struct opts *o) {
    if (!rt_has_resolv() && !o->resolv_layer) return "";
    mkdir_p_one("m", 0755);
    mkdir_p_one("m/etc", 0755);
    int fd = open("m/etc/resolv.conf", O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) die_step("runtime-mount-point");
    close(fd);
    if (o->uid_map && (chown("m/etc", (uid_t)o->root_uid, (gid_t)o->root_gid) < 0 ||
                       chown("m/etc/resolv.conf", (uid_t)o->root_uid, (gid_t)o->root_gid) < 0))
        die_step("runtime-mount-point");
    return ":/tmp/m";
}

/* Write the runtime files into a new tmpfs at `dir`; bind resolv.conf into `root` (NULL: gVisor,
 * whose OCI spec binds it, gvisor.py). */
static void runtime_files(const char *dir, const char *root) {
    if (!rt_buf) return;
    char p[512], name[256], data[96];
    size_t off = 0, total = 0, n, len;
    int resolv = 0;
    while (off < rt_len) { rt_field(&off, &n); rt_field(&off, &len); total += len + 4096; }
    mkdir_p_one(dir, 0755);
    snprintf(data, sizeof data, "mode=0755,size=%zu,nr_inodes=1024", total + 65536);
    xmount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, data);
    for (off = 0; off < rt_len;) {
        const char *path = rt_field(&off, &n);
        const char *body = rt_field(&off, &len);
        rt_name(path, n, name, sizeof name);
        if (!strcmp(name, "resolv.conf") && n == 16) resolv = 1;
        snprintf(p, sizeof p, "%s/%s", dir, name);
        int fd = open(p, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0444);
        if (fd < 0) die_step(p);
        for (size_t w = 0; w < len;) {
            ssize_t k = write(fd, body + w, len - w);
            if (k <= 0) die_step(p);
            w += (size_t)k;
        }
        close(fd);
    }
    xmount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    if (resolv && root) {
        snprintf(p, sizeof p, "%s/resolv.conf", dir);
        bind_resolv(root, p, 0);
    }
}

static void mount_root(struct opts *o) {
    char data[256];
    if (o->spec_fd < 0) xmount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    /* Opened before the tmpfs goes on /tmp: the store may itself live under /tmp. */
    int layers = open(o->layers, O_DIRECTORY | O_CLOEXEC);
    if (layers < 0) die_step("open-layers");
    snprintf(data, sizeof data, "size=%s,nr_inodes=%s,mode=0755", o->disk, o->inodes);
    xmount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, data);
    if (chdir("/tmp") < 0) die_step("chdir-scratch");
    mkdir_p_one("u", o->root_mode);
    mkdir_p_one("w", 0700);
    mkdir_p_one("r", 0755);
    if (chmod("u", o->root_mode) < 0) die_step("chmod-upper");
    if (o->uid_map && chown("u", (uid_t)o->root_uid, (gid_t)o->root_gid) < 0) die_step("chown-upper");
    int scratch = open(".", O_DIRECTORY | O_CLOEXEC);
    if (scratch < 0) die_step("scratch-open");
    /* The engine writes injected files into the upper before the overlay exists (never
     * under a mounted overlay), then answers with one byte. */
    send_fd(o->sock_fd, scratch);
    char go;
    if (o->inject && recv(o->sock_fd, &go, 1, 0) != 1) die_step("inject-wait");
    const char *lowest = mount_point_layer(o);
    size_t need = strlen(o->lower) + 128;
    char *ov = malloc(need);
    snprintf(ov, need, "lowerdir=%s%s,upperdir=/tmp/u,workdir=/tmp/w%s", o->lower,
             *o->lower ? lowest : lowest + (*lowest == ':'), o->uid_map ? "" : ",userxattr");
    if (fchdir(layers) < 0) die_step("chdir-layers");
    /* nodev: a device node in a layer (an old import, a bug) opens nothing on any tier, and
     * runsc's gofer, which opens files of this root on the host, is held to it as well. */
    if (mount("overlay", "/tmp/r", "overlay", MS_NODEV, ov) < 0) die_step("overlay");
    free(ov);
    close(layers);
    if (fchdir(scratch) < 0) die_step("chdir-scratch");
    mkdir("r/proc", 0555);
    mkdir("r/dev", 0755);
    /* runsc brings its own; a live sandbox binds the host's nodes from inside (setup_dev): CRIU
     * restores binds, but cannot mknod a tmpfs's device nodes back inside a user namespace. */
    if (o->uid_map && !o->exec_runtime && !o->live) {
        setup_dev_root(o, "r/dev");
        runtime_files("r/dev/sandtree", "r");
    }
    if (o->exec_runtime) {                 /* runsc binds them (gvisor.py) */
        runtime_files("x", NULL);
        /* runsc would follow a link at the bind's destination (and make its target in our
         * upper): it sees the mount point's empty file there instead, which its bind covers. */
        if (rt_has_resolv()) bind_resolv("r", "m/etc/resolv.conf", 1);
    }
    close(scratch);
}

/* Warm start, before the clone: the scratch tmpfs, the /dev tree (at /tmp/d, bound into the
 * root at run time) and the layers dir, all ready; the scratch fd goes to the engine now. */
static int warm_layers = -1;
static void warm_prepare(struct opts *o) {
    warm_layers = open(o->layers, O_DIRECTORY | O_CLOEXEC);  /* before /tmp is covered */
    if (warm_layers < 0) die_step("open-layers");
    /* No size yet: the engine injects the run's files into u before the run's own size and
     * inode count arrive (warm_mount remounts with them); it checked they fit that disk. */
    xmount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=100%,mode=0755");
    if (chdir("/tmp") < 0) die_step("chdir-scratch");
    mkdir_p_one("u", 0755);
    mkdir_p_one("w", 0700);
    mkdir_p_one("r", 0755);
    mkdir_p_one("p", 0555);
    mkdir_p_one("d", 0755);
    setup_dev_root(o, "d");
    int scratch = open(".", O_DIRECTORY | O_CLOEXEC);
    if (scratch < 0) die_step("scratch-open");
    send_fd(o->sock_fd, scratch);
    close(scratch);
}

/* Warm start, the run: its size, its root's owner and mode, its overlay, /dev bound in. All of
 * it propagates into C's mount namespace. The engine wrote injected files into u already. */
static void warm_mount(struct opts *o) {
    char data[128];
    snprintf(data, sizeof data, "size=%s,nr_inodes=%s", o->disk, o->inodes);
    xmount(NULL, "/tmp", NULL, MS_REMOUNT | MS_NOSUID | MS_NODEV, data);
    if (chmod("u", o->root_mode) < 0) die_step("chmod-upper");
    if (chown("u", (uid_t)o->root_uid, (gid_t)o->root_gid) < 0) die_step("chown-upper");
    size_t need = strlen(o->lower) + 128;
    char *ov = malloc(need);
    snprintf(ov, need, "lowerdir=%s,upperdir=/tmp/u,workdir=/tmp/w", o->lower);
    if (fchdir(warm_layers) < 0) die_step("chdir-layers");
    /* nodev: a device node in a layer (an old import, a bug) opens nothing on any tier, and
     * runsc's gofer, which opens files of this root on the host, is held to it as well. */
    if (mount("overlay", "/tmp/r", "overlay", MS_NODEV, ov) < 0) die_step("overlay");
    free(ov);
    if (chdir("/tmp") < 0) die_step("chdir-scratch");
    mkdir("r/proc", 0555);
    mkdir("r/dev", 0755);
    xmount("d", "r/dev", NULL, MS_BIND | MS_REC, NULL);
    runtime_files("r/dev/sandtree", "r");            /* a linked warm helper's (--runtime-fd) */
}

/* C: pid 1 of the sandbox. */
static int sandbox_init(struct opts *o) {
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

/* Options: "--name value" pairs, then "--", then the command. Used for argv (cold start) and
 * for the NUL-separated spec read from --spec-fd (warm start). Returns the index after "--". */
static int parse_opts(int argc, char **argv, struct opts *o) {
    int i = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) return i + 1;
        if (!v) { fprintf(stderr, "sandtree-exec: %s needs a value\n", a); exit(125); }
        if (!strcmp(a, "--layers")) o->layers = v;
        else if (!strcmp(a, "--root-mode")) o->root_mode = strtol(v, NULL, 8);
        else if (!strcmp(a, "--root-uid")) o->root_uid = atol(v);
        else if (!strcmp(a, "--root-gid")) o->root_gid = atol(v);
        else if (!strcmp(a, "--lower")) o->lower = v;
        else if (!strcmp(a, "--sock")) o->sock_fd = atoi(v);
        else if (!strcmp(a, "--report")) o->report_fd = atoi(v);
        else if (!strcmp(a, "--seccomp-fd")) o->seccomp_fd = atoi(v);
        else if (!strcmp(a, "--spec-fd")) o->spec_fd = atoi(v);
        else if (!strcmp(a, "--inject")) o->inject = atoi(v);
        else if (!strcmp(a, "--exec")) o->exec_runtime = atoi(v);
        else if (!strcmp(a, "--live")) o->live = atoi(v);
        else if (!strcmp(a, "--init")) o->init = v;
        else if (!strcmp(a, "--restore")) o->restore = atoi(v);
        else if (!strcmp(a, "--detach")) o->detach = atoi(v);
        else if (!strcmp(a, "--lifetime")) o->lifetime = atol(v);
        else if (!strcmp(a, "--deadline-fd")) o->deadline_fd = atoi(v);
        else if (!strcmp(a, "--enter-fd")) o->enter_fd = atoi(v);
        else if (!strcmp(a, "--mnt-fd")) o->mnt_fd = atoi(v);
        else if (!strcmp(a, "--agent-fd")) o->agent_fd = atoi(v);
        else if (!strcmp(a, "--resumed")) o->resumed = atoi(v);
        else if (!strcmp(a, "--netns-fd")) o->netns_fd = atoi(v);
        else if (!strcmp(a, "--resolv-layer")) o->resolv_layer = atoi(v);
        else if (!strcmp(a, "--runtime-fd")) o->runtime_fd = atoi(v);
        else if (!strcmp(a, "--pty")) o->pty = atoi(v);
        else if (!strcmp(a, "--drain")) o->drain = v;
        else if (!strcmp(a, "--relay-ahead")) o->relay_ahead = atoi(v);
        else if (!strcmp(a, "--uid-map")) o->uid_map = v;
        else if (!strcmp(a, "--gid-map")) o->gid_map = v;
        else if (!strcmp(a, "--disk")) o->disk = v;
        else if (!strcmp(a, "--inodes")) o->inodes = v;
        else if (!strcmp(a, "--hostname")) o->hostname = v;
        else if (!strcmp(a, "--cwd")) o->cwd = v;
        else if (!strcmp(a, "--uid")) o->uid = atol(v);
        else if (!strcmp(a, "--owner-base")) o->owner_base = atol(v);
        else if (!strcmp(a, "--gid")) o->gid = atol(v);
        else if (!strcmp(a, "--cgroup") && o->ncgroups < MAX_LIST) o->cgroups[o->ncgroups++] = v;
        else if (!strcmp(a, "--keep-cap") && o->nkeep < 64) o->keep_caps[o->nkeep++] = atoi(v);
        else if (!strcmp(a, "--env")) {
            o->envp = realloc(o->envp, sizeof(char *) * (size_t)(o->nenv + 2));
            o->envp[o->nenv++] = (char *)v;
            o->envp[o->nenv] = NULL;
        }
        else { fprintf(stderr, "sandtree-exec: unknown option %s\n", a); exit(125); }
        i++;
    }
    return argc;
}

static void parse(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    o->sock_fd = o->report_fd = o->seccomp_fd = o->spec_fd = o->enter_fd = o->mnt_fd = o->agent_fd = o->deadline_fd = o->netns_fd = o->runtime_fd = o->tty_sock = -1;
    o->disk = "1g"; o->inodes = "262144"; o->root_mode = 0755; o->hostname = "sandtree"; o->cwd = "/"; o->lower = "";
    int i = 1 + parse_opts(argc - 1, argv + 1, o);
    o->self_argv0 = argv[0];
    o->argv_end = argv[argc - 1] + strlen(argv[argc - 1]);
    o->argv = argv + i;
    /* The command's env comes as our own environment's _ST_NAME=VALUE entries: names that no
     * loader or libc reads (LD_PRELOAD, GLIBC_TUNABLES, ... act on nothing of ours, and a dynamic
     * build of this root helper would load them), and not argv (/proc/PID/cmdline is world-readable). */
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "_ST_", 4)) continue;
        o->envp = realloc(o->envp, sizeof(char *) * (size_t)(o->nenv + 2));
        if (!o->envp) exit(125);
        o->envp[o->nenv++] = *e + 4;
        o->envp[o->nenv] = NULL;
    }
    if (o->spec_fd >= 0) return;                 /* the rest comes with the spec */
    if ((o->enter_fd >= 0 || o->mnt_fd >= 0) && o->report_fd >= 0) return;
    if (i >= argc || !o->layers || o->sock_fd < 0 || o->report_fd < 0) {
        fprintf(stderr, "usage: sandtree-exec --layers DIR --lower L --sock N --report N [...] -- CMD...\n");
        exit(125);
    }
}

/* A warm start's spec is never larger than this (the engine's limits on a command and its env,
 * runtime/validate.py, keep it far below): a writer that sends more is refused, not buffered. */
#define MAX_SPEC (16 << 20)

/* Everything on fd until EOF (then closed), in memory of ours; *len its size. */
static char *read_all(int fd, size_t *len) {
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    *len = 0;
    for (;;) {
        if (!buf) die_step("spec-alloc");
        if (*len == cap) {
            if (cap >= MAX_SPEC) { errno = E2BIG; die_step("spec"); }
            buf = realloc(buf, cap *= 2);
            continue;
        }
        ssize_t n = read(fd, buf + *len, cap - *len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die_step("spec-read");
        if (n == 0) break;
        *len += (size_t)n;
    }
    close(fd);
    return buf;
}

/* Warm start: read the per-run spec (NUL-separated options, "--", command) until EOF. */
static void read_spec(int fd, struct opts *o) {
    size_t len;
    char *buf = read_all(fd, &len);
    parse_spec(buf, len, o);
}

/* The spec in buf (kept: the options point into it) as options and command. */
static void parse_spec(char *buf, size_t len, struct opts *o) {
    if (len == 0 || buf[len - 1] != 0) { errno = EINVAL; die_step("spec"); }
    int argc = 0;
    for (size_t k = 0; k < len; k++) if (buf[k] == 0) argc++;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    size_t start = 0;
    for (int k = 0; k < argc; k++) { args[k] = buf + start; start += strlen(buf + start) + 1; }
    int i = parse_opts(argc, args, o);
    o->argv = args + i;
    if (i >= argc || (!o->layers && o->enter_fd < 0)) { errno = EINVAL; die_step("spec"); }
}

static void forward_rt(int sig) { if (g_pid > 0) kill(-g_pid, sig - SIGRTMIN); }

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
struct relay { int out, err, sock; };        /* the pipes' write ends; the relay's socket */

static void close_relay(struct relay *r) {
    if (r->out >= 0) close(r->out);
    if (r->err >= 0) close(r->err);
    if (r->sock >= 0) close(r->sock);        /* EOF: a relay still waiting exits */
    r->out = r->err = r->sock = -1;
}

static int start_relay(struct opts *o, int drain_fd, struct relay *r) {
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
static void use_relay(struct relay *r) {
    int me = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (me >= 0 && sendmsg_fd(r->sock, me, 'p', MSG_NOSIGNAL) == 1 && dup2(r->out, 1) >= 0 && dup2(r->err, 2) >= 0)
        dprintf(report_fd, "relay\n");
    if (me >= 0) close(me);
    close_relay(r);
}

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

/* An enter with --pty 1, before its fork: the engine's terminal becomes ours (our session's
 * controlling terminal, so its window size changes reach us as SIGWINCH and its hangup as
 * SIGHUP) and raw (the command's terminal does echo, line editing and ^C as SIGINT: this one
 * only carries bytes). 0, or the errno G reports as "tty". */
static struct termios tty_saved;
static int tty_restore;

static int own_terminal(void) {
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
static int recv_master(int sock) {
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
static void relay_terminal(int master, int out, pid_t g, int sfd) {
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

/* --enter-fd: run the command inside a live sandbox (see the header). */
static int enter_sandbox(struct opts *o) {
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

/* A live P, once its sandbox is up: the lifetime's alarm (SIGKILL to c, the sandbox's root
 * process), "ready" to the engine, which is free then (its report closed, our stdio /dev/null). */
static void live_ready(struct opts *o, pid_t c) {
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
static volatile sig_atomic_t detach_wanted;
static void want_detach(int sig) { (void)sig; detach_wanted = 1; }

static int detach_host(struct opts *o) {
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
static int live_wait(struct opts *o, pid_t c) {
    live_ready(o, c);                        /* the engine is free; we stay for C */
    while (waitpid(c, NULL, 0) < 0 && errno == EINTR) {}
    return 0;
}

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

static int live_runtime(struct opts *o) {
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
static int enter_mount(struct opts *o) {
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

/* --restore, the child that becomes CRIU: the root it runs in. CRIU re-creates what the sandbox
 * had deleted but held open ("ghost" files and cwds) with path calls made in its own mount
 * namespace, as the sandbox's root user: a symlink the sandbox planted on such a path is
 * followed from CRIU's root. So that root holds nothing of the host that could be written:
 * read-only binds of the programs CRIU runs (itself, tar, ip, iptables-restore, a shell, and
 * their libraries and configuration), a proc of its own, a /dev with only the nodes a sandbox
 * binds, private /tmp and /run, and the sandbox's root at /r (the path given to --root). */
static void criu_root(void) {
    static const char *ro[] = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "sys", NULL};
    char src[64], dst[64], link[256];
    struct stat sb;
    if (unshare(CLONE_NEWNS) < 0) die_step("criu-unshare");
    xmount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    mkdir_p_one("/tmp/c", 0755);
    xmount("tmpfs", "/tmp/c", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m");
    for (const char **d = ro; *d; d++) {
        snprintf(src, sizeof src, "/%s", *d);
        snprintf(dst, sizeof dst, "/tmp/c/%s", *d);
        if (lstat(src, &sb) < 0) continue;
        if (S_ISLNK(sb.st_mode)) {                 /* merged /usr: bin -> usr/bin, ... */
            ssize_t n = readlink(src, link, sizeof link - 1);
            if (n < 0) die_step(src);
            link[n] = 0;
            if (symlink(link, dst) < 0) die_step(dst);
            continue;
        }
        mkdir_p_one(dst, 0755);
        /* not recursive: a submount (/sys/fs/cgroup, ...) would keep its own, writable flags */
        xmount(src, dst, NULL, MS_BIND, NULL);
        xmount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
    }
    mkdir_p_one("/tmp/c/proc", 0555);
    xmount("proc", "/tmp/c/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mkdir_p_one("/tmp/c/dev", 0755);
    bind_dev_nodes("/tmp/c/dev");                /* the sources of the sandbox's /dev binds */
    mkdir_p_one("/tmp/c/tmp", 01777);
    xmount("tmpfs", "/tmp/c/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=16m");
    mkdir_p_one("/tmp/c/run", 0755);
    xmount("tmpfs", "/tmp/c/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m");
    if (stat("/run/criu.kdat", &sb) == 0) {       /* CRIU's probe of this kernel, read-only */
        touch("/tmp/c/run/criu.kdat", 0644);
        xmount("/run/criu.kdat", "/tmp/c/run/criu.kdat", NULL, MS_BIND, NULL);
        xmount(NULL, "/tmp/c/run/criu.kdat", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL);
    }
    mkdir_p_one("/tmp/c/r", 0755);
    xmount("/tmp/r", "/tmp/c/r", NULL, MS_BIND | MS_REC, NULL);
    if (chdir("/tmp/c") < 0) die_step("chdir-criu-root");
    if (syscall(SYS_pivot_root, ".", ".") < 0) die_step("pivot_root-criu");
    if (umount2(".", MNT_DETACH) < 0) die_step("umount-criu");
    if (chdir("/") < 0) die_step("chdir-/");
}

/* --restore, the CRIU child: enter a user namespace of the sandbox's own before CRIU runs.
 * CRIU creates the sandbox's user namespace, owned by CRIU's effective uid, and what the kernel
 * counts per user (inotify instances, ...) is charged up the chain of owners to the topmost one:
 * with CRIU as host root, host root's quota. CRIU cannot run as another uid: it writes the uts
 * sysctls, which only uid 0 may, and its restorer keeps a task's capabilities across the task's
 * own id changes only when CRIU is uid 0. So it runs as uid 0 of a namespace U that `owner`
 * owns: U maps every id to itself (CRIU's files, maps and ids mean what they mean on the host),
 * CRIU has all capabilities in U and in the sandbox's namespace it makes inside U, none outside,
 * and the chain ends at `owner`, a uid of this sandbox's own (as P's clone at a start). Nothing
 * of the sandbox can reach U: its tasks have no capability there. Only the effective uid is
 * `owner`, for the unshare (the kernel takes U's owner from it); P, in the parent namespace,
 * writes U's maps (to_p: 'u' once U exists; from_p: EOF once P has written them). */
static void enter_owned_userns(uid_t owner, int to_p, int from_p) {
    if (setresuid((uid_t)-1, owner, (uid_t)-1) < 0) die_step("owner-euid");
    /* a mount namespace of U's own too: CRIU mounts (the sandbox's root, /proc) in it */
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) < 0) die_step("owner-userns");
    if (write(to_p, "u", 1) != 1) die_step("owner-sync");
    char c;
    while (read(from_p, &c, 1) < 0 && errno == EINTR) {}
    close(to_p);
    close(from_p);
    /* uid 0 of U (identity-mapped: host root's ids), with U's full capability set */
    if (setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) die_step("owner-ids");
}

/* P's half: U's maps, identity over every id (CRIU inside writes the sandbox's own maps, the
 * checkpoint's host ids, which then mean the same). */
static void map_owned_userns(pid_t cr, int from_c, int to_c) {
    char c, path[64];
    ssize_t n;
    while ((n = read(from_c, &c, 1)) < 0 && errno == EINTR) {}
    if (n == 1) {
        snprintf(path, sizeof path, "/proc/%d/uid_map", (int)cr); write_file(path, "0 0 4294967295\n");
        snprintf(path, sizeof path, "/proc/%d/gid_map", (int)cr); write_file(path, "0 0 4294967295\n");
    }
    close(from_c);
    close(to_c);                              /* EOF: the child goes on */
}

/* --restore 1 (resume a hibernated live sandbox): the same cgroups and the same scratch + overlay
 * as a start (the lowers are the image committed at hibernation, the upper starts empty), then
 * the command, `criu restore --root /tmp/r --restore-detached ...`, rebuilds the namespaces, the
 * mounts inside and the process tree from the checkpoint. We are its child subreaper, so the
 * restored pid 1 becomes our child when CRIU exits: from there on we are its P, as after a start. */
static int restore_sandbox(struct opts *o) {
    for (int k = 0; k < o->ncgroups; k++) write_file(o->cgroups[k], "0\n");
    if (o->netns_fd >= 0) {
        /* A networked sandbox's link (the egress daemon's namespace, owned by the host's user
         * namespace): its dump was taken from inside it, so the checkpoint holds no network
         * namespace and CRIU restores the tasks into the one it runs in, which it inherits from
         * us. CRIU itself could not join it: it runs in a user namespace with no capability
         * over the host's namespaces (enter_owned_userns). */
        if (setns(o->netns_fd, CLONE_NEWNET) < 0) die_step("netns");
        close(o->netns_fd);
    }
    /* A cgroup namespace rooted at the sandbox's cgroups, as at a start: CRIU (managing no
     * cgroups) gives the restored tree its own, so the sandbox sees "/" and no host paths. */
    if (unshare(CLONE_NEWNS | CLONE_NEWCGROUP) < 0) die_step("unshare-mnt");
    mount_root(o);
    if (chdir("/") < 0) die_step("chdir-/");
    close(o->sock_fd);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) die_step("subreaper");
    int owned = o->owner_base > 0, up[2] = {-1, -1}, down[2] = {-1, -1};
    if (owned && (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0)) die_step("pipe");
    pid_t p = getpid(), cr = fork();
    if (cr < 0) die_step("fork");
    if (cr == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        fcntl(report_fd, F_SETFD, FD_CLOEXEC);
        criu_root();
        if (owned) {
            close(up[0]);
            close(down[1]);
            /* a fresh owner for the resumed sandbox: base + our P's pid, as at a start */
            enter_owned_userns((uid_t)(o->owner_base + p), up[1], down[0]);
            /* the id changes cleared the parent-death signal: again, and P must still be there */
            if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die_step("pdeathsig");
            if (getppid() != p) _exit(125);
        }
        execv(o->argv[0], o->argv);
        _exit(127);
    }
    if (owned) {
        close(up[1]);
        close(down[0]);
        map_owned_userns(cr, up[0], down[1]);
    }
    int st;
    while (waitpid(cr, &st, 0) < 0) if (errno != EINTR) die_step("wait-criu");
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        errno = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
        die_step("criu-restore");
    }
    /* Our one child now: the restored pid 1 (CRIU's --restore-detached left it to us). */
    char path[64], buf[64] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, buf, sizeof buf - 1) <= 0) { errno = ESRCH; die_step("restored-pid"); }
    close(fd);
    pid_t c = (pid_t)atoi(buf);
    if (c <= 0) { errno = ESRCH; die_step("restored-pid"); }
    live_c = c;                                   /* (CRIU, forked before this, keeps SIGPIPE) */
    signal(SIGPIPE, SIG_IGN);
    dprintf(report_fd, "pid %d\n", c);
    if (detach_host(o) < 0) die_step("detach-host");
    return live_wait(o, c);
}

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
