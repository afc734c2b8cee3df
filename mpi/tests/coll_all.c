/* Every blocking collective, checked exactly, for many sizes, on WORLD, a duplicate, a split (reversed
 * order) communicator; in-place variants; roots everywhere. Values are integers so results are exact. */
#include "check.h"

static int R, N;
static long V(int rank, long i) { return (long)rank * 1000003L + i * 7 + 1; }

static void run(MPI_Comm comm, int count)
{
    int r, n;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &n);
    long *s = malloc(sizeof(long) * (size_t)(count * n + 1));
    long *d = malloc(sizeof(long) * (size_t)(count * n + 1));
    long *e = malloc(sizeof(long) * (size_t)(count * n + 1));
    int *cnts = malloc(sizeof(int) * n), *dsp = malloc(sizeof(int) * n);

    /* barrier */
    MPI_Barrier(comm);
    /* bcast from every root */
    for (int root = 0; root < n; root++) {
        for (int i = 0; i < count; i++) d[i] = (r == root) ? V(root, i) : -1;
        MPI_Bcast(d, count, MPI_LONG, root, comm);
        for (int i = 0; i < count; i++) CHECK(d[i] == V(root, i));
    }
    /* reduce / allreduce (sum, max) */
    for (int i = 0; i < count; i++) s[i] = V(r, i);
    for (int root = 0; root < n; root += (n > 2 ? n - 1 : 1)) {
        for (int i = 0; i < count; i++) d[i] = -7;
        MPI_Reduce(s, d, count, MPI_LONG, MPI_SUM, root, comm);
        if (r == root)
            for (int i = 0; i < count; i++) {
                long x = 0;
                for (int k = 0; k < n; k++) x += V(k, i);
                CHECK(d[i] == x);
            }
        /* in place at the root */
        for (int i = 0; i < count; i++) d[i] = V(r, i);
        MPI_Reduce(r == root ? MPI_IN_PLACE : d, r == root ? d : NULL, count, MPI_LONG, MPI_MAX, root, comm);
        if (r == root)
            for (int i = 0; i < count; i++) CHECK(d[i] == V(n - 1, i));
    }
    MPI_Allreduce(s, d, count, MPI_LONG, MPI_SUM, comm);
    for (int i = 0; i < count; i++) {
        long x = 0;
        for (int k = 0; k < n; k++) x += V(k, i);
        CHECK(d[i] == x);
    }
    for (int i = 0; i < count; i++) d[i] = V(r, i);
    MPI_Allreduce(MPI_IN_PLACE, d, count, MPI_LONG, MPI_MIN, comm);
    for (int i = 0; i < count; i++) CHECK(d[i] == V(0, i));
    /* gather / scatter */
    for (int root = 0; root < n; root++) {
        for (int i = 0; i < count * n; i++) d[i] = -1;
        MPI_Gather(s, count, MPI_LONG, d, count, MPI_LONG, root, comm);
        if (r == root)
            for (int k = 0; k < n; k++)
                for (int i = 0; i < count; i++) CHECK(d[k * count + i] == V(k, i));
        if (r == root) {
            for (int k = 0; k < n; k++)
                for (int i = 0; i < count; i++) e[k * count + i] = V(k, i) * 3;
        }
        for (int i = 0; i < count; i++) d[i] = -1;
        MPI_Scatter(e, count, MPI_LONG, d, count, MPI_LONG, root, comm);
        for (int i = 0; i < count; i++) CHECK(d[i] == V(r, i) * 3);
        /* in place */
        if (r == root) {
            for (int i = 0; i < count * n; i++) d[i] = -1;
            for (int i = 0; i < count; i++) d[r * count + i] = V(r, i);
            MPI_Gather(MPI_IN_PLACE, count, MPI_LONG, d, count, MPI_LONG, root, comm);
            for (int k = 0; k < n; k++)
                for (int i = 0; i < count; i++) CHECK(d[k * count + i] == V(k, i));
            MPI_Scatter(e, count, MPI_LONG, MPI_IN_PLACE, count, MPI_LONG, root, comm);
        } else {
            MPI_Gather(s, count, MPI_LONG, NULL, 0, MPI_LONG, root, comm);
            MPI_Scatter(NULL, 0, MPI_LONG, d, count, MPI_LONG, root, comm);
            for (int i = 0; i < count; i++) CHECK(d[i] == V(r, i) * 3);
        }
    }
    /* gatherv / scatterv with varying counts (rank k contributes min(count, k+1) elements, reversed order) */
    int tot = 0;
    for (int k = n - 1; k >= 0; k--) {
        cnts[k] = count < k + 1 ? count : k + 1;
        dsp[k] = tot;
        tot += cnts[k];
    }
    int root = n / 2;
    for (int i = 0; i < tot; i++) d[i] = -1;
    MPI_Gatherv(s, cnts[r], MPI_LONG, d, cnts, dsp, MPI_LONG, root, comm);
    if (r == root)
        for (int k = 0; k < n; k++)
            for (int i = 0; i < cnts[k]; i++) CHECK(d[dsp[k] + i] == V(k, i));
    for (int k = 0; k < n; k++)
        for (int i = 0; i < cnts[k]; i++) e[dsp[k] + i] = V(k, i) + 5;
    for (int i = 0; i < count; i++) d[i] = -1;
    MPI_Scatterv(e, cnts, dsp, MPI_LONG, d, cnts[r], MPI_LONG, root, comm);
    for (int i = 0; i < cnts[r]; i++) CHECK(d[i] == V(r, i) + 5);
    /* allgather(v) incl. in place */
    MPI_Allgather(s, count, MPI_LONG, d, count, MPI_LONG, comm);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < count; i++) CHECK(d[k * count + i] == V(k, i));
    for (int i = 0; i < count * n; i++) d[i] = -1;
    for (int i = 0; i < count; i++) d[r * count + i] = V(r, i);
    MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d, count, MPI_LONG, comm);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < count; i++) CHECK(d[k * count + i] == V(k, i));
    for (int i = 0; i < tot; i++) d[i] = -1;
    MPI_Allgatherv(s, cnts[r], MPI_LONG, d, cnts, dsp, MPI_LONG, comm);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < cnts[k]; i++) CHECK(d[dsp[k] + i] == V(k, i));
    /* alltoall(v) incl. in place */
    for (int k = 0; k < n; k++)
        for (int i = 0; i < count; i++) s[k * count + i] = V(r, i) * 100 + k;
    MPI_Alltoall(s, count, MPI_LONG, d, count, MPI_LONG, comm);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < count; i++) CHECK(d[k * count + i] == V(k, i) * 100 + r);
    memcpy(d, s, sizeof(long) * count * n);
    MPI_Alltoall(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d, count, MPI_LONG, comm);
    for (int k = 0; k < n; k++)
        for (int i = 0; i < count; i++) CHECK(d[k * count + i] == V(k, i) * 100 + r);
    {
        /* rank r sends (k + r) % (count+1) elements to rank k */
        int *sc = malloc(sizeof(int) * n), *sd = malloc(sizeof(int) * n), *rc = malloc(sizeof(int) * n), *rd = malloc(sizeof(int) * n);
        int so = 0, ro = 0;
        for (int k = 0; k < n; k++) {
            sc[k] = (k + r) % (count + 1);
            sd[k] = so;
            so += sc[k];
            rc[k] = (r + k) % (count + 1);
            rd[k] = ro;
            ro += rc[k];
        }
        for (int k = 0; k < n; k++)
            for (int i = 0; i < sc[k]; i++) s[sd[k] + i] = V(r, i) + k;
        for (int i = 0; i < ro; i++) d[i] = -1;
        MPI_Alltoallv(s, sc, sd, MPI_LONG, d, rc, rd, MPI_LONG, comm);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < rc[k]; i++) CHECK(d[rd[k] + i] == V(k, i) + r);
        free(sc); free(sd); free(rc); free(rd);
    }
    /* reduce_scatter(_block), scan, exscan */
    for (int i = 0; i < count * n; i++) s[i] = V(r, i);
    MPI_Reduce_scatter_block(s, d, count, MPI_LONG, MPI_SUM, comm);
    for (int i = 0; i < count; i++) {
        long x = 0;
        for (int k = 0; k < n; k++) x += V(k, r * count + i);
        CHECK(d[i] == x);
    }
    memcpy(d, s, sizeof(long) * count * n);
    MPI_Reduce_scatter_block(MPI_IN_PLACE, d, count, MPI_LONG, MPI_SUM, comm);
    for (int i = 0; i < count; i++) {
        long x = 0;
        for (int k = 0; k < n; k++) x += V(k, r * count + i);
        CHECK(d[i] == x);
    }
    tot = 0;
    for (int k = 0; k < n; k++) { cnts[k] = count < k + 1 ? count : k + 1; tot += cnts[k]; }
    MPI_Reduce_scatter(s, d, cnts, MPI_LONG, MPI_SUM, comm);
    {
        int off = 0;
        for (int k = 0; k < r; k++) off += cnts[k];
        for (int i = 0; i < cnts[r]; i++) {
            long x = 0;
            for (int k = 0; k < n; k++) x += V(k, off + i);
            CHECK(d[i] == x);
        }
    }
    MPI_Scan(s, d, count, MPI_LONG, MPI_SUM, comm);
    for (int i = 0; i < count; i++) {
        long x = 0;
        for (int k = 0; k <= r; k++) x += V(k, i);
        CHECK(d[i] == x);
    }
    memcpy(d, s, sizeof(long) * count);
    MPI_Scan(MPI_IN_PLACE, d, count, MPI_LONG, MPI_MAX, comm);
    for (int i = 0; i < count; i++) CHECK(d[i] == V(r, i));
    MPI_Exscan(s, d, count, MPI_LONG, MPI_SUM, comm);
    if (r > 0)
        for (int i = 0; i < count; i++) {
            long x = 0;
            for (int k = 0; k < r; k++) x += V(k, i);
            CHECK(d[i] == x);
        }
    free(s); free(d); free(e); free(cnts); free(dsp);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    MPI_Comm dup, rev, half;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Comm_split(MPI_COMM_WORLD, 0, N - R, &rev);
    MPI_Comm_split(MPI_COMM_WORLD, R % 2, R, &half);
    int sizes[] = {0, 1, 2, 7, 100, 1000, 20000, 140000};
    for (unsigned k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        run(MPI_COMM_WORLD, sizes[k]);
        if (sizes[k] < 50000) {
            run(dup, sizes[k]);
            run(rev, sizes[k]);
            run(half, sizes[k]);
        }
    }
    MPI_Comm_free(&dup);
    MPI_Comm_free(&rev);
    MPI_Comm_free(&half);
    if (R == 0) printf("PASS coll_all\n");
    MPI_Finalize();
    return 0;
}
