/*
 * mounts.c: the run's root. The scratch tmpfs (upper and work), the overlay of the image's layers,
 * a masked /proc, a minimal /dev (device nodes as root, binds in a user namespace), and a warm
 * start's mounts made before the run comes (warm_prepare) and for it (warm_mount). The runtime files
 * mounted into that root are runfiles.c's.
 */
#include "helper.h"

/* /proc entries that leak host information or offer host-wide knobs. */
static const char *proc_null[] = {"kcore", "keys", "latency_stats", "timer_list",
                                  "sched_debug", "sysrq-trigger", "kallsyms", "kmsg", NULL};
static const char *proc_empty[] = {"acpi", "scsi", "asound", "firmware", NULL};
static const char *proc_ro[] = {"sys", "bus", "fs", "irq", NULL};

void setup_proc(const char *base) {
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
void bind_dev_nodes(const char *dir) {
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

void setup_dev(void) {
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

/* The run's root: a tmpfs scratch (upper + work, so --disk caps the run's writes, and
 * commit reads the upper through the fd sent to the engine, after every namespace is gone)
 * and the overlay of the image's layers on scratch/r. Done by P in a private mount
 * namespace when we are root (a host overlay: trusted.* xattrs, whiteouts as 0/0 devices),
 * or by C inside the user namespace when rootless (userxattr). Paths, not fds: overlay
 * refuses lowers that belong to another mount namespace. */
void mount_root(struct opts *o) {
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
void warm_prepare(struct opts *o) {
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
void warm_mount(struct opts *o) {
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
