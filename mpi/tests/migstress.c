/* Sequence-checked traffic for live-migration tests (issue 23): every iteration runs
 *   - a ring MPI_Sendrecv whose size cycles through 8 B .. 300 KB (eager and rendezvous),
 *   - an MPI_Alltoall with a payload per ordered pair,
 *   - an MPI_Allreduce and an MPI_Bcast (rotating root) whose results depend on the iteration,
 *   - one-sided operations inside one passive-target epoch (MPI_Win_lock_all for the whole run, on an
 *     MPI_Win_allocate window): a put to the next rank, flushed and read back with a get, a fetch-and-add on
 *     a counter at rank 0, and the put from the previous rank checked after a barrier,
 * and every received element is checked against what its sender must have sent in that iteration, so a
 * lost, duplicated, reordered or corrupt message is caught where it happens.
 *
 *   migstress                      200 iterations, then exit (what the plain test run does)
 *   migstress STOPFILE [MAXSECS] [no-rma]
 *                                  run until STOPFILE exists (seen by rank 0, agreed by all), at most
 *                                  MAXSECS seconds (default 300; then it fails: the file never came);
 *                                  no-rma leaves the one-sided part out (ranks in VMs: a window of ranks
 *                                  in two guests lives in the region, which a guest cannot leave while
 *                                  it is in use)
 *
 * Rank 0 prints "migstress PASS: N iterations" at the end. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long val(int src, int dst, long it, long i) {
    return it * 1000003L + src * 7919L + dst * 104729L + i;
}

static void fail(int rank, const char *what, long it, long i, long got, long want) {
    fprintf(stderr, "migstress: rank %d: %s wrong at iteration %ld, element %ld: got %ld, want %ld\n", rank,
            what, it, i, got, want);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int r, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char *stop = argc > 1 ? argv[1] : NULL;
    double maxsecs = argc > 2 ? atof(argv[2]) : 300;
    const int rma = !(argc > 3 && strcmp(argv[3], "no-rma") == 0);
    const long ring_bytes[] = {8, 1000, 70000, 300000, 4096};
    const long ring_max = 300000 / 8;
    long *sb = malloc(ring_max * sizeof(long)), *rb = malloc(ring_max * sizeof(long));
    const long a2a_max = 64 + 2 * 1024;
    long *as = malloc(a2a_max * n * sizeof(long)), *ar = malloc(a2a_max * n * sizeof(long));
    long bc[1000], red[16], sum[16];
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    /* Window: two slots per rank (by iteration parity: a rank one iteration ahead writes the other one),
     * then the counter (at rank 0). */
    long *wb;
    MPI_Win win = MPI_WIN_NULL;
    if (rma) {
        MPI_Win_allocate((MPI_Aint)(2 * n + 1) * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &wb, &win);
        for (int i = 0; i < 2 * n + 1; i++) wb[i] = -1;
        wb[2 * n] = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Win_lock_all(0, win);
    }
    double t0 = MPI_Wtime();
    long it = 0;
    for (;; it++) {
        /* Ring. */
        long cnt = ring_bytes[it % 5] / 8;
        for (long i = 0; i < cnt; i++) sb[i] = val(r, next, it, i);
        MPI_Status st;
        MPI_Sendrecv(sb, (int)cnt, MPI_LONG, next, 5, rb, (int)cnt, MPI_LONG, prev, 5, MPI_COMM_WORLD, &st);
        int got;
        MPI_Get_count(&st, MPI_LONG, &got);
        if (got != cnt || st.MPI_SOURCE != prev) fail(r, "ring status", it, -1, got, cnt);
        for (long i = 0; i < cnt; i++)
            if (rb[i] != val(prev, r, it, i)) fail(r, "ring payload", it, i, rb[i], val(prev, r, it, i));
        /* All-to-all. */
        long ac = 64 + (it % 3) * 1024;
        for (int p = 0; p < n; p++)
            for (long i = 0; i < ac; i++) as[p * ac + i] = val(r, p, it, i);
        MPI_Alltoall(as, (int)ac, MPI_LONG, ar, (int)ac, MPI_LONG, MPI_COMM_WORLD);
        for (int p = 0; p < n; p++)
            for (long i = 0; i < ac; i++)
                if (ar[p * ac + i] != val(p, r, it, i)) fail(r, "alltoall", it, p * ac + i, ar[p * ac + i], val(p, r, it, i));
        /* Allreduce. */
        for (int i = 0; i < 16; i++) red[i] = it + (long)r * i;
        MPI_Allreduce(red, sum, 16, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 16; i++) {
            long want = n * it + (long)i * n * (n - 1) / 2;
            if (sum[i] != want) fail(r, "allreduce", it, i, sum[i], want);
        }
        /* Bcast from a rotating root. */
        int root = (int)(it % n);
        if (r == root)
            for (int i = 0; i < 1000; i++) bc[i] = val(root, 0, it, i);
        MPI_Bcast(bc, 1000, MPI_LONG, root, MPI_COMM_WORLD);
        for (int i = 0; i < 1000; i++)
            if (bc[i] != val(root, 0, it, i)) fail(r, "bcast", it, i, bc[i], val(root, 0, it, i));
        /* One-sided, inside the epoch. */
        if (rma) {
        long pv = val(r, next, it, 0), back = 0, one = 1, old = 0;
        int slot = (int)(it % 2) * n;
        MPI_Put(&pv, 1, MPI_LONG, next, slot + r, 1, MPI_LONG, win);
        MPI_Win_flush(next, win);
        MPI_Get(&back, 1, MPI_LONG, next, slot + r, 1, MPI_LONG, win);
        MPI_Win_flush(next, win);
        if (back != pv) fail(r, "rma get after put", it, slot + r, back, pv);
        MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, 2 * n, MPI_SUM, win);
        MPI_Win_flush(0, win);
        if (old < it || old >= (long)n * (it + 1)) fail(r, "rma fetch-and-add", it, 2 * n, old, it);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Win_sync(win);
        if (wb[slot + prev] != val(prev, r, it, 0)) fail(r, "rma put from prev", it, slot + prev, wb[slot + prev], val(prev, r, it, 0));
        }
        /* Stop? */
        if (it % 16 == 15) {
            int done = 0;
            if (r == 0) {
                if (!stop) done = it + 1 >= 200;
                else if (access(stop, F_OK) == 0) done = 1;
                else if (MPI_Wtime() - t0 > maxsecs) done = 2;
            }
            MPI_Bcast(&done, 1, MPI_INT, 0, MPI_COMM_WORLD);
            if (done == 2) {
                if (r == 0) fprintf(stderr, "migstress: %s did not appear within %.0f s\n", stop, maxsecs);
                MPI_Finalize();
                return 2;
            }
            if (done) break;
        }
    }
    if (rma) {
        MPI_Win_unlock_all(win);
        MPI_Barrier(MPI_COMM_WORLD);
        if (r == 0 && wb[2 * n] != (long)n * (it + 1)) fail(r, "rma counter", it, 2 * n, wb[2 * n], (long)n * (it + 1));
        MPI_Win_free(&win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) printf("migstress PASS: %ld iterations\n", it + 1);
    free(sb);
    free(rb);
    free(as);
    free(ar);
    MPI_Finalize();
    return 0;
}
