/*
 * restore.c: --restore 1, a hibernated live sandbox back: the same cgroups and root as a start, then
 * CRIU in a root of its own (criu_root) and, as root, in a user namespace owned by the sandbox's own
 * uid (enter_owned_userns); the restored pid 1 becomes our child, and from there we are its P.
 */
#include "helper.h"

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

/* --fresh-net 1, the CRIU child: a network namespace for the restored tasks, made here, after
 * enter_owned_userns, so that U owns it and the restoring CRIU holds CAP_NET_ADMIN over it (TCP
 * repair, sockets' options). The checkpoint holds none: a live fork's dump runs inside the
 * source's own (criu.py NETNS_FRESH), which leaves out CRIU's dump and restore of it (ip and
 * iptables save/restore: about 45 ms each way). It is set up as a start's (loopback_up) and, as
 * the sandbox's root holds no capability over it (its user namespace is U's child, made by
 * CRIU), as a link's (joined_sysctls). */
static void fresh_netns(void) {
    if (unshare(CLONE_NEWNET) < 0) die_step("fresh-netns");
    loopback_up();
    joined_sysctls();
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
int restore_sandbox(struct opts *o) {
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
        if (o->fresh_net && o->netns_fd < 0) fresh_netns();
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
