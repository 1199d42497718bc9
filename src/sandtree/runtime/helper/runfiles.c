/*
 * runfiles.c: the runtime files (RunSpec.runtime_files, --runtime-fd N): files the sandbox is shown
 * read-only and a commit never holds (a link's resolv.conf and CA bundle), in a tmpfs of their own at
 * /dev/sandtree, resolv.conf bound over the image's. Their own file: a format (records read from an
 * fd), its checks (names, the no-follow bind) and the overlay layer they may need.
 */
#include "helper.h"

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

void read_runtime(int fd) {
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
void bind_resolv(const char *root, const char *src, int only_link) {
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
int rt_has_resolv(void) {
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
const char *mount_point_layer(struct opts *o) {
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
void runtime_files(const char *dir, const char *root) {
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
