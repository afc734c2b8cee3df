/* Every send mode, blocking and nonblocking, and synchronous-send semantics. Needs >= 2 ranks (passes
 * trivially with 1). Pairs (0,1), (2,3). */
#include "check.h"
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    int peer = rank ^ 1;
    if (peer >= size) {
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0)
            printf("p2p_modes: PASS (%d rank, nothing to pair with)\n", size);
        MPI_Finalize();
        return 0;
    }
    int n = 100000;
    unsigned char *s = malloc(n), *r = malloc(n);
    MPI_Status st;
    int bsize = 4 * (n + MPI_BSEND_OVERHEAD);
    void *bbuf = malloc(bsize);
    MPI_Buffer_attach(bbuf, bsize);

    /* 8 modes x 2 sizes (eager and rendezvous); even rank sends, odd rank receives. */
    for (int mode = 0; mode < 8; mode++) {
        for (int big = 0; big < 2; big++) {
            int len = big ? n : 16;
            int tag = mode * 2 + big;
            if (rank % 2 == 0) {
                fill(s, len, tag);
                MPI_Request q = MPI_REQUEST_NULL;
                if (mode == 2 || mode == 6) /* ready mode: the receive must be posted first */
                    MPI_Recv(NULL, 0, MPI_BYTE, peer, 1000, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                switch (mode) {
                case 0: MPI_Send(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD); break;
                case 1: MPI_Ssend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD); break;
                case 2: MPI_Rsend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD); break;
                case 3: MPI_Bsend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD); memset(s, 0, len); break;
                case 4: MPI_Isend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q); break;
                case 5: MPI_Issend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q); break;
                case 6: MPI_Irsend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q); break;
                case 7: MPI_Ibsend(s, len, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q); break;
                }
                MPI_Wait(&q, MPI_STATUS_IGNORE);
                CHECK(q == MPI_REQUEST_NULL);
            } else {
                MPI_Request q;
                memset(r, 0, len);
                MPI_Irecv(r, n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &q);
                if (mode == 2 || mode == 6)
                    MPI_Send(NULL, 0, MPI_BYTE, peer, 1000, MPI_COMM_WORLD);
                MPI_Wait(&q, &st);
                int c;
                MPI_Get_count(&st, MPI_BYTE, &c);
                CHECK(c == len && st.MPI_SOURCE == peer && st.MPI_TAG == tag);
                CHECK(same(r, len, tag));
            }
        }
    }
    void *dbuf;
    int dsize;
    MPI_Buffer_detach(&dbuf, &dsize);
    CHECK(dbuf == bbuf && dsize == bsize);

    /* Bsend without enough buffer space fails with MPI_ERR_BUFFER. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Bsend(s, 10, MPI_BYTE, peer, 77, MPI_COMM_WORLD), MPI_ERR_BUFFER);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);

    /* Issend does not complete before the receiver matches it. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank % 2 == 0) {
        MPI_Request q;
        int flag = 0, v = 5;
        MPI_Issend(&v, 1, MPI_INT, peer, 50, MPI_COMM_WORLD, &q);
        for (int i = 0; i < 20; i++) {
            MPI_Test(&q, &flag, MPI_STATUS_IGNORE);
            CHECK(!flag);
            usleep(2000);
        }
        MPI_Send(&v, 1, MPI_INT, peer, 51, MPI_COMM_WORLD); /* "go" */
        MPI_Wait(&q, MPI_STATUS_IGNORE);
    } else {
        int v = 0;
        MPI_Recv(&v, 1, MPI_INT, peer, 51, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Recv(&v, 1, MPI_INT, peer, 50, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        CHECK(v == 5);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(s);
    free(r);
    free(bbuf);
    if (rank == 0)
        printf("p2p_modes: PASS (%d ranks)\n", size);
    MPI_Finalize();
    return 0;
}
