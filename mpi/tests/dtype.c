/* Derived datatypes: constructors, extents, names, envelope/contents, pack/unpack, and use through
 * point-to-point (eager and rendezvous sizes, blocking/nonblocking/persistent/sendrecv) and collectives. */
#include "check.h"
#include <stddef.h>

static int R, N;
static int tcopies, tdeletes;
static int tcopy(MPI_Datatype t, int k, void *x, void *in, void *out, int *flag)
{
    (void)t; (void)k; (void)x;
    tcopies++;
    *(void **)out = in;
    *flag = 1;
    return MPI_SUCCESS;
}
static int tdel(MPI_Datatype t, int k, void *v, void *x)
{
    (void)t; (void)k; (void)v; (void)x;
    tdeletes++;
    return MPI_SUCCESS;
}

static void check_extent(MPI_Datatype t, MPI_Aint lb, MPI_Aint ext, int size)
{
    MPI_Aint l, e;
    int s;
    MPI_Type_get_extent(t, &l, &e);
    MPI_Type_size(t, &s);
    if (l != lb || e != ext || s != size) {
        fprintf(stderr, "extent: lb %ld ext %ld size %d, want %ld %ld %d\n", (long)l, (long)e, s, (long)lb, (long)ext, size);
        CHECK(0);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    int next = (R + 1) % N, prev = (R + N - 1) % N;

    /* constructors and extents */
    MPI_Datatype c3, vec, hvec, idx, hidx, iblk, hblk, st, rs, dup, sub, dar;
    MPI_Type_contiguous(3, MPI_INT, &c3);
    check_extent(c3, 0, 12, 12);
    MPI_Type_vector(4, 2, 5, MPI_DOUBLE, &vec); /* 4 blocks of 2 doubles, stride 5 */
    check_extent(vec, 0, (3 * 5 + 2) * 8, 64);
    MPI_Type_create_hvector(3, 1, 20, MPI_INT, &hvec);
    check_extent(hvec, 0, 44, 12);
    int bl[3] = {2, 1, 3}, dp[3] = {5, 0, 9};
    MPI_Type_indexed(3, bl, dp, MPI_INT, &idx);
    check_extent(idx, 0, 48, 24);
    MPI_Aint hdp[3] = {40, 0, 100};
    MPI_Type_create_hindexed(3, bl, hdp, MPI_SHORT, &hidx);
    check_extent(hidx, 0, 106, 12);
    int ibd[3] = {6, 0, 2};
    MPI_Type_create_indexed_block(3, 2, ibd, MPI_INT, &iblk);
    check_extent(iblk, 0, 32, 24);
    MPI_Aint hbd[2] = {16, 0};
    MPI_Type_create_hindexed_block(2, 3, hbd, MPI_CHAR, &hblk);
    check_extent(hblk, 0, 19, 6);
    struct S { char c; double d; int i; };
    int sbl[3] = {1, 1, 1};
    MPI_Aint sdp[3] = {offsetof(struct S, c), offsetof(struct S, d), offsetof(struct S, i)};
    MPI_Datatype sty[3] = {MPI_CHAR, MPI_DOUBLE, MPI_INT};
    MPI_Type_create_struct(3, sbl, sdp, sty, &st);
    check_extent(st, 0, sizeof(struct S), 13);
    MPI_Aint tlb, text;
    MPI_Type_get_true_extent(st, &tlb, &text);
    CHECK(tlb == 0 && text == 20);
    MPI_Type_create_resized(c3, -4, 20, &rs);
    check_extent(rs, -4, 20, 12);
    MPI_Type_get_true_extent(rs, &tlb, &text);
    CHECK(tlb == 0 && text == 12);
    MPI_Type_dup(vec, &dup);
    check_extent(dup, 0, 17 * 8, 64);
    int sizes[2] = {6, 8}, subs[2] = {3, 4}, starts[2] = {1, 2};
    MPI_Type_create_subarray(2, sizes, subs, starts, MPI_ORDER_C, MPI_INT, &sub);
    check_extent(sub, 0, 6 * 8 * 4, 48);
    int gs[2] = {8, 6}, dist[2] = {MPI_DISTRIBUTE_BLOCK, MPI_DISTRIBUTE_CYCLIC}, darg[2] = {MPI_DISTRIBUTE_DFLT_DARG, 2}, ps[2] = {1, 1};
    MPI_Type_create_darray(1, 0, 2, gs, dist, darg, ps, MPI_ORDER_C, MPI_INT, &dar);
    check_extent(dar, 0, 8 * 6 * 4, 8 * 6 * 4);
    MPI_Datatype all[] = {c3, vec, hvec, idx, hidx, iblk, hblk, st, rs, dup, sub, dar};
    for (unsigned k = 0; k < sizeof all / sizeof *all; k++) MPI_Type_commit(&all[k]);

    /* names and envelope/contents */
    char nm[MPI_MAX_OBJECT_NAME];
    int len;
    MPI_Type_get_name(MPI_INT, nm, &len);
    CHECK(strcmp(nm, "MPI_INT") == 0);
    MPI_Type_set_name(vec, "myvec");
    MPI_Type_get_name(vec, nm, &len);
    CHECK(strcmp(nm, "myvec") == 0 && len == 5);
    int ni, na, nd, comb;
    MPI_Type_get_envelope(vec, &ni, &na, &nd, &comb);
    CHECK(comb == MPI_COMBINER_VECTOR && ni == 3 && na == 0 && nd == 1);
    int iv[3];
    MPI_Aint av[1];
    MPI_Datatype dv[1];
    MPI_Type_get_contents(vec, 3, 0, 1, iv, av, dv);
    CHECK(iv[0] == 4 && iv[1] == 2 && iv[2] == 5 && dv[0] == MPI_DOUBLE);
    MPI_Type_get_envelope(st, &ni, &na, &nd, &comb);
    CHECK(comb == MPI_COMBINER_STRUCT && ni == 4 && na == 3 && nd == 3);
    MPI_Type_get_envelope(MPI_INT, &ni, &na, &nd, &comb);
    CHECK(comb == MPI_COMBINER_NAMED);
    MPI_Type_get_envelope(sub, &ni, &na, &nd, &comb);
    CHECK(comb == MPI_COMBINER_SUBARRAY && ni == 8);
    MPI_Type_get_envelope(rs, &ni, &na, &nd, &comb);
    CHECK(comb == MPI_COMBINER_RESIZED && na == 2);

    /* pack / unpack */
    double a[20], b[20];
    for (int i = 0; i < 20; i++) a[i] = i;
    char pk[1000];
    int pos = 0, psz;
    MPI_Pack_size(1, vec, MPI_COMM_WORLD, &psz);
    CHECK(psz >= 64);
    MPI_Pack(a, 1, vec, pk, sizeof pk, &pos, MPI_COMM_WORLD);
    CHECK(pos == 64);
    int x = 77;
    MPI_Pack(&x, 1, MPI_INT, pk, sizeof pk, &pos, MPI_COMM_WORLD);
    CHECK(((double *)pk)[2] == 5 && ((double *)pk)[7] == 16);
    for (int i = 0; i < 20; i++) b[i] = -1;
    pos = 0;
    int y = 0;
    MPI_Unpack(pk, sizeof pk, &pos, b, 1, vec, MPI_COMM_WORLD);
    MPI_Unpack(pk, sizeof pk, &pos, &y, 1, MPI_INT, MPI_COMM_WORLD);
    CHECK(y == 77);
    for (int i = 0; i < 20; i++) CHECK(b[i] == ((i % 5 < 2 && i < 17) ? i : -1));
    /* external32 is big-endian */
    int e32 = 0x01020304;
    unsigned char ext[4];
    MPI_Aint ep = 0;
    MPI_Pack_external("external32", &e32, 1, MPI_INT, ext, 4, &ep);
    CHECK(ep == 4 && ext[0] == 1 && ext[3] == 4);
    int back = 0;
    ep = 0;
    MPI_Unpack_external("external32", ext, 4, &ep, &back, 1, MPI_INT);
    CHECK(back == e32);
    /* external32 of a struct mixing types: each member big-endian, in typemap order, with no padding */
    {
        struct mix { int a; double b; short c; char d[3]; } m[2], mb[2];
        int bl[4] = {1, 1, 1, 3};
        MPI_Aint ds[4] = {offsetof(struct mix, a), offsetof(struct mix, b), offsetof(struct mix, c), offsetof(struct mix, d)};
        MPI_Datatype ts[4] = {MPI_INT, MPI_DOUBLE, MPI_SHORT, MPI_CHAR}, mt, mv;
        MPI_Type_create_struct(4, bl, ds, ts, &mt);
        MPI_Type_contiguous(2, mt, &mv); /* a constructor over the mixed struct */
        MPI_Type_commit(&mv);
        for (int i = 0; i < 2; i++) {
            m[i].a = 0x01020304 + i;
            m[i].b = 1.0 + i; /* 0x3ff0000000000000, 0x4000000000000000 */
            m[i].c = (short)0x0a0b;
            m[i].d[0] = 'x'; m[i].d[1] = 'y'; m[i].d[2] = 'z';
        }
        MPI_Aint need = 0;
        MPI_Pack_external_size("external32", 1, mv, &need);
        CHECK(need == 2 * 17);
        unsigned char xb[64];
        ep = 0;
        CHECK(MPI_Pack_external("external32", m, 1, mv, xb, sizeof xb, &ep) == MPI_SUCCESS);
        CHECK(ep == 34);
        for (int i = 0; i < 2; i++) {
            unsigned char *q = xb + 17 * i;
            CHECK(q[0] == 1 && q[1] == 2 && q[2] == 3 && q[3] == 4 + i);
            CHECK(q[4] == (i ? 0x40 : 0x3f) && q[5] == (i ? 0x00 : 0xf0) && q[11] == 0);
            CHECK(q[12] == 0x0a && q[13] == 0x0b);
            CHECK(q[14] == 'x' && q[15] == 'y' && q[16] == 'z');
        }
        memset(mb, 0, sizeof mb);
        ep = 0;
        CHECK(MPI_Unpack_external("external32", xb, 34, &ep, mb, 1, mv) == MPI_SUCCESS && ep == 34);
        for (int i = 0; i < 2; i++)
            CHECK(mb[i].a == m[i].a && mb[i].b == m[i].b && mb[i].c == m[i].c && mb[i].d[2] == 'z');
        /* a pair type: the double and the int are swapped separately */
        struct { double v; int k; } di = {2.0, 0x01020304};
        unsigned char pb[32];
        ep = 0;
        MPI_Pack_external("external32", &di, 1, MPI_DOUBLE_INT, pb, sizeof pb, &ep);
        CHECK(pb[0] == 0x40 && pb[7] == 0 && pb[8] == 1 && pb[11] == 4);
        MPI_Type_free(&mv);
        MPI_Type_free(&mt);
        /* only "external32" is a data representation */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        int ec = 0;
        ep = 0;
        MPI_Error_class(MPI_Pack_external("native", &e32, 1, MPI_INT, ext, 4, &ep), &ec);
        CHECK(ec == MPI_ERR_ARG && ep == 0);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    }
    /* subarray contents via pack */
    {
        int arr[6][8], out[12];
        for (int i = 0; i < 6; i++) for (int j = 0; j < 8; j++) arr[i][j] = i * 100 + j;
        pos = 0;
        MPI_Pack(arr, 1, sub, out, sizeof out, &pos, MPI_COMM_WORLD);
        for (int i = 0; i < 3; i++) for (int j = 0; j < 4; j++) CHECK(out[i * 4 + j] == (i + 1) * 100 + j + 2);
    }
    /* darray with 2x... process grid over world when it fits: block rows x cyclic(2) cols */
    if (N == 2 || N == 4) {
        MPI_Datatype dd;
        int p2[2] = {N / 2, 2};
        MPI_Type_create_darray(N, R, 2, gs, dist, darg, p2, MPI_ORDER_C, MPI_INT, &dd);
        MPI_Type_commit(&dd);
        int sz;
        MPI_Type_size(dd, &sz);
        int tot;
        MPI_Allreduce(&sz, &tot, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        CHECK(tot == 8 * 6 * 4);
        int garr[8][6], *loc = malloc(sz);
        for (int i = 0; i < 8; i++) for (int j = 0; j < 6; j++) garr[i][j] = i * 10 + j;
        pos = 0;
        MPI_Pack(garr, 1, dd, loc, sz, &pos, MPI_COMM_WORLD);
        int pr = R / 2, pc = R % 2, k = 0, rows = 8 / (N / 2);
        for (int i = pr * rows; i < (pr + 1) * rows; i++)
            for (int j = 0; j < 6; j++)
                if ((j / 2) % 2 == pc) CHECK(loc[k++] == i * 10 + j);
        CHECK(k * 4 == sz);
        free(loc);
        MPI_Type_free(&dd);
    }

    /* point-to-point with derived types: vector of doubles, small and large (rendezvous) */
    int counts[] = {1, 3, 1000, 70000};
    for (int c = 0; c < 4; c++) {
        int n = counts[c];
        MPI_Datatype v2;
        MPI_Type_vector(n, 1, 3, MPI_DOUBLE, &v2); /* every third double */
        MPI_Type_commit(&v2);
        double *s = malloc(sizeof(double) * 3 * n), *r = malloc(sizeof(double) * 3 * n), *d = malloc(sizeof(double) * n);
        for (int i = 0; i < 3 * n; i++) { s[i] = R * 1e6 + i; r[i] = -1; }
        /* typed send -> contiguous receive */
        MPI_Sendrecv(s, 1, v2, next, 1, d, n, MPI_DOUBLE, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < n; i++) CHECK(d[i] == prev * 1e6 + 3 * i);
        /* contiguous send -> typed receive, nonblocking */
        MPI_Request rq[2];
        MPI_Irecv(r, 1, v2, prev, 2, MPI_COMM_WORLD, &rq[0]);
        MPI_Isend(d, n, MPI_DOUBLE, next, 2, MPI_COMM_WORLD, &rq[1]);
        MPI_Status sts[2];
        MPI_Waitall(2, rq, sts);
        int cnt;
        MPI_Get_count(&sts[0], v2, &cnt);
        CHECK(cnt == 1);
        MPI_Get_elements(&sts[0], v2, &cnt);
        CHECK(cnt == n);
        for (int i = 0; i < 3 * n; i++) CHECK(r[i] == (i % 3 == 0 ? ((prev + N - 1) % N) * 1e6 + i : -1));
        /* typed both sides, blocking Send/Recv ordered by rank parity, and persistent */
        for (int i = 0; i < 3 * n; i++) r[i] = -1;
        if (N > 1) {
            if (R % 2 == 0) {
                MPI_Send(s, 1, v2, next, 3, MPI_COMM_WORLD);
                MPI_Recv(r, 1, v2, prev, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(r, 1, v2, prev, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(s, 1, v2, next, 3, MPI_COMM_WORLD);
            }
            for (int i = 0; i < 3 * n; i++) CHECK(r[i] == (i % 3 == 0 ? prev * 1e6 + i : -1));
        }
        MPI_Request pr[2];
        MPI_Recv_init(r, 1, v2, prev, 4, MPI_COMM_WORLD, &pr[0]);
        MPI_Send_init(s, 1, v2, next, 4, MPI_COMM_WORLD, &pr[1]);
        for (int it = 0; it < 2; it++) {
            for (int i = 0; i < 3 * n; i++) r[i] = -1;
            s[0] = it;
            MPI_Startall(2, pr);
            MPI_Waitall(2, pr, MPI_STATUSES_IGNORE);
            for (int i = 3; i < 3 * n; i++) CHECK(r[i] == (i % 3 == 0 ? prev * 1e6 + i : -1));
            CHECK(r[0] == it);
        }
        MPI_Request_free(&pr[0]);
        MPI_Request_free(&pr[1]);
        s[0] = R * 1e6;
        /* collectives with the vector type: bcast, allgather into resized vector */
        for (int i = 0; i < 3 * n; i++) r[i] = (R == 0) ? s[i] : -1;
        MPI_Bcast(r, 1, v2, 0, MPI_COMM_WORLD);
        for (int i = 0; i < 3 * n; i++) CHECK(r[i] == (i % 3 == 0 || R == 0 ? (double)i : -1));
        free(s); free(r); free(d);
        MPI_Type_free(&v2);
    }
    /* gather of struct elements with a resized column type: column k of an N x 4 int matrix */
    {
        MPI_Datatype col, colr;
        MPI_Type_vector(N, 1, 4, MPI_INT, &col);
        MPI_Type_create_resized(col, 0, sizeof(int), &colr);
        MPI_Type_commit(&colr);
        int mine[4], m[64];
        for (int j = 0; j < 4; j++) mine[j] = R * 10 + j;
        /* each rank contributes 4 ints; root receives them as column R of a 4 x N (row-major, N cols)? use
           alltoall-free check: gather rows into matrix rows */
        MPI_Gather(mine, 4, MPI_INT, m, 4, MPI_INT, 0, MPI_COMM_WORLD);
        /* now scatter columns: rank k gets column k%4 ... use colr with count 1 per rank from a N x 4 matrix */
        int got[64];
        if (N <= 4) {
            MPI_Scatter(m, 1, colr, got, N, MPI_INT, 0, MPI_COMM_WORLD);
            for (int i = 0; i < N; i++) CHECK(got[i] == i * 10 + R);
            /* and gather columns back with colr at the root */
            int back2[64];
            for (int i = 0; i < 64; i++) back2[i] = -1;
            MPI_Gather(got, N, MPI_INT, back2, 1, colr, 0, MPI_COMM_WORLD);
            if (R == 0)
                for (int i = 0; i < N; i++)
                    for (int j = 0; j < N; j++) CHECK(back2[i * 4 + j] == i * 10 + j);
        }
        MPI_Type_free(&col);
        MPI_Type_free(&colr);
    }
    /* struct type through allreduce with a user op and through alltoallw */
    {
        struct S in[2], out[8];
        for (int k = 0; k < 2; k++) { in[k].c = (char)('a' + R); in[k].d = R + k; in[k].i = R * k; }
        MPI_Datatype sty2;
        MPI_Type_dup(st, &sty2);
        MPI_Allgather(in, 1, st, out, 1, st, MPI_COMM_WORLD);
        for (int k = 0; k < N; k++) CHECK(out[k].c == 'a' + k && out[k].d == k && out[k].i == 0);
        MPI_Type_free(&sty2);
        int *sc = calloc(N, sizeof(int)), *rc = calloc(N, sizeof(int)), *sd = calloc(N, sizeof(int)), *rd = calloc(N, sizeof(int));
        MPI_Datatype *sts = malloc(sizeof(MPI_Datatype) * N), *rts = malloc(sizeof(MPI_Datatype) * N);
        double *sbuf = malloc(sizeof(double) * 3 * N * 4), *rbuf = malloc(sizeof(double) * 3 * N * 4);
        MPI_Datatype v4;
        MPI_Type_vector(4, 1, 3, MPI_DOUBLE, &v4);
        MPI_Type_commit(&v4);
        for (int k = 0; k < N; k++) {
            sc[k] = 1; sts[k] = v4; sd[k] = k * 12 * sizeof(double);   /* typed send */
            rc[k] = 4; rts[k] = MPI_DOUBLE; rd[k] = k * 4 * sizeof(double); /* contiguous receive */
        }
        for (int i = 0; i < 12 * N; i++) sbuf[i] = R * 1000 + i;
        MPI_Alltoallw(sbuf, sc, sd, sts, rbuf, rc, rd, rts, MPI_COMM_WORLD);
        for (int k = 0; k < N; k++)
            for (int j = 0; j < 4; j++) CHECK(rbuf[k * 4 + j] == k * 1000 + R * 12 + 3 * j);
        MPI_Type_free(&v4);
        free(sc); free(rc); free(sd); free(rd); free(sts); free(rts); free(sbuf); free(rbuf);
    }
    /* Get_address */
    {
        struct S s;
        MPI_Aint a0, a1;
        MPI_Get_address(&s, &a0);
        MPI_Get_address(&s.d, &a1);
        CHECK(a1 - a0 == offsetof(struct S, d));
        CHECK(MPI_Aint_diff(a1, a0) == offsetof(struct S, d));
    }
    /* reductions on a non-contiguous derived type (every other int) with predefined ops: an extension
       (MPICH refuses predefined ops on derived types; vmfabric reduces them packed, as basic elements) */
    {
        MPI_Datatype ev;
        int m = 5000;
        MPI_Type_vector(m, 1, 2, MPI_INT, &ev);
        MPI_Type_commit(&ev);
        int *in = malloc(sizeof(int) * 2 * m * N), *out = malloc(sizeof(int) * 2 * m * N);
        for (int i = 0; i < 2 * m * N; i++) { in[i] = R + i; out[i] = -1; }
        MPI_Allreduce(in, out, 1, ev, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 2 * m; i++) CHECK(out[i] == (i % 2 ? -1 : N * (N - 1) / 2 + N * i));
        for (int i = 0; i < 2 * m; i++) out[i] = -1;
        MPI_Reduce(in, out, 1, ev, MPI_MAX, N - 1, MPI_COMM_WORLD);
        if (R == N - 1) for (int i = 0; i < 2 * m; i++) CHECK(out[i] == (i % 2 ? -1 : N - 1 + i));
        for (int i = 0; i < 2 * m; i++) out[i] = -1;
        MPI_Scan(in, out, 1, ev, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 2 * m; i++) CHECK(out[i] == (i % 2 ? -1 : R * (R + 1) / 2 + (R + 1) * i));
        for (int i = 0; i < 2 * m; i++) out[i] = -1;
        /* reduce_scatter_block: N elements of ev (one each), laid out with extent (2m-1) ints */
        MPI_Datatype evr;
        MPI_Type_create_resized(ev, 0, sizeof(int) * 2 * m, &evr);
        MPI_Type_commit(&evr);
        MPI_Reduce_scatter_block(in, out, 1, evr, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < 2 * m; i++) CHECK(out[i] == (i % 2 ? -1 : N * (N - 1) / 2 + N * (R * 2 * m + i)));
        MPI_Type_free(&evr);
        MPI_Type_free(&ev);
        free(in); free(out);
    }
    /* datatype attributes: copied on dup, deleted on free */
    {
        int key, flag;
        void *v;
        static int val;
        MPI_Type_create_keyval(tcopy, tdel, &key, NULL);
        MPI_Datatype t1, t2;
        MPI_Type_contiguous(2, MPI_INT, &t1);
        MPI_Type_set_attr(t1, key, &val);
        MPI_Type_get_attr(t1, key, &v, &flag);
        CHECK(flag && v == &val);
        MPI_Type_dup(t1, &t2);
        CHECK(tcopies == 1);
        MPI_Type_get_attr(t2, key, &v, &flag);
        CHECK(flag && v == &val);
        MPI_Type_delete_attr(t2, key);
        CHECK(tdeletes == 1);
        MPI_Type_get_attr(t2, key, &v, &flag);
        CHECK(!flag);
        MPI_Type_free(&t1);
        CHECK(tdeletes == 2);
        MPI_Type_free(&t2);
        MPI_Type_free_keyval(&key);
    }
    /* large-count entry points */
    {
        MPI_Count cs, clb, cext;
        MPI_Type_size_c(vec, &cs);
        MPI_Type_get_extent_c(vec, &clb, &cext);
        CHECK(cs == 64 && clb == 0 && cext == 17 * 8);
        long lv = R + 1, lo = 0;
        MPI_Allreduce_c(&lv, &lo, (MPI_Count)1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        CHECK(lo == (long)N * (N + 1) / 2);
        long bv = R == 0 ? 99 : 0;
        MPI_Bcast_c(&bv, (MPI_Count)1, MPI_LONG, 0, MPI_COMM_WORLD);
        CHECK(bv == 99);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        CHECK_RC(MPI_Bcast_c(&bv, (MPI_Count)-1, MPI_LONG, 0, MPI_COMM_WORLD), MPI_ERR_COUNT);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    }
    /* pair types: the size of their members, the extent of the C struct; the padding is no data */
    {
        struct di { double v; int k; } a[4], b[4];
        struct si { short v; int k; } sa[4], sb[4];
        check_extent(MPI_DOUBLE_INT, 0, sizeof(struct di), 12);
        check_extent(MPI_SHORT_INT, 0, sizeof(struct si), 6);
        check_extent(MPI_FLOAT_INT, 0, 8, 8);
        MPI_Aint tlb, text;
        MPI_Type_get_true_extent(MPI_SHORT_INT, &tlb, &text);
        CHECK(tlb == 0 && text == 8);
        /* sent as MPI_DOUBLE_INT, received as a struct {double, int} of the same signature */
        int pbl[2] = {1, 1};
        MPI_Aint pds[2] = {offsetof(struct di, v), offsetof(struct di, k)};
        MPI_Datatype pts[2] = {MPI_DOUBLE, MPI_INT}, ps;
        MPI_Type_create_struct(2, pbl, pds, pts, &ps);
        MPI_Type_commit(&ps);
        check_extent(ps, 0, sizeof(struct di), 12);
        for (int i = 0; i < 4; i++) a[i] = (struct di){R * 10 + i, i};
        memset(b, 0xff, sizeof b);
        MPI_Status s;
        MPI_Sendrecv(a, 4, MPI_DOUBLE_INT, next, 7, b, 4, ps, prev, 7, MPI_COMM_WORLD, &s);
        for (int i = 0; i < 4; i++) CHECK(b[i].v == prev * 10 + i && b[i].k == i);
        int c = 0;
        MPI_Get_count(&s, MPI_DOUBLE_INT, &c);
        CHECK(c == 4);
        MPI_Get_elements(&s, MPI_DOUBLE_INT, &c);
        CHECK(c == 8);
        MPI_Get_count(&s, MPI_BYTE, &c);
        CHECK(c == 48);
        /* 20 bytes as MPI_DOUBLE_INT: a pair and a double */
        unsigned char raw[20] = {0};
        MPI_Sendrecv(raw, 20, MPI_BYTE, R, 8, b, 2, MPI_DOUBLE_INT, R, 8, MPI_COMM_WORLD, &s);
        MPI_Get_elements(&s, MPI_DOUBLE_INT, &c);
        CHECK(c == 3);
        MPI_Get_count(&s, MPI_DOUBLE_INT, &c);
        CHECK(c == MPI_UNDEFINED);
        /* a broadcast and a gather of padded pairs */
        for (int i = 0; i < 4; i++) sa[i] = (struct si){(short)(R == 0 ? 100 + i : -1), R == 0 ? i : -1};
        MPI_Bcast(sa, 3, MPI_SHORT_INT, 0, MPI_COMM_WORLD);
        for (int i = 0; i < 3; i++) CHECK(sa[i].v == 100 + i && sa[i].k == i);
        struct di *all_di = malloc(N * sizeof *all_di), mine = {R + 0.5, R};
        MPI_Allgather(&mine, 1, MPI_DOUBLE_INT, all_di, 1, MPI_DOUBLE_INT, MPI_COMM_WORLD);
        for (int r = 0; r < N; r++) CHECK(all_di[r].v == r + 0.5 && all_di[r].k == r);
        free(all_di);
        /* MINLOC/MAXLOC over an array of pairs and over every other pair (reduced packed) */
        MPI_Datatype pc, pv, sv;
        MPI_Type_contiguous(2, MPI_DOUBLE_INT, &pc);
        MPI_Type_vector(2, 1, 2, MPI_DOUBLE_INT, &pv);
        MPI_Type_vector(2, 1, 2, MPI_SHORT_INT, &sv);
        MPI_Type_commit(&pc);
        MPI_Type_commit(&pv);
        MPI_Type_commit(&sv);
        for (int i = 0; i < 4; i++) {
            a[i] = (struct di){(R + i) % N, R};
            sa[i] = (struct si){(short)((R + i) % N), R};
        }
        /* position i's minimum 0 is at rank (N - i % N) % N, its maximum N-1 at (2N - 1 - i % N) % N */
        memset(b, 0xff, sizeof b);
        MPI_Allreduce(a, b, 2, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD);
        for (int i = 0; i < 2; i++) CHECK(b[i].v == 0 && b[i].k == (N - i % N) % N);
        memset(b, 0xff, sizeof b);
        MPI_Allreduce(a, b, 1, pc, MPI_MAXLOC, MPI_COMM_WORLD);
        for (int i = 0; i < 2; i++) CHECK(b[i].v == N - 1 && b[i].k == (2 * N - 1 - i % N) % N);
        memset(b, 0xff, sizeof b);
        MPI_Allreduce(a, b, 1, pv, MPI_MINLOC, MPI_COMM_WORLD);
        for (int i = 0; i < 4; i += 2) CHECK(b[i].v == 0 && b[i].k == (N - i % N) % N);
        CHECK(b[1].k == -1 && b[3].k == -1);
        memset(sb, 0xff, sizeof sb);
        MPI_Reduce(sa, sb, 1, sv, MPI_MAXLOC, 0, MPI_COMM_WORLD);
        if (R == 0) {
            for (int i = 0; i < 4; i += 2) CHECK(sb[i].v == N - 1 && sb[i].k == (2 * N - 1 - i % N) % N);
            CHECK(sb[1].k == -1);
        }
        MPI_Type_free(&sv);
        MPI_Type_free(&pv);
        MPI_Type_free(&pc);
        MPI_Type_free(&ps);
        /* external32: C long is 4 bytes, truncated when it does not fit, sign-extended back */
        long lv[2] = {-2, 0x100000005L}, lb[2] = {0, 0};
        unsigned char xl[8];
        MPI_Aint need = 0, ep = 0;
        MPI_Pack_external_size("external32", 2, MPI_LONG, &need);
        CHECK(need == 8);
        MPI_Pack_external("external32", lv, 2, MPI_LONG, xl, sizeof xl, &ep);
        CHECK(ep == 8 && xl[0] == 0xff && xl[3] == 0xfe && xl[4] == 0 && xl[7] == 5);
        ep = 0;
        MPI_Unpack_external("external32", xl, sizeof xl, &ep, lb, 2, MPI_LONG);
        CHECK(ep == 8 && lb[0] == -2 && lb[1] == 5);
        MPI_Pack_external_size("external32", 1, MPI_LONG_INT, &need);
        CHECK(need == 8);
    }
    /* MPI-1 bound markers in a struct: they set lb and ub (the last of each wins) and are no data */
    {
        int mbl[3] = {1, 2, 1};
        MPI_Aint mds[3] = {-4, 0, 20};
        MPI_Datatype mts[3] = {MPI_LB, MPI_INT, MPI_UB}, mk;
        MPI_Type_create_struct(3, mbl, mds, mts, &mk);
        MPI_Type_commit(&mk);
        check_extent(mk, -4, 24, 8);
        MPI_Aint tlb, text;
        MPI_Type_get_true_extent(mk, &tlb, &text);
        CHECK(tlb == 0 && text == 8);
        int src[24], dst[24];
        for (int i = 0; i < 24; i++) src[i] = R * 100 + i;
        for (int i = 0; i < 24; i++) dst[i] = -1;
        /* two elements 24 bytes (6 ints) apart, their data at the buffer's start */
        MPI_Sendrecv(src + 1, 2, mk, next, 9, dst + 1, 2, mk, prev, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (int i = 0; i < 24; i++) {
            int want = (i == 1 || i == 2 || i == 7 || i == 8) ? prev * 100 + i : -1;
            CHECK(dst[i] == want);
        }
        MPI_Type_free(&mk);
    }
    for (unsigned k = 0; k < sizeof all / sizeof *all; k++) MPI_Type_free(&all[k]);
    CHECK(all[0] == MPI_DATATYPE_NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    {
        /* A type built from a dup that the program frees: MPI_Type_get_contents still names the dup,
         * and that handle still answers (MPI_COMBINER_DUP of MPI_SHORT_INT), as in MPICH. */
        MPI_Datatype dup, st, got[1], inner[1];
        int bl = 2, ni, na, nd, comb;
        MPI_Aint disp = 0;
        CHECK(MPI_Type_dup(MPI_SHORT_INT, &dup) == MPI_SUCCESS);
        CHECK(MPI_Type_create_struct(1, &bl, &disp, &dup, &st) == MPI_SUCCESS);
        CHECK(MPI_Type_free(&dup) == MPI_SUCCESS && dup == MPI_DATATYPE_NULL);
        int ints[2];
        MPI_Aint aints[1];
        CHECK(MPI_Type_get_contents(st, 2, 1, 1, ints, aints, got) == MPI_SUCCESS);
        CHECK(ints[0] == 1 && ints[1] == 2 && aints[0] == 0);
        CHECK(MPI_Type_get_envelope(got[0], &ni, &na, &nd, &comb) == MPI_SUCCESS);
        CHECK(comb == MPI_COMBINER_DUP && ni == 0 && na == 0 && nd == 1);
        CHECK(MPI_Type_get_contents(got[0], 0, 0, 1, NULL, NULL, inner) == MPI_SUCCESS);
        CHECK(inner[0] == MPI_SHORT_INT);
        int sz;
        CHECK(MPI_Type_size(got[0], &sz) == MPI_SUCCESS && sz == (int)(sizeof(short) + sizeof(int)));
        CHECK(MPI_Type_free(&got[0]) == MPI_SUCCESS);
        CHECK(MPI_Type_commit(&st) == MPI_SUCCESS);
        CHECK(MPI_Type_size(st, &sz) == MPI_SUCCESS && sz == 2 * (int)(sizeof(short) + sizeof(int)));
        CHECK(MPI_Type_free(&st) == MPI_SUCCESS);
        /* Many builds and frees in that order leave no slot behind that breaks later types. */
        for (int k = 0; k < 100; k++) {
            CHECK(MPI_Type_dup(MPI_INT, &dup) == MPI_SUCCESS);
            CHECK(MPI_Type_contiguous(3, dup, &st) == MPI_SUCCESS);
            CHECK(MPI_Type_free(&dup) == MPI_SUCCESS);
            CHECK(MPI_Type_commit(&st) == MPI_SUCCESS);
            CHECK(MPI_Type_size(st, &sz) == MPI_SUCCESS && sz == 3 * (int)sizeof(int));
            CHECK(MPI_Type_free(&st) == MPI_SUCCESS);
        }
    }
    if (R == 0) printf("PASS dtype\n");
    MPI_Finalize();
    return 0;
}
