/* long double reductions: MPI_LONG_DOUBLE SUM/PROD/MAX/MIN, MPI_LONG_DOUBLE_INT MINLOC/MAXLOC,
 * MPI_C_LONG_DOUBLE_COMPLEX SUM/PROD. Values differ below double precision (2^-58), so a library that
 * reduced through double (or not at all) gives different results; every result is exact. */
#include "check.h"
#include <complex.h>
#include <math.h>

static int R, N;

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    const long double eps = ldexpl(1.0L, -58);
    CHECK(1.0L + eps != 1.0L && (double)(1.0L + eps) == 1.0);

    /* SUM: sum_r (1 + (r+1) eps) = N + N(N+1)/2 eps, exact in a 64-bit mantissa */
    long double v[3] = {1.0L + (R + 1) * eps, -(long double)R, (R + 1) * 0.25L}, s[3], want;
    for (int root = 0; root < N; root++) {
        s[0] = s[1] = s[2] = -7;
        MPI_Reduce(v, s, 3, MPI_LONG_DOUBLE, MPI_SUM, root, MPI_COMM_WORLD);
        if (R == root) {
            want = (long double)N + (long double)(N * (N + 1) / 2) * eps;
            CHECK(s[0] == want);
            CHECK(s[1] == -(long double)(N * (N - 1) / 2));
            CHECK(s[2] == (N * (N + 1) / 2) * 0.25L);
        } else {
            CHECK(s[0] == -7);
        }
    }
    MPI_Allreduce(v, s, 3, MPI_LONG_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    CHECK(s[0] == (long double)N + (long double)(N * (N + 1) / 2) * eps);
    /* in place */
    s[0] = v[0];
    MPI_Allreduce(MPI_IN_PLACE, s, 1, MPI_LONG_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    CHECK(s[0] == (long double)N + (long double)(N * (N + 1) / 2) * eps);
    /* large count (ring algorithm for commutative ops) */
    int big = 6000;
    long double *bv = malloc(big * sizeof(long double)), *bs = malloc(big * sizeof(long double));
    for (int i = 0; i < big; i++)
        bv[i] = 1.0L + ((i % 13) + R) * eps;
    MPI_Allreduce(bv, bs, big, MPI_LONG_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < big; i++)
        CHECK(bs[i] == (long double)N + (long double)((i % 13) * N + N * (N - 1) / 2) * eps);
    free(bv);
    free(bs);

    /* PROD: rank 0 contributes (1 + eps) * 2, the others 2: (1 + eps) 2^N */
    long double p = R == 0 ? (1.0L + eps) * 2 : 2.0L, pr;
    MPI_Allreduce(&p, &pr, 1, MPI_LONG_DOUBLE, MPI_PROD, MPI_COMM_WORLD);
    CHECK(pr == ldexpl(1.0L + eps, N));

    /* MAX / MIN: values distinct only below double precision, maximum at rank N/2 */
    int top = N / 2;
    long double m = 1.0L + (R == top ? 5 : (R % 3)) * eps, mx, mn;
    MPI_Allreduce(&m, &mx, 1, MPI_LONG_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    CHECK(mx == 1.0L + 5 * eps);
    long double m2 = 2.0L - (R == top ? 4 : 0) * eps;
    MPI_Allreduce(&m2, &mn, 1, MPI_LONG_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    CHECK(mn == 2.0L - 4 * eps);

    /* MAXLOC / MINLOC on (long double, int): ties keep the lowest index */
    struct { long double v; int i; } in, out;
    in.v = 3.0L + (R == top ? 2 : 1) * eps;
    in.i = R;
    MPI_Allreduce(&in, &out, 1, MPI_LONG_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    CHECK(out.v == 3.0L + 2 * eps && out.i == top);
    in.v = 3.0L + (R == 0 ? 0 : 1) * eps; /* rank 0 unique minimum */
    MPI_Allreduce(&in, &out, 1, MPI_LONG_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD);
    CHECK(out.v == 3.0L && out.i == 0);
    in.v = 3.0L; /* all equal: lowest rank */
    MPI_Allreduce(&in, &out, 1, MPI_LONG_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
    CHECK(out.v == 3.0L && out.i == 0);

    /* complex: SUM of (1 + r eps) + 2r i, PROD of (1 + i) = (1 + i)^N */
    long double _Complex c = (1.0L + R * eps) + 2.0L * R * I, cs, cp;
    MPI_Allreduce(&c, &cs, 1, MPI_C_LONG_DOUBLE_COMPLEX, MPI_SUM, MPI_COMM_WORLD);
    CHECK(creall(cs) == (long double)N + (long double)(N * (N - 1) / 2) * eps);
    CHECK(cimagl(cs) == (long double)(N * (N - 1)));
    long double _Complex one_i = 1.0L + 1.0L * I, w = 1;
    MPI_Allreduce(&one_i, &cp, 1, MPI_C_LONG_DOUBLE_COMPLEX, MPI_PROD, MPI_COMM_WORLD);
    for (int r = 0; r < N; r++)
        w *= one_i;
    CHECK(creall(cp) == creall(w) && cimagl(cp) == cimagl(w));
    /* a product that needs the extended precision: (1 + eps i)(1 + eps i) = 1 - eps^2 + 2 eps i */
    long double _Complex a = 1.0L + eps * I, b = 1.0L + eps * I;
    MPI_Reduce_local(&a, &b, 1, MPI_C_LONG_DOUBLE_COMPLEX, MPI_PROD);
    CHECK(creall(b) == 1.0L - eps * eps && cimagl(b) == 2 * eps);

    /* Reduce_local on every op, and ops that are not defined on long double */
    long double x = 1.0L + eps, y = 2.0L;
    MPI_Reduce_local(&x, &y, 1, MPI_LONG_DOUBLE, MPI_SUM);
    CHECK(y == 3.0L + eps);
    y = 2.0L;
    MPI_Reduce_local(&x, &y, 1, MPI_LONG_DOUBLE, MPI_PROD);
    CHECK(y == 2.0L + 2 * eps);
    y = 1.0L;
    MPI_Reduce_local(&x, &y, 1, MPI_LONG_DOUBLE, MPI_MAX);
    CHECK(y == 1.0L + eps);
    MPI_Reduce_local(&y, &x, 1, MPI_LONG_DOUBLE, MPI_MIN);
    CHECK(x == 1.0L + eps);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Reduce_local(&x, &y, 1, MPI_LONG_DOUBLE, MPI_BAND), MPI_ERR_OP);
    CHECK_RC(MPI_Reduce_local(&c, &cs, 1, MPI_C_LONG_DOUBLE_COMPLEX, MPI_MAX), MPI_ERR_OP);

    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0)
        printf("PASS ldouble\n");
    MPI_Finalize();
    return 0;
}
