/* Persistent collectives (MPI 4.0 *_init): every one, started many times with new data each time
 * (Start/Wait, Startall/Waitall, Test loops), in place where allowed, inactive Wait, Request_free. */
#include "check.h"
#include <string.h>

static int R, N;
#define NI 4 /* iterations */

/* Overwrite freed heap memory, as a program does between an _init call and its starts. */
static void churn(void)
{
    for (int k = 0; k < 64; k++) {
        size_t len = 16 + 8 * (size_t)k;
        long *p = malloc(len);
        memset(p, 0x5a, len);
        free(p);
    }
}

/* The large-count (_c) forms of the persistent v-collectives: their count arrays are MPI_Count, and a
 * start reads them long after the _init call returned (they once pointed at freed memory). */
static void test_large_count_v(MPI_Comm c)
{
    int r, n;
    MPI_Comm_rank(c, &r);
    MPI_Comm_size(c, &n);
    MPI_Count *cnt = malloc(n * sizeof *cnt);
    MPI_Aint *dsp = malloc(n * sizeof *dsp);
    for (int i = 0; i < n; i++) {
        cnt[i] = 1 + i % 2;
        dsp[i] = 2 * i;
    }
    int *all = malloc(2 * n * sizeof(int)), mine[2], in[2 * 64];
    MPI_Request q[4];
    CHECK(MPI_Allgatherv_init_c(mine, cnt[r], MPI_INT, all, cnt, dsp, MPI_INT, c, MPI_INFO_NULL, &q[0]) == MPI_SUCCESS);
    CHECK(MPI_Gatherv_init_c(mine, cnt[r], MPI_INT, all, cnt, dsp, MPI_INT, 0, c, MPI_INFO_NULL, &q[1]) == MPI_SUCCESS);
    int scat[2];
    CHECK(MPI_Scatterv_init_c(all, cnt, dsp, MPI_INT, scat, cnt[r], MPI_INT, 0, c, MPI_INFO_NULL, &q[2]) == MPI_SUCCESS);
    /* In place: every rank contributes 2n ints and keeps the sum of its block of 2. */
    MPI_Count rcnt[64];
    for (int i = 0; i < n; i++)
        rcnt[i] = 2;
    CHECK(MPI_Reduce_scatter_init_c(MPI_IN_PLACE, in, rcnt, MPI_INT, MPI_SUM, c, MPI_INFO_NULL, &q[3]) == MPI_SUCCESS);
    for (int it = 0; it < NI; it++) {
        churn();
        mine[0] = 100 * r + it;
        mine[1] = 100 * r + it + 50;
        for (int i = 0; i < 2 * n; i++)
            all[i] = -1, in[i] = r + i + it;
        MPI_Start(&q[0]);
        MPI_Wait(&q[0], MPI_STATUS_IGNORE);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < cnt[i]; k++)
                CHECK(all[dsp[i] + k] == 100 * i + it + 50 * k);
        for (int i = 0; i < 2 * n; i++)
            all[i] = -1;
        MPI_Start(&q[1]);
        MPI_Wait(&q[1], MPI_STATUS_IGNORE);
        if (r == 0)
            for (int i = 0; i < n; i++)
                for (int k = 0; k < cnt[i]; k++)
                    CHECK(all[dsp[i] + k] == 100 * i + it + 50 * k);
        if (r == 0)
            for (int i = 0; i < 2 * n; i++)
                all[i] = 1000 * it + i;
        scat[0] = scat[1] = -1;
        MPI_Start(&q[2]);
        MPI_Wait(&q[2], MPI_STATUS_IGNORE);
        for (int k = 0; k < cnt[r]; k++)
            CHECK(scat[k] == 1000 * it + dsp[r] + k);
        MPI_Start(&q[3]);
        MPI_Wait(&q[3], MPI_STATUS_IGNORE);
        for (int k = 0; k < 2; k++) /* sum over ranks s of (s + 2r + k + it) */
            CHECK(in[k] == n * (n - 1) / 2 + n * (2 * r + k + it));
    }
    for (int i = 0; i < 4; i++)
        MPI_Request_free(&q[i]);
    free(cnt);
    free(dsp);
    free(all);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    enum { BAR, BC, RED, ARED, GA, GAV, SC, SCV, AG, AGV, A2A, A2AV, A2AW, RS, RSB, SCAN, EXSCAN, ARIP, NR };
    MPI_Request rq[NR];
    int root = N - 1;
    int bc[3], red[2], rres[2], ar[2], arres[2], arip[2];
    int *ga = malloc(N * 2 * sizeof(int)), gsend[2];
    int *gav = malloc(N * N * sizeof(int)), *gcounts = malloc(N * sizeof(int)), *gdispls = malloc(N * sizeof(int));
    int *scs = malloc(N * sizeof(int)), scr, *scvs = malloc(N * N * sizeof(int)), scvr[64];
    int *ag = malloc(N * sizeof(int)), agsend, *agv = malloc(N * N * sizeof(int));
    int *a2s = malloc(N * sizeof(int)), *a2r = malloc(N * sizeof(int));
    int *a2vs = malloc(N * N * sizeof(int)), *a2vr = malloc(N * N * sizeof(int));
    int *sc_ = malloc(N * sizeof(int)), *sd = malloc(N * sizeof(int)), *rc = malloc(N * sizeof(int)), *rd = malloc(N * sizeof(int));
    int *wsd = malloc(N * sizeof(int)), *wrd = malloc(N * sizeof(int));
    MPI_Datatype *wt = malloc(N * sizeof(MPI_Datatype));
    int *a2ws = malloc(N * sizeof(int)), *a2wr = malloc(N * sizeof(int));
    int *rss = malloc(N * N * sizeof(int)), rsr[64], *rscounts = malloc(N * sizeof(int));
    int *rsbs = malloc(N * 2 * sizeof(int)), rsbr[2];
    int scn, scnr, exr, agvsend[64];
    int gtot = 0;
    for (int i = 0; i < N; i++) {
        gcounts[i] = i + 1;
        gdispls[i] = gtot;
        gtot += i + 1;
        sc_[i] = i + 1; /* alltoallv: i+1 ints to rank i */
        rc[i] = R + 1;  /* R+1 ints from each rank */
        rscounts[i] = i + 1;
        wt[i] = MPI_INT;
        wsd[i] = i * (int)sizeof(int);
        wrd[i] = i * (int)sizeof(int);
    }
    for (int i = 0, a = 0, b = 0; i < N; i++) {
        sd[i] = a;
        a += sc_[i];
        rd[i] = b;
        b += rc[i];
    }
    int ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1;
    MPI_Barrier_init(comm, MPI_INFO_NULL, &rq[BAR]);
    MPI_Bcast_init(bc, 3, MPI_INT, root, comm, MPI_INFO_NULL, &rq[BC]);
    MPI_Reduce_init(red, rres, 2, MPI_INT, MPI_SUM, root, comm, MPI_INFO_NULL, &rq[RED]);
    MPI_Allreduce_init(ar, arres, 2, MPI_INT, MPI_MAX, comm, MPI_INFO_NULL, &rq[ARED]);
    MPI_Allreduce_init(MPI_IN_PLACE, arip, 2, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &rq[ARIP]);
    MPI_Gather_init(gsend, 2, MPI_INT, ga, 2, MPI_INT, 0, comm, MPI_INFO_NULL, &rq[GA]);
    MPI_Gatherv_init(gsend, R + 1 > 2 ? 2 : R + 1, MPI_INT, gav, gcounts, gdispls, MPI_INT, 0, comm, MPI_INFO_NULL, &rq[GAV]);
    MPI_Scatter_init(scs, 1, MPI_INT, &scr, 1, MPI_INT, root, comm, MPI_INFO_NULL, &rq[SC]);
    MPI_Scatterv_init(scvs, gcounts, gdispls, MPI_INT, scvr, R + 1, MPI_INT, 0, comm, MPI_INFO_NULL, &rq[SCV]);
    MPI_Allgather_init(&agsend, 1, MPI_INT, ag, 1, MPI_INT, comm, MPI_INFO_NULL, &rq[AG]);
    MPI_Allgatherv_init(agvsend, R + 1, MPI_INT, agv, gcounts, gdispls, MPI_INT, comm, MPI_INFO_NULL, &rq[AGV]);
    MPI_Alltoall_init(a2s, 1, MPI_INT, a2r, 1, MPI_INT, comm, MPI_INFO_NULL, &rq[A2A]);
    MPI_Alltoallv_init(a2vs, sc_, sd, MPI_INT, a2vr, rc, rd, MPI_INT, comm, MPI_INFO_NULL, &rq[A2AV]);
    MPI_Alltoallw_init(a2ws, ones, wsd, wt, a2wr, ones, wrd, wt, comm, MPI_INFO_NULL, &rq[A2AW]);
    MPI_Reduce_scatter_init(rss, rsr, rscounts, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &rq[RS]);
    MPI_Reduce_scatter_block_init(rsbs, rsbr, 2, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &rq[RSB]);
    MPI_Scan_init(&scn, &scnr, 1, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &rq[SCAN]);
    MPI_Exscan_init(&scn, &exr, 1, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &rq[EXSCAN]);
    /* before any start: the requests are inactive, Wait returns at once with an empty status */
    MPI_Status st0;
    st0.MPI_SOURCE = 5;
    MPI_Wait(&rq[BC], &st0);
    CHECK(rq[BC] != MPI_REQUEST_NULL && st0.MPI_SOURCE == MPI_ANY_SOURCE && st0.MPI_TAG == MPI_ANY_TAG);

    for (int it = 0; it < NI; it++) {
        /* fill inputs for this iteration */
        for (int k = 0; k < 3; k++)
            bc[k] = R == root ? 100 * it + k : -1;
        red[0] = R + it, red[1] = 2 * R;
        rres[0] = rres[1] = -1;
        ar[0] = R * it, ar[1] = -R;
        arip[0] = R, arip[1] = it;
        gsend[0] = R * 10 + it, gsend[1] = R * 10 + it + 1;
        for (int i = 0; i < N; i++)
            scs[i] = R == root ? 1000 * it + i : -1;
        for (int i = 0; i < N * N; i++)
            scvs[i] = 7 * i + it;
        agsend = R + 50 * it;
        for (int k = 0; k <= R; k++)
            agvsend[k] = 7 * (gdispls[R] + k) + it;
        for (int j = 0; j < N; j++)
            a2s[j] = 100 * R + j + it, a2ws[j] = -(100 * R + j + it);
        for (int j = 0, k = 0; j < N; j++)
            for (int m = 0; m < sc_[j]; m++, k++)
                a2vs[k] = 1000 * R + 10 * j + m + it;
        for (int i = 0; i < N * N; i++)
            rss[i] = i + R + it;
        for (int i = 0; i < 2 * N; i++)
            rsbs[i] = i * R + it;
        scn = R + 1 + it;
        exr = -99;
        if (it % 2 == 0) {
            MPI_Startall(NR, rq);
            MPI_Waitall(NR, rq, MPI_STATUSES_IGNORE);
        } else {
            /* one at a time in the same order on every rank, completed with Test loops */
            for (int k = 0; k < NR; k++) {
                int done = 0;
                MPI_Start(&rq[k]);
                while (!done)
                    MPI_Test(&rq[k], &done, MPI_STATUS_IGNORE);
            }
        }
        for (int k = 0; k < NR; k++)
            CHECK(rq[k] != MPI_REQUEST_NULL);
        for (int k = 0; k < 3; k++)
            CHECK(bc[k] == 100 * it + k);
        if (R == root)
            CHECK(rres[0] == N * (N - 1) / 2 + N * it && rres[1] == N * (N - 1));
        else
            CHECK(rres[0] == -1);
        CHECK(arres[0] == (N - 1) * it && arres[1] == 0);
        CHECK(arip[0] == N * (N - 1) / 2 && arip[1] == N * it);
        if (R == 0)
            for (int i = 0; i < N; i++)
                CHECK(ga[2 * i] == i * 10 + it && ga[2 * i + 1] == i * 10 + it + 1);
        if (R == 0)
            for (int i = 0; i < N; i++)
                for (int k = 0; k < (i + 1 > 2 ? 2 : i + 1); k++)
                    CHECK(gav[gdispls[i] + k] == i * 10 + it + k);
        CHECK(scr == 1000 * it + R);
        for (int k = 0; k <= R; k++)
            CHECK(scvr[k] == 7 * (gdispls[R] + k) + it);
        for (int i = 0; i < N; i++)
            CHECK(ag[i] == i + 50 * it);
        for (int i = 0; i < N; i++)
            for (int k = 0; k <= i; k++)
                CHECK(agv[gdispls[i] + k] == 7 * (gdispls[i] + k) + it);
        for (int j = 0; j < N; j++)
            CHECK(a2r[j] == 100 * j + R + it && a2wr[j] == -(100 * j + R + it));
        for (int j = 0; j < N; j++)
            for (int m = 0; m < rc[j]; m++)
                CHECK(a2vr[rd[j] + m] == 1000 * j + 10 * R + m + it);
        for (int k = 0; k <= R; k++) {
            int idx = gdispls[R] + k;
            CHECK(rsr[k] == N * (idx + it) + N * (N - 1) / 2);
        }
        for (int k = 0; k < 2; k++) {
            int idx = 2 * R + k;
            CHECK(rsbr[k] == idx * N * (N - 1) / 2 + N * it);
        }
        CHECK(scnr == (R + 1) * (R + 2) / 2 + (R + 1) * it);
        if (R > 0)
            CHECK(exr == R * (R + 1) / 2 + R * it);
    }
    for (int k = 0; k < NR; k++) {
        MPI_Request_free(&rq[k]);
        CHECK(rq[k] == MPI_REQUEST_NULL);
    }
    /* errors: a bad root is reported when the collective starts; Start on an active request */
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Request b;
    CHECK(MPI_Bcast_init(bc, 1, MPI_INT, N, comm, MPI_INFO_NULL, &b) == MPI_SUCCESS);
    CHECK_RC(MPI_Start(&b), MPI_ERR_ROOT);
    MPI_Request_free(&b);
    CHECK_RC(MPI_Barrier_init(MPI_COMM_NULL, MPI_INFO_NULL, &b), MPI_ERR_COMM);
    MPI_Barrier_init(comm, MPI_INFO_NULL, &b);
    MPI_Start(&b);
    CHECK_RC(MPI_Start(&b), MPI_ERR_REQUEST);
    MPI_Wait(&b, MPI_STATUS_IGNORE);
    MPI_Request_free(&b);
    /* many restarts of one request interleaved with a blocking collective on the same communicator */
    int x = 0, y;
    MPI_Allreduce_init(&x, &y, 1, MPI_INT, MPI_SUM, comm, MPI_INFO_NULL, &b);
    for (int it = 0; it < 50; it++) {
        x = R + it;
        MPI_Start(&b);
        int z;
        MPI_Allreduce(&it, &z, 1, MPI_INT, MPI_MAX, comm);
        CHECK(z == it);
        MPI_Wait(&b, MPI_STATUS_IGNORE);
        CHECK(y == N * (N - 1) / 2 + N * it);
    }
    MPI_Request_free(&b);
    test_large_count_v(comm);
    test_large_count_v(MPI_COMM_SELF);
    MPI_Comm_free(&comm);
    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0)
        printf("PASS pcoll\n");
    MPI_Finalize();
    return 0;
}
