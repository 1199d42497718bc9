/* A process that holds state only in memory, for hibernate tests and benchmarks: MB megabytes of
 * random bytes (argv[1], read from /dev/urandom, so a restarted process could not rebuild them)
 * and a counter. Each time /tmp/ask appears it counts one more and writes "COUNT SUM" to
 * /tmp/answer, then removes /tmp/ask. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <fcntl.h>

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? (size_t)atol(argv[1]) : 100, n = mb << 20;
    unsigned char *buf = malloc(n);
    int fd = open("/dev/urandom", O_RDONLY);
    for (size_t off = 0; off < n;) {
        ssize_t r = read(fd, buf + off, n - off);
        if (r <= 0) return 1;
        off += (size_t)r;
    }
    close(fd);
    unsigned long count = 0;
    FILE *ready = fopen("/tmp/ready", "w");
    fclose(ready);
    for (;;) {
        if (access("/tmp/ask", F_OK) == 0) {
            unsigned long long sum = 0;
            for (size_t i = 0; i < n; i++) sum = sum * 31 + buf[i];
            count++;
            FILE *f = fopen("/tmp/answer.tmp", "w");
            fprintf(f, "%lu %llu\n", count, sum);
            fclose(f);
            rename("/tmp/answer.tmp", "/tmp/answer");
            unlink("/tmp/ask");
        }
        usleep(2000);
    }
}
