/*
 * alltoall_floor.c -- a lower bound for the alltoall latency that mpi_coll.c measures: the same timing
 * (each call timed on its own, an untimed barrier after it, the mean per call averaged over ranks), the
 * same rank placement as `vmfabric run` (one CPU each while there are enough, else blocks of consecutive
 * ranks: 4 ranks on 2 CPUs -> 0 and 1 on the first, 2 and 3 on the second), but no MPI library: plain
 * processes forked from one parent, sharing one anonymous mapping, doing only what any alltoall must.
 *
 *   alltoall_floor [--ranks N] [--sizes 8,1024,...] [--iters N] [--warmup N] [--json FILE] [--label NAME]
 *
 * - Up to SMALL_MAX bytes per block: each rank writes its block for rank p into p's inbox line(s) and
 *   stamps it; p copies it out once the stamp is there (one cache-line transfer per pair, as small as
 *   a shared-memory exchange gets). Inboxes are reused with no acknowledgement: safe only because a
 *   barrier separates the calls, which a library cannot assume -- so this is a bound, not a design.
 * - Larger blocks: every send buffer lies in the shared mapping, so each rank copies every block it
 *   receives exactly once, straight out of the sender's buffer (what a single-copy transport does with
 *   no kernel help), after every rank has entered the call and before any leaves it.
 * - Waiting: a rank that waits for a rank on its own CPU yields to it at once (sched_yield); for ranks on
 *   other CPUs it spins, and yields after SPIN_MAX polls (the awaited rank may itself wait for our mate).
 * Iterations for size s as mpi_coll: max(10, min(N, N * 8192 / s)), N defaults to 10000. The first byte
 * of every block changes with every call and is checked; a wrong one fails the run (exit status 1).
 *
 * JSON (written by rank 0): {"benchmark": "coll-alltoall", "transport": "<label>", "ranks": n,
 *                            "results": [{"size": 8, "latency_us": 1.23}, ...]}
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll_args.h"

#define MAX_RANKS 16
#define SMALL_MAX 4096
#define SPIN_MAX 4096

struct line {
    _Alignas(64) _Atomic uint64_t v;
};
struct inbox {
    _Alignas(64) _Atomic uint64_t stamp;
    unsigned char data[SMALL_MAX];
};
struct ctl {
    struct line enter[MAX_RANKS], leave[MAX_RANKS], bar[MAX_RANKS];
    double lat[MAX_RANKS][MAX_SIZES];
    _Atomic int failed;
};

static int nranks, me, cpu_of[MAX_RANKS];

static void die(const char *m)
{
    fprintf(stderr, "alltoall_floor: %s\n", m);
    exit(2);
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* True if rank r runs on this rank's CPU (then it needs the CPU we would spin on). */
static int mate_of_mine(int r) { return cpu_of[r] >= 0 && cpu_of[r] == cpu_of[me]; }

/* One idle step of a wait: yield at once while a mate is awaited, else spin, yielding every SPIN_MAX. */
static void idle(int mate, unsigned *spins)
{
    if (mate || ++*spins >= SPIN_MAX) {
        sched_yield();
        *spins = 0;
    } else {
        __builtin_ia32_pause();
    }
}

/* Wait until every other rank's word (at base + r * stride bytes) reaches v. */
static void wait_all(const void *base, size_t stride, uint64_t v)
{
    for (unsigned spins = 0;;) {
        int missing = 0, mate = 0;
        for (int r = 0; r < nranks; r++) {
            if (r == me) continue;
            const _Atomic uint64_t *w = (const _Atomic uint64_t *)((const char *)base + r * stride);
            if (atomic_load_explicit(w, memory_order_acquire) < v) {
                missing = 1;
                mate |= mate_of_mine(r);
            }
        }
        if (!missing) return;
        idle(mate, &spins);
    }
}

static void barrier(struct ctl *c, uint64_t *seq)
{
    ++*seq;
    atomic_store_explicit(&c->bar[me].v, *seq, memory_order_release);
    wait_all(&c->bar[0].v, sizeof(struct line), *seq);
}

static unsigned char pattern(int from, int to, uint64_t call) { return (unsigned char)(from * 16 + to + call * 7); }

