/* Remote minitransaction latency (issue 25): two ranks on two hosts (`vmfabric run --hosts 2 -n 2`), one
 * memory node each. Rank 1 times, per operation, the median and 99th percentile of:
 *   tcp-rtt      an 8-byte MPI ping-pong round trip (the transport's round trip, for comparison);
 *   write-1      a 1-item minitransaction writing 8 bytes on rank 0's node (one message: prepare+commit);
 *   read-1       a 1-item minitransaction reading 8 bytes there;
 *   cas-1        compare + write of one word there (an increment);
 *   two-hosts    a write on each node (the two-phase commit: local prepare, remote prepare, commit).
 * Prints one JSON object per line: {"op": ..., "median_us": ..., "p99_us": ..., "rtts": median/tcp-rtt}.
 * Argument: iterations (default 3000). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vmfabric/mtx.h>

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double stat(double *v, int n, double q)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    int i = (int)(q * (n - 1));
    return v[i];
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int iters = argc > 1 ? atoi(argv[1]) : 3000;
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "mtx_remote: run with 2 ranks on 2 hosts (vmfabric run --hosts 2 -n 2)\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double *t = malloc(sizeof(double) * (size_t)iters);
    const int warm = iters / 10 + 10;
    /* tcp-rtt */
    uint64_t b = 0;
    for (int i = -warm; i < iters; i++) {
        double t0 = MPI_Wtime();
        if (rank == 1) {
            MPI_Send(&b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
            MPI_Recv(&b, 8, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(&b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(&b, 8, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
        }
        if (i >= 0)
            t[i] = (MPI_Wtime() - t0) * 1e6;
    }
    double rtt = 0;
    if (rank == 1) {
        rtt = stat(t, iters, 0.5);
        printf("{\"op\": \"tcp-rtt\", \"median_us\": %.2f, \"p99_us\": %.2f, \"rtts\": 1.00}\n", rtt, stat(t, iters, 0.99));
    }
    vmf_store_t s;
    if (vmf_store_create(MPI_COMM_WORLD, 4096, &s) != 0) {
        fprintf(stderr, "mtx_remote: vmf_store_create: %s\n", vmf_strerror(-1));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const char *ops[4] = {"write-1", "read-1", "cas-1", "two-hosts"};
    if (rank == 1) {
        for (int k = 0; k < 4; k++) {
            vmf_mtx_t tx;
            uint64_t v = 0, got = 0;
            vmf_mtx_begin(s, &tx);
            if (k == 0 || k == 3)
                vmf_mtx_write(tx, 0, 64, &v, 8);
            if (k == 1)
                vmf_mtx_read(tx, 0, 192, &got, 8); /* a word nothing writes */
            if (k == 2) {
                vmf_mtx_compare(tx, 0, 128, &v, 8);
                vmf_mtx_write(tx, 0, 128, &v, 8);
            }
            if (k == 3)
                vmf_mtx_write(tx, 1, 64, &v, 8);
            for (int i = -warm; i < iters; i++) {
                uint64_t old = v++;
                if (k == 0 || k == 3)
                    vmf_mtx_set_write(tx, 0, &v, 8);
                if (k == 3)
                    vmf_mtx_set_write(tx, 1, &v, 8);
                if (k == 2) {
                    vmf_mtx_set_compare(tx, 0, &old, 8);
                    vmf_mtx_set_write(tx, 0, &v, 8);
                }
                double t0 = MPI_Wtime();
                int rc = vmf_mtx_commit(tx, VMF_MTX_BLOCKING);
                double dt = (MPI_Wtime() - t0) * 1e6;
                if (rc != VMF_MTX_COMMITTED) {
                    fprintf(stderr, "mtx_remote: %s: commit returned %d (%s)\n", ops[k], rc, vmf_strerror(rc));
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                if (i >= 0)
                    t[i] = dt;
            }
            if (k == 1 && got != 0) {
                fprintf(stderr, "mtx_remote: read %llu, want 0\n", (unsigned long long)got);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            vmf_mtx_free(&tx);
            double med = stat(t, iters, 0.5);
            printf("{\"op\": \"%s\", \"median_us\": %.2f, \"p99_us\": %.2f, \"rtts\": %.2f}\n", ops[k], med, stat(t, iters, 0.99), med / rtt);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    vmf_store_free(&s);
    free(t);
    MPI_Finalize();
    return 0;
}
