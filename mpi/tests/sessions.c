/* The MPI 4.0 Sessions model, with no MPI_Init at all: process sets, groups from them, communicators from
 * groups (used for collectives and point-to-point), intercommunicators from two groups, concurrent
 * creations told apart by their string tags, session error handlers and info. Any rank count. (Debian's
 * MPICH 4.0 passes up to the user session error handler, which it treats as fatal.) */
#include "check.h"

static int eh_calls, eh_code;
static void session_eh(MPI_Session *s, int *code, ...)
{
    (void)s;
    eh_calls++;
    eh_code = *code;
}

int main(void)
{
    /* A failing MPI_Session_init reports to the handler it was given (with MPI_SESSION_NULL). */
    MPI_Errhandler early_eh;
    MPI_Session_create_errhandler(session_eh, &early_eh);
    MPI_Session bad_s;
    CHECK(MPI_Session_init((MPI_Info)MPI_COMM_WORLD, early_eh, &bad_s) != MPI_SUCCESS);
    CHECK(eh_calls == 1);
    eh_calls = 0;
    MPI_Session s;
    MPI_Info sinfo;
    MPI_Info_create(&sinfo);
    MPI_Info_set(sinfo, "thread_level", "MPI_THREAD_SINGLE");
    MPI_Info_set(sinfo, "org.vmfabric.test", "yes");
    CHECK(MPI_Session_init(sinfo, MPI_ERRORS_RETURN, &s) == MPI_SUCCESS);
    MPI_Info_free(&sinfo);
    int flag;
    MPI_Initialized(&flag);
    CHECK(!flag); /* the world model is not initialised by a session */

    /* Process sets. */
    int npsets, len;
    char name[64];
    MPI_Session_get_num_psets(s, MPI_INFO_NULL, &npsets);
    CHECK(npsets >= 2);
    int have_world = 0, have_self = 0;
    for (int i = 0; i < npsets; i++) {
        len = 0;
        MPI_Session_get_nth_pset(s, MPI_INFO_NULL, i, &len, name); /* 0: ask for the length */
        CHECK(len > 1 && len <= (int)sizeof name);
        MPI_Session_get_nth_pset(s, MPI_INFO_NULL, i, &len, name);
        CHECK((int)strlen(name) == len - 1);
        have_world |= strcmp(name, "mpi://WORLD") == 0;
        have_self |= strcmp(name, "mpi://SELF") == 0;
    }
    CHECK(have_world && have_self);
    MPI_Info pinfo;
    char v[MPI_MAX_INFO_VAL + 1];
    MPI_Session_get_pset_info(s, "mpi://WORLD", &pinfo);
    MPI_Info_get(pinfo, "mpi_size", MPI_MAX_INFO_VAL, v, &flag);
    CHECK(flag);
    int size = atoi(v);
    CHECK(size >= 1);
    MPI_Info_free(&pinfo);

    /* A communicator over mpi://WORLD. */
    MPI_Group wg, sg;
    MPI_Comm world, self;
    MPI_Group_from_session_pset(s, "mpi://WORLD", &wg);
    MPI_Comm_create_from_group(wg, "org.vmfabric.sessions.world", MPI_INFO_NULL, MPI_ERRORS_RETURN, &world);
    int rank, n;
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &n);
    check_rank = rank;
    CHECK(n == size);
    int x = rank + 1, sum = 0;
    MPI_Allreduce(&x, &sum, 1, MPI_INT, MPI_SUM, world);
    CHECK(sum == size * (size + 1) / 2);
    int right = (rank + 1) % size, left = (rank + size - 1) % size, got = -1;
    MPI_Sendrecv(&rank, 1, MPI_INT, right, 3, &got, 1, MPI_INT, left, 3, world, MPI_STATUS_IGNORE);
    CHECK(got == left);
    MPI_Group_from_session_pset(s, "mpi://SELF", &sg);
    MPI_Comm_create_from_group(sg, "org.vmfabric.sessions.self", MPI_INFO_NULL, MPI_ERRORS_RETURN, &self);
    MPI_Comm_size(self, &n);
    CHECK(n == 1);

    /* Two communicators from overlapping groups made one after the other with different tags, even ranks
     * and the lower half: each gets a context of its own. */
    int nev = (size + 1) / 2, nlow = (size + 1) / 2;
    int *ev = malloc(sizeof(int) * nev), *low = malloc(sizeof(int) * nlow);
    for (int i = 0; i < nev; i++)
        ev[i] = 2 * i;
    for (int i = 0; i < nlow; i++)
        low[i] = i;
    MPI_Group geven, glow;
    MPI_Group_incl(wg, nev, ev, &geven);
    MPI_Group_incl(wg, nlow, low, &glow);
    MPI_Comm ceven = MPI_COMM_NULL, clow = MPI_COMM_NULL;
    if (rank % 2 == 0)
        MPI_Comm_create_from_group(geven, "even", MPI_INFO_NULL, MPI_ERRORS_RETURN, &ceven);
    if (rank < nlow)
        MPI_Comm_create_from_group(glow, "low", MPI_INFO_NULL, MPI_ERRORS_RETURN, &clow);
    if (ceven != MPI_COMM_NULL) {
        int r, t = rank, mx = -1;
        MPI_Comm_rank(ceven, &r);
        CHECK(r == rank / 2);
        MPI_Allreduce(&t, &mx, 1, MPI_INT, MPI_MAX, ceven);
        CHECK(mx == 2 * (nev - 1));
        MPI_Comm_free(&ceven);
    }
    if (clow != MPI_COMM_NULL) {
        int t = 1, cnt = 0;
        MPI_Allreduce(&t, &cnt, 1, MPI_INT, MPI_SUM, clow);
        CHECK(cnt == nlow);
        MPI_Comm_free(&clow);
    }

    /* An intercommunicator between the even and the odd ranks. */
    if (size >= 2) {
        int nodd = size / 2;
        int *od = malloc(sizeof(int) * nodd);
        for (int i = 0; i < nodd; i++)
            od[i] = 2 * i + 1;
        MPI_Group godd, mine, other;
        MPI_Group_incl(wg, nodd, od, &godd);
        mine = rank % 2 == 0 ? geven : godd;
        other = rank % 2 == 0 ? godd : geven;
        MPI_Comm inter;
        CHECK(MPI_Intercomm_create_from_groups(mine, 0, other, 0, "org.vmfabric.sessions.inter", MPI_INFO_NULL,
                                               MPI_ERRORS_RETURN, &inter) == MPI_SUCCESS);
        int is_inter, rsize;
        MPI_Comm_test_inter(inter, &is_inter);
        MPI_Comm_remote_size(inter, &rsize);
        CHECK(is_inter && rsize == (rank % 2 == 0 ? nodd : nev));
        /* Local rank 0 of each side swaps its world rank with the other side's rank 0. */
        int lr;
        MPI_Comm_rank(inter, &lr);
        if (lr == 0) {
            int peer = -1;
            MPI_Sendrecv(&rank, 1, MPI_INT, 0, 9, &peer, 1, MPI_INT, 0, 9, inter, MPI_STATUS_IGNORE);
            CHECK(peer == (rank % 2 == 0 ? 1 : 0));
        }
        int one = 1, remote_sum = 0;
        MPI_Allreduce(&one, &remote_sum, 1, MPI_INT, MPI_SUM, inter); /* sums over the remote group */
        CHECK(remote_sum == rsize);
        MPI_Comm_free(&inter);
        MPI_Group_free(&godd);
        free(od);
    }
    MPI_Group_free(&geven);
    MPI_Group_free(&glow);
    free(ev);
    free(low);

    /* Errors: unknown process set, a session error handler, a bad session handle. */
    MPI_Group bad;
    CHECK(MPI_Group_from_session_pset(s, "mpi://NOWHERE", &bad) != MPI_SUCCESS);
    MPI_Errhandler eh, cur;
    MPI_Session_create_errhandler(session_eh, &eh);
    MPI_Session_set_errhandler(s, eh);
    MPI_Session_get_errhandler(s, &cur);
    CHECK(cur == eh);
    CHECK(MPI_Session_call_errhandler(s, MPI_ERR_OTHER) == MPI_SUCCESS);
    CHECK(eh_calls == 1 && eh_code == MPI_ERR_OTHER);
    MPI_Group_from_session_pset(s, "mpi://NOWHERE", &bad);
    CHECK(eh_calls == 2);
    MPI_Session_set_errhandler(s, MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&eh);

    MPI_Info used;
    MPI_Session_get_info(s, &used);
    MPI_Info_get(used, "thread_level", MPI_MAX_INFO_VAL, v, &flag);
    CHECK(flag && strncmp(v, "MPI_THREAD_", 11) == 0);
    MPI_Info_free(&used);

    MPI_Barrier(world);
    MPI_Comm_free(&self);
    MPI_Comm_free(&world);
    MPI_Group_free(&wg);
    MPI_Group_free(&sg);
    CHECK(MPI_Session_finalize(&s) == MPI_SUCCESS && s == MPI_SESSION_NULL);
    MPI_Finalized(&flag);
    if (flag) {
        fprintf(stderr, "MPI_Finalized is true without MPI_Init\n");
        return 1;
    }
    if (rank == 0)
        printf("sessions: PASS (%d ranks)\n", size);
    return 0;
}
