/*
 * particles.c -- a small parallel particle (fluid) simulation in the style of 002_*'s FLUIDS case (§3.3.4):
 * the particles live in memory every rank maps (MPI_Win_allocate_shared, as FLUIDS' did in the Nahanni
 * region), each rank moves its share of them, and the ranks synchronise with one barrier per time step.
 *
 *   particles [--n N] [--steps S] [--barrier spin|block|adaptive|mpi] [--json FILE]
 *
 * Per step every rank computes, for its own particles, the pair forces of the neighbours within the
 * interaction radius (cell lists built from the current positions), gravity and the walls, and writes
 * the new state into the second buffer; after the barrier the buffers swap. A particle's update depends
 * only on the previous step's positions and is summed in one fixed order, so the result does not depend
 * on the number of ranks: the checksum (a hash of every final coordinate's bits) is the same at 1, 2, 4
 * and 8 ranks, which the tests check.
 *
 * Barriers: vmfabric's (vmfabric/mtx.h: spin, block, adaptive) or MPI_Barrier (`mpi`, also how the
 * program runs on MPICH and Open MPI, built with -DNO_VMFABRIC).
 *
 * Output (rank 0): one line `particles: ranks R barrier B n N steps S seconds T checksum C` and, with
 * --json, {"benchmark": "particles", "ranks": R, "barrier": B, "n": N, "steps": S, "seconds": T,
 * "checksum": "C"}.
 */
#include <mpi.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef NO_VMFABRIC
#include <vmfabric/mtx.h>
#endif

#define H 0.01     /* interaction radius */
#define DT 2e-4    /* time step */
#define K 2000.0   /* repulsion stiffness */
#define G 9.81     /* gravity */
#define DAMP 0.999 /* velocity damping per step */

static int rank, size;

