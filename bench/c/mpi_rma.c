/*
 * mpi_rma.c -- one-sided micro-benchmarks for MPI (vmfabric vs MPICH vs Open MPI, see bench/README.md).
 *
 *   mpi_rma put|get|fop|cas|putbw|getbw [--sizes 8,64,...] [--iters N] [--json FILE] [--label NAME]
 *           [--target-busy SECONDS] [--target-asleep SECONDS]
 *
 * Rank 0 is the origin, rank 1 the target; other ranks idle. The window comes from MPI_Win_allocate
 * and the origin holds MPI_Win_lock_all for the whole run, as OSU's `-w allocate -s flush` does.
 *
 * put, get : one MPI_Put/MPI_Get of `size` bytes, then MPI_Win_flush(1); latency_us is the mean of
 *            `iters` such pairs (after `iters / 10` untimed ones); mb_per_s = size / latency_us.
 * fop      : MPI_Fetch_and_op(MPI_SUM) on one long, then MPI_Win_flush.
 * cas      : MPI_Compare_and_swap on one long, then MPI_Win_flush.
 * putbw,
 * getbw    : 64 operations of `size` bytes, then one MPI_Win_flush; mb_per_s = bytes / time.
 *
 * The target either waits in MPI_Barrier (default: an idle target inside the library) or, with
 * --target-busy S, computes without any MPI call until the origin sets a flag in its window (or S
 * seconds pass, after which it calls MPI_Barrier: a library whose passive target needs the target's
 * progress then finishes, late). `target_calls_late` in the JSON says whether that happened.
 * --target-asleep S does the same with the target asleep (1 ms naps, no MPI call) instead of computing:
 * outside the library but off the CPU, as on a machine with a core to spare for a progress thread.
 *
 * Every operation is checked: put and get compare the bytes moved, fop and cas the counter.
 *
 * JSON (rank 0): {"benchmark": "rma-put", "transport": "<label>", "target": "idle|busy|asleep",
 *                 "results": [{"size": 8, "latency_us": 0.05, "mb_per_s": 160.0}, ...]}
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SIZES 64
#define WINDOW 64

static const long default_sizes[] = {8, 64, 512, 4096, 65536, 1048576, 4194304};

static void die(const char *msg)
{
    fprintf(stderr, "mpi_rma: %s\n", msg);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static long parse_size(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end == 'K' || *end == 'k')
        v <<= 10, end++;
    else if (*end == 'M' || *end == 'm')
        v <<= 20, end++;
    if (*end || v <= 0)
        die("invalid size in --sizes");
    return v;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, nprocs;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    if (nprocs < 2)
        die("needs 2 ranks");
    if (argc < 2)
        die("usage: mpi_rma put|get|fop|cas|putbw|getbw [--sizes ...] [--iters N] [--json F] [--label L] [--target-busy S] [--target-asleep S]");
    const char *mode = argv[1];
    int atomic = !strcmp(mode, "fop") || !strcmp(mode, "cas");
    int bw = !strcmp(mode, "putbw") || !strcmp(mode, "getbw");
    int is_put = !strcmp(mode, "put") || !strcmp(mode, "putbw");
    if (!atomic && !is_put && strcmp(mode, "get") && strcmp(mode, "getbw"))
        die("unknown mode");
    long sizes[MAX_SIZES];
    int nsizes = 0;
    for (size_t i = 0; i < sizeof default_sizes / sizeof *default_sizes; i++)
        sizes[nsizes++] = default_sizes[i];
    long iters = 100000;
    double busy = 0;
    int asleep = 0;
    const char *json = NULL;
    char label[128] = "mpi";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--sizes") && v) {
            nsizes = 0;
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && nsizes < MAX_SIZES; t = strtok_r(NULL, ",", &save))
                sizes[nsizes++] = parse_size(t);
            free(dup);
            i++;
        } else if (!strcmp(a, "--iters") && v) {
            iters = atol(v);
            i++;
        } else if (!strcmp(a, "--json") && v) {
            json = v;
            i++;
        } else if (!strcmp(a, "--label") && v) {
            snprintf(label, sizeof label, "%s", v);
            i++;
        } else if (!strcmp(a, "--target-busy") && v) {
            busy = atof(v);
            i++;
        } else if (!strcmp(a, "--target-asleep") && v) {
            busy = atof(v);
            asleep = 1;
            i++;
        } else {
            die("unknown argument");
        }
    }
    if (atomic) {
        sizes[0] = 8;
        nsizes = 1;
    }
    long maxsz = 64;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > maxsz)
            maxsz = sizes[i];
    /* Data, then a 64-byte tail whose last long is the flag that releases a computing target. */
    char *base;
    MPI_Win win;
    MPI_Win_allocate(maxsz + 64, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    memset(base, 0, maxsz + 64);
    char *buf = malloc(maxsz), *chk = malloc(maxsz);
    for (long i = 0; i < maxsz; i++)
        buf[i] = (char)(i % 251);
    volatile long *flag = (volatile long *)(base + maxsz + 56);
    double lat[MAX_SIZES], mbps[MAX_SIZES];
    int late = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int s = 0; s < nsizes; s++) {
        long size = sizes[s];
        long it = iters * 8192 / (size > 8192 ? size : 8192);
        if (it < 20)
            it = 20;
        if (bw)
            it = it / WINDOW > 10 ? it / WINDOW : 10;
        long warm = it / 10 > 2 ? it / 10 : 2;
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            MPI_Win_lock_all(0, win);
            double t0 = 0;
            long one = 1, old = 0, cur = 0, res;
            for (long i = 0; i < warm + it; i++) {
                if (i == warm)
                    t0 = MPI_Wtime();
                if (!strcmp(mode, "fop")) {
                    MPI_Fetch_and_op(&one, &old, MPI_LONG, 1, 0, MPI_SUM, win);
                    MPI_Win_flush(1, win);
                    if (old != i)
                        die("fetch-and-op returned a wrong value");
                } else if (!strcmp(mode, "cas")) {
                    long nw = cur + 1;
                    MPI_Compare_and_swap(&nw, &cur, &res, MPI_LONG, 1, 0, win);
                    MPI_Win_flush(1, win);
                    if (res != cur)
                        die("compare-and-swap returned a wrong value");
                    cur = nw;
                } else if (bw) {
                    for (int k = 0; k < WINDOW; k++) {
                        if (is_put)
                            MPI_Put(buf, size, MPI_BYTE, 1, 0, size, MPI_BYTE, win);
                        else
                            MPI_Get(chk, size, MPI_BYTE, 1, 0, size, MPI_BYTE, win);
                    }
                    MPI_Win_flush(1, win);
                } else if (is_put) {
                    MPI_Put(buf, size, MPI_BYTE, 1, 0, size, MPI_BYTE, win);
                    MPI_Win_flush(1, win);
                } else {
                    MPI_Get(chk, size, MPI_BYTE, 1, 0, size, MPI_BYTE, win);
                    MPI_Win_flush(1, win);
                }
            }
            double el = MPI_Wtime() - t0;
            if (bw) {
                lat[s] = el * 1e6 / ((double)it * WINDOW);
                mbps[s] = (double)size * WINDOW * it / el / 1e6;
            } else {
                lat[s] = el * 1e6 / it;
                mbps[s] = (double)size / lat[s];
            }
            if (!atomic) {
                /* Check the path: the target must hold the pattern after a put (for get runs, one put
                 * first), and a get must bring it back. */
                if (!is_put) {
                    MPI_Put(buf, size, MPI_BYTE, 1, 0, size, MPI_BYTE, win);
                    MPI_Win_flush(1, win);
                }
                MPI_Get(chk, size, MPI_BYTE, 1, 0, size, MPI_BYTE, win);
                MPI_Win_flush(1, win);
                if (memcmp(chk, buf, size))
                    die("the target's memory differs from what was written");
            } else {
                long zero = 0, prev;
                MPI_Fetch_and_op(&zero, &prev, MPI_LONG, 1, 0, MPI_REPLACE, win);
                MPI_Win_flush(1, win);
            }
            long stop = 1;
            MPI_Put(&stop, 1, MPI_LONG, 1, maxsz + 56, 1, MPI_LONG, win);
            MPI_Win_flush(1, win);
            MPI_Win_unlock_all(win);
        } else if (rank == 1 && busy > 0) {
            /* Compute without calling MPI until the origin raises the flag (bounded by `busy`). */
            double x = 1.0;
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            double start = ts.tv_sec + ts.tv_nsec * 1e-9;
            while (*flag == 0) {
                if (asleep) {
                    struct timespec nap = {0, 1000000};
                    nanosleep(&nap, NULL);
                } else {
                    for (int k = 0; k < 100; k++)
                        x = x * 1.000001 + 1e-9;
                }
                clock_gettime(CLOCK_MONOTONIC, &ts);
                if (ts.tv_sec + ts.tv_nsec * 1e-9 - start > busy) {
                    late = 1;
                    break;
                }
            }
            if (x == 0)
                printf("%g\n", x);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 1)
            *flag = 0;
    }
    int any_late;
    MPI_Reduce(&late, &any_late, 1, MPI_INT, MPI_MAX, 1, MPI_COMM_WORLD);
    if (rank == 1)
        MPI_Send(&any_late, 1, MPI_INT, 0, 5, MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Recv(&late, 1, MPI_INT, 1, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("# mpi_rma %s (%s), target %s%s\n%10s %14s %14s\n", mode, label, busy > 0 ? (asleep ? "asleep outside MPI" : "computing") : "idle in MPI",
               late ? " (it had to call MPI before the origin finished)" : "", "size(B)", "latency(us)", "MB/s");
        for (int s = 0; s < nsizes; s++)
            printf("%10ld %14.3f %14.1f\n", sizes[s], lat[s], mbps[s]);
        if (json) {
            FILE *f = fopen(json, "w");
            if (!f)
                die("cannot write the JSON file");
            fprintf(f, "{\"benchmark\": \"rma-%s\", \"transport\": \"%s\", \"target\": \"%s\", \"target_calls_late\": %s, \"results\": [",
                    mode, label, busy > 0 ? (asleep ? "asleep" : "busy") : "idle", late ? "true" : "false");
            for (int s = 0; s < nsizes; s++) {
                /* Bandwidth runs report bandwidth only (compare.py judges the first metric present). */
                if (bw)
                    fprintf(f, "%s{\"size\": %ld, \"mb_per_s\": %.2f}", s ? ", " : "", sizes[s], mbps[s]);
                else
                    fprintf(f, "%s{\"size\": %ld, \"latency_us\": %.4f, \"mb_per_s\": %.2f}", s ? ", " : "",
                            sizes[s], lat[s], mbps[s]);
            }
            fprintf(f, "]}\n");
            fclose(f);
        }
    }
    free(buf);
    free(chk);
    MPI_Win_free(&win);
    MPI_Finalize();
    return 0;
}
