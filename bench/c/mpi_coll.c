/*
 * mpi_coll.c -- OSU-style collective latency for MPI (one source, built with mpicc.mpich and
 * mpicc.openmpi; the MPICH build also runs on vmfabric's libmpich.so.12).
 *
 *   mpi_coll --coll barrier|bcast|allreduce|alltoall [--sizes 8,1024,...] [--iters N]
 *            [--warmup N] [--json FILE] [--label NAME]
 *
 * For each size (bytes per rank; for alltoall bytes per peer): `warmup` untimed calls, then `iters`
 * timed calls, each timed on its own and followed by an untimed MPI_Barrier (as the OSU collective
 * benchmarks do, so a root cannot run ahead of its receivers); each rank's mean time per call is
 * averaged over ranks (OSU's "Avg Latency"). The barrier benchmark times back-to-back barriers. bcast rotates nothing (root 0); allreduce sums MPI_FLOAT vectors
 * (size/4 elements, as OSU); alltoall moves size bytes to every peer. The first iteration's result is
 * verified so a broken library cannot post a number.
 * Iterations for size s: max(10, min(N, N * 8192 / s)); N defaults to 10000 (barrier: N).
 *
 * JSON (rank 0): {"benchmark": "coll-allreduce", "transport": "<label>", "ranks": n,
 *                 "results": [{"size": 8, "latency_us": 1.23}, ...]}
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_args.h"

static void die(const char *m)
{
    fprintf(stderr, "mpi_coll: %s\n", m);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *coll = "allreduce";
    struct coll_args a;
    coll_args_init(&a, "mpi");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--coll") && i + 1 < argc) coll = argv[++i];
        else if (!coll_args_take(&a, argc, argv, &i))
            die("usage: mpi_coll --coll barrier|bcast|allreduce|alltoall [--sizes a,b] [--iters N] [--json F] [--label L]");
    }
    long *sizes = a.sizes;
    int nsizes = a.nsizes;
    const char *json = a.json, *label = a.label;
    int c = !strcmp(coll, "barrier") ? 0 : !strcmp(coll, "bcast") ? 1 : !strcmp(coll, "allreduce") ? 2 : !strcmp(coll, "alltoall") ? 3 : -1;
    if (c < 0) die("unknown --coll");
    if (c == 0) { nsizes = 1; sizes[0] = 0; }
    long maxs = 8;
    for (int k = 0; k < nsizes; k++) if (sizes[k] > maxs) maxs = sizes[k];
    size_t bytes = (size_t)maxs * (c == 3 ? n : 1);
    char *sb = NULL, *rb = NULL;
    if (posix_memalign((void **)&sb, 4096, bytes) || posix_memalign((void **)&rb, 4096, bytes)) die("out of memory");
    memset(sb, 1, bytes);
    memset(rb, 0, bytes);
    double lat[MAX_SIZES];
    for (int k = 0; k < nsizes; k++) {
        long s = sizes[k];
        long it, wu;
        coll_args_counts(&a, c == 0 ? 0 : s, &it, &wu);
        int nf = (int)(s / 4);
        /* verify once */
        if (c == 2) {
            float *f = (float *)sb, *g = (float *)rb;
            for (int i = 0; i < nf; i++) f[i] = (float)(rank + 1);
            MPI_Allreduce(f, g, nf, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            for (int i = 0; i < nf; i++) if (g[i] != (float)(n * (n + 1) / 2)) die("allreduce result wrong");
        } else if (c == 1) {
            for (long i = 0; i < s; i++) sb[i] = (char)(rank == 0 ? i * 7 : 0);
            MPI_Bcast(sb, (int)s, MPI_CHAR, 0, MPI_COMM_WORLD);
            for (long i = 0; i < s; i++) if (sb[i] != (char)(i * 7)) die("bcast result wrong");
        } else if (c == 3) {
            for (int p = 0; p < n; p++) memset(sb + (size_t)p * s, rank * 16 + p, s);
            MPI_Alltoall(sb, (int)s, MPI_CHAR, rb, (int)s, MPI_CHAR, MPI_COMM_WORLD);
            for (int p = 0; p < n; p++) if (s && rb[(size_t)p * s + s - 1] != (char)(p * 16 + rank)) die("alltoall result wrong");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double total = 0, t0 = 0;
        for (long i = 0; i < wu + it; i++) {
            if (c == 0 && i == wu) t0 = MPI_Wtime();
            double t = MPI_Wtime();
            switch (c) {
            case 0: MPI_Barrier(MPI_COMM_WORLD); break;
            case 1: MPI_Bcast(sb, (int)s, MPI_CHAR, 0, MPI_COMM_WORLD); break;
            case 2: MPI_Allreduce(sb, rb, nf, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
            case 3: MPI_Alltoall(sb, (int)s, MPI_CHAR, rb, (int)s, MPI_CHAR, MPI_COMM_WORLD); break;
            }
            if (c != 0) {
                if (i >= wu) total += MPI_Wtime() - t;
                MPI_Barrier(MPI_COMM_WORLD);
            }
        }
        if (c == 0) total = MPI_Wtime() - t0;
        double mine = total * 1e6 / it, sum = 0;
        MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        lat[k] = sum / n;
        if (rank == 0) {
            printf("%-10s %8ld B  %10.3f us  (%ld iters, %d ranks)\n", coll, s, lat[k], it, n);
            fflush(stdout);
        }
        MPI_Barrier(MPI_COMM_WORLD);
    }
    if (rank == 0 && json) {
        FILE *f = fopen(json, "w");
        if (!f) die("cannot write --json file");
        fprintf(f, "{\"benchmark\": \"coll-%s\", \"transport\": \"%s\", \"ranks\": %d, \"results\": [", coll, label, n);
        for (int k = 0; k < nsizes; k++)
            fprintf(f, "%s{\"size\": %ld, \"latency_us\": %.4f}", k ? ", " : "", sizes[k], lat[k]);
        fprintf(f, "]}\n");
        fclose(f);
    }
    free(sb);
    free(rb);
    MPI_Finalize();
    return 0;
}
