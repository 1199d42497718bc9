/* spawntime N PATH: start PATH N times from this process (vfork, execve, waitpid) and print the
 * median and the 90th percentile in microseconds. Inside a sandbox it measures the sandbox's own
 * cost of starting a program, the floor under any exec that reaches it from outside
 * (bench/gvisor_live.py). Built static: the busybox image has no libc. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int cmp(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: spawntime N PATH\n"); return 2; }
    int n = atoi(argv[1]);
    if (n < 1 || n > 100000) return 2;
    long *us = calloc(n, sizeof *us);
    char *av[] = {argv[2], NULL};
    for (int i = 0; i < n; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        pid_t p = vfork();
        if (p == 0) { execve(argv[2], av, environ); _exit(127); }
        int st;
        if (p < 0 || waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        us[i] = (b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000;
    }
    qsort(us, n, sizeof *us, cmp);
    printf("%ld %ld\n", us[n / 2], us[(n * 9) / 10]);
    return 0;
}
