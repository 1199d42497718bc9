/*
 * network.c: the sandbox's own network namespace, before anything of the command runs: loopback
 * up and small TCP buffer maxima (why: below). A namespace joined with --netns-fd comes set up by the
 * egress daemon (network/links.py) and gets none of this.
 */
#include "helper.h"

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

/* What the egress daemon sets in a link's namespace (network/links.py LINK_SYSCTLS), for a namespace
 * the sandbox's root holds no capability over (restore.c fresh_netns): dev servers bind 80. */
void joined_sysctls(void) {
    int f = open("/proc/sys/net/ipv4/ip_unprivileged_port_start", O_WRONLY | O_CLOEXEC);
    if (f < 0 || write(f, "0", 1) != 1) die_step("ip_unprivileged_port_start");
    close(f);
}

void loopback_up(void) {
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
