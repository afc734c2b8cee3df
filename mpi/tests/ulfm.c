/* MPICH's fault-tolerance extension (ULFM): MPIX_Comm_revoke interrupts blocked receives, probes, barriers
 * (shared-memory and point-to-point ones) and rendezvous sends at every other member, and makes every later
 * communication on the communicator fail with MPIX_ERR_REVOKED; MPIX_Comm_agree (intra: AND over the group;
 * inter: AND over the remote group) and MPIX_Comm_shrink work on the revoked communicator; failure_ack and
 * failure_get_acked report no failures. Needs >= 2 ranks for the revocation parts. */
#include "check.h"
#include <unistd.h>

static int rank, size;

static MPI_Comm fresh(void)
{
    MPI_Comm c;
    CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &c) == MPI_SUCCESS);
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    return c;
}

/* Rank 0 revokes `c` after a pause while the others are blocked in `blocked` (which must fail revoked). */
#define REVOKED_WHILE(c, blocked)                                                               \
    do {                                                                                        \
        if (rank == 0) {                                                                        \
            usleep(200000);                                                                     \
            CHECK(MPIX_Comm_revoke(c) == MPI_SUCCESS);                                          \
        } else {                                                                                \
            CHECK_RC(blocked, MPIX_ERR_REVOKED);                                                \
        }                                                                                       \
    } while (0)

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    int buf[4] = {0}, flag;

    if (size >= 2) {
        /* 1. A receive from a rank that never sends. */
        MPI_Comm c = fresh();
        REVOKED_WHILE(c, MPI_Recv(buf, 1, MPI_INT, 0, 7, c, MPI_STATUS_IGNORE));
        /* Everything after the revocation fails on every member, the revoker included. */
        CHECK_RC(MPI_Send(buf, 1, MPI_INT, (rank + 1) % size, 0, c), MPIX_ERR_REVOKED);
        MPI_Request rq;
        CHECK_RC(MPI_Irecv(buf, 1, MPI_INT, MPI_ANY_SOURCE, 0, c, &rq), MPIX_ERR_REVOKED);
        CHECK_RC(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, c, &flag, MPI_STATUS_IGNORE), MPIX_ERR_REVOKED);
        CHECK_RC(MPI_Barrier(c), MPIX_ERR_REVOKED);
        CHECK_RC(MPI_Allreduce(MPI_IN_PLACE, buf, 1, MPI_INT, MPI_SUM, c), MPIX_ERR_REVOKED);
        /* Revoking again (from any member) is harmless. */
        CHECK(MPIX_Comm_revoke(c) == MPI_SUCCESS);
        /* Local calls still work. */
        int r2, s2;
        CHECK(MPI_Comm_rank(c, &r2) == MPI_SUCCESS && r2 == rank);
        CHECK(MPI_Comm_size(c, &s2) == MPI_SUCCESS && s2 == size);

        /* 2. Agree on the revoked communicator: bitwise AND of every member's flag. */
        flag = rank == size - 1 ? 0x6 : 0x7 | (rank << 8);
        CHECK(MPIX_Comm_agree(c, &flag) == MPI_SUCCESS);
        CHECK(flag == 0x6);
        flag = 0xff;
        CHECK(MPIX_Comm_agree(c, &flag) == MPI_SUCCESS);
        CHECK(flag == 0xff);

        /* 3. Shrink it: same group, working communicator. */
        MPI_Comm s;
        CHECK(MPIX_Comm_shrink(c, &s) == MPI_SUCCESS);
        int res;
        MPI_Comm_compare(s, MPI_COMM_WORLD, &res);
        CHECK(res == MPI_CONGRUENT);
        int sum = rank;
        CHECK(MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_INT, MPI_SUM, s) == MPI_SUCCESS);
        CHECK(sum == size * (size - 1) / 2);
        int tok = rank;
        CHECK(MPI_Sendrecv_replace(&tok, 1, MPI_INT, (rank + 1) % size, 3, (rank + size - 1) % size, 3,
                                   s, MPI_STATUS_IGNORE) == MPI_SUCCESS);
        CHECK(tok == (rank + size - 1) % size);
        MPI_Comm_free(&s);

        /* 4. No failures to acknowledge. */
        MPI_Group g;
        CHECK(MPIX_Comm_failure_ack(c) == MPI_SUCCESS);
        CHECK(MPIX_Comm_failure_get_acked(c, &g) == MPI_SUCCESS);
        int gs;
        MPI_Group_size(g, &gs);
        CHECK(gs == 0);
        if (g != MPI_GROUP_EMPTY)
            MPI_Group_free(&g);
        CHECK(MPI_Comm_free(&c) == MPI_SUCCESS);

        /* 5. A barrier the revoker never enters. */
        c = fresh();
        REVOKED_WHILE(c, MPI_Barrier(c));
        MPI_Comm_free(&c);

        /* 6. A blocking probe. */
        c = fresh();
        REVOKED_WHILE(c, MPI_Probe(0, 1, c, MPI_STATUS_IGNORE));
        MPI_Comm_free(&c);

        /* 7. A waited-for nonblocking receive. */
        c = fresh();
        if (rank == 0) {
            usleep(200000);
            CHECK(MPIX_Comm_revoke(c) == MPI_SUCCESS);
        } else {
            MPI_Request r;
            CHECK(MPI_Irecv(buf, 1, MPI_INT, 0, 5, c, &r) == MPI_SUCCESS);
            CHECK_RC(MPI_Wait(&r, MPI_STATUS_IGNORE), MPIX_ERR_REVOKED);
        }
        MPI_Comm_free(&c);

        /* 8. A rendezvous send nobody receives: the sender is released when the receiver revokes. */
        c = fresh();
        size_t big = 1 << 20;
        char *p = malloc(big);
        memset(p, rank, big);
        if (rank == 0) {
            usleep(200000);
            CHECK(MPIX_Comm_revoke(c) == MPI_SUCCESS);
        } else {
            CHECK_RC(MPI_Send(p, (int)big, MPI_CHAR, 0, 9, c), MPIX_ERR_REVOKED);
        }
        free(p);
        MPI_Comm_free(&c);

        /* 9. Agree and shrink on an intercommunicator: AND over the remote group. */
        MPI_Comm half, inter;
        int color = rank % 2;
        MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
        MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, 1 - color, 11, &inter);
        MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
        flag = color == 0 ? 0x3 : 0x5;
        if (rank == 0)
            flag |= 0x10; /* the other group sees this bit only if every member of group 0 set it */
        CHECK(MPIX_Comm_agree(inter, &flag) == MPI_SUCCESS);
        if (color == 0)
            CHECK(flag == 0x5);
        else
            CHECK(flag == (size == 2 ? 0x13 : 0x3));
        if (rank == 1) {
            usleep(100000);
            CHECK(MPIX_Comm_revoke(inter) == MPI_SUCCESS);
        } else {
            /* Blocked on a receive from the other group's rank 0 (world 1), which never sends. */
            CHECK_RC(MPI_Recv(buf, 1, MPI_INT, 0, 4, inter, MPI_STATUS_IGNORE), MPIX_ERR_REVOKED);
        }
        MPI_Comm sh;
        CHECK(MPIX_Comm_shrink(inter, &sh) == MPI_SUCCESS);
        int rs;
        MPI_Comm_remote_size(sh, &rs);
        CHECK(rs == (color == 0 ? size / 2 : (size + 1) / 2));
        int v = rank, got = -1;
        /* Local rank 0 of each group swaps with the remote rank 0. */
        int lr;
        MPI_Comm_rank(sh, &lr);
        if (lr == 0) {
            CHECK(MPI_Sendrecv(&v, 1, MPI_INT, 0, 2, &got, 1, MPI_INT, 0, 2, sh, MPI_STATUS_IGNORE) ==
                  MPI_SUCCESS);
            CHECK(got == 1 - color);
        }
        MPI_Comm_free(&sh);
        MPI_Comm_free(&inter);
        MPI_Comm_free(&half);
    }

    /* Also on one rank: agree and shrink of MPI_COMM_SELF. */
    flag = 0x5a;
    CHECK(MPIX_Comm_agree(MPI_COMM_SELF, &flag) == MPI_SUCCESS && flag == 0x5a);
    MPI_Comm me;
    CHECK(MPIX_Comm_shrink(MPI_COMM_SELF, &me) == MPI_SUCCESS);
    MPI_Comm_set_errhandler(me, MPI_ERRORS_RETURN);
    CHECK(MPIX_Comm_revoke(me) == MPI_SUCCESS);
    CHECK_RC(MPI_Barrier(me), MPIX_ERR_REVOKED);
    CHECK_RC(MPI_Bcast(buf, 1, MPI_INT, 0, me), MPIX_ERR_REVOKED);
    MPI_Comm_free(&me);

    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS ulfm\n");
    MPI_Finalize();
    return 0;
}
