/*
 * cacheline.c -- the physical floor for intra-node message latency.
 *
 * Two processes (fork) share one anonymous MAP_SHARED page and are pinned
 * to two different CPUs (cpu 0 and cpu 1, or the first two CPUs of the
 * current affinity mask).  They ping-pong a counter that lives in a single
 * 64-byte cache line: the parent writes an odd value and spins until it
 * sees the next even one; the child spins on the odd value and writes the
 * next even one.  Every hand-off is one cache-line transfer between cores,
 * which no shared-memory transport can beat.
 *
 *   cacheline [--iters N] [--batches B] [--json FILE]
 *
 * N round trips (default 1,000,000) are split into B batches (default 10)
 * after one untimed warmup batch; each batch gives a mean half round trip
 * = batch_time / (2 * round_trips_in_batch), and the MEDIAN over batches
 * is reported (min and max are printed too).
 *
 * JSON:
 *   {"benchmark": "cacheline", "transport": "cacheline",
 *    "results": [{"size": 8, "latency_us": 0.07}]}
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_BATCHES 1000

struct shared {
    _Alignas(64) _Atomic uint64_t value; /* the one cache line ping-ponged */
    char pad0[64 - sizeof(uint64_t)];
    _Alignas(64) _Atomic int child_ready;
};

static int g_yield; /* spin with sched_yield() when only one CPU is usable */

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static long parse_long(const char *s, const char *what)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v <= 0) {
        fprintf(stderr, "cacheline: invalid %s: '%s'\n", what, s);
        exit(2);
    }
    return v;
}

/* Pick two distinct CPUs: 0 and 1 if both are allowed, else the first two
 * of the affinity mask.  Returns the number found (0, 1 or 2). */
static int pick_cpus(int cpus[2])
{
    cpu_set_t set;
    int n = 0;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return 0;
    if (CPU_ISSET(0, &set) && CPU_ISSET(1, &set)) {
        cpus[0] = 0;
        cpus[1] = 1;
        return 2;
    }
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return n;
}

static void pin_to(int cpu, const char *who)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        fprintf(stderr, "cacheline: warning: cannot pin %s to cpu %d: %s\n", who,
                cpu, strerror(errno));
}

static inline void wait_for(_Atomic uint64_t *v, uint64_t want)
{
    if (g_yield) {
        while (atomic_load_explicit(v, memory_order_acquire) != want)
            sched_yield();
    } else {
        while (atomic_load_explicit(v, memory_order_acquire) != want)
            ; /* pure spin: the floor, no pause instruction */
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    long iters = 1000000;
    long batches = 10;
    const char *json_path = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--iters") == 0 && v) {
            iters = parse_long(v, "--iters");
            i++;
        } else if (strcmp(a, "--batches") == 0 && v) {
            batches = parse_long(v, "--batches");
            i++;
        } else if (strcmp(a, "--json") == 0 && v) {
            json_path = v;
            i++;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            printf("usage: %s [--iters N] [--batches B] [--json FILE]\n", argv[0]);
            return 0;
        } else {
            fprintf(stderr, "usage: %s [--iters N] [--batches B] [--json FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    if (batches > MAX_BATCHES)
        batches = MAX_BATCHES;
    long per_batch = iters / batches;
    if (per_batch < 1)
        per_batch = 1;
    long total = per_batch * (batches + 1); /* +1 warmup batch */

    struct shared *sh = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE),
                             PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                             -1, 0);
    if (sh == MAP_FAILED) {
        perror("cacheline: mmap");
        return 1;
    }
    atomic_store(&sh->value, 0);
    atomic_store(&sh->child_ready, 0);

    int cpus[2] = {0, 0};
    int ncpus = pick_cpus(cpus);
    if (ncpus < 2) {
        g_yield = 1;
        fprintf(stderr, "cacheline: warning: fewer than 2 usable CPUs; "
                        "spinning with sched_yield (result is NOT a floor)\n");
    }

    pid_t pid = fork();
    if (pid < 0) {
        perror("cacheline: fork");
        return 1;
    }
    if (pid == 0) {
        /* child: pong */
        if (ncpus >= 2)
            pin_to(cpus[1], "child");
        atomic_store_explicit(&sh->child_ready, 1, memory_order_release);
        for (long i = 0; i < total; i++) {
            uint64_t odd = 2 * (uint64_t)i + 1;
            wait_for(&sh->value, odd);
            atomic_store_explicit(&sh->value, odd + 1, memory_order_release);
        }
        _exit(0);
    }

    /* parent: ping */
    if (ncpus >= 2)
        pin_to(cpus[0], "parent");
    while (atomic_load_explicit(&sh->child_ready, memory_order_acquire) == 0)
        sched_yield();

    double half_rtt_ns[MAX_BATCHES];
    long i = 0;
    for (long b = 0; b <= batches; b++) {
        double t0 = now_ns();
        for (long k = 0; k < per_batch; k++, i++) {
            uint64_t odd = 2 * (uint64_t)i + 1;
            atomic_store_explicit(&sh->value, odd, memory_order_release);
            wait_for(&sh->value, odd + 1);
        }
        double t1 = now_ns();
        if (b > 0) /* batch 0 is warmup */
            half_rtt_ns[b - 1] = (t1 - t0) / (2.0 * (double)per_batch);
    }

    int status = 0;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        fprintf(stderr, "cacheline: child failed\n");
        return 1;
    }

    qsort(half_rtt_ns, (size_t)batches, sizeof(double), cmp_double);
    double med = batches % 2 ? half_rtt_ns[batches / 2]
                             : 0.5 * (half_rtt_ns[batches / 2 - 1] +
                                      half_rtt_ns[batches / 2]);
    printf("# cacheline ping-pong: cpus %d,%d  %ld round trips in %ld batches "
           "(+1 warmup)\n",
           cpus[0], ncpus >= 2 ? cpus[1] : cpus[0], per_batch * batches, batches);
    printf("half round trip: median %.1f ns (%.4f us)  min %.1f ns  max %.1f ns\n",
           med, med / 1000.0, half_rtt_ns[0], half_rtt_ns[batches - 1]);

    if (json_path != NULL) {
        FILE *f = fopen(json_path, "w");
        if (f == NULL) {
            fprintf(stderr, "cacheline: cannot write %s: %s\n", json_path,
                    strerror(errno));
            return 1;
        }
        fprintf(f,
                "{\"benchmark\": \"cacheline\", \"transport\": \"cacheline\", "
                "\"results\": [{\"size\": 8, \"latency_us\": %.4f}]}\n",
                med / 1000.0);
        if (fclose(f) != 0)
            return 1;
    }
    munmap(sh, (size_t)sysconf(_SC_PAGESIZE));
    return 0;
}
