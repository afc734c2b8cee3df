/* Intercommunicators: create (even/odd world ranks), test_inter, remote size/group, point-to-point to
 * the remote group, every supported collective with MPI_ROOT/MPI_PROC_NULL semantics (blocking,
 * nonblocking, persistent), dup, merge, and error classes. */
#include "check.h"

static int R, N;

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    int flag = -1;
    MPI_Comm_test_inter(MPI_COMM_WORLD, &flag);
    CHECK(flag == 0);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int rs;
    CHECK_RC(MPI_Comm_remote_size(MPI_COMM_WORLD, &rs), MPI_ERR_COMM);
    if (N < 2) {
        if (R == 0)
            printf("PASS intercomm (1 rank: no intercommunicator possible)\n");
        MPI_Finalize();
        return 0;
    }
    const int par = R % 2;
    const int neven = (N + 1) / 2, nodd = N / 2;
    const int lsize = par ? nodd : neven, rsize = par ? neven : nodd;
    /* world rank of rank i of the even (p = 0) or odd (p = 1) group */
#define W(p, i) (2 * (i) + (p))
    MPI_Comm local, ic;
    MPI_Comm_split(MPI_COMM_WORLD, par, R, &local);
    int lr;
    MPI_Comm_rank(local, &lr);
    CHECK(lr == R / 2);
    MPI_Comm_set_errhandler(local, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Intercomm_create(local, lsize, MPI_COMM_WORLD, 1 - par, 7, &ic), MPI_ERR_RANK);
    CHECK(MPI_Intercomm_create(local, 0, MPI_COMM_WORLD, 1 - par, 7, &ic) == MPI_SUCCESS);
    MPI_Comm_test_inter(ic, &flag);
    CHECK(flag == 1);
    int sz, rk;
    MPI_Comm_size(ic, &sz);
    MPI_Comm_rank(ic, &rk);
    MPI_Comm_remote_size(ic, &rs);
    CHECK(sz == lsize && rk == lr && rs == rsize);
    MPI_Group rg, lg, wg;
    MPI_Comm_remote_group(ic, &rg);
    MPI_Comm_group(ic, &lg);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    int gs;
    MPI_Group_size(rg, &gs);
    CHECK(gs == rsize);
    for (int i = 0; i < rsize; i++) {
        int w;
        MPI_Group_translate_ranks(rg, 1, &i, wg, &w);
        CHECK(w == W(1 - par, i));
    }
    for (int i = 0; i < lsize; i++) {
        int w;
        MPI_Group_translate_ranks(lg, 1, &i, wg, &w);
        CHECK(w == W(par, i));
    }
    MPI_Group_free(&rg);
    MPI_Group_free(&lg);
    MPI_Comm_set_errhandler(ic, MPI_ERRORS_RETURN);

    /* point-to-point: ranks name the remote group */
    if (lr < rsize) {
        int out = 1000 + R, in = -1;
        MPI_Status stt;
        MPI_Sendrecv(&out, 1, MPI_INT, lr, 3, &in, 1, MPI_INT, lr, 3, ic, &stt);
        CHECK(in == 1000 + W(1 - par, lr) && stt.MPI_SOURCE == lr && stt.MPI_TAG == 3);
    }
    /* every process of the odd group sends to every even process; evens receive with ANY_SOURCE */
    if (par == 1) {
        for (int j = 0; j < rsize; j++)
            MPI_Send(&R, 1, MPI_INT, j, 5, ic);
    } else {
        int got[64] = {0};
        for (int k = 0; k < rsize; k++) {
            int v;
            MPI_Status stt;
            MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 5, ic, &stt);
            CHECK(v == W(1, stt.MPI_SOURCE) && !got[stt.MPI_SOURCE]);
            got[stt.MPI_SOURCE] = 1;
        }
    }
    int dummy;
    CHECK_RC(MPI_Send(&dummy, 1, MPI_INT, rsize, 0, ic), MPI_ERR_RANK);
    MPI_Request pr;
    MPI_Isend(&dummy, 1, MPI_INT, MPI_PROC_NULL, 0, ic, &pr);
    MPI_Wait(&pr, MPI_STATUS_IGNORE);

    MPI_Barrier(ic);

    /* Bcast: even group's rank 0 is the root, then odd group's last rank */
    for (int round = 0; round < 2; round++) {
        int rootpar = round, rootlr = round ? nodd - 1 : 0;
        int buf[3] = {-1, -1, -1};
        int root;
        if (par == rootpar) {
            root = lr == rootlr ? MPI_ROOT : MPI_PROC_NULL;
            if (lr == rootlr)
                buf[0] = 11, buf[1] = 22 + round, buf[2] = 33;
        } else {
            root = rootlr;
        }
        MPI_Bcast(buf, 3, MPI_INT, root, ic);
        if (par == rootpar && lr != rootlr)
            CHECK(buf[0] == -1); /* not involved */
        else
            CHECK(buf[0] == 11 && buf[1] == 22 + round && buf[2] == 33);
    }

    /* Allreduce: each group gets the reduction of the other group's contributions */
    long v[2] = {R, 2 * R + 1}, s[2];
    MPI_Allreduce(v, s, 2, MPI_LONG, MPI_SUM, ic);
    long want0 = 0, want1 = 0;
    for (int i = 0; i < rsize; i++)
        want0 += W(1 - par, i), want1 += 2 * W(1 - par, i) + 1;
    CHECK(s[0] == want0 && s[1] == want1);
    int mx;
    MPI_Allreduce(&R, &mx, 1, MPI_INT, MPI_MAX, ic);
    CHECK(mx == W(1 - par, rsize - 1));

    /* Reduce_scatter: the other group's vectors (12 elements in both groups) reduced, then scattered
     * over this group by this group's counts */
    {
        long rv[12], rr[12];
        int cnts[64], off = 0;
        for (int i = 0; i < lsize; i++) cnts[i] = 12 / lsize + (i < 12 % lsize);
        for (int i = 0; i < lr; i++) off += cnts[i];
        for (int j = 0; j < 12; j++) rv[j] = R * 100 + j;
        for (int j = 0; j < 12; j++) rr[j] = -1;
        MPI_Reduce_scatter(rv, rr, cnts, MPI_LONG, MPI_SUM, ic);
        for (int j = 0; j < cnts[lr]; j++) {
            long w = 0;
            for (int i = 0; i < rsize; i++) w += W(1 - par, i) * 100 + off + j;
            CHECK(rr[j] == w);
        }
        CHECK(cnts[lr] == 12 || rr[cnts[lr]] == -1);
        /* Reduce_scatter_block: block = the remote group's size, so both groups reduce lsize*rsize elements */
        long bv[64 * 64], br[64];
        int blk = rsize;
        for (int j = 0; j < lsize * blk; j++) bv[j] = R + 1000 * j;
        MPI_Reduce_scatter_block(bv, br, blk, MPI_LONG, MPI_MAX, ic);
        for (int j = 0; j < blk; j++) CHECK(br[j] == W(1 - par, rsize - 1) + 1000 * (lr * blk + j));
    }

    /* Allgather: the remote group's blocks in remote rank order */
    int ag[2 * 64];
    int mine[2] = {R * 10, R * 10 + 1};
    MPI_Allgather(mine, 2, MPI_INT, ag, 2, MPI_INT, ic);
    for (int i = 0; i < rsize; i++)
        CHECK(ag[2 * i] == W(1 - par, i) * 10 && ag[2 * i + 1] == W(1 - par, i) * 10 + 1);

    /* Gather to the odd group's rank 0 from the even group */
    int gb[64];
    for (int i = 0; i < 64; i++)
        gb[i] = -1;
    int v1 = R * 3;
    if (par == 1) {
        MPI_Gather(NULL, 0, MPI_INT, gb, 1, MPI_INT, lr == 0 ? MPI_ROOT : MPI_PROC_NULL, ic);
        if (lr == 0)
            for (int i = 0; i < neven; i++)
                CHECK(gb[i] == W(0, i) * 3);
        else
            CHECK(gb[0] == -1);
    } else {
        MPI_Gather(&v1, 1, MPI_INT, NULL, 0, MPI_INT, 0, ic);
    }
    /* Scatter from the even group's rank 0 to the odd group */
    int sb[64], sr = -1;
    for (int i = 0; i < 64; i++)
        sb[i] = 500 + i;
    if (par == 0) {
        MPI_Scatter(sb, 1, MPI_INT, NULL, 0, MPI_INT, lr == 0 ? MPI_ROOT : MPI_PROC_NULL, ic);
    } else {
        MPI_Scatter(NULL, 0, MPI_INT, &sr, 1, MPI_INT, 0, ic);
        CHECK(sr == 500 + lr);
    }
    /* Reduce to the even group's last rank: sum and a non-commutative check through MPI_MAX/MIN */
    long red[2] = {-1, -1}, contrib[2] = {R, -R};
    if (par == 0) {
        MPI_Reduce(contrib, red, 2, MPI_LONG, MPI_SUM, lr == neven - 1 ? MPI_ROOT : MPI_PROC_NULL, ic); /* sendbuf ignored */
        if (lr == neven - 1) {
            long w = 0;
            for (int i = 0; i < nodd; i++)
                w += W(1, i);
            CHECK(red[0] == w && red[1] == -w);
        } else {
            CHECK(red[0] == -1);
        }
    } else {
        MPI_Reduce(contrib, red, 2, MPI_LONG, MPI_SUM, neven - 1, ic); /* recvbuf ignored */
        CHECK(red[0] == -1);
    }
    /* Alltoall: block j goes to remote rank j */
    int a2s[64], a2r[64];
    for (int j = 0; j < rsize; j++)
        a2s[j] = 1000 * R + j;
    MPI_Alltoall(a2s, 1, MPI_INT, a2r, 1, MPI_INT, ic);
    for (int j = 0; j < rsize; j++)
        CHECK(a2r[j] == 1000 * W(1 - par, j) + lr);
    /* Allgatherv with per-remote-rank counts (rank i of the remote group contributes i+1 ints) */
    int cnts[64], dsp[64], tot = 0, agv[512], myv[64];
    for (int i = 0; i < rsize; i++)
        cnts[i] = i + 1, dsp[i] = tot, tot += i + 1;
    for (int k = 0; k <= lr; k++)
        myv[k] = R * 100 + k;
    MPI_Allgatherv(myv, lr + 1, MPI_INT, agv, cnts, dsp, MPI_INT, ic);
    for (int i = 0; i < rsize; i++)
        for (int k = 0; k <= i; k++)
            CHECK(agv[dsp[i] + k] == W(1 - par, i) * 100 + k);

    /* nonblocking and persistent forms */
    MPI_Request rq;
    long ns[2];
    MPI_Iallreduce(v, ns, 2, MPI_LONG, MPI_SUM, ic, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    CHECK(ns[0] == want0 && ns[1] == want1);
    long pin = 0, pout = -1;
    MPI_Allreduce_init(&pin, &pout, 1, MPI_LONG, MPI_SUM, ic, MPI_INFO_NULL, &rq);
    for (int it = 0; it < 5; it++) {
        pin = R + it;
        MPI_Start(&rq);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
        long w = 0;
        for (int i = 0; i < rsize; i++)
            w += W(1 - par, i) + it;
        CHECK(pout == w);
    }
    MPI_Request_free(&rq);
    MPI_Ibarrier(ic, &rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);

    /* collectives an intercommunicator does not support, and bad roots */
    CHECK_RC(MPI_Scan(&R, &mx, 1, MPI_INT, MPI_SUM, ic), MPI_ERR_COMM);
    CHECK_RC(MPI_Exscan(&R, &mx, 1, MPI_INT, MPI_SUM, ic), MPI_ERR_COMM);
    CHECK_RC(MPI_Bcast(&mx, 1, MPI_INT, rsize, ic), MPI_ERR_ROOT);

    /* split_type(SHARED) on the intercommunicator: the local and remote processes of my shared-memory
     * region (as MPI_COMM_WORLD's split_type finds it), or MPI_COMM_NULL if either side has none; the
     * last process of the odd group opts out (MPI_UNDEFINED). */
    {
        MPI_Comm wsh, sp;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &wsh);
        int ns, near[64] = {0};
        MPI_Comm_size(wsh, &ns);
        int *who = malloc(ns * sizeof(int));
        MPI_Allgather(&R, 1, MPI_INT, who, 1, MPI_INT, wsh);
        /* opting out: the last odd world rank */
        const int out = (N % 2 == 0) ? N - 1 : N - 2;
        for (int i = 0; i < ns; i++)
            if (who[i] < 64 && who[i] != out)
                near[who[i]] = 1;
        int el = 0, er = 0;
        for (int i = 0; i < lsize; i++)
            el += near[W(par, i)];
        for (int i = 0; i < rsize; i++)
            er += near[W(1 - par, i)];
        CHECK(MPI_Comm_split_type(ic, R == out ? MPI_UNDEFINED : MPI_COMM_TYPE_SHARED, R, MPI_INFO_NULL, &sp) == MPI_SUCCESS);
        if (R == out || el == 0 || er == 0) {
            CHECK(sp == MPI_COMM_NULL);
        } else {
            int f = 0, a, b;
            CHECK(sp != MPI_COMM_NULL);
            MPI_Comm_test_inter(sp, &f);
            MPI_Comm_size(sp, &a);
            MPI_Comm_remote_size(sp, &b);
            CHECK(f == 1 && a == el && b == er);
            /* the order follows the key (world rank) and the processes talk */
            int x = R, y = -1, rr;
            MPI_Comm_rank(sp, &rr);
            MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MAX, sp);
            int m = -1;
            for (int i = 0; i < rsize; i++)
                if (near[W(1 - par, i)] && W(1 - par, i) > m)
                    m = W(1 - par, i);
            CHECK(y == m);
            MPI_Comm_free(&sp);
        }
        free(who);
        MPI_Comm_free(&wsh);
    }

    /* split: colour by local-rank parity, reversed order within each group; a colour with no member
     * in the remote group gives MPI_COMM_NULL */
    {
        MPI_Comm sp;
        const int color = lr % 2;
        const int lcount = (lsize - color + 1) / 2, rcount = (rsize - color + 1) / 2;
        CHECK(MPI_Comm_split(ic, color, -lr, &sp) == MPI_SUCCESS);
        if (rcount == 0) {
            CHECK(sp == MPI_COMM_NULL);
        } else {
            int a;
            MPI_Comm_test_inter(sp, &a);
            CHECK(a == 1);
            MPI_Comm_size(sp, &a);
            CHECK(a == lcount);
            MPI_Comm_remote_size(sp, &a);
            CHECK(a == rcount);
            MPI_Comm_rank(sp, &a);
            CHECK(a == lcount - 1 - lr / 2);
            long mine = W(par, lr), sum = 0, want = 0;
            MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, sp);
            for (int i = color; i < rsize; i += 2)
                want += W(1 - par, i);
            CHECK(sum == want);
            MPI_Comm_free(&sp);
        }
        /* undefined colour everywhere: MPI_COMM_NULL */
        CHECK(MPI_Comm_split(ic, MPI_UNDEFINED, 0, &sp) == MPI_SUCCESS);
        CHECK(sp == MPI_COMM_NULL);
        /* create from a subgroup of each side's local group: local rank 0 of each side */
        MPI_Group lg, g0;
        MPI_Comm_group(ic, &lg);
        int zero = 0;
        MPI_Group_incl(lg, 1, &zero, &g0);
        CHECK(MPI_Comm_create(ic, g0, &sp) == MPI_SUCCESS);
        if (lr == 0) {
            int a, b;
            MPI_Comm_size(sp, &a);
            MPI_Comm_remote_size(sp, &b);
            CHECK(a == 1 && b == 1);
            long mine = R, got = -1;
            MPI_Allreduce(&mine, &got, 1, MPI_LONG, MPI_SUM, sp);
            CHECK(got == W(1 - par, 0));
            MPI_Comm_free(&sp);
        } else {
            CHECK(sp == MPI_COMM_NULL);
        }
        MPI_Group_free(&g0);
        MPI_Group_free(&lg);
    }
    int t;
    MPI_Topo_test(ic, &t);
    CHECK(t == MPI_UNDEFINED);

    /* dup: still an intercommunicator, with its own contexts */
    MPI_Comm icd;
    MPI_Comm_dup(ic, &icd);
    MPI_Comm_test_inter(icd, &flag);
    CHECK(flag == 1);
    MPI_Comm_remote_size(icd, &rs);
    CHECK(rs == rsize);
    MPI_Comm_set_name(icd, "icd");
    char name[MPI_MAX_OBJECT_NAME];
    int nl;
    MPI_Comm_get_name(icd, name, &nl);
    CHECK(nl == 3 && strcmp(name, "icd") == 0);
    if (lr < rsize) {
        /* the same tag on ic and icd: contexts keep them apart */
        int a = R, b = R + 1, x = -1, y = -1;
        MPI_Request q[4];
        MPI_Irecv(&x, 1, MPI_INT, lr, 9, icd, &q[0]);
        MPI_Irecv(&y, 1, MPI_INT, lr, 9, ic, &q[1]);
        MPI_Isend(&a, 1, MPI_INT, lr, 9, ic, &q[2]);
        MPI_Isend(&b, 1, MPI_INT, lr, 9, icd, &q[3]);
        MPI_Status qs[4];
        MPI_Waitall(4, q, qs);
        CHECK(y == W(1 - par, lr) && x == W(1 - par, lr) + 1);
    }
    MPI_Allreduce(&R, &mx, 1, MPI_INT, MPI_MAX, icd);
    CHECK(mx == W(1 - par, rsize - 1));
    MPI_Comm_free(&icd);
    CHECK(icd == MPI_COMM_NULL);

    /* merge: high = odd group, so even ranks come first */
    MPI_Comm m;
    MPI_Intercomm_merge(ic, par, &m);
    MPI_Comm_test_inter(m, &flag);
    CHECK(flag == 0);
    MPI_Comm_size(m, &sz);
    MPI_Comm_rank(m, &rk);
    CHECK(sz == N && rk == (par ? neven + lr : lr));
    int sum;
    MPI_Allreduce(&R, &sum, 1, MPI_INT, MPI_SUM, m);
    CHECK(sum == N * (N - 1) / 2);
    int first;
    int mr = rk;
    MPI_Bcast(&mr, 1, MPI_INT, neven, m); /* merged rank neven = odd group's rank 0 = world rank 1 */
    CHECK(mr == neven);
    first = R;
    MPI_Bcast(&first, 1, MPI_INT, neven, m);
    CHECK(first == 1);
    MPI_Comm_free(&m);
    /* reversed: odd group first */
    MPI_Intercomm_merge(ic, 1 - par, &m);
    MPI_Comm_rank(m, &rk);
    CHECK(rk == (par ? lr : nodd + lr));
    MPI_Barrier(m);
    MPI_Comm_free(&m);
    /* same high on both sides: a consistent order all the same */
    MPI_Intercomm_merge(ic, 0, &m);
    MPI_Comm_rank(m, &rk);
    int all[64];
    MPI_Allgather(&R, 1, MPI_INT, all, 1, MPI_INT, m);
    int seen = 0;
    for (int i = 0; i < N; i++)
        seen |= 1 << all[i];
    CHECK(seen == (1 << N) - 1 && all[rk] == R);
    MPI_Comm_free(&m);

    MPI_Comm_free(&ic);
    MPI_Comm_free(&local);
    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0)
        printf("PASS intercomm\n");
    MPI_Finalize();
    return 0;
}
