/* bench/c/dvm_native.c -- the native side of the DVM benchmarks (bench/dvm.sh, issue 27): the same
 * loops as the DASS programs, compiled with gcc -O2 (-mno-red-zone: the push/pop loops move the stack
 * pointer), as 004_* measured them (Table 4.1, Figures 4.6 and 4.7).
 *
 *   dvm_native iteration      1e6 iterations of a += n (Listing 4.3): microseconds
 *   dvm_native volatile       the same with a volatile sum: microseconds
 *   dvm_native memcpy WORDS   10 MiB as copies of WORDS 8-byte words to one buffer: microseconds
 *   dvm_native pushpop        1 MiB pushed and popped in 16 bursts of 64 KiB, one register per
 *                             instruction, one instruction per loop iteration (as the DASS loop
 *                             `push 0 $1; for ...`): "push_us pop_us"
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: dvm_native iteration|volatile|memcpy WORDS|pushpop\n");
        return 2;
    }
    const char *m = argv[1];
    if (!strcmp(m, "iteration")) {
        uint64_t n = 0, a = 0, N = 1000000;
        double t0 = now_us();
        while (n < N) {
            __asm__("add %1, %0" : "+r"(a) : "r"(n));
            __asm__("inc %0" : "+r"(n));
        }
        double t1 = now_us();
        printf("%.1f\n", t1 - t0);
        return a == 499999500000ull ? 0 : 1;
    }
    if (!strcmp(m, "volatile")) {
        volatile uint64_t a = 0;
        uint64_t N = 1000000;
        double t0 = now_us();
        for (uint64_t n = 0; n < N; n++)
            a = a + n;
        double t1 = now_us();
        printf("%.1f\n", t1 - t0);
        return a == 499999500000ull ? 0 : 1;
    }
    if (!strcmp(m, "memcpy") && argc == 3) {
        size_t words = strtoul(argv[2], 0, 10);
        if (words == 0 || words > 4096)
            return 2;
        uint64_t *src = calloc(words, 8), *dst = calloc(words, 8);
        size_t count = (10u << 20) / (8 * words);
        for (size_t i = 0; i < words; i++)
            src[i] = 42 + i;
        double t0 = now_us();
        for (size_t i = 0; i < count; i++) {
            memcpy(dst, src, 8 * words);
            __asm__ volatile("" ::"r"(dst) : "memory");
        }
        double t1 = now_us();
        printf("%.1f\n", t1 - t0);
        return dst[0] == 42 ? 0 : 1;
    }
    if (!strcmp(m, "pushpop")) {
        double push = 0, pop = 0;
        for (int burst = 0; burst < 16; burst++) {
            uint64_t v = burst;
            double t0 = now_us();
            __asm__ volatile("mov %%rsp, %%r11\n\t"
                             "mov $8192, %%rcx\n\t"
                             "1:\n\t"
                             "push %%rax\n\t"
                             "dec %%rcx\n\tjnz 1b\n\t"
                             "mov %%r11, %%rsp\n\t"
                             :
                             : "a"(v)
                             : "rcx", "r11", "memory");
            double t1 = now_us();
            __asm__ volatile("mov %%rsp, %%r11\n\t"
                             "sub $65536, %%rsp\n\t"
                             "mov $8192, %%rcx\n\t"
                             "1:\n\t"
                             "pop %%rdx\n\t"
                             "dec %%rcx\n\tjnz 1b\n\t"
                             "mov %%r11, %%rsp\n\t"
                             :
                             :
                             : "rcx", "rdx", "r11", "memory");
            double t2 = now_us();
            push += t1 - t0;
            pop += t2 - t1;
        }
        printf("%.1f %.1f\n", push, pop);
        return 0;
    }
    fprintf(stderr, "dvm_native: unknown mode %s\n", m);
    return 2;
}
