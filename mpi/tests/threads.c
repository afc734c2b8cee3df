/* MPI_THREAD_MULTIPLE: threads of every rank call MPI at once — point-to-point with per-thread tags
 * (blocking, nonblocking, probe), collectives on communicators of their own issued in different orders on
 * different ranks, communicator construction (dup, idup, split), one-sided atomics on one counter, and a
 * partitioned send whose partitions threads mark while the main thread already waits for it.
 * Prints PASS on rank 0. */
#include "check.h"
#include <pthread.h>
#include <unistd.h>

#define NT 4
static int rank, size;
static MPI_Comm comms[NT];
static MPI_Win win;
static long *counter;
static const int ITER = 300;

static void *worker(void *arg)
{
    int t = (int)(long)arg;
    int peer = rank ^ 1;
    /* Point-to-point between thread t of paired ranks, tag t. */
    if (peer < size) {
        for (int i = 0; i < ITER; i++) {
            int out[4] = {rank, t, i, rank * 1000 + t}, in[4];
            if (rank < peer) {
                CHECK(MPI_Send(out, 4, MPI_INT, peer, t, MPI_COMM_WORLD) == MPI_SUCCESS);
                CHECK(MPI_Recv(in, 4, MPI_INT, peer, t, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS);
            } else {
                MPI_Status st;
                CHECK(MPI_Probe(peer, t, MPI_COMM_WORLD, &st) == MPI_SUCCESS);
                CHECK(st.MPI_TAG == t);
                CHECK(MPI_Recv(in, 4, MPI_INT, peer, t, MPI_COMM_WORLD, MPI_STATUS_IGNORE) == MPI_SUCCESS);
                MPI_Request r;
                CHECK(MPI_Isend(out, 4, MPI_INT, peer, t, MPI_COMM_WORLD, &r) == MPI_SUCCESS);
                CHECK(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS);
            }
            CHECK(in[0] == peer && in[1] == t && in[2] == i && in[3] == peer * 1000 + t);
        }
    }
    /* Collectives on this thread's communicator; the order of the threads differs between ranks, which
     * only works if a thread waiting in one lets the others run theirs. */
    for (int i = 0; i < 50; i++) {
        long v = rank + t + i, sum;
        CHECK(MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, comms[t]) == MPI_SUCCESS);
        CHECK(sum == (long)size * (size - 1) / 2 + (long)size * (t + i));
        int b = rank == 0 ? 77 + t + i : -1;
        CHECK(MPI_Bcast(&b, 1, MPI_INT, 0, comms[t]) == MPI_SUCCESS);
        CHECK(b == 77 + t + i);
        CHECK(MPI_Barrier(comms[t]) == MPI_SUCCESS);
    }
    /* Communicator construction from threads, each on its own parent. */
    MPI_Comm d, id, sp;
    CHECK(MPI_Comm_dup(comms[t], &d) == MPI_SUCCESS);
    MPI_Request r;
    CHECK(MPI_Comm_idup(d, &id, &r) == MPI_SUCCESS);
    CHECK(MPI_Wait(&r, MPI_STATUS_IGNORE) == MPI_SUCCESS);
    CHECK(MPI_Comm_split(id, rank % 2, -rank, &sp) == MPI_SUCCESS);
    int sr, ss;
    MPI_Comm_rank(sp, &sr);
    MPI_Comm_size(sp, &ss);
    CHECK(ss == (size + (rank % 2 == 0)) / 2);
    int x = t, y;
    CHECK(MPI_Allreduce(&x, &y, 1, MPI_INT, MPI_MAX, sp) == MPI_SUCCESS && y == t);
    MPI_Comm_free(&sp);
    MPI_Comm_free(&id);
    MPI_Comm_free(&d);
    /* One-sided: fetch-and-add on rank 0's counter from every thread of every rank. */
    for (int i = 0; i < ITER; i++) {
        long one = 1, old;
        CHECK(MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, 0, MPI_SUM, win) == MPI_SUCCESS);
        CHECK(MPI_Win_flush(0, win) == MPI_SUCCESS);
        CHECK(old >= 0 && old < (long)NT * size * ITER);
    }
    return NULL;
}

/* Partitioned send (MPI 4.0): each thread fills and marks its partition. */
#define PARTS NT
#define PCOUNT 1000
static int pbuf[PARTS * PCOUNT];
static MPI_Request preq;

static void *mark(void *arg)
{
    int p = (int)(long)arg;
    for (int k = 0; k < PCOUNT; k++)
        pbuf[p * PCOUNT + k] = p * 100000 + k;
    usleep(2000 * (PARTS - p)); /* the main thread is in MPI_Wait by now */
    CHECK(MPI_Pready(p, preq) == MPI_SUCCESS);
    return NULL;
}

static void test_partitioned(void)
{
    if (size < 2 || rank > 1)
        return;
    if (rank == 0) {
        CHECK(MPI_Psend_init(pbuf, PARTS, PCOUNT, MPI_INT, 1, 7, MPI_COMM_WORLD, MPI_INFO_NULL, &preq) ==
              MPI_SUCCESS);
        for (int round = 0; round < 3; round++) {
            CHECK(MPI_Start(&preq) == MPI_SUCCESS);
            pthread_t th[PARTS];
            for (int p = 0; p < PARTS; p++)
                pthread_create(&th[p], NULL, mark, (void *)(long)p);
            CHECK(MPI_Wait(&preq, MPI_STATUS_IGNORE) == MPI_SUCCESS);
            for (int p = 0; p < PARTS; p++)
                pthread_join(th[p], NULL);
        }
    } else {
        CHECK(MPI_Precv_init(pbuf, PARTS, PCOUNT, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_INFO_NULL, &preq) ==
              MPI_SUCCESS);
        for (int round = 0; round < 3; round++) {
            memset(pbuf, 0xff, sizeof pbuf);
            CHECK(MPI_Start(&preq) == MPI_SUCCESS);
            CHECK(MPI_Wait(&preq, MPI_STATUS_IGNORE) == MPI_SUCCESS);
            for (int k = 0; k < PARTS * PCOUNT; k++)
                CHECK(pbuf[k] == (k / PCOUNT) * 100000 + k % PCOUNT);
        }
    }
    CHECK(MPI_Request_free(&preq) == MPI_SUCCESS);
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    CHECK(provided == MPI_THREAD_MULTIPLE);
    int q, main_;
    MPI_Query_thread(&q);
    CHECK(q == MPI_THREAD_MULTIPLE);
    MPI_Is_thread_main(&main_);
    CHECK(main_);
    for (int t = 0; t < NT; t++)
        MPI_Comm_dup(MPI_COMM_WORLD, &comms[t]);
    CHECK(MPI_Win_allocate(sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &counter, &win) ==
          MPI_SUCCESS);
    *counter = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_lock_all(0, win);
    pthread_t th[NT];
    /* Odd ranks start the threads in reverse order. */
    for (int k = 0; k < NT; k++) {
        int t = rank % 2 ? NT - 1 - k : k;
        pthread_create(&th[t], NULL, worker, (void *)(long)t);
    }
    for (int t = 0; t < NT; t++)
        pthread_join(th[t], NULL);
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
        CHECK(*counter == (long)NT * size * ITER);
        MPI_Win_unlock(0, win);
    }
    MPI_Win_free(&win);
    test_partitioned();
    for (int t = 0; t < NT; t++)
        MPI_Comm_free(&comms[t]);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS\n");
    MPI_Finalize();
    return 0;
}
