/* Dynamic processes: MPI_Comm_spawn and spawn_multiple (children are this program, started with an
 * argument), MPI_Comm_get_parent, MPI_UNIVERSE_SIZE / MPI_APPNUM, traffic and collectives over the
 * parent-child intercommunicator, Intercomm_merge, ports (Open_port, accept/connect within the job,
 * Publish/Lookup/Unpublish_name), MPI_Comm_join over a TCP socket, MPI_Comm_disconnect, and the errors
 * of bad ports, names and programs. Prints PASS on rank 0 of the parent job.
 *
 * `spawn server NAME` / `spawn client NAME`: two separate jobs meeting through a published name. */
#include "check.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

static void seq_exchange(MPI_Comm inter, int lead)
{
    /* Every local rank sends 20 sequence-checked messages to every remote rank and receives theirs. */
    int rank, rsize;
    MPI_Comm_rank(inter, &rank);
    MPI_Comm_remote_size(inter, &rsize);
    for (int i = 0; i < 20; i++) {
        for (int r = 0; r < rsize; r++) {
            int out[3] = {lead, rank, i}, in[3];
            MPI_Sendrecv(out, 3, MPI_INT, r, 7, in, 3, MPI_INT, r, 7, inter, MPI_STATUS_IGNORE);
            CHECK(in[0] == !lead && in[1] == r && in[2] == i);
        }
    }
    /* A large message (rendezvous over TCP) from remote rank 0 to local rank 0. */
    if (rank == 0) {
        int n = 1 << 20;
        unsigned char *b = malloc(n), *c = malloc(n);
        fill(b, n, 5 + lead);
        MPI_Sendrecv(b, n, MPI_BYTE, 0, 8, c, n, MPI_BYTE, 0, 8, inter, MPI_STATUS_IGNORE);
        unsigned char *w = malloc(n);
        fill(w, n, 5 + !lead);
        CHECK(memcmp(c, w, n) == 0);
        free(b); free(c); free(w);
    }
}

static void inter_colls(MPI_Comm inter, int parent_side)
{
    /* Bcast from parent rank 0 to every child; allreduce over both groups; merge. */
    int rank, size, rsize;
    MPI_Comm_rank(inter, &rank);
    MPI_Comm_size(inter, &size);
    MPI_Comm_remote_size(inter, &rsize);
    int v = parent_side ? 4242 : -1;
    if (parent_side)
        MPI_Bcast(&v, 1, MPI_INT, rank == 0 ? MPI_ROOT : MPI_PROC_NULL, inter);
    else
        MPI_Bcast(&v, 1, MPI_INT, 0, inter);
    CHECK(v == 4242);
    int mine = parent_side ? 1 : 1000, sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, inter);
    /* An intercommunicator allreduce gives each group the reduction of the other group. */
    CHECK(sum == rsize * (parent_side ? 1000 : 1));
    MPI_Comm merged;
    MPI_Intercomm_merge(inter, parent_side ? 0 : 1, &merged);
    int mr, ms;
    MPI_Comm_rank(merged, &mr);
    MPI_Comm_size(merged, &ms);
    CHECK(ms == size + rsize);
    if (parent_side)
        CHECK(mr == rank);
    else
        CHECK(mr == rsize + rank);
    int all = 0;
    MPI_Allreduce(&mr, &all, 1, MPI_INT, MPI_SUM, merged);
    CHECK(all == ms * (ms - 1) / 2);
    MPI_Comm dup;
    MPI_Comm_dup(merged, &dup);
    MPI_Barrier(dup);
    MPI_Comm_free(&dup);
    MPI_Comm_free(&merged);
}

static int child_main(int argc, char **argv)
{
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    CHECK(parent != MPI_COMM_NULL);
    int flag, *appnum;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_APPNUM, &appnum, &flag);
    CHECK(flag);
    int want_app = argc > 2 ? atoi(argv[2]) : 0;
    CHECK(*appnum == want_app);
    int inter, len;
    MPI_Comm_test_inter(parent, &inter);
    CHECK(inter);
    char name[MPI_MAX_OBJECT_NAME];
    MPI_Comm_get_name(parent, name, &len);
    CHECK(strcmp(name, "MPI_COMM_PARENT") == 0);
    seq_exchange(parent, 0);
    inter_colls(parent, 0);
    MPI_Comm_disconnect(&parent);
    MPI_Comm_get_parent(&parent);
    CHECK(parent == MPI_COMM_NULL);
    MPI_Finalize();
    return 0;
}

