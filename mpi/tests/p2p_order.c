/* Non-overtaking order under wildcards: every rank sends 200 messages (mixed eager and rendezvous sizes,
 * tags 0..4) to rank 0, which receives first all tag-3 messages of each source, then everything with
 * MPI_ANY_SOURCE / MPI_ANY_TAG; per source, sequence numbers must come in order within each tag. */
#include "check.h"

#define M 200
#define BIG 70000

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    int *buf = malloc(BIG);
    if (rank != 0 || size == 1) {
        MPI_Request *q = malloc(sizeof(MPI_Request) * M);
        int **bufs = malloc(sizeof(int *) * M);
        for (int i = 0; i < M; i++) {
            int len = (i % 13 == 0) ? BIG : 4 * (1 + i % 10);
            bufs[i] = malloc(len);
            bufs[i][0] = i;
            MPI_Isend(bufs[i], len, MPI_BYTE, 0, i % 5, MPI_COMM_WORLD, &q[i]);
        }
        if (size == 1) { /* receive our own messages below */
        } else {
            MPI_Waitall(M, q, MPI_STATUSES_IGNORE);
            for (int i = 0; i < M; i++)
                free(bufs[i]);
        }
        if (size > 1) {
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Finalize();
            return 0;
        }
        /* size == 1: fall through as rank 0 with sends outstanding */
        int last[5];
        for (int t = 0; t < 5; t++) last[t] = -1;
        for (int i = 0; i < M / 5; i++) {
            MPI_Status st;
            MPI_Recv(buf, BIG, MPI_BYTE, 0, 3, MPI_COMM_WORLD, &st);
            CHECK(buf[0] % 5 == 3 && buf[0] > last[3]);
            last[3] = buf[0];
        }
        for (int i = 0; i < M - M / 5; i++) {
            MPI_Status st;
            MPI_Recv(buf, BIG, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            CHECK(st.MPI_TAG != 3 && buf[0] % 5 == st.MPI_TAG && buf[0] > last[st.MPI_TAG]);
            last[st.MPI_TAG] = buf[0];
        }
        MPI_Waitall(M, q, MPI_STATUSES_IGNORE);
        printf("p2p_order: PASS (1 rank)\n");
        MPI_Finalize();
        return 0;
    }
    int last[8][5];
    for (int s = 0; s < 8; s++)
        for (int t = 0; t < 5; t++)
            last[s][t] = -1;
    int prev_overall[8];
    for (int s = 0; s < 8; s++) prev_overall[s] = -1;
    /* tag 3 of each source first */
    for (int src = 1; src < size; src++)
        for (int i = 0; i < M / 5; i++) {
            MPI_Status st;
            MPI_Recv(buf, BIG, MPI_BYTE, src, 3, MPI_COMM_WORLD, &st);
            CHECK(st.MPI_SOURCE == src && st.MPI_TAG == 3 && buf[0] % 5 == 3 && buf[0] > last[src][3]);
            last[src][3] = buf[0];
        }
    /* then the rest with full wildcards: per source, strictly increasing sequence numbers */
    for (int i = 0; i < (size - 1) * (M - M / 5); i++) {
        MPI_Status st;
        MPI_Recv(buf, BIG, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
        int src = st.MPI_SOURCE, c;
        CHECK(src > 0 && src < size && st.MPI_TAG != 3);
        CHECK(buf[0] % 5 == st.MPI_TAG);
        CHECK(buf[0] > prev_overall[src]);
        prev_overall[src] = buf[0];
        MPI_Get_count(&st, MPI_BYTE, &c);
        CHECK(c == ((buf[0] % 13 == 0) ? BIG : 4 * (1 + buf[0] % 10)));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    printf("p2p_order: PASS (%d ranks)\n", size);
    MPI_Finalize();
    return 0;
}
