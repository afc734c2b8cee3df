/* The tool interface: control variables (the fabric's VMF_* tunables), performance variables (the engine's
 * counters, checked against traffic this program makes), categories, event sources; before MPI_Init,
 * during, and after MPI_Finalize. Any rank count (1 rank: messages to itself). */
#include "check.h"

static int rank, nproc;

static int pvar(const char *name, int cls)
{
    int i;
    CHECK(MPI_T_pvar_get_index(name, cls, &i) == MPI_SUCCESS);
    return i;
}

static unsigned long long rd(MPI_T_pvar_session s, MPI_T_pvar_handle h)
{
    unsigned long long v = 0;
    CHECK(MPI_T_pvar_read(s, h, &v) == MPI_SUCCESS);
    return v;
}

int main(int argc, char **argv)
{
    int provided, n, idx, count;
    char name[256], desc[1024];
    int nlen, dlen, verb, bind, scope, cls, ro, cont, atomic;
    MPI_Datatype dt;
    MPI_T_enum et;

    /* Usable before MPI_Init. */
    CHECK(MPI_T_cvar_get_num(&n) == MPI_T_ERR_NOT_INITIALIZED);
    CHECK(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS);
    CHECK(MPI_T_cvar_get_num(&n) == MPI_SUCCESS && n > 20);
    CHECK(MPI_T_cvar_get_index("VMF_SHM_EAGER_LIMIT", &idx) == MPI_SUCCESS);
    nlen = sizeof name;
    dlen = sizeof desc;
    CHECK(MPI_T_cvar_get_info(idx, name, &nlen, &verb, &dt, &et, desc, &dlen, &bind, &scope) == MPI_SUCCESS);
    CHECK(strcmp(name, "VMF_SHM_EAGER_LIMIT") == 0 && nlen == (int)strlen(name) + 1);
    CHECK(dt == MPI_UNSIGNED_LONG_LONG && bind == MPI_T_BIND_NO_OBJECT && scope == MPI_T_SCOPE_READONLY);
    CHECK(strstr(desc, "rendezvous") != NULL);
    /* A short buffer gets a truncated, terminated name; the length says what is needed. */
    nlen = 4;
    CHECK(MPI_T_cvar_get_info(idx, name, &nlen, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == MPI_SUCCESS);
    CHECK(strcmp(name, "VMF") == 0 && nlen == 4);
    /* A query (no buffer) says what the name needs. */
    nlen = 0;
    CHECK(MPI_T_cvar_get_info(idx, NULL, &nlen, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == MPI_SUCCESS);
    CHECK(nlen == (int)strlen("VMF_SHM_EAGER_LIMIT") + 1);
    MPI_T_cvar_handle ch;
    CHECK(MPI_T_cvar_handle_alloc(idx, NULL, &ch, &count) == MPI_SUCCESS && count == 1);
    unsigned long long eager = 0;
    CHECK(MPI_T_cvar_read(ch, &eager) == MPI_SUCCESS);
    const char *env = getenv("VMF_SHM_EAGER_LIMIT");
    if (!env) /* auto: this host's calibration (docs/transports/shm.md), else 64 KiB */
        CHECK(eager >= 1024 && eager <= (1ull << 30));
    else if (env[0] && env[strspn(env, "0123456789")] == 0)
        CHECK(eager == strtoull(env, NULL, 10));
    CHECK(MPI_T_cvar_write(ch, &eager) == MPI_T_ERR_CVAR_SET_NEVER);
    CHECK(MPI_T_cvar_handle_free(&ch) == MPI_SUCCESS && ch == MPI_T_CVAR_HANDLE_NULL);
    CHECK(MPI_T_cvar_read(ch, &eager) == MPI_T_ERR_INVALID_HANDLE);
    CHECK(MPI_T_cvar_get_index("VMF_WAIT", &idx) == MPI_SUCCESS);
    CHECK(MPI_T_cvar_get_info(idx, NULL, NULL, NULL, &dt, NULL, NULL, NULL, NULL, NULL) == MPI_SUCCESS);
    CHECK(dt == MPI_CHAR);
    CHECK(MPI_T_cvar_handle_alloc(idx, NULL, &ch, &count) == MPI_SUCCESS && count > 8);
    char *wait = calloc(count, 1);
    CHECK(MPI_T_cvar_read(ch, wait) == MPI_SUCCESS);
    CHECK(strcmp(wait, getenv("VMF_WAIT") ? getenv("VMF_WAIT") : "adaptive") == 0);
    free(wait);
    MPI_T_cvar_handle_free(&ch);
    CHECK(MPI_T_cvar_get_index("MPIR_CVAR_NO_SUCH", &idx) == MPI_T_ERR_INVALID_NAME);
    CHECK(MPI_T_cvar_get_info(n, name, &nlen, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == MPI_T_ERR_INVALID_INDEX);

    MPI_Init_thread(&argc, &argv, MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);
    check_rank = rank;

    /* Performance variables. */
    CHECK(MPI_T_pvar_get_num(&n) == MPI_SUCCESS && n >= 15);
    MPI_T_pvar_session s;
    CHECK(MPI_T_pvar_session_create(&s) == MPI_SUCCESS);
    const char *sent_name = nproc == 1 ? "self_msgs_sent" : getenv("VMF_SHM") && !strcmp(getenv("VMF_SHM"), "0") ? "tcp_msgs_sent" : "shm_msgs_sent";
    int isent = pvar(sent_name, MPI_T_PVAR_CLASS_COUNTER), irecv = pvar("msgs_recvd", MPI_T_PVAR_CLASS_COUNTER);
    int ibytes = pvar("bytes_recvd", MPI_T_PVAR_CLASS_COUNTER), irdv = pvar("rendezvous_sent", MPI_T_PVAR_CLASS_COUNTER);
    int iunx = pvar("unexpected_queue_length", MPI_T_PVAR_CLASS_LEVEL);
    int imax = pvar("unexpected_queue_max", MPI_T_PVAR_CLASS_HIGHWATERMARK);
    CHECK(MPI_T_pvar_get_index("unexpected_queue_length", MPI_T_PVAR_CLASS_COUNTER, &idx) == MPI_T_ERR_INVALID_NAME);
    nlen = sizeof name;
    dlen = sizeof desc;
    CHECK(MPI_T_pvar_get_info(irecv, name, &nlen, &verb, &cls, &dt, &et, desc, &dlen, &bind, &ro, &cont, &atomic) == MPI_SUCCESS);
    CHECK(strcmp(name, "msgs_recvd") == 0 && cls == MPI_T_PVAR_CLASS_COUNTER && dt == MPI_UNSIGNED_LONG_LONG);
    CHECK(ro == 0 && cont == 1 && bind == MPI_T_BIND_NO_OBJECT);
    CHECK(MPI_T_pvar_get_info(iunx, NULL, NULL, NULL, &cls, NULL, NULL, NULL, NULL, NULL, &ro, NULL, NULL) == MPI_SUCCESS);
    CHECK(cls == MPI_T_PVAR_CLASS_LEVEL && ro == 1);
    MPI_T_pvar_handle hsent, hrecv, hbytes, hrdv, hunx, hmax;
    CHECK(MPI_T_pvar_handle_alloc(s, isent, NULL, &hsent, &count) == MPI_SUCCESS && count == 1);
    MPI_T_pvar_handle_alloc(s, irecv, NULL, &hrecv, &count);
    MPI_T_pvar_handle_alloc(s, ibytes, NULL, &hbytes, &count);
    MPI_T_pvar_handle_alloc(s, irdv, NULL, &hrdv, &count);
    MPI_T_pvar_handle_alloc(s, iunx, NULL, &hunx, &count);
    MPI_T_pvar_handle_alloc(s, imax, NULL, &hmax, &count);
    CHECK(MPI_T_pvar_start(s, MPI_T_PVAR_ALL_HANDLES) == MPI_SUCCESS);
    CHECK(MPI_T_pvar_start(s, hsent) == MPI_T_ERR_PVAR_NO_STARTSTOP);
    MPI_Barrier(MPI_COMM_WORLD);
    /* Counters start at 0 at the handle's allocation; reset them after the barrier's own traffic. */
    CHECK(MPI_T_pvar_reset(s, MPI_T_PVAR_ALL_HANDLES) == MPI_SUCCESS);
    CHECK(MPI_T_pvar_reset(s, hunx) == MPI_T_ERR_PVAR_NO_WRITE);
    CHECK(rd(s, hsent) == 0 && rd(s, hrecv) == 0);

    /* 10 messages of 100 bytes from rank 0 to the last rank, sent before the receives are posted. */
    int to = nproc - 1;
    char buf[100] = {0};
    MPI_Request rq[10];
    if (rank == 0)
        for (int i = 0; i < 10; i++)
            MPI_Isend(buf, 100, MPI_CHAR, to, i, MPI_COMM_WORLD, &rq[i]);
    if (rank == to) {
        int flag = 0;
        MPI_Status st;
        while (!flag) /* the last one here: all ten are in the unexpected queue */
            MPI_Iprobe(0, 9, MPI_COMM_WORLD, &flag, &st);
        unsigned long long level = rd(s, hunx);
        CHECK(level >= 10 && rd(s, hmax) >= 10);
        for (int i = 0; i < 10; i++)
            MPI_Recv(buf, 100, MPI_CHAR, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        /* The ten left the queue (rank 0's next message may have arrived meanwhile). */
        CHECK(rd(s, hunx) <= level - 10 + 1 && rd(s, hmax) >= 10);
        CHECK(rd(s, hrecv) == 10 && rd(s, hbytes) == 1000);
    }
    if (rank == 0) {
        MPI_Waitall(10, rq, MPI_STATUSES_IGNORE);
        CHECK(rd(s, hsent) == 10);
    }
    /* A message above the eager limit goes by rendezvous. */
    size_t big = 4 << 20;
    char *b = calloc(big, 1);
    if (rank == 0) {
        MPI_Request r;
        MPI_Isend(b, (int)big, MPI_CHAR, to, 99, MPI_COMM_WORLD, &r);
        if (to == 0)
            MPI_Recv(b, (int)big, MPI_CHAR, 0, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
        if (to != 0) /* messages to oneself are copied, with no protocol */
            CHECK(rd(s, hrdv) == 1);
    } else if (rank == to) {
        MPI_Recv(b, (int)big, MPI_CHAR, 0, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    free(b);
    /* readreset, write. */
    unsigned long long v = 7;
    if (rank == to) {
        CHECK(MPI_T_pvar_readreset(s, hrecv, &v) == MPI_SUCCESS && v == 11);
        CHECK(rd(s, hrecv) == 0);
    }
    v = 1000;
    CHECK(MPI_T_pvar_write(s, hrecv, &v) == MPI_SUCCESS && rd(s, hrecv) == 1000);
    CHECK(MPI_T_pvar_write(s, hunx, &v) == MPI_T_ERR_PVAR_NO_WRITE);
    /* Handles belong to their session. */
    MPI_T_pvar_session s2;
    MPI_T_pvar_session_create(&s2);
    CHECK(MPI_T_pvar_read(s2, hrecv, &v) == MPI_T_ERR_INVALID_HANDLE);
    MPI_T_pvar_session_free(&s2);
    CHECK(s2 == MPI_T_PVAR_SESSION_NULL);
    CHECK(MPI_T_pvar_handle_free(s, &hsent) == MPI_SUCCESS && hsent == MPI_T_PVAR_HANDLE_NULL);
    CHECK(MPI_T_pvar_read(s, hsent, &v) == MPI_T_ERR_INVALID_HANDLE);

    /* Categories. */
    int ncat, found = 0;
    CHECK(MPI_T_category_get_num(&ncat) == MPI_SUCCESS && ncat > 3);
    CHECK(MPI_T_category_get_index("vmfabric_shm", &idx) == MPI_SUCCESS);
    int nc, np, nsub;
    nlen = sizeof name;
    dlen = sizeof desc;
    CHECK(MPI_T_category_get_info(idx, name, &nlen, desc, &dlen, &nc, &np, &nsub) == MPI_SUCCESS && nc > 3);
    int *cv = malloc(sizeof(int) * nc), eidx;
    MPI_T_category_get_cvars(idx, nc, cv);
    MPI_T_cvar_get_index("VMF_SHM_EAGER_LIMIT", &eidx);
    for (int i = 0; i < nc; i++)
        found |= cv[i] == eidx;
    CHECK(found);
    free(cv);
    CHECK(MPI_T_category_get_index("vmfabric_matching", &idx) == MPI_SUCCESS);
    int pv[4] = {-1, -1, -1, -1};
    MPI_T_category_get_info(idx, NULL, NULL, NULL, NULL, &nc, &np, &nsub);
    CHECK(np == 2);
    MPI_T_category_get_pvars(idx, 4, pv);
    CHECK((pv[0] == iunx && pv[1] == imax) || (pv[0] == imax && pv[1] == iunx));
    int upd;
    CHECK(MPI_T_category_changed(&upd) == MPI_SUCCESS);

    /* Events: none defined; one clock source. */
    CHECK(MPI_T_event_get_num(&n) == MPI_SUCCESS && n == 0);
    CHECK(MPI_T_source_get_num(&n) == MPI_SUCCESS && n == 1);
    MPI_Count t1, t2, tps;
    MPI_T_source_get_timestamp(0, &t1);
    MPI_T_source_get_timestamp(0, &t2);
    CHECK(t2 >= t1);
    CHECK(MPI_T_source_get_info(0, NULL, NULL, NULL, NULL, NULL, &tps, NULL, NULL) == MPI_SUCCESS && tps == 1000000000);
    CHECK(MPI_T_event_get_info(0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL) == MPI_T_ERR_INVALID_INDEX);

    MPI_T_pvar_session_free(&s);
    CHECK(MPI_T_finalize() == MPI_SUCCESS);
    CHECK(MPI_T_cvar_get_num(&n) == MPI_T_ERR_NOT_INITIALIZED);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS\n");
    MPI_Finalize();
    /* After MPI_Finalize the interface still answers, with the final counts. */
    CHECK(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) == MPI_SUCCESS);
    MPI_T_pvar_session_create(&s);
    MPI_T_pvar_handle_alloc(s, pvar("unexpected_queue_max", MPI_T_PVAR_CLASS_HIGHWATERMARK), NULL, &hmax, &count);
    if (rank == to)
        CHECK(rd(s, hmax) >= 10);
    MPI_T_pvar_session_free(&s);
    MPI_T_finalize();
    return 0;
}
