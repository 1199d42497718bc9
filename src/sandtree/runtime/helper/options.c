/*
 * options.c: the options, from argv (a cold start) or from a warm start's spec (NUL-separated,
 * read from --spec-fd once the run comes). They fill struct opts (helper.h), which every other file
 * reads: the engine (runtime/namespaces.py) decides, the helper only performs.
 */
#include "helper.h"

/* Options: "--name value" pairs, then "--", then the command. Used for argv (cold start) and
 * for the NUL-separated spec read from --spec-fd (warm start). Returns the index after "--". */
static int parse_opts(int argc, char **argv, struct opts *o) {
    int i = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--")) return i + 1;
        if (!v) { fprintf(stderr, "sandtree-exec: %s needs a value\n", a); exit(125); }
        if (!strcmp(a, "--layers")) o->layers = v;
        else if (!strcmp(a, "--root-mode")) o->root_mode = strtol(v, NULL, 8);
        else if (!strcmp(a, "--root-uid")) o->root_uid = atol(v);
        else if (!strcmp(a, "--root-gid")) o->root_gid = atol(v);
        else if (!strcmp(a, "--lower")) o->lower = v;
        else if (!strcmp(a, "--sock")) o->sock_fd = atoi(v);
        else if (!strcmp(a, "--report")) o->report_fd = atoi(v);
        else if (!strcmp(a, "--seccomp-fd")) o->seccomp_fd = atoi(v);
        else if (!strcmp(a, "--spec-fd")) o->spec_fd = atoi(v);
        else if (!strcmp(a, "--inject")) o->inject = atoi(v);
        else if (!strcmp(a, "--exec")) o->exec_runtime = atoi(v);
        else if (!strcmp(a, "--live")) o->live = atoi(v);
        else if (!strcmp(a, "--init")) o->init = v;
        else if (!strcmp(a, "--restore")) o->restore = atoi(v);
        else if (!strcmp(a, "--detach")) o->detach = atoi(v);
        else if (!strcmp(a, "--lifetime")) o->lifetime = atol(v);
        else if (!strcmp(a, "--deadline-fd")) o->deadline_fd = atoi(v);
        else if (!strcmp(a, "--enter-fd")) o->enter_fd = atoi(v);
        else if (!strcmp(a, "--mnt-fd")) o->mnt_fd = atoi(v);
        else if (!strcmp(a, "--agent-fd")) o->agent_fd = atoi(v);
        else if (!strcmp(a, "--resumed")) o->resumed = atoi(v);
        else if (!strcmp(a, "--netns-fd")) o->netns_fd = atoi(v);
        else if (!strcmp(a, "--resolv-layer")) o->resolv_layer = atoi(v);
        else if (!strcmp(a, "--fresh-net")) o->fresh_net = atoi(v);
        else if (!strcmp(a, "--runtime-fd")) o->runtime_fd = atoi(v);
        else if (!strcmp(a, "--pty")) o->pty = atoi(v);
        else if (!strcmp(a, "--drain")) o->drain = v;
        else if (!strcmp(a, "--relay-ahead")) o->relay_ahead = atoi(v);
        else if (!strcmp(a, "--uid-map")) o->uid_map = v;
        else if (!strcmp(a, "--gid-map")) o->gid_map = v;
        else if (!strcmp(a, "--disk")) o->disk = v;
        else if (!strcmp(a, "--inodes")) o->inodes = v;
        else if (!strcmp(a, "--hostname")) o->hostname = v;
        else if (!strcmp(a, "--cwd")) o->cwd = v;
        else if (!strcmp(a, "--uid")) o->uid = atol(v);
        else if (!strcmp(a, "--owner-base")) o->owner_base = atol(v);
        else if (!strcmp(a, "--gid")) o->gid = atol(v);
        else if (!strcmp(a, "--cgroup") && o->ncgroups < MAX_LIST) o->cgroups[o->ncgroups++] = v;
        else if (!strcmp(a, "--keep-cap") && o->nkeep < 64) o->keep_caps[o->nkeep++] = atoi(v);
        else if (!strcmp(a, "--env")) {
            o->envp = realloc(o->envp, sizeof(char *) * (size_t)(o->nenv + 2));
            o->envp[o->nenv++] = (char *)v;
            o->envp[o->nenv] = NULL;
        }
        else { fprintf(stderr, "sandtree-exec: unknown option %s\n", a); exit(125); }
        i++;
    }
    return argc;
}

