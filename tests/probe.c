/* A static probe run inside sandboxes by test_isolation.py: each mode tries one forbidden thing
 * and prints what the kernel answered. Never run on the host. */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <unistd.h>

static void report(const char *what, long rc) {
    printf("%s %s\n", what, rc < 0 ? strerror(errno) : "ALLOWED");
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *m = argv[1];
    if (!strcmp(m, "mount")) report("mount", mount("none", "/mnt", "tmpfs", 0, NULL));
    else if (!strcmp(m, "unshare")) report("unshare", unshare(CLONE_NEWUSER));
    else if (!strcmp(m, "ptrace")) report("ptrace", ptrace(PTRACE_ATTACH, atoi(argv[2]), 0, 0));
    else if (!strcmp(m, "module")) report("init_module", syscall(SYS_init_module, "", 0, ""));
    else if (!strcmp(m, "bpf")) report("bpf", syscall(SYS_bpf, 0, NULL, 0));
    else if (!strcmp(m, "keyctl")) report("keyctl", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
    else if (!strcmp(m, "chroot")) report("chroot", chroot("/tmp"));
    else if (!strcmp(m, "hog")) {
        size_t mb = (size_t)atol(argv[2]);
        for (size_t i = 0; i < mb; i++) {
            char *p = malloc(1 << 20);
            if (!p) { puts("malloc failed"); return 3; }
            memset(p, 1, 1 << 20);
        }
        puts("hog survived");
    }
    return 0;
}
