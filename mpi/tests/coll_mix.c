/*
 * coll_mix.c -- a long random sequence of small collectives (the same on every rank), with barriers in
 * between or not, on the world and on a split communicator, every result checked exactly.
 *
 * It exercises how ranks wait for each other in the shared-memory collectives when they outnumber the
 * cores: pinned CPU-mates, spinning for ranks on other CPUs, and the barrier whose leader is learnt from
 * the collective that follows it (broadcast and scatter roots change from call to call here). A wrong
 * leader or a wait that never ends shows as a hang (the test harness times out), a wrong result as a
 * CHECK failure.
 */
#include "check.h"

static unsigned long long lcg(unsigned long long *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static void mix(MPI_Comm comm, int iters, unsigned long long seed)
{
    int me, n;
    MPI_Comm_rank(comm, &me);
    MPI_Comm_size(comm, &n);
    int a[64], b[64 * 16];
    for (int it = 0; it < iters; it++) {
        int op = (int)(lcg(&seed) % 8);
        int root = (int)(lcg(&seed) % (unsigned)n);
        int cnt = 1 + (int)(lcg(&seed) % 16);
        int bar = (int)(lcg(&seed) % 3);
        switch (op) {
        case 0:
            MPI_Barrier(comm);
            break;
        case 1: /* bcast */
            for (int i = 0; i < cnt; i++) a[i] = me == root ? it * 100 + i : -1;
            MPI_Bcast(a, cnt, MPI_INT, root, comm);
            for (int i = 0; i < cnt; i++) CHECK(a[i] == it * 100 + i);
            break;
        case 2: /* allreduce */
            for (int i = 0; i < cnt; i++) a[i] = me + i + it;
            MPI_Allreduce(MPI_IN_PLACE, a, cnt, MPI_INT, MPI_SUM, comm);
            for (int i = 0; i < cnt; i++) CHECK(a[i] == n * (n - 1) / 2 + n * (i + it));
            break;
        case 3: /* reduce */
            for (int i = 0; i < cnt; i++) a[i] = me * i + it;
            MPI_Reduce(me == root ? MPI_IN_PLACE : a, me == root ? a : NULL, cnt, MPI_INT, MPI_MAX, root, comm);
            if (me == root)
                for (int i = 0; i < cnt; i++) CHECK(a[i] == (n - 1) * i + it);
            break;
        case 4: /* alltoall */
            for (int p = 0; p < n; p++)
                for (int i = 0; i < cnt; i++) b[p * cnt + i] = me * 1000 + p * 10 + i + it;
            MPI_Alltoall(MPI_IN_PLACE, cnt, MPI_INT, b, cnt, MPI_INT, comm);
            for (int p = 0; p < n; p++)
                for (int i = 0; i < cnt; i++) CHECK(b[p * cnt + i] == p * 1000 + me * 10 + i + it);
            break;
        case 5: /* scatter */
            if (me == root)
                for (int p = 0; p < n; p++)
                    for (int i = 0; i < cnt; i++) b[p * cnt + i] = p * 100 + i + it;
            MPI_Scatter(b, cnt, MPI_INT, a, cnt, MPI_INT, root, comm);
            for (int i = 0; i < cnt; i++) CHECK(a[i] == me * 100 + i + it);
            break;
        case 6: /* gather */
            for (int i = 0; i < cnt; i++) a[i] = me * 100 + i + it;
            MPI_Gather(a, cnt, MPI_INT, b, cnt, MPI_INT, root, comm);
            if (me == root)
                for (int p = 0; p < n; p++)
                    for (int i = 0; i < cnt; i++) CHECK(b[p * cnt + i] == p * 100 + i + it);
            break;
        case 7: /* allgather */
            for (int i = 0; i < cnt; i++) a[i] = me * 100 + i + it;
            MPI_Allgather(a, cnt, MPI_INT, b, cnt, MPI_INT, comm);
            for (int p = 0; p < n; p++)
                for (int i = 0; i < cnt; i++) CHECK(b[p * cnt + i] == p * 100 + i + it);
            break;
        }
        if (bar == 0) MPI_Barrier(comm);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    check_rank = me;
    /* The OSU pattern: a collective rooted at 0, then a barrier, many times (the learnt leader). */
    for (int it = 0; it < 3000; it++) {
        int v = me == 0 ? it : -1;
        MPI_Bcast(&v, 1, MPI_INT, 0, MPI_COMM_WORLD);
        CHECK(v == it);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    mix(MPI_COMM_WORLD, 6000, 12345);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, me % 2, n - me, &half);
    mix(half, 3000, 777);
    MPI_Comm_free(&half);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) printf("PASS coll_mix (%d ranks)\n", n);
    MPI_Finalize();
    return 0;
}