static void ports_within_job(int rank, int size)
{
    /* Two halves of the job meet through a port found by name. */
    if (size < 2)
        return;
    int color = rank < size / 2;
    MPI_Comm half, inter;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
    char port[MPI_MAX_PORT_NAME], service[64];
    snprintf(service, sizeof service, "vmf-spawn-test-%d", (int)getppid());
    if (color) {
        int hr;
        MPI_Comm_rank(half, &hr);
        if (hr == 0) {
            MPI_Open_port(MPI_INFO_NULL, port);
            MPI_Publish_name(service, MPI_INFO_NULL, port);
            /* Publishing a taken name fails. */
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
            CHECK_RC(MPI_Publish_name(service, MPI_INFO_NULL, port), MPI_ERR_SERVICE);
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Comm_accept(port, MPI_INFO_NULL, 0, half, &inter);
        MPI_Barrier(MPI_COMM_WORLD);
        if (hr == 0) {
            MPI_Unpublish_name(service, MPI_INFO_NULL, port);
            MPI_Close_port(port);
        }
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
        int hr;
        MPI_Comm_rank(half, &hr);
        if (hr == 0)
            MPI_Lookup_name(service, MPI_INFO_NULL, port);
        MPI_Comm_connect(port, MPI_INFO_NULL, 0, half, &inter);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    int rs;
    MPI_Comm_remote_size(inter, &rs);
    CHECK(rs == (color ? size - size / 2 : size / 2));
    seq_exchange(inter, color);
    MPI_Comm_disconnect(&inter);
    MPI_Comm_free(&half);
    MPI_Barrier(MPI_COMM_WORLD);
    /* Unpublished: the name is gone. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Lookup_name(service, MPI_INFO_NULL, port), MPI_ERR_NAME);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

static void join_pair(int rank, int size)
{
    /* Ranks 0 and 1 connect a TCP socket of their own (on loopback, so not between emulated hosts,
     * which are network namespaces) and join over it. */
    if (size < 2 || rank > 1 || getenv("VMF_HOSTS_TABLE")) {
        MPI_Barrier(MPI_COMM_WORLD);
        return;
    }
    int fd = -1;
    if (rank == 0) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        CHECK(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0);
        socklen_t al = sizeof a;
        getsockname(l, (struct sockaddr *)&a, &al);
        int p = ntohs(a.sin_port);
        MPI_Send(&p, 1, MPI_INT, 1, 3, MPI_COMM_WORLD);
        fd = accept(l, NULL, NULL);
        close(l);
    } else {
        int p;
        MPI_Recv(&p, 1, MPI_INT, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons(p);
        CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    }
    CHECK(fd >= 0);
    MPI_Comm inter;
    MPI_Comm_join(fd, &inter);
    int rs;
    MPI_Comm_remote_size(inter, &rs);
    CHECK(rs == 1);
    int out = 100 + rank, in = -1;
    MPI_Sendrecv(&out, 1, MPI_INT, 0, 1, &in, 1, MPI_INT, 0, 1, inter, MPI_STATUS_IGNORE);
    CHECK(in == 100 + !rank);
    MPI_Comm_disconnect(&inter);
    close(fd);
    MPI_Barrier(MPI_COMM_WORLD);
}

static int two_jobs(const char *role, const char *service)
{
    /* Two separate launches: the server publishes SERVICE and accepts, the client looks it up. */
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    char port[MPI_MAX_PORT_NAME];
    MPI_Comm inter;
    int server = strcmp(role, "server") == 0;
    if (server) {
        if (rank == 0) {
            MPI_Open_port(MPI_INFO_NULL, port);
            MPI_Publish_name(service, MPI_INFO_NULL, port);
        }
        MPI_Comm_accept(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    } else {
        if (rank == 0) {
            /* The server may not have published yet. */
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
            int tries = 0;
            while (MPI_Lookup_name(service, MPI_INFO_NULL, port) != MPI_SUCCESS) {
                CHECK(++tries < 3000);
                usleep(10000);
            }
            MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
        }
        MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter);
    }
    seq_exchange(inter, server);
    inter_colls(inter, server);
    MPI_Comm_disconnect(&inter);
    if (server && rank == 0) {
        MPI_Unpublish_name(service, MPI_INFO_NULL, port);
        MPI_Close_port(port);
    }
    MPI_Finalize();
    if (rank == 0)
        printf("PASS %s\n", role);
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (argc > 1 && strcmp(argv[1], "child") == 0)
        return child_main(argc, argv);
    if (argc > 2)
        return two_jobs(argv[1], argv[2]);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    MPI_Comm parent;
    MPI_Comm_get_parent(&parent);
    CHECK(parent == MPI_COMM_NULL);
    int flag, *usize;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_UNIVERSE_SIZE, &usize, &flag);
    /* Set only when the launcher knows it (vmfabric run --universe-size, mpiexec -usize). */
    const char *want = getenv("SPAWN_TEST_USIZE");
    if (want)
        CHECK(flag && *usize == atoi(want));
    else
        CHECK(!flag || *usize >= size);

    /* 1. spawn 2 children from every rank of the world (root 0). */
    char *args[] = {"child", "0", NULL};
    MPI_Comm inter;
    int codes[2] = {-1, -1};
    MPI_Comm_spawn(argv[0], args, 2, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &inter, codes);
    CHECK(codes[0] == MPI_SUCCESS && codes[1] == MPI_SUCCESS);
    int rs;
    MPI_Comm_remote_size(inter, &rs);
    CHECK(rs == 2);
    seq_exchange(inter, 1);
    inter_colls(inter, 1);
    MPI_Comm_disconnect(&inter);

    /* 2. spawn_multiple: 1 + 2 children with appnums 0 and 1, from MPI_COMM_SELF of the last rank. */
    if (rank == size - 1) {
        char *cmds[2] = {argv[0], argv[0]};
        char *a0[] = {"child", "0", NULL}, *a1[] = {"child", "1", NULL};
        char **argvs[2] = {a0, a1};
        int np[2] = {1, 2};
        MPI_Info infos[2];
        MPI_Info_create(&infos[0]);
        char cwd[4096];
        CHECK(getcwd(cwd, sizeof cwd) != NULL);
        MPI_Info_set(infos[0], "wdir", cwd);
        infos[1] = MPI_INFO_NULL;
        MPI_Comm_spawn_multiple(2, cmds, argvs, np, infos, 0, MPI_COMM_SELF, &inter,
                                MPI_ERRCODES_IGNORE);
        MPI_Info_free(&infos[0]);
        MPI_Comm_remote_size(inter, &rs);
        CHECK(rs == 3);
        seq_exchange(inter, 1);
        inter_colls(inter, 1);
        MPI_Comm_disconnect(&inter);
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 3. ports and names within the job; 4. join. */
    ports_within_job(rank, size);
    join_pair(rank, size);

    /* 5. errors: a program that does not exist, a port that is not one, a name never published. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    int c1 = -1;
    /* Hydra ends the whole job when a program cannot be started; vmfabric run reports it. */
    if (getenv("VMF_JOB_ID"))
        CHECK_RC(MPI_Comm_spawn("/nonexistent/program", MPI_ARGV_NULL, 1, MPI_INFO_NULL, 0,
                                MPI_COMM_WORLD, &inter, &c1),
                 MPI_ERR_SPAWN);
    if (rank == 0) {
        CHECK_RC(MPI_Comm_connect("vmfport:127.0.0.1:1#00000000000000000000000000000000",
                                  MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter),
                 MPI_ERR_PORT);
        CHECK_RC(MPI_Comm_connect("not a port", MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter),
                 MPI_ERR_PORT);
        char port[MPI_MAX_PORT_NAME];
        CHECK_RC(MPI_Lookup_name("vmf-never-published", MPI_INFO_NULL, port), MPI_ERR_NAME);
        CHECK_RC(MPI_Close_port("vmfport:127.0.0.1:1#00"), MPI_ERR_PORT);
    }
    MPI_Finalize();
    if (rank == 0)
        printf("PASS\n");
    return 0;
}
