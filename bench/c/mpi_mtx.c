/* bench/c/mpi_mtx.c -- the MPI side of issue 25's microbenchmarks (002_*), for MPICH and Open MPI:
 *   barrier ITERS           MPI_Barrier per second;
 *   counter ITERS           002_*'s increment counters done with MPI RMA (one counter per process, in rank
 *                           0's window; MPI_Win_lock + MPI_Fetch_and_op(+1) + MPI_Win_unlock) at no, medium
 *                           and high contention as the thesis defines them; the sums are checked.
 * Prints one JSON object per result line (rank 0). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: mpi_mtx barrier|counter ITERS\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long iters = atol(argv[2]);
    if (strcmp(argv[1], "barrier") == 0) {
        for (int i = 0; i < 10; i++)
            MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (long i = 0; i < iters; i++)
            MPI_Barrier(MPI_COMM_WORLD);
        double el = MPI_Wtime() - t0;
        if (rank == 0)
            printf("{\"kind\": \"mpi\", \"ranks\": %d, \"barriers_per_s\": %.1f, \"barriers\": %ld}\n", n, iters / el, iters);
    } else {
        long *base;
        MPI_Win win;
        MPI_Win_allocate(n * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
        const char *levels[3] = {"none", "medium", "high"};
        for (int l = 0; l < 3; l++) {
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win);
            for (int i = 0; i < n; i++)
                base[i] = 0;
            MPI_Win_unlock(rank, win);
            MPI_Barrier(MPI_COMM_WORLD);
            long one = 1, old, idx = rank;
            double t0 = MPI_Wtime();
            for (long k = 0; k < iters; k++) {
                long c = l == 0 ? rank : l == 1 ? (idx = (idx + 1) % n) : 0;
                MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
                MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, c, MPI_SUM, win);
                MPI_Win_unlock(0, win);
            }
            MPI_Barrier(MPI_COMM_WORLD);
            double el = MPI_Wtime() - t0;
            if (rank == 0) {
                long sum = 0;
                MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
                for (int i = 0; i < n; i++)
                    sum += base[i];
                MPI_Win_unlock(0, win);
                if (sum != iters * n) {
                    fprintf(stderr, "mpi_mtx: counters sum to %ld, not %ld\n", sum, iters * n);
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
                printf("{\"impl\": \"mpi-rma\", \"contention\": \"%s\", \"ranks\": %d, \"updates_per_s\": %.1f, "
                       "\"aborts\": 0, \"updates\": %ld}\n", levels[l], n, iters * n / el, iters * n);
            }
        }
        MPI_Win_free(&win);
    }
    MPI_Finalize();
    return 0;
}
