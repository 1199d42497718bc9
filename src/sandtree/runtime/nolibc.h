/*
 * The two things sandtree-init (init.c) and sandtree-drain (drain.c) need in place of libc: one
 * system call with up to four arguments, and an entry point. They run inside every live sandbox
 * from a copy on its /dev/shm, so they stay a few hundred bytes (build.py: -nostdlib; a change
 * here rebuilds both, as build.py hashes this file with each source).
 */
#ifndef SANDTREE_NOLIBC_H
#define SANDTREE_NOLIBC_H

#if defined(__x86_64__)
static long sys(long n, long a, long b, long c, long d) {
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
}
/* _start: a zeroed frame pointer, an aligned stack, then the program's main (which never returns),
 * given the initial stack pointer (argc, argv..., 0, envp..., 0: a main may read its arguments) */
#define NOLIBC_START(entry) \
    __asm__(".global _start\n_start:\n xor %rbp,%rbp\n mov %rsp,%rdi\n and $-16,%rsp\n call " #entry "\n hlt\n");
#elif defined(__aarch64__)
static long sys(long n, long a, long b, long c, long d) {
    register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b,
                  x2 __asm__("x2") = c, x3 __asm__("x3") = d;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
    return x0;
}
#define NOLIBC_START(entry) __asm__(".global _start\n_start:\n mov x29, #0\n mov x0, sp\n bl " #entry "\n");
#else
#error "sandtree: add this architecture's system call convention to nolibc.h"
#endif

#endif
