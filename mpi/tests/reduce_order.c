/*
 * reduce_order.c -- MPI_Allreduce and MPI_Reduce of doubles group their sums as MPICH does: recursive
 * doubling for an allreduce ((x0 + x1) + x2 on 3 ranks, (x0 + x1) + (x2 + x3) on 4), the binomial tree
 * counted from the root for a reduce; bit for bit, on every rank, whichever path serves the call (the
 * shared-memory collectives small and big, the one-hop and the tree schedules with VMF_SHM_COLL=0).
 *
 * The standard leaves the grouping to the implementation, but floating-point sums depend on it, and codes
 * validated under MPICH can be that fragile: ScaLAPACK's xdsep (a 26-fold eigenvalue cluster, 3 ranks of
 * 4) failed its orthogonality check in most runs while the shared-memory and one-hop paths folded from
 * the right, x0 + (x1 + x2), and fails it under MPICH as well once MPICH's sums are folded that way.
 *
 * Every communicator of the first k ranks (k = 1 .. n, the xdsep case being 3 of 4) and the reversed
 * world are tested, with counts on both sides of the paths' thresholds (4 KiB one-hop, 8 KiB
 * shared-memory buffer, below the 64 KiB ring allreduce, whose chunks are summed in another order).
 * The values span 2^-30 .. 2^25 with both signs, so that a different grouping changes some results
 * (checked: the right fold must differ somewhere, or the test would prove nothing).
 */
#include "check.h"

#define MAXN 64
#define MAXC 8000

/* 2^e, exactly (no libm). */
static double pow2(int e)
{
    double v = 1.0;
    for (; e > 0; e--) v *= 2.0;
    for (; e < 0; e++) v /= 2.0;
    return v;
}

static double val(int r, int i, int it)
{
    double m = 1.0 + (double)((r * 7 + i * 13 + it * 5) % 17) / 17.0;
    int e = ((r * 5 + i * 3 + it) % 7) * 9 - 30;
    return ((r + i + it) % 3 == 0 ? -1.0 : 1.0) * m * pow2(e);
}

/* MPICH's recursive-doubling allreduce: ranks 2i, 2i+1 pair up for i < n - p (p = largest power of two
 * <= n), then the p partial sums combine as a balanced tree. */
static double doubling(const double *x, int n)
{
    double b[MAXN];
    int p = 1;
    while (p * 2 <= n) p *= 2;
    int rem = n - p;
    for (int r = 0; r < n; r++) b[r] = x[r];
    for (int r = 1; r < 2 * rem; r += 2) b[r] = b[r - 1] + b[r];
    double y[MAXN];
    for (int v = 0; v < p; v++) y[v] = b[v < rem ? 2 * v + 1 : v + rem];
    for (int w = 1; w < p; w *= 2)
        for (int v = 0; v < p; v += 2 * w) y[v] = y[v] + y[v + w];
    return y[0];
}

/* MPICH's binomial reduce, ranks counted from the root (MPI_SUM commutes). */
static double binomial(const double *x, int n, int root)
{
    double a[MAXN];
    for (int v = 0; v < n; v++) a[v] = x[(root + v) % n];
    for (int m = 1; m < n; m *= 2)
        for (int v = 0; v + m < n; v += 2 * m) a[v] = a[v] + a[v + m];
    return a[0];
}

static double right_fold(const double *x, int n)
{
    double acc = x[n - 1];
    for (int r = n - 2; r >= 0; r--) acc = x[r] + acc;
    return acc;
}

static const int counts[] = {1, 5, 100, 512, 513, 1024, 1025, 3000, MAXC};

/* Returns how many results a right fold would have got wrong. */
static long test(MPI_Comm comm, int it)
{
    int me, n;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    static double in[MAXC], out[MAXC];
    double x[MAXN];
    long differs = 0;
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        int cnt = counts[c];
        for (int i = 0; i < cnt; i++) in[i] = val(me, i, it);
        /* Allreduce, in place on odd iterations. */
        if (it % 2) {
            memcpy(out, in, sizeof(double) * cnt);
            MPI_Allreduce(MPI_IN_PLACE, out, cnt, MPI_DOUBLE, MPI_SUM, comm);
        } else {
            MPI_Allreduce(in, out, cnt, MPI_DOUBLE, MPI_SUM, comm);
        }
        for (int i = 0; i < cnt; i++) {
            for (int r = 0; r < n; r++) x[r] = val(r, i, it);
            double want = doubling(x, n);
            if (memcmp(&out[i], &want, sizeof want)) {
                fprintf(stderr, "allreduce on %d ranks, count %d, element %d: %.17g, want %.17g (right fold %.17g)\n",
                        n, cnt, i, out[i], want, right_fold(x, n));
                CHECK(0);
            }
            differs += right_fold(x, n) != want;
        }
        /* Reduce to every root in turn. */
        int root = (it + (int)c) % n;
        MPI_Reduce(in, me == root ? out : NULL, cnt, MPI_DOUBLE, MPI_SUM, root, comm);
        if (me == root)
            for (int i = 0; i < cnt; i++) {
                for (int r = 0; r < n; r++) x[r] = val(r, i, it);
                double want = binomial(x, n, root);
                if (memcmp(&out[i], &want, sizeof want)) {
                    fprintf(stderr, "reduce on %d ranks to %d, count %d, element %d: %.17g, want %.17g\n", n,
                            root, cnt, i, out[i], want);
                    CHECK(0);
                }
            }
    }
    return differs;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    check_rank = me;
    CHECK(n <= MAXN);
    long differs = 0;
    for (int k = 1; k <= n; k++) {
        MPI_Comm sub;
        MPI_Comm_split(MPI_COMM_WORLD, me < k ? 0 : MPI_UNDEFINED, me, &sub);
        for (int it = 0; it < 4; it++) {
            if (sub != MPI_COMM_NULL) {
                long d = test(sub, it);
                if (me == 0 && k >= 3) differs += d;
            }
            MPI_Barrier(MPI_COMM_WORLD);
        }
        if (sub != MPI_COMM_NULL) MPI_Comm_free(&sub);
    }
    MPI_Comm rev;
    MPI_Comm_split(MPI_COMM_WORLD, 0, n - me, &rev);
    for (int it = 0; it < 4; it++) test(rev, it);
    MPI_Comm_free(&rev);
    /* With 3 ranks or more the data must tell the groupings apart (counted on rank 0). */
    CHECK(me != 0 || n < 3 || differs > 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) printf("PASS reduce_order (%d ranks; %ld results a right fold gets wrong)\n", n, differs);
    MPI_Finalize();
    return 0;
}