int main(int argc, char **argv)
{
    struct coll_args a;
    coll_args_init(&a, "ideal-shm");
    nranks = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ranks") && i + 1 < argc) nranks = atoi(argv[++i]);
        else if (!coll_args_take(&a, argc, argv, &i))
            die("usage: alltoall_floor [--ranks N] [--sizes a,b] [--iters N] [--warmup N] [--json F] [--label L]");
    }
    const long *sizes = a.sizes, iters = a.iters;
    const int nsizes = a.nsizes;
    const char *json = a.json, *label = a.label;
    if (nranks < 2 || nranks > MAX_RANKS) die("--ranks must be 2..16");
    if (iters < 1) die("--iters must be positive");
    long maxs = 8;
    for (int k = 0; k < nsizes; k++) {
        if (sizes[k] < 1) die("sizes must be positive");
        if (sizes[k] > maxs) maxs = sizes[k];
    }

    /* Placement as vmf_pal::process::cpu_for_rank over the CPUs we may run on. */
    cpu_set_t allowed;
    int cpus[CPU_SETSIZE], ncpus = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++) if (CPU_ISSET(c, &allowed)) cpus[ncpus++] = c;
    for (int r = 0; r < nranks; r++)
        cpu_of[r] = ncpus == 0 ? -1 : nranks <= ncpus ? cpus[r] : cpus[r * ncpus / nranks];

    size_t inbox_bytes = sizeof(struct inbox) * nranks * nranks;
    size_t send_bytes = (size_t)maxs * nranks * nranks;
    size_t total = sizeof(struct ctl) + inbox_bytes + send_bytes;
    char *shm = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED) die("mmap failed");
    struct ctl *c = (struct ctl *)shm;
    struct inbox *inbox = (struct inbox *)(shm + sizeof(struct ctl)); /* inbox[to * n + from] */
    unsigned char *sendall = (unsigned char *)(shm + sizeof(struct ctl) + inbox_bytes);

    pid_t kids[MAX_RANKS];
    for (me = 1; me < nranks; me++) {
        pid_t p = fork();
        if (p < 0) die("fork failed");
        if (p == 0) break;
        kids[me] = p;
    }
    if (me == nranks) me = 0;
    alarm(600); /* a rank that died leaves the others waiting: end the run */
    if (cpu_of[me] >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu_of[me], &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    int n = nranks;
    unsigned char *sb = sendall + (size_t)me * n * maxs, *rb = NULL;
    if (posix_memalign((void **)&rb, 4096, (size_t)maxs * n)) die("out of memory");
    memset(rb, 0, (size_t)maxs * n);
    uint64_t bseq = 0, call = 0;
    barrier(c, &bseq);

    for (int k = 0; k < nsizes; k++) {
        long s = sizes[k];
        long it, wu;
        coll_args_counts(&a, s, &it, &wu);
        double sum = 0;
        for (long i = 0; i < wu + it; i++) {
            ++call;
            /* The send buffer changes every call, so a stale block cannot pass the check. */
            for (int p = 0; p < n; p++) sb[(size_t)p * s] = pattern(me, p, call);
            double t = now();
            if (s <= SMALL_MAX) {
                for (int p = 0; p < n; p++) {
                    if (p == me) continue;
                    struct inbox *b = &inbox[p * n + me];
                    memcpy(b->data, sb + (size_t)p * s, s);
                    atomic_store_explicit(&b->stamp, call, memory_order_release);
                }
                memcpy(rb + (size_t)me * s, sb + (size_t)me * s, s);
                /* Copy each block out as its stamp arrives; wait as wait_all does. */
                int pending = n - 1;
                unsigned char got[MAX_RANKS] = {0};
                got[me] = 1;
                for (unsigned spins = 0; pending;) {
                    int mate = 0, progress = 0;
                    for (int p = 0; p < n; p++) {
                        if (got[p]) continue;
                        struct inbox *b = &inbox[me * n + p];
                        if (atomic_load_explicit(&b->stamp, memory_order_acquire) >= call) {
                            memcpy(rb + (size_t)p * s, b->data, s);
                            got[p] = 1;
                            pending--;
                            progress = 1;
                        } else {
                            mate |= mate_of_mine(p);
                        }
                    }
                    if (pending && !progress) idle(mate, &spins);
                }
            } else {
                atomic_store_explicit(&c->enter[me].v, call, memory_order_release);
                wait_all(&c->enter[0].v, sizeof(struct line), call);
                for (int j = 0; j < n; j++) {
                    int p = (me + j) % n;
                    memcpy(rb + (size_t)p * s, sendall + (size_t)p * n * maxs + (size_t)me * s, s);
                }
                atomic_store_explicit(&c->leave[me].v, call, memory_order_release);
                wait_all(&c->leave[0].v, sizeof(struct line), call);
            }
            if (i >= wu) sum += now() - t;
            for (int p = 0; p < n; p++)
                if (rb[(size_t)p * s] != pattern(p, me, call)) {
                    atomic_store(&c->failed, 1);
                    fprintf(stderr, "alltoall_floor: rank %d got a wrong block from rank %d (size %ld)\n", me, p, s);
                    break;
                }
            barrier(c, &bseq);
        }
        c->lat[me][k] = sum * 1e6 / it;
        barrier(c, &bseq);
        if (me == 0) {
            double mean = 0;
            for (int r = 0; r < n; r++) mean += c->lat[r][k];
            printf("alltoall %8ld B  %10.3f us  (%ld iters, %d ranks, no MPI)\n", s, mean / n, it, n);
            fflush(stdout);
        }
    }
    if (me != 0) _exit(atomic_load(&c->failed) ? 1 : 0);
    int bad = atomic_load(&c->failed);
    for (int r = 1; r < n; r++) {
        int st;
        if (waitpid(kids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    }
    if (bad) {
        fprintf(stderr, "alltoall_floor: a rank failed; no results written\n");
        return 1;
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) die("cannot write --json file");
        fprintf(f, "{\"benchmark\": \"coll-alltoall\", \"transport\": \"%s\", \"ranks\": %d, \"results\": [", label, n);
        for (int k = 0; k < nsizes; k++) {
            double mean = 0;
            for (int r = 0; r < n; r++) mean += c->lat[r][k];
            fprintf(f, "%s{\"size\": %ld, \"latency_us\": %.4f}", k ? ", " : "", sizes[k], mean / n);
        }
        fprintf(f, "]}\n");
        fclose(f);
    }
    return 0;
}