static void die(const char *m)
{
    fprintf(stderr, "particles: rank %d: %s\n", rank, m);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long n = 20000, steps = 200;
    const char *bar = "adaptive", *json = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atol(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--barrier") && i + 1 < argc) bar = argv[++i];
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else die("usage: particles [--n N] [--steps S] [--barrier spin|block|adaptive|mpi] [--json FILE]");
    }
    if (n < 1 || steps < 0) die("--n must be >= 1 and --steps >= 0");
    /* The shared state: two buffers of (x, y, vx, vy) per particle, on the ranks of this host. */
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int nsize;
    MPI_Comm_size(node, &nsize);
    if (nsize != size) die("every rank must run on one host (the particles are in shared memory)");
    MPI_Win win;
    double *mem;
    MPI_Aint bytes = rank == 0 ? (MPI_Aint)(2 * 4 * n * sizeof(double)) : 0;
    if (MPI_Win_allocate_shared(bytes, sizeof(double), MPI_INFO_NULL, node, &mem, &win) != MPI_SUCCESS)
        die("MPI_Win_allocate_shared failed");
    MPI_Aint qsz;
    int disp;
    MPI_Win_shared_query(win, 0, &qsz, &disp, &mem);
    double *buf[2] = {mem, mem + 4 * n};
#ifndef NO_VMFABRIC
    vmf_barrier_t vb = NULL;
    if (strcmp(bar, "mpi")) {
        int kind = !strcmp(bar, "spin") ? VMF_BARRIER_SPIN : !strcmp(bar, "block") ? VMF_BARRIER_BLOCK
                 : !strcmp(bar, "adaptive") ? VMF_BARRIER_ADAPTIVE : -1;
        if (kind < 0) die("--barrier takes spin, block, adaptive or mpi");
        if (vmf_barrier_create(MPI_COMM_WORLD, kind, &vb) != 0) die("vmf_barrier_create failed");
    }
#define BARRIER() do { if (vb) { if (vmf_barrier_wait(vb)) die("vmf_barrier_wait failed"); } else MPI_Barrier(MPI_COMM_WORLD); } while (0)
#else
    if (strcmp(bar, "mpi")) die("built without vmfabric: only --barrier mpi");
#define BARRIER() MPI_Barrier(MPI_COMM_WORLD)
#endif
    /* Initial state: a block of particles on a jittered lattice in the lower left, at rest. */
    if (rank == 0) {
        long side = (long)ceil(sqrt((double)n));
        uint64_t s = 88172645463325252ull;
        for (long i = 0; i < n; i++) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            double jx = (double)(s % 1000) / 1000.0 - 0.5;
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            double jy = (double)(s % 1000) / 1000.0 - 0.5;
            double *p = buf[0] + 4 * i;
            p[0] = 0.02 + (i % side + 0.5 + 0.2 * jx) * 0.35 * H;
            p[1] = 0.02 + (i / side + 0.5 + 0.2 * jy) * 0.35 * H;
            p[2] = p[3] = 0.0;
        }
    }
    /* One passive epoch over the whole run, so that MPI_Win_sync is legal (MPICH checks it). */
    MPI_Win_lock_all(MPI_MODE_NOCHECK, win);
    MPI_Win_sync(win);
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_sync(win);
    /* Cell lists (private to each rank, rebuilt from the shared positions every step). */
    int gc = (int)ceil(1.0 / H);
    long *head = malloc(sizeof(long) * gc * gc), *next = malloc(sizeof(long) * n);
    if (!head || !next) die("out of memory");
    long lo = n * rank / size, hi = n * (rank + 1) / size;
    double t0 = MPI_Wtime();
    for (long st = 0; st < steps; st++) {
        const double *cur = buf[st & 1];
        double *nxt = buf[(st + 1) & 1];
        for (int c = 0; c < gc * gc; c++) head[c] = -1;
        for (long i = 0; i < n; i++) {
            int cx = (int)(cur[4 * i] / H), cy = (int)(cur[4 * i + 1] / H);
            cx = cx < 0 ? 0 : cx >= gc ? gc - 1 : cx;
            cy = cy < 0 ? 0 : cy >= gc ? gc - 1 : cy;
            next[i] = head[cy * gc + cx];
            head[cy * gc + cx] = i;
        }
        for (long i = lo; i < hi; i++) {
            const double *p = cur + 4 * i;
            double ax = 0, ay = -G;
            int cx = (int)(p[0] / H), cy = (int)(p[1] / H);
            for (int dy = -1; dy <= 1; dy++)
                for (int dx = -1; dx <= 1; dx++) {
                    int x = cx + dx, y = cy + dy;
                    if (x < 0 || y < 0 || x >= gc || y >= gc) continue;
                    for (long j = head[y * gc + x]; j >= 0; j = next[j]) {
                        if (j == i) continue;
                        double rx = p[0] - cur[4 * j], ry = p[1] - cur[4 * j + 1];
                        double d2 = rx * rx + ry * ry;
                        if (d2 >= H * H || d2 == 0) continue;
                        double d = sqrt(d2), f = K * (H - d) / d;
                        ax += f * rx;
                        ay += f * ry;
                    }
                }
            double *q = nxt + 4 * i;
            double vx = (p[2] + DT * ax) * DAMP, vy = (p[3] + DT * ay) * DAMP;
            double x = p[0] + DT * vx, y = p[1] + DT * vy;
            if (x < 0) { x = -x; vx = -vx; }
            if (x > 1) { x = 2 - x; vx = -vx; }
            if (y < 0) { y = -y; vy = -vy; }
            if (y > 1) { y = 2 - y; vy = -vy; }
            q[0] = x; q[1] = y; q[2] = vx; q[3] = vy;
        }
        BARRIER();
    }
    double t = MPI_Wtime() - t0, tmax;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        const double *fin = buf[steps & 1];
        uint64_t h = 1469598103934665603ull;
        for (long i = 0; i < 4 * n; i++) {
            uint64_t b;
            memcpy(&b, &fin[i], 8);
            h = (h ^ b) * 1099511628211ull;
        }
        printf("particles: ranks %d barrier %s n %ld steps %ld seconds %.4f checksum %016llx\n", size, bar, n,
               steps, tmax, (unsigned long long)h);
        if (json) {
            FILE *f = fopen(json, "w");
            if (!f) die("cannot write the JSON file");
            fprintf(f, "{\"benchmark\": \"particles\", \"ranks\": %d, \"barrier\": \"%s\", \"n\": %ld, \"steps\": %ld, "
                       "\"seconds\": %.6f, \"checksum\": \"%016llx\"}\n", size, bar, n, steps, tmax, (unsigned long long)h);
            fclose(f);
        }
    }
#ifndef NO_VMFABRIC
    if (vb) vmf_barrier_free(&vb);
#endif
    free(head);
    free(next);
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
    MPI_Comm_free(&node);
    MPI_Finalize();
    return 0;
}