void parse(int argc, char **argv, struct opts *o) {
    memset(o, 0, sizeof *o);
    o->sock_fd = o->report_fd = o->seccomp_fd = o->spec_fd = o->enter_fd = o->mnt_fd = o->agent_fd = o->deadline_fd = o->netns_fd = o->runtime_fd = o->tty_sock = -1;
    o->disk = "1g"; o->inodes = "262144"; o->root_mode = 0755; o->hostname = "sandtree"; o->cwd = "/"; o->lower = "";
    int i = 1 + parse_opts(argc - 1, argv + 1, o);
    o->self_argv0 = argv[0];
    o->argv_end = argv[argc - 1] + strlen(argv[argc - 1]);
    o->argv = argv + i;
    /* The command's env comes as our own environment's _ST_NAME=VALUE entries: names that no
     * loader or libc reads (LD_PRELOAD, GLIBC_TUNABLES, ... act on nothing of ours, and a dynamic
     * build of this root helper would load them), and not argv (/proc/PID/cmdline is world-readable). */
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, "_ST_", 4)) continue;
        o->envp = realloc(o->envp, sizeof(char *) * (size_t)(o->nenv + 2));
        if (!o->envp) exit(125);
        o->envp[o->nenv++] = *e + 4;
        o->envp[o->nenv] = NULL;
    }
    if (o->spec_fd >= 0) return;                 /* the rest comes with the spec */
    if ((o->enter_fd >= 0 || o->mnt_fd >= 0) && o->report_fd >= 0) return;
    if (i >= argc || !o->layers || o->sock_fd < 0 || o->report_fd < 0) {
        fprintf(stderr, "usage: sandtree-exec --layers DIR --lower L --sock N --report N [...] -- CMD...\n");
        exit(125);
    }
}

/* A warm start's spec is never larger than this (the engine's limits on a command and its env,
 * runtime/validate.py, keep it far below): a writer that sends more is refused, not buffered. */
#define MAX_SPEC (16 << 20)

/* Everything on fd until EOF (then closed), in memory of ours; *len its size. */
char *read_all(int fd, size_t *len) {
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    *len = 0;
    for (;;) {
        if (!buf) die_step("spec-alloc");
        if (*len == cap) {
            if (cap >= MAX_SPEC) { errno = E2BIG; die_step("spec"); }
            buf = realloc(buf, cap *= 2);
            continue;
        }
        ssize_t n = read(fd, buf + *len, cap - *len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) die_step("spec-read");
        if (n == 0) break;
        *len += (size_t)n;
    }
    close(fd);
    return buf;
}

/* Warm start: read the per-run spec (NUL-separated options, "--", command) until EOF. */
void read_spec(int fd, struct opts *o) {
    size_t len;
    char *buf = read_all(fd, &len);
    parse_spec(buf, len, o);
}

/* The spec in buf (kept: the options point into it) as options and command. */
void parse_spec(char *buf, size_t len, struct opts *o) {
    if (len == 0 || buf[len - 1] != 0) { errno = EINVAL; die_step("spec"); }
    int argc = 0;
    for (size_t k = 0; k < len; k++) if (buf[k] == 0) argc++;
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    size_t start = 0;
    for (int k = 0; k < argc; k++) { args[k] = buf + start; start += strlen(buf + start) + 1; }
    int i = parse_opts(argc, args, o);
    o->argv = args + i;
    if (i >= argc || (!o->layers && o->enter_fd < 0)) { errno = EINVAL; die_step("spec"); }
}
