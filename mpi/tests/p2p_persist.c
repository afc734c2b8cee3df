/* Persistent requests (Send_init, Ssend_init, Recv_init, Start, Startall), Request_get_status,
 * Request_free, and the Wait/Test families (any/some/all) with NULL and inactive requests. */
#include "check.h"

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    int sbuf[2] = {0, 0}, rbuf[2] = {0, 0}, big_n = 50000;
    int *bs = malloc(4 * big_n), *br = malloc(4 * big_n);
    MPI_Request q[4];
    MPI_Status st[4];

    MPI_Send_init(sbuf, 2, MPI_INT, right, 1, MPI_COMM_WORLD, &q[0]);
    MPI_Recv_init(rbuf, 2, MPI_INT, left, 1, MPI_COMM_WORLD, &q[1]);
    MPI_Ssend_init(bs, big_n, MPI_INT, right, 2, MPI_COMM_WORLD, &q[2]);
    MPI_Recv_init(br, big_n, MPI_INT, MPI_ANY_SOURCE, 2, MPI_COMM_WORLD, &q[3]);
    /* inactive persistent requests complete at once with an empty status */
    int flag = 0;
    MPI_Test(&q[1], &flag, &st[0]);
    CHECK(flag && q[1] != MPI_REQUEST_NULL && st[0].MPI_SOURCE == MPI_ANY_SOURCE && st[0].MPI_TAG == MPI_ANY_TAG);
    for (int it = 0; it < 50; it++) {
        sbuf[0] = rank * 1000 + it;
        sbuf[1] = it;
        for (int i = 0; i < big_n; i++)
            bs[i] = rank + it + i;
        MPI_Start(&q[1]);
        MPI_Start(&q[0]);
        MPI_Startall(2, &q[2]);
        MPI_Waitall(4, q, st);
        CHECK(q[0] != MPI_REQUEST_NULL && q[3] != MPI_REQUEST_NULL); /* persistent: not freed */
        CHECK(rbuf[0] == left * 1000 + it && rbuf[1] == it);
        CHECK(st[1].MPI_SOURCE == left && st[1].MPI_TAG == 1);
        CHECK(st[3].MPI_SOURCE == left && st[3].MPI_TAG == 2);
        for (int i = 0; i < big_n; i += 997)
            CHECK(br[i] == left + it + i);
    }
    /* Request_get_status does not free; then Wait does. */
    MPI_Start(&q[1]);
    MPI_Start(&q[0]);
    flag = 0;
    while (!flag)
        MPI_Request_get_status(q[1], &flag, &st[0]);
    CHECK(st[0].MPI_SOURCE == left && st[0].MPI_TAG == 1);
    MPI_Request_get_status(q[1], &flag, &st[0]);
    CHECK(flag);
    MPI_Wait(&q[1], &st[1]);
    CHECK(st[1].MPI_SOURCE == left);
    MPI_Wait(&q[0], MPI_STATUS_IGNORE);
    for (int i = 0; i < 4; i++) {
        MPI_Request_free(&q[i]);
        CHECK(q[i] == MPI_REQUEST_NULL);
    }

    /* Waitany / Testany / Waitsome / Testsome over a mix of NULL and real requests. */
    int vals[3] = {rank, rank + 10, rank + 20}, got[3] = {-1, -1, -1};
    MPI_Request r[5];
    r[0] = MPI_REQUEST_NULL;
    MPI_Irecv(&got[0], 1, MPI_INT, left, 30, MPI_COMM_WORLD, &r[1]);
    MPI_Irecv(&got[1], 1, MPI_INT, left, 31, MPI_COMM_WORLD, &r[2]);
    MPI_Irecv(&got[2], 1, MPI_INT, left, 32, MPI_COMM_WORLD, &r[3]);
    r[4] = MPI_REQUEST_NULL;
    MPI_Request sr[3];
    for (int i = 0; i < 3; i++)
        MPI_Isend(&vals[i], 1, MPI_INT, right, 30 + i, MPI_COMM_WORLD, &sr[i]);
    int idx = -1, done = 0;
    MPI_Waitany(5, r, &idx, &st[0]);
    CHECK(idx >= 1 && idx <= 3 && r[idx] == MPI_REQUEST_NULL && st[0].MPI_TAG == 29 + idx);
    done = 1;
    while (done < 3) {
        int outc = 0, ind[5];
        MPI_Status sts[5];
        MPI_Testsome(5, r, &outc, ind, sts);
        CHECK(outc != MPI_UNDEFINED);
        for (int k = 0; k < outc; k++) {
            CHECK(r[ind[k]] == MPI_REQUEST_NULL && sts[k].MPI_TAG == 29 + ind[k] && sts[k].MPI_SOURCE == left);
            done++;
        }
    }
    CHECK(got[0] == left && got[1] == left + 10 && got[2] == left + 20);
    /* all NULL now */
    MPI_Waitany(5, r, &idx, &st[0]);
    CHECK(idx == MPI_UNDEFINED);
    int outc;
    MPI_Waitsome(5, r, &outc, &idx, MPI_STATUSES_IGNORE);
    CHECK(outc == MPI_UNDEFINED);
    flag = 0;
    MPI_Testany(5, r, &idx, &flag, MPI_STATUS_IGNORE);
    CHECK(flag && idx == MPI_UNDEFINED);
    flag = 0;
    while (!flag)
        MPI_Testall(3, sr, &flag, MPI_STATUSES_IGNORE);
    CHECK(sr[0] == MPI_REQUEST_NULL && sr[2] == MPI_REQUEST_NULL);
    /* Waitsome blocking with one receive */
    MPI_Irecv(&got[0], 1, MPI_INT, left, 40, MPI_COMM_WORLD, &r[2]);
    MPI_Send(&vals[0], 1, MPI_INT, right, 40, MPI_COMM_WORLD);
    int ind[5];
    MPI_Waitsome(5, r, &outc, ind, st);
    CHECK(outc == 1 && ind[0] == 2 && got[0] == left);
    /* Request_free on an active send: it still completes and delivers. */
    MPI_Request fr;
    int fv = 77 + rank, fg = 0;
    MPI_Isend(&fv, 1, MPI_INT, right, 41, MPI_COMM_WORLD, &fr);
    MPI_Request_free(&fr);
    CHECK(fr == MPI_REQUEST_NULL);
    MPI_Recv(&fg, 1, MPI_INT, left, 41, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    CHECK(fg == 77 + left);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("p2p_persist: PASS (%d ranks)\n", size);
    MPI_Finalize();
    return 0;
}
