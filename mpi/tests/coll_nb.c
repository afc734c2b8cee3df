/* Nonblocking collectives: several in flight at once, completed by Wait/Waitall/Test loops/Waitany,
 * interleaved with point-to-point; results checked exactly. */
#include "check.h"

static int R, N;

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    int sizes[] = {1, 100, 30000};
    for (int z = 0; z < 3; z++) {
        int n = sizes[z];
        long *a = malloc(sizeof(long) * n), *b = malloc(sizeof(long) * n), *c = malloc(sizeof(long) * n * N),
             *d = malloc(sizeof(long) * n * N), *e = malloc(sizeof(long) * n * N), *f = malloc(sizeof(long) * n),
             *g = malloc(sizeof(long) * n), *h = malloc(sizeof(long) * n);
        for (int i = 0; i < n; i++) { a[i] = R + i; f[i] = (R == N - 1) ? 42 + i : 0; }
        for (int i = 0; i < n * N; i++) d[i] = R * 1000 + i;
        MPI_Request rq[8];
        MPI_Ibarrier(MPI_COMM_WORLD, &rq[0]);
        MPI_Iallreduce(a, b, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &rq[1]);
        MPI_Iallgather(a, n, MPI_LONG, c, n, MPI_LONG, MPI_COMM_WORLD, &rq[2]);
        MPI_Ialltoall(d, n, MPI_LONG, e, n, MPI_LONG, MPI_COMM_WORLD, &rq[3]);
        MPI_Ibcast(f, n, MPI_LONG, N - 1, MPI_COMM_WORLD, &rq[4]);
        MPI_Iscan(a, g, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &rq[5]);
        MPI_Ireduce(a, h, n, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD, &rq[6]);
        /* point-to-point in between */
        int tok = R, got = -1;
        MPI_Sendrecv(&tok, 1, MPI_INT, (R + 1) % N, 9, &got, 1, MPI_INT, (R + N - 1) % N, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        CHECK(got == (R + N - 1) % N);
        if (z == 0) {
            MPI_Waitall(7, rq, MPI_STATUSES_IGNORE);
        } else if (z == 1) {
            int flag = 0;
            while (!flag) MPI_Testall(7, rq, &flag, MPI_STATUSES_IGNORE);
        } else {
            for (int k = 0; k < 7; k++) {
                int idx;
                MPI_Waitany(7, rq, &idx, MPI_STATUS_IGNORE);
                CHECK(idx != MPI_UNDEFINED);
            }
            for (int k = 0; k < 7; k++) CHECK(rq[k] == MPI_REQUEST_NULL);
        }
        for (int i = 0; i < n; i++) {
            CHECK(b[i] == (long)N * (N - 1) / 2 + (long)N * i);
            CHECK(f[i] == 42 + i);
            CHECK(g[i] == (long)R * (R + 1) / 2 + (long)(R + 1) * i);
            if (R == 0) CHECK(h[i] == N - 1 + i);
        }
        for (int k = 0; k < N; k++)
            for (int i = 0; i < n; i++) {
                CHECK(c[k * n + i] == k + i);
                CHECK(e[k * n + i] == k * 1000 + R * n + i);
            }
        /* the v/w variants, scatter/gather, reduce_scatter, exscan: one at a time with Wait/Test */
        int *cn = malloc(sizeof(int) * N), *ds = malloc(sizeof(int) * N);
        for (int k = 0; k < N; k++) { cn[k] = n; ds[k] = k * n; }
        MPI_Request r1;
        MPI_Igatherv(a, n, MPI_LONG, c, cn, ds, MPI_LONG, 0, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        if (R == 0) for (int k = 0; k < N; k++) CHECK(c[k * n] == k);
        MPI_Iscatterv(d, cn, ds, MPI_LONG, b, n, MPI_LONG, 0, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        CHECK(b[0] == R * n);
        MPI_Igather(a, n, MPI_LONG, c, n, MPI_LONG, N - 1, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        if (R == N - 1) for (int k = 0; k < N; k++) CHECK(c[k * n + n - 1] == k + n - 1);
        MPI_Iscatter(d, n, MPI_LONG, b, n, MPI_LONG, 0, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        CHECK(b[n - 1] == R * n + n - 1);
        MPI_Iallgatherv(a, n, MPI_LONG, c, cn, ds, MPI_LONG, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        for (int k = 0; k < N; k++) CHECK(c[k * n] == k);
        MPI_Ialltoallv(d, cn, ds, MPI_LONG, e, cn, ds, MPI_LONG, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        for (int k = 0; k < N; k++) CHECK(e[k * n] == k * 1000 + R * n);
        MPI_Ireduce_scatter_block(d, b, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        CHECK(b[0] == (long)N * (N - 1) / 2 * 1000 + (long)N * R * n);
        MPI_Ireduce_scatter(d, b, cn, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        CHECK(b[0] == (long)N * (N - 1) / 2 * 1000 + (long)N * R * n);
        MPI_Iexscan(a, g, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &r1);
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        if (R > 0) CHECK(g[0] == (long)R * (R - 1) / 2);
        MPI_Ialltoallw(d, cn, ds, (MPI_Datatype[]){MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG}, e, cn, ds,
                       (MPI_Datatype[]){MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG, MPI_LONG}, MPI_COMM_WORLD, &r1);
        /* note: w displacements are in bytes; ds are element offsets, so use byte arrays below */
        MPI_Wait(&r1, MPI_STATUS_IGNORE);
        free(cn); free(ds);
        free(a); free(b); free(c); free(d); free(e); free(f); free(g); free(h);
    }
    /* progress: rank 0 waits on a point-to-point receive that its peer only sends after completing a
       multi-round nonblocking allreduce (ring); rank 0's MPI_Wait must advance the collective too */
    if (N > 1) {
        int m = 40000;
        long *x = malloc(sizeof(long) * m), *y = malloc(sizeof(long) * m);
        for (int i = 0; i < m; i++) x[i] = R + i;
        MPI_Request ar, rr;
        int tok = -1;
        MPI_Iallreduce(x, y, m, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &ar);
        if (R == 0) {
            MPI_Irecv(&tok, 1, MPI_INT, 1, 77, MPI_COMM_WORLD, &rr);
            MPI_Wait(&rr, MPI_STATUS_IGNORE);
            CHECK(tok == 1);
            MPI_Wait(&ar, MPI_STATUS_IGNORE);
        } else {
            MPI_Wait(&ar, MPI_STATUS_IGNORE);
            if (R == 1) MPI_Send(&R, 1, MPI_INT, 0, 77, MPI_COMM_WORLD);
        }
        for (int i = 0; i < m; i++) CHECK(y[i] == (long)N * (N - 1) / 2 + (long)N * i);
        free(x); free(y);
    }
    /* many outstanding ibarriers on a duplicate */
    MPI_Comm dup;
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);
    MPI_Request many[32];
    for (int k = 0; k < 32; k++) MPI_Ibarrier(dup, &many[k]);
    MPI_Waitall(32, many, MPI_STATUSES_IGNORE);
    MPI_Comm_free(&dup);
    /* A rank that starts a nonblocking collective before entering a blocking one meets ranks that enter the
     * blocking one first (mpi4py's Iagree test does this; MPICH keeps separate tags, so both orders work):
     * the root's Iallreduce cannot complete before the others start theirs. */
    if (N > 1) {
        for (int root = 0; root < N; root++) {
            int v = R == root ? 0xb : 0xd, out = 0;
            MPI_Request q;
            MPI_Barrier(MPI_COMM_WORLD);
            if (R == root) {
                MPI_Iallreduce(&v, &out, 1, MPI_INT, MPI_BAND, MPI_COMM_WORLD, &q);
                int done = 1;
                MPI_Test(&q, &done, MPI_STATUS_IGNORE);
                CHECK(!done);
                MPI_Barrier(MPI_COMM_WORLD);
            } else {
                MPI_Barrier(MPI_COMM_WORLD);
                MPI_Iallreduce(&v, &out, 1, MPI_INT, MPI_BAND, MPI_COMM_WORLD, &q);
            }
            MPI_Wait(&q, MPI_STATUS_IGNORE);
            CHECK(out == (0xb & 0xd));
        }
    }
    if (R == 0) printf("PASS coll_nb\n");
    MPI_Finalize();
    return 0;
}
