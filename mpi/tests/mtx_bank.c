/* A bank on minitransactions: every rank is a memory node holding ACCOUNTS accounts; every rank moves
 * random amounts between random accounts of random nodes (on its own host and, under --hosts, on the
 * others: two-phase commits over TCP) with minitransactions that compare the balances they read and write
 * the new ones, in blocking and try mode. Rank 0 and the last rank audit meanwhile: a read-only
 * minitransaction over every account must see the initial total at every instant. At the end every
 * balance is non-negative and the total holds. Every rank runs the transfers on two threads at once
 * (MPI_THREAD_MULTIPLE) through the same store handle; every other transfer takes from one hot account. Argument: transfers per thread (default 300). */
#include "check.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <vmfabric/mtx.h>

#define ACCOUNTS 8
#define START 1000

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Sum of every account in one read-only minitransaction; *neg set if a balance is negative. */
static int64_t audit(vmf_store_t s, int size, int *neg)
{
    vmf_mtx_t t;
    int64_t *v = calloc((size_t)size * ACCOUNTS, sizeof *v), sum = 0;
    CHECK(v && vmf_mtx_begin(s, &t) == 0);
    for (int n = 0; n < size; n++)
        for (int a = 0; a < ACCOUNTS; a++)
            CHECK(vmf_mtx_read(t, n, (size_t)a * 64, &v[n * ACCOUNTS + a], 8) == 0);
    CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED);
    for (int i = 0; i < size * ACCOUNTS; i++) {
        sum += v[i];
        if (v[i] < 0)
            *neg = 1;
    }
    vmf_mtx_free(&t);
    free(v);
    return sum;
}

static int rank, size, transfers;
static vmf_store_t s;
static int64_t total;

struct worker {
    int id;
    long retries, audits;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    uint64_t x = 0x9e3779b97f4a7c15ULL ^ (uint64_t)(rank * 2 + w->id + 1) * 0x2545f4914f6cdd1dULL;
    vmf_mtx_t t;
    CHECK(vmf_mtx_begin(s, &t) == 0);
    for (int i = 0; i < transfers; i++) {
        int n1 = (int)(rnd(&x) % (uint64_t)size), a1 = (int)(rnd(&x) % ACCOUNTS);
        int n2 = (int)(rnd(&x) % (uint64_t)size), a2 = (int)(rnd(&x) % ACCOUNTS);
        if (i % 2 == 0)
            n1 = 0, a1 = 0; /* a hot account: threads and ranks contend for it */
        if (n1 == n2 && a1 == a2)
            a2 = (a2 + 1) % ACCOUNTS;
        for (;;) {
            int64_t v1, v2;
            vmf_mtx_reset(t);
            CHECK(vmf_mtx_read(t, n1, (size_t)a1 * 64, &v1, 8) == 0);
            CHECK(vmf_mtx_read(t, n2, (size_t)a2 * 64, &v2, 8) == 0);
            CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED);
            CHECK(v1 >= 0 && v2 >= 0);
            int64_t amt = (int64_t)(rnd(&x) % (uint64_t)(v1 + 1)), n1v = v1 - amt, n2v = v2 + amt;
            vmf_mtx_reset(t);
            CHECK(vmf_mtx_compare(t, n1, (size_t)a1 * 64, &v1, 8) == 0);
            CHECK(vmf_mtx_compare(t, n2, (size_t)a2 * 64, &v2, 8) == 0);
            CHECK(vmf_mtx_write(t, n1, (size_t)a1 * 64, &n1v, 8) == 0);
            CHECK(vmf_mtx_write(t, n2, (size_t)a2 * 64, &n2v, 8) == 0);
            int rc = vmf_mtx_commit(t, i % 2 ? VMF_MTX_TRY : VMF_MTX_BLOCKING);
            if (!(rc == VMF_MTX_COMMITTED || rc == VMF_MTX_COMPARE_FAILED || (rc == VMF_MTX_LOCK_FAILED && i % 2)))
                fprintf(stderr, "rank %d thread %d: commit returned %d: %s\n", rank, w->id, rc, vmf_strerror(rc));
            CHECK(rc == VMF_MTX_COMMITTED || rc == VMF_MTX_COMPARE_FAILED || (rc == VMF_MTX_LOCK_FAILED && i % 2));
            if (rc == VMF_MTX_COMMITTED)
                break;
            w->retries++;
        }
        if ((rank == 0 || rank == size - 1) && i % 10 == 0) {
            int neg = 0;
            int64_t sum = audit(s, size, &neg);
            if (sum != total || neg)
                fprintf(stderr, "rank %d: audit %ld saw a total of %lld (want %lld)%s\n", rank, w->audits,
                        (long long)sum, (long long)total, neg ? " and a negative balance" : "");
            CHECK(sum == total && !neg);
            w->audits++;
        }
    }
    vmf_mtx_free(&t);
    return NULL;
}

int main(int argc, char **argv)
{
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    CHECK(provided == MPI_THREAD_MULTIPLE);
    transfers = argc > 1 ? atoi(argv[1]) : 300;
    CHECK(vmf_store_create(MPI_COMM_WORLD, ACCOUNTS * 64, &s) == 0);
    /* Each rank opens its own accounts. */
    vmf_mtx_t t;
    CHECK(vmf_mtx_begin(s, &t) == 0);
    for (int a = 0; a < ACCOUNTS; a++) {
        int64_t v = START;
        CHECK(vmf_mtx_write(t, rank, (size_t)a * 64, &v, 8) == 0);
    }
    CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED);
    vmf_mtx_free(&t);
    MPI_Barrier(MPI_COMM_WORLD);
    total = (int64_t)START * ACCOUNTS * size;
    struct worker w[2] = {{0, 0, 0}, {1, 0, 0}};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, work, &w[1]) == 0);
    work(&w[0]);
    pthread_join(th, NULL);
    MPI_Barrier(MPI_COMM_WORLD);
    int neg = 0;
    CHECK(audit(s, size, &neg) == total && !neg);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(vmf_store_free(&s) == 0);
    if (rank == 0)
        printf("PASS mtx_bank (%d ranks x 2 threads, %d transfers each, %ld retries, %ld audits)\n", size, transfers,
               w[0].retries + w[1].retries, w[0].audits + w[1].audits);
    MPI_Finalize();
    return 0;
}
