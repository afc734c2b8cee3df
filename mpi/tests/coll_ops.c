/* Predefined ops on every allowed type, MINLOC/MAXLOC pairs, user ops (commutative and not), Reduce_local. */
#include "check.h"
#include <stdint.h>
#include <complex.h>
#include <stdbool.h>

static int R, N;

#define TEST_INT_OPS(T, DT)                                                                       \
    do {                                                                                          \
        T in[4], out[4];                                                                          \
        MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN, MPI_LAND, MPI_LOR, MPI_LXOR,         \
                        MPI_BAND, MPI_BOR, MPI_BXOR};                                             \
        for (unsigned o = 0; o < sizeof ops / sizeof *ops; o++) {                                 \
            for (int i = 0; i < 4; i++) in[i] = (T)((R + 1) * (i + 1) + (i == 3 ? -R : 0));       \
            if (o == 4 || o == 5 || o == 6) in[2] = (T)(R % 2);                                   \
            MPI_Allreduce(in, out, 4, DT, ops[o], MPI_COMM_WORLD);                                \
            for (int i = 0; i < 4; i++) {                                                         \
                T x = 0;                                                                          \
                for (int k = 0; k < N; k++) {                                                     \
                    T v = (T)((k + 1) * (i + 1) + (i == 3 ? -k : 0));                             \
                    if ((o == 4 || o == 5 || o == 6) && i == 2) v = (T)(k % 2);                   \
                    if (k == 0) { x = v; continue; }                                              \
                    switch (o) {                                                                  \
                    case 0: x = (T)(x + v); break;                                                \
                    case 1: x = (T)(x * v); break;                                                \
                    case 2: x = x > v ? x : v; break;                                             \
                    case 3: x = x < v ? x : v; break;                                             \
                    case 4: x = (T)(x && v); break;                                               \
                    case 5: x = (T)(x || v); break;                                               \
                    case 6: x = (T)((!!x) != (!!v)); break;                                       \
                    case 7: x = (T)(x & v); break;                                                \
                    case 8: x = (T)(x | v); break;                                                \
                    case 9: x = (T)(x ^ v); break;                                                \
                    }                                                                             \
                }                                                                                 \
                if (!(out[i] == x)) {                                                             \
                    fprintf(stderr, "type %s op %u elem %d: got %lld want %lld\n", #T, o, i,      \
                            (long long)out[i], (long long)x);                                     \
                    CHECK(0);                                                                     \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    } while (0)

#define TEST_FLOAT_OPS(T, DT)                                                                     \
    do {                                                                                          \
        T in[3], out[3];                                                                          \
        MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MAX, MPI_MIN};                                     \
        for (unsigned o = 0; o < 4; o++) {                                                        \
            for (int i = 0; i < 3; i++) in[i] = (T)(0.5 * (R + 1) + i);                           \
            MPI_Allreduce(in, out, 3, DT, ops[o], MPI_COMM_WORLD);                                \
            for (int i = 0; i < 3; i++) {                                                         \
                T x = (T)(0.5 + i);                                                               \
                for (int k = 1; k < N; k++) {                                                     \
                    T v = (T)(0.5 * (k + 1) + i);                                                 \
                    x = o == 0 ? x + v : o == 1 ? x * v : o == 2 ? (x > v ? x : v) : (x < v ? x : v); \
                }                                                                                 \
                CHECK(out[i] == x || (o < 2 && (out[i] - x) / x < 1e-5 && (x - out[i]) / x < 1e-5)); \
            }                                                                                     \
        }                                                                                         \
    } while (0)

/* non-commutative associative op: 2x2 integer matrix product (mod 2^32) */
static void matmul(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    (void)dt;
    unsigned *a = in, *b = inout;
    for (int k = 0; k < *len; k++, a += 4, b += 4) {
        unsigned c[4] = {a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2],
                         a[2] * b[1] + a[3] * b[3]};
        memcpy(b, c, sizeof c);
    }
}
static void mine(unsigned *m, int rank, int i) { m[0] = rank + 1; m[1] = i + 2; m[2] = 1; m[3] = rank * 3 + i; }
static void prod(unsigned *acc, int from, int to, int i) /* acc = M(from) ... M(to-1) */
{
    unsigned id[4] = {1, 0, 0, 1};
    memcpy(acc, id, sizeof id);
    for (int k = from; k < to; k++) {
        unsigned m[4], c[4];
        mine(m, k, i);
        c[0] = acc[0] * m[0] + acc[1] * m[2]; c[1] = acc[0] * m[1] + acc[1] * m[3];
        c[2] = acc[2] * m[0] + acc[3] * m[2]; c[3] = acc[2] * m[1] + acc[3] * m[3];
        memcpy(acc, c, sizeof c);
    }
}
static int user_calls;
static void isum(void *in, void *inout, int *len, MPI_Datatype *dt)
{
    CHECK(*dt == MPI_INT);
    user_calls++;
    for (int i = 0; i < *len; i++) ((int *)inout)[i] += ((int *)in)[i];
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;

    TEST_INT_OPS(signed char, MPI_SIGNED_CHAR);
    TEST_INT_OPS(char, MPI_CHAR); /* MPICH accepts arithmetic on MPI_CHAR */
    TEST_INT_OPS(unsigned char, MPI_UNSIGNED_CHAR);
    {   /* MPI_BYTE: bitwise ops only (as MPICH) */
        unsigned char by = (unsigned char)(1 << (R % 8)), bo;
        MPI_Allreduce(&by, &bo, 1, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD);
        unsigned char want = 0;
        for (int k = 0; k < N; k++) want |= (unsigned char)(1 << (k % 8));
        CHECK(bo == want);
    }
    TEST_INT_OPS(short, MPI_SHORT);
    TEST_INT_OPS(unsigned short, MPI_UNSIGNED_SHORT);
    TEST_INT_OPS(int, MPI_INT);
    TEST_INT_OPS(unsigned, MPI_UNSIGNED);
    TEST_INT_OPS(long, MPI_LONG);
    TEST_INT_OPS(unsigned long, MPI_UNSIGNED_LONG);
    TEST_INT_OPS(long long, MPI_LONG_LONG);
    TEST_INT_OPS(unsigned long long, MPI_UNSIGNED_LONG_LONG);
    TEST_INT_OPS(int8_t, MPI_INT8_T);
    TEST_INT_OPS(int16_t, MPI_INT16_T);
    TEST_INT_OPS(int32_t, MPI_INT32_T);
    TEST_INT_OPS(int64_t, MPI_INT64_T);
    TEST_INT_OPS(uint8_t, MPI_UINT8_T);
    TEST_INT_OPS(uint16_t, MPI_UINT16_T);
    TEST_INT_OPS(uint32_t, MPI_UINT32_T);
    TEST_INT_OPS(uint64_t, MPI_UINT64_T);
    TEST_INT_OPS(MPI_Aint, MPI_AINT);
    TEST_INT_OPS(MPI_Offset, MPI_OFFSET);
    TEST_INT_OPS(MPI_Count, MPI_COUNT);
    TEST_FLOAT_OPS(float, MPI_FLOAT);
    TEST_FLOAT_OPS(double, MPI_DOUBLE);

    /* logical ops on floating values (an MPICH extension): any nonzero is true; results are 1 or 0 */
    {
        float f[3] = {1.0f, 0.0f, R > 0 ? 2.5f : 0.0f}, fo[3];
        double d[3] = {1.0, 0.0, R > 0 ? -3.0 : 0.0}, dO[3];
        long double l[3] = {1.0L, 0.0L, R > 0 ? 0.25L : 0.0L}, lo[3];
        MPI_Op lops[] = {MPI_LAND, MPI_LOR, MPI_LXOR};
        for (int o = 0; o < 3; o++) {
            /* element 0: every rank true; 1: every rank false; 2: all but rank 0 true */
            double want[3] = {o == 0 ? 1 : o == 1 ? 1 : N % 2, 0, o == 0 ? 0 : o == 1 ? (N > 1) : (N - 1) % 2};
            CHECK(MPI_Allreduce(f, fo, 3, MPI_FLOAT, lops[o], MPI_COMM_WORLD) == MPI_SUCCESS);
            CHECK(MPI_Allreduce(d, dO, 3, MPI_DOUBLE, lops[o], MPI_COMM_WORLD) == MPI_SUCCESS);
            CHECK(MPI_Allreduce(l, lo, 3, MPI_LONG_DOUBLE, lops[o], MPI_COMM_WORLD) == MPI_SUCCESS);
            for (int i = 0; i < 3; i++) {
                if (fo[i] != (float)want[i] || dO[i] != want[i] || lo[i] != (long double)want[i]) {
                    fprintf(stderr, "logical op %d on floating elem %d: got %g %g %Lg want %g\n", o, i,
                            (double)fo[i], dO[i], lo[i], want[i]);
                    CHECK(0);
                }
            }
        }
    }

    /* logical on C bool */
    {
        bool b = R % 2, o;
        MPI_Allreduce(&b, &o, 1, MPI_C_BOOL, MPI_LOR, MPI_COMM_WORLD);
        CHECK(o == (N > 1));
        MPI_Allreduce(&b, &o, 1, MPI_C_BOOL, MPI_LAND, MPI_COMM_WORLD);
        CHECK(o == 0);
    }
    /* complex sum/prod */
    {
        double complex z = (R + 1) + 1.0 * I, o;
        MPI_Allreduce(&z, &o, 1, MPI_C_DOUBLE_COMPLEX, MPI_SUM, MPI_COMM_WORLD);
        CHECK(creal(o) == N * (N + 1) / 2 && cimag(o) == N);
        float complex f = 1.0f * I, fo;
        MPI_Allreduce(&f, &fo, 1, MPI_C_FLOAT_COMPLEX, MPI_PROD, MPI_COMM_WORLD);
        float complex want = 1;
        for (int k = 0; k < N; k++) want *= 1.0f * I;
        CHECK(crealf(fo) == crealf(want) && cimagf(fo) == cimagf(want));
    }
    /* MINLOC / MAXLOC on every pair type */
    {
        struct { double v; int i; } d[2], od[2];
        struct { float v; int i; } f[1], of[1];
        struct { long v; int i; } l[1], ol[1];
        struct { short v; int i; } s[1], os[1];
        int ii[2], oi[2];
        d[0].v = R % 3; d[0].i = R; d[1].v = -R; d[1].i = R;
        MPI_Allreduce(d, od, 2, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD);
        CHECK(od[0].v == 0 && od[0].i == 0 && od[1].v == -(N - 1) && od[1].i == N - 1);
        MPI_Allreduce(d, od, 2, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD);
        CHECK(od[0].v == (N > 2 ? 2 : N - 1) && od[0].i == (N > 2 ? 2 : N - 1) && od[1].v == 0 && od[1].i == 0);
        f[0].v = (float)(5 - R); f[0].i = R;
        MPI_Allreduce(f, of, 1, MPI_FLOAT_INT, MPI_MINLOC, MPI_COMM_WORLD);
        CHECK(of[0].v == 5 - (N - 1) && of[0].i == N - 1);
        l[0].v = 7; l[0].i = 10 + R;
        MPI_Allreduce(l, ol, 1, MPI_LONG_INT, MPI_MAXLOC, MPI_COMM_WORLD);
        CHECK(ol[0].v == 7 && ol[0].i == 10); /* ties: lowest index */
        s[0].v = (short)(R * 2); s[0].i = R;
        MPI_Reduce(s, os, 1, MPI_SHORT_INT, MPI_MAXLOC, N - 1, MPI_COMM_WORLD);
        if (R == N - 1) CHECK(os[0].v == 2 * (N - 1) && os[0].i == N - 1);
        ii[0] = -R; ii[1] = R;
        MPI_Allreduce(ii, oi, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD);
        CHECK(oi[0] == -(N - 1) && oi[1] == N - 1);
    }
    /* user ops */
    {
        MPI_Op op;
        MPI_Op_create(isum, 1, &op);
        int commute;
        MPI_Op_commutative(op, &commute);
        CHECK(commute == 1);
        int in[1000], out[1000];
        for (int i = 0; i < 1000; i++) in[i] = R + i;
        MPI_Allreduce(in, out, 1000, MPI_INT, op, MPI_COMM_WORLD);
        for (int i = 0; i < 1000; i++) CHECK(out[i] == N * (N - 1) / 2 + N * i);
        int calls_all = 0;
        MPI_Allreduce(&user_calls, &calls_all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(N == 1 || calls_all > 0);
        int big = 50000;
        int *bi = malloc(sizeof(int) * big), *bo = malloc(sizeof(int) * big);
        for (int i = 0; i < big; i++) bi[i] = R * i;
        MPI_Allreduce(bi, bo, big, MPI_INT, op, MPI_COMM_WORLD);
        for (int i = 0; i < big; i++) CHECK(bo[i] == i * (N * (N - 1) / 2));
        free(bi); free(bo);
        MPI_Op_free(&op);
        CHECK(op == MPI_OP_NULL);

        MPI_Datatype mat;
        MPI_Type_contiguous(4, MPI_UNSIGNED, &mat);
        MPI_Type_commit(&mat);
        MPI_Op mm;
        MPI_Op_create(matmul, 0, &mm);
        MPI_Op_commutative(mm, &commute);
        CHECK(commute == 0);
        int cnts[] = {1, 3, 3000};
        for (int c = 0; c < 3; c++) {
            int n = cnts[c];
            unsigned *a = malloc(16 * n), *b = malloc(16 * n * N), want[4];
            for (int i = 0; i < n; i++) mine(a + 4 * i, R, i);
            for (int root = 0; root < N; root++) {
                MPI_Reduce(a, b, n, mat, mm, root, MPI_COMM_WORLD);
                if (R == root)
                    for (int i = 0; i < n; i++) { prod(want, 0, N, i); CHECK(memcmp(b + 4 * i, want, 16) == 0); }
            }
            MPI_Allreduce(a, b, n, mat, mm, MPI_COMM_WORLD);
            for (int i = 0; i < n; i++) { prod(want, 0, N, i); CHECK(memcmp(b + 4 * i, want, 16) == 0); }
            MPI_Scan(a, b, n, mat, mm, MPI_COMM_WORLD);
            for (int i = 0; i < n; i++) { prod(want, 0, R + 1, i); CHECK(memcmp(b + 4 * i, want, 16) == 0); }
            MPI_Exscan(a, b, n, mat, mm, MPI_COMM_WORLD);
            if (R > 0)
                for (int i = 0; i < n; i++) { prod(want, 0, R, i); CHECK(memcmp(b + 4 * i, want, 16) == 0); }
            free(a); free(b);
        }
        /* reduce_scatter_block with a non-commutative op */
        unsigned *a = malloc(16 * N * 2), b[8], want[4];
        for (int k = 0; k < N * 2; k++) mine(a + 4 * k, R, k);
        MPI_Reduce_scatter_block(a, b, 2, mat, mm, MPI_COMM_WORLD);
        for (int j = 0; j < 2; j++) { prod(want, 0, N, R * 2 + j); CHECK(memcmp(b + 4 * j, want, 16) == 0); }
        free(a);
        /* Reduce_local */
        unsigned x[4], y[4];
        mine(x, 1, 0); mine(y, 2, 0);
        MPI_Reduce_local(x, y, 1, mat, mm);
        unsigned w2[4];
        prod(w2, 1, 3, 0);
        CHECK(memcmp(y, w2, 16) == 0);
        int li[3] = {1, 2, 3}, lo[3] = {10, 20, 30};
        MPI_Reduce_local(li, lo, 3, MPI_INT, MPI_SUM);
        CHECK(lo[0] == 11 && lo[2] == 33);
        MPI_Op_free(&mm);
        MPI_Type_free(&mat);
    }
    /* errors: MPI_BAND on float is invalid */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    {
        float a = 1, b;
        CHECK_RC(MPI_Allreduce(&a, &b, 1, MPI_FLOAT, MPI_BAND, MPI_COMM_WORLD), MPI_ERR_OP);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0) printf("PASS coll_ops\n");
    MPI_Finalize();
    return 0;
}
