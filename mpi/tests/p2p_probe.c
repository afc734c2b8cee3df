/* Probe, Iprobe, Mprobe, Improbe, Mrecv, Imrecv (also with MPI_PROC_NULL), and cancelling a receive. */
#include "check.h"

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Status st;
    int c;
    int n = 80000;
    char *s = malloc(n), *r = malloc(n);

    /* Probe then receive exactly the probed size. */
    fill((unsigned char *)s, n, rank);
    MPI_Request q[3];
    MPI_Isend(s, 1000, MPI_BYTE, right, 1, MPI_COMM_WORLD, &q[0]);
    MPI_Isend(s, n, MPI_BYTE, right, 2, MPI_COMM_WORLD, &q[1]);
    MPI_Probe(left, 2, MPI_COMM_WORLD, &st); /* skips the tag-1 message */
    MPI_Get_count(&st, MPI_BYTE, &c);
    CHECK(c == n && st.MPI_SOURCE == left && st.MPI_TAG == 2);
    int flag = 0;
    while (!flag)
        MPI_Iprobe(MPI_ANY_SOURCE, 1, MPI_COMM_WORLD, &flag, &st);
    MPI_Get_count(&st, MPI_BYTE, &c);
    CHECK(c == 1000 && st.MPI_TAG == 1);
    /* Matched probe removes the message: a later Iprobe no longer sees it. */
    MPI_Message m;
    MPI_Mprobe(left, 2, MPI_COMM_WORLD, &m, &st);
    CHECK(m != MPI_MESSAGE_NULL && st.MPI_TAG == 2);
    MPI_Iprobe(left, 2, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    CHECK(!flag);
    MPI_Mrecv(r, n, MPI_BYTE, &m, &st);
    CHECK(m == MPI_MESSAGE_NULL && st.MPI_SOURCE == left && st.MPI_TAG == 2);
    CHECK(same((unsigned char *)r, n, left));
    flag = 0;
    while (!flag)
        MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &m, &st);
    CHECK(st.MPI_TAG == 1);
    MPI_Request rq;
    MPI_Imrecv(r, 1000, MPI_BYTE, &m, &rq);
    MPI_Wait(&rq, &st);
    MPI_Get_count(&st, MPI_BYTE, &c);
    CHECK(c == 1000 && st.MPI_SOURCE == left && same((unsigned char *)r, 1000, left));
    MPI_Waitall(2, q, MPI_STATUSES_IGNORE);

    /* MPI_PROC_NULL with probes. */
    MPI_Probe(MPI_PROC_NULL, 0, MPI_COMM_WORLD, &st);
    CHECK(st.MPI_SOURCE == MPI_PROC_NULL && st.MPI_TAG == MPI_ANY_TAG);
    MPI_Mprobe(MPI_PROC_NULL, 0, MPI_COMM_WORLD, &m, &st);
    CHECK(m == MPI_MESSAGE_NO_PROC);
    MPI_Mrecv(r, 10, MPI_BYTE, &m, &st);
    CHECK(m == MPI_MESSAGE_NULL && st.MPI_SOURCE == MPI_PROC_NULL);

    /* Cancel a receive that cannot match. */
    MPI_Irecv(r, 10, MPI_BYTE, MPI_ANY_SOURCE, 999, MPI_COMM_WORLD, &rq);
    MPI_Cancel(&rq);
    MPI_Wait(&rq, &st);
    MPI_Test_cancelled(&st, &flag);
    CHECK(flag && rq == MPI_REQUEST_NULL);
    /* A completed receive is not cancelled. */
    int v = rank, w = -1;
    MPI_Irecv(&w, 1, MPI_INT, left, 5, MPI_COMM_WORLD, &rq);
    MPI_Send(&v, 1, MPI_INT, right, 5, MPI_COMM_WORLD);
    MPI_Wait(&rq, &st);
    MPI_Test_cancelled(&st, &flag);
    CHECK(!flag && w == left);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("p2p_probe: PASS (%d ranks)\n", size);
    MPI_Finalize();
    return 0;
}
