/* A counter a sandbox keeps writing, for measuring how long a live fork stops it: every 0.5 ms
 * it counts one more and writes "COUNT LONGEST_GAP_US" in place (pwrite at offset 0, fixed width,
 * so a reader never sees a half-written or empty file) to argv[1] (default /tmp/tick). The
 * longest gap is its own view (CLOCK_MONOTONIC between two turns of its loop), since it started
 * or since /tmp/tick-reset last appeared (it removes that file); a reader outside times the gaps
 * between the counts it sees change. */
#include <stdio.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000;
}

int main(int argc, char **argv) {
    int fd = open(argc > 1 ? argv[1] : "/tmp/tick", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 1;
    unsigned long long count = 0, longest = 0, last = now_us();
    char buf[64];
    for (;;) {
        unsigned long long t = now_us();
        if (access("/tmp/tick-reset", F_OK) == 0) {
            longest = 0;
            unlink("/tmp/tick-reset");
        } else if (t - last > longest) {
            longest = t - last;
        }
        last = t;
        count++;
        int len = snprintf(buf, sizeof buf, "%020llu %020llu\n", count, longest);
        if (pwrite(fd, buf, (size_t)len, 0) != len) return 2;
        usleep(500);
    }
}
