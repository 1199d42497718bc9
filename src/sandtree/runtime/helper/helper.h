/*
 * helper.h: the one header of sandtree-exec, the privileged half of the `namespaces` runtime
 * tier: what crosses its files (the options, the shared state, the functions one file calls in
 * another). Everything else stays static in the file of its concern.
 *
 * Why C: this runs once per sandbox start, between fork and the user's exec.
 * A Python child would cost a fork of the whole engine; a tiny exec'd binary
 * costs well under a millisecond. It holds no policy: the Python runtime
 * (runtime/namespaces.py) decides limits, maps, seccomp rules and layers and
 * passes them here as options. These files only perform them, in order:
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
 *
 * The files, one concern each (laid out as Firecracker's jailer is):
 *   main.c      the entry point and P's start (clone, maps, a warm start's spec, the report)
 *   options.c   the options, from argv or a warm start's spec
 *   steps.c     a failed step (die_step) and the small steps every file takes
 *   mounts.c    the run's root: scratch, overlay, /proc, /dev (a warm start's too)
 *   runfiles.c  the runtime files (/dev/sandtree, resolv.conf)
 *   network.c   the sandbox's own network namespace (loopback, TCP buffers)
 *   pid1.c      C, pid 1 of the sandbox (and sandtree-init in a live one); the shared pipes
 *   command.c   G: ids, capabilities, rlimits, seccomp, exec of the command
 *   terminal.c  an enter's terminal (--pty 1)
 *   enter.c     --enter-fd: a command in a live sandbox
 *   relay.c     an enter's output relay (sandtree-drain)
 *   live.c      a live sandbox's P: lifetime, "ready", the host's tree detached
 *   gvisor.c    a live gVisor sandbox: runsc run (--live --exec), runsc exec (--mnt-fd)
 *   restore.c   --restore: a hibernated sandbox back through CRIU
 * runtime/build.py compiles them together and keys the binary by the hash of all of them.
 */
#ifndef SANDTREE_HELPER_H
#define SANDTREE_HELPER_H

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
    int spec_fd;                /* warm mode: per-run options arrive here (options.c: read_spec) */
    char **envp; int nenv;      /* the command's environment (--env K=V; the helper's own is empty) */
    int live;                   /* --live 1: pid 1 runs no command and waits for `--enter`s */
    int detach;                 /* live: --detach 1 outlives the engine (else it dies with it) */
    long lifetime;              /* live: seconds until the sandbox is killed (0: no limit) */
    int deadline_fd;            /* live: --deadline-fd N: the engine's deadline (epoch seconds, as
                                   text) read when the lifetime is up or on SIGALRM: a later one
                                   re-arms the alarm (the sandbox's timeout was moved) */
    const char *init;           /* live: the sandtree-init binary (init.c) */
    int restore;                /* live: --restore 1: the command is `criu restore` (restore.c) */
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
    int fresh_net;              /* --fresh-net 1 (with --restore): the checkpoint holds no network
                                   namespace (a live fork's, dumped from inside the sandbox's own:
                                   criu.py NETNS_FRESH); CRIU restores into a new one made for it
                                   (restore.c fresh_netns) */
    int netns_fd;               /* --netns-fd N: join this network namespace (made and wired by the
                                   egress daemon, network/links.py; owned by the host's user
                                   namespace, so root in the sandbox holds no capability over its
                                   links, routes or netfilter) instead of a new, empty one */
    int runtime_fd;             /* --runtime-fd N: the runtime files (see runtime_files) */
};

/* An enter's output relay (relay.c). */
struct relay { int out, err, sock; };        /* the pipes' write ends; the relay's socket */

/* steps.c */
extern int report_fd;                   /* the engine's report (--report; the protocol: above) */
extern pid_t live_c;                    /* a live P's sandbox, once cloned: a failed step kills it */
__attribute__((noreturn)) void die_step(const char *step);
void write_file(const char *path, const char *data);
void xmount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data);
void touch(const char *path, mode_t mode);
void mkdir_p_one(const char *path, mode_t mode);
ssize_t sendmsg_fd(int sock, int fd, char tag, int flags);
void send_fd(int sock, int fd);

/* options.c */
void parse(int argc, char **argv, struct opts *o);
char *read_all(int fd, size_t *len);
void read_spec(int fd, struct opts *o);
void parse_spec(char *buf, size_t len, struct opts *o);

/* mounts.c */
void setup_proc(const char *base);
void bind_dev_nodes(const char *dir);
void setup_dev(void);
void mount_root(struct opts *o);
void warm_prepare(struct opts *o);
void warm_mount(struct opts *o);

/* runfiles.c */
void read_runtime(int fd);
void bind_resolv(const char *root, const char *src, int only_link);
int rt_has_resolv(void);
const char *mount_point_layer(struct opts *o);
void runtime_files(const char *dir, const char *root);

/* network.c */
void loopback_up(void);
void joined_sysctls(void);

/* pid1.c */
extern int sync_pipe[2];                /* P -> C: maps written */
extern int exec_pipe[2];                /* G -> C: errno of a failed execve (CLOEXEC) */
extern int status_pipe[2];              /* C -> P: G's wait status / exec errno */
extern int spec_pipe[2];                /* P -> C: the run's spec (warm start) */
extern int init_fd;                     /* live: sandtree-init (init.c), opened by P */
extern volatile pid_t g_pid;            /* the command (or a live sandbox's root process) */
void forward(int sig);
int sandbox_init(struct opts *o);

/* command.c */
void become_command(const struct opts *o);

/* terminal.c */
extern struct termios tty_saved;        /* the engine's terminal's mode, before own_terminal */
extern int tty_restore;                 /* whether to put it back */
int take_terminal(int sock);
int own_terminal(void);
int recv_master(int sock);
void relay_terminal(int master, int out, pid_t g, int sfd);

/* enter.c */
void forward_rt(int sig);
int enter_sandbox(struct opts *o);

/* relay.c */
void close_relay(struct relay *r);
int start_relay(struct opts *o, int drain_fd, struct relay *r);
void use_relay(struct relay *r);

/* live.c */
void live_ready(struct opts *o, pid_t c);
int detach_host(struct opts *o);
int live_wait(struct opts *o, pid_t c);

/* gvisor.c */
int live_runtime(struct opts *o);
int enter_mount(struct opts *o);

/* restore.c */
int restore_sandbox(struct opts *o);

#endif
