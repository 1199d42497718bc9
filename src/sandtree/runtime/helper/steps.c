/*
 * steps.c: how a step fails, and the small steps every file takes. A failed step is reported to
 * the engine ("setupfail <errno> <step>" on the report fd) and takes a live sandbox along (die_step);
 * writing a file, mounting, making a file or a directory, and passing an fd over a unix socket fail
 * through it (or return sendmsg's answer), so no caller repeats the check.
 */
#include "helper.h"

int report_fd = -1;

/* A live P's sandbox (its pid 1), once cloned: a P that fails takes it along. Its pid 1 drops
 * the parent-death signal (a sandbox outlives its engine), so without this a P that died while
 * setting up (its engine killed: the report pipe gone) left a sandbox with no P, hence no
 * lifetime, no row and no end. */
pid_t live_c = -1;

__attribute__((noreturn)) void die_step(const char *step) {
    int e = errno;
    if (report_fd >= 0) dprintf(report_fd, "setupfail %d %s\n", e, step);
    if (live_c > 0) kill(live_c, SIGKILL);
    _exit(125);
}

void write_file(const char *path, const char *data) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) die_step(path);
    size_t n = strlen(data);
    if (write(fd, data, n) != (ssize_t)n) die_step(path);
    close(fd);
}

void xmount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
    if (mount(src, dst, type, flags, data) < 0) die_step(dst);
}

void touch(const char *path, mode_t mode) {
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, mode);
    if (fd < 0) die_step(path);
    close(fd);
}

void mkdir_p_one(const char *path, mode_t mode) {
    if (mkdir(path, mode) < 0 && errno != EEXIST) die_step(path);
}

/* One byte `tag` with `fd` attached (SCM_RIGHTS); sendmsg's answer. */
ssize_t sendmsg_fd(int sock, int fd, char tag, int flags) {
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

void send_fd(int sock, int fd) {
    if (sendmsg_fd(sock, fd, 'u', 0) < 0) die_step("sendmsg");
}
