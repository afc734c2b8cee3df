/* Payloads and status fields at every protocol size, blocking and nonblocking, Sendrecv(_replace),
 * MPI_PROC_NULL, wildcards, self messages. Any number of ranks (1..4). */
#include "check.h"

static const int sizes[] = {0, 1, 8, 100, 4096, 65536, 65537, 300000, 4 << 20};
#define NSIZES ((int)(sizeof(sizes) / sizeof(sizes[0])))

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    unsigned char *s = malloc(4 << 20), *r = malloc((4 << 20) + 64);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    MPI_Status st;
    int count;

    /* Ring with blocking calls (even ranks send first) and Get_count on several datatypes. */
    for (int k = 0; k < NSIZES; k++) {
        int n = sizes[k];
        fill(s, n, rank + k);
        memset(r, 0xee, n + 64);
        MPI_Request rq;
        MPI_Irecv(r, n + 64, MPI_BYTE, left, 10 + k, MPI_COMM_WORLD, &rq);
        MPI_Send(s, n, MPI_BYTE, right, 10 + k, MPI_COMM_WORLD);
        MPI_Wait(&rq, &st);
        CHECK(st.MPI_SOURCE == left && st.MPI_TAG == 10 + k);
        MPI_Get_count(&st, MPI_BYTE, &count);
        CHECK(count == n);
        CHECK(same(r, n, left + k));
        CHECK(r[n] == 0xee);
        MPI_Get_count(&st, MPI_INT, &count);
        CHECK(count == (n % 4 ? MPI_UNDEFINED : n / 4));
        MPI_Get_elements(&st, MPI_BYTE, &count);
        CHECK(count == n);
    }

    /* Typed messages: doubles, blocking Recv with ANY_SOURCE / ANY_TAG. */
    double d[1000], e[1000];
    for (int i = 0; i < 1000; i++)
        d[i] = rank * 1000.0 + i;
    if (rank % 2 == 0) {
        MPI_Send(d, 1000, MPI_DOUBLE, right, 5, MPI_COMM_WORLD);
        MPI_Recv(e, 1000, MPI_DOUBLE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
    } else {
        MPI_Recv(e, 1000, MPI_DOUBLE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        MPI_Send(d, 1000, MPI_DOUBLE, right, 5, MPI_COMM_WORLD);
    }
    CHECK(st.MPI_SOURCE == left && st.MPI_TAG == 5);
    MPI_Get_count(&st, MPI_DOUBLE, &count);
    CHECK(count == 1000);
    for (int i = 0; i < 1000; i++)
        CHECK(e[i] == left * 1000.0 + i);

    /* Sendrecv and Sendrecv_replace around the ring. */
    int a = rank, b = -1;
    MPI_Sendrecv(&a, 1, MPI_INT, right, 7, &b, 1, MPI_INT, left, 7, MPI_COMM_WORLD, &st);
    CHECK(b == left && st.MPI_SOURCE == left && st.MPI_TAG == 7);
    int v[3] = {rank, rank * 2, rank * 3};
    MPI_Sendrecv_replace(v, 3, MPI_INT, right, 8, left, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
    CHECK(v[0] == left && v[1] == left * 2 && v[2] == left * 3 && st.MPI_TAG == 8);

    /* MPI_PROC_NULL: sends vanish, receives complete at once with the defined status. */
    MPI_Send(s, 10, MPI_BYTE, MPI_PROC_NULL, 1, MPI_COMM_WORLD);
    st.MPI_SOURCE = 1234;
    MPI_Recv(r, 10, MPI_BYTE, MPI_PROC_NULL, 1, MPI_COMM_WORLD, &st);
    CHECK(st.MPI_SOURCE == MPI_PROC_NULL && st.MPI_TAG == MPI_ANY_TAG);
    MPI_Get_count(&st, MPI_BYTE, &count);
    CHECK(count == 0);
    MPI_Request pr[2];
    MPI_Isend(s, 10, MPI_BYTE, MPI_PROC_NULL, 1, MPI_COMM_WORLD, &pr[0]);
    MPI_Irecv(r, 10, MPI_BYTE, MPI_PROC_NULL, 1, MPI_COMM_WORLD, &pr[1]);
    MPI_Status sts[2];
    MPI_Waitall(2, pr, sts);
    CHECK(pr[0] == MPI_REQUEST_NULL && pr[1] == MPI_REQUEST_NULL);
    CHECK(sts[1].MPI_SOURCE == MPI_PROC_NULL);

    /* MPI_REQUEST_NULL gives the empty status, MPI_ERROR = MPI_SUCCESS included, whatever the status held
     * before (MPICH's rqstatus reads an uninitialised one). */
    {
        MPI_Request nr = MPI_REQUEST_NULL;
        int f = 0;
        memset(&st, 0x5a, sizeof st);
        MPI_Request_get_status(MPI_REQUEST_NULL, &f, &st);
        CHECK(f == 1 && st.MPI_SOURCE == MPI_ANY_SOURCE && st.MPI_TAG == MPI_ANY_TAG && st.MPI_ERROR == MPI_SUCCESS);
        MPI_Get_count(&st, MPI_BYTE, &count);
        CHECK(count == 0);
        memset(&st, 0x5a, sizeof st);
        MPI_Wait(&nr, &st);
        CHECK(st.MPI_SOURCE == MPI_ANY_SOURCE && st.MPI_TAG == MPI_ANY_TAG && st.MPI_ERROR == MPI_SUCCESS);
        memset(&st, 0x5a, sizeof st);
        f = 0;
        MPI_Test(&nr, &f, &st);
        CHECK(f == 1 && st.MPI_SOURCE == MPI_ANY_SOURCE && st.MPI_ERROR == MPI_SUCCESS);
    }

    /* Self messages on MPI_COMM_WORLD and MPI_COMM_SELF, unexpected first. */
    int x = 42 + rank, y = 0, srank, ssize;
    MPI_Send(&x, 1, MPI_INT, rank, 3, MPI_COMM_WORLD);
    MPI_Recv(&y, 1, MPI_INT, rank, 3, MPI_COMM_WORLD, &st);
    CHECK(y == x && st.MPI_SOURCE == rank);
    MPI_Comm_rank(MPI_COMM_SELF, &srank);
    MPI_Comm_size(MPI_COMM_SELF, &ssize);
    CHECK(srank == 0 && ssize == 1);
    MPI_Request q;
    MPI_Isend(&x, 1, MPI_INT, 0, 4, MPI_COMM_SELF, &q);
    MPI_Recv(&y, 1, MPI_INT, MPI_ANY_SOURCE, 4, MPI_COMM_SELF, &st);
    MPI_Wait(&q, MPI_STATUS_IGNORE);
    CHECK(y == x && st.MPI_SOURCE == 0);
    /* A message on MPI_COMM_SELF does not match a receive on MPI_COMM_WORLD (contexts differ). */
    MPI_Isend(&x, 1, MPI_INT, 0, 6, MPI_COMM_SELF, &q);
    int flag = 1;
    MPI_Iprobe(rank, 6, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    CHECK(flag == 0);
    MPI_Recv(&y, 1, MPI_INT, 0, 6, MPI_COMM_SELF, MPI_STATUS_IGNORE);
    MPI_Wait(&q, MPI_STATUS_IGNORE);

    MPI_Barrier(MPI_COMM_WORLD);
    free(s);
    free(r);
    if (rank == 0)
        printf("p2p_basic: PASS (%d ranks)\n", size);
    MPI_Finalize();
    return 0;
}
