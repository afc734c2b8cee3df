/* vmfabric/mtx.h from an MPI program: a store with one memory node per rank, minitransactions (counters under
 * high contention in both modes, multi-node transfers audited by read-only transactions, compare failures),
 * bad arguments and stale handles, the three barrier kinds, and condition variables of the three kinds (a
 * turn passed round the ranks). With the argument "remote" (ranks on several hosts): the same store tests run
 * with memory nodes on both hosts (two-phase commits over TCP), barriers work over MPI, and condition
 * variables (one host only) are refused with VMF_ERR_REMOTE on every rank. */
#include "check.h"
#include <stdint.h>
#include <vmfabric/mtx.h>

static int rank, size;

static uint64_t get64(vmf_store_t s, int node, size_t off)
{
    vmf_mtx_t t;
    uint64_t v = 0;
    CHECK(vmf_mtx_begin(s, &t) == 0);
    CHECK(vmf_mtx_read(t, node, off, &v, 8) == 0);
    CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED);
    vmf_mtx_free(&t);
    return v;
}

static void barriers(void)
{
    int kinds[3] = {VMF_BARRIER_SPIN, VMF_BARRIER_BLOCK, VMF_BARRIER_ADAPTIVE};
    for (int k = 0; k < 3; k++) {
        vmf_barrier_t b;
        CHECK(vmf_barrier_create(MPI_COMM_WORLD, kinds[k], &b) == 0);
        /* No rank passes round r before every rank reached it: each round, every rank sends its round
         * number to rank 0 (nonblocking); rank 0 checks all arrived before its barrier returns. */
        for (int r = 0; r < 200; r++) {
            MPI_Request rq;
            MPI_Isend(&r, 1, MPI_INT, 0, 77, MPI_COMM_WORLD, &rq);
            if (rank == 0)
                for (int i = 0; i < size; i++) {
                    int got;
                    MPI_Recv(&got, 1, MPI_INT, MPI_ANY_SOURCE, 77, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    CHECK(got == r);
                }
            MPI_Wait(&rq, MPI_STATUS_IGNORE);
            CHECK(vmf_barrier_wait(b) == 0);
        }
        CHECK(vmf_barrier_free(&b) == 0 && b == NULL);
        CHECK(vmf_barrier_wait(b) == VMF_ERR_HANDLE);
    }
    vmf_barrier_t b;
    CHECK(vmf_barrier_create(MPI_COMM_WORLD, 42, &b) == VMF_ERR_ARG);
}

/* Each kind: the ranks take turns (rank r acts when turn % size == r) 50 times each, the turn kept in a
 * store and changed only under the condition variable's mutex; waiters wait on the condition, the actor
 * broadcasts. Every rank sees exactly its own turns, and the final turn is 50 * size. */
static void conds(void)
{
    int kinds[3] = {VMF_COND_SPIN, VMF_COND_BLOCK, VMF_COND_ADAPTIVE};
    vmf_store_t s;
    CHECK(vmf_store_create(MPI_COMM_WORLD, 64, &s) == 0);
    for (int k = 0; k < 3; k++) {
        vmf_cond_t c;
        CHECK(vmf_cond_create(MPI_COMM_WORLD, kinds[k], &c) == 0);
        const uint64_t base = (uint64_t)k * 50 * size;
        for (int i = 0; i < 50; i++) {
            CHECK(vmf_cond_lock(c) == 0);
            uint64_t turn;
            while ((turn = get64(s, 0, 0)) % size != (uint64_t)rank || turn < base + (uint64_t)i * size)
                CHECK(vmf_cond_wait(c) == 0);
            CHECK(turn == base + (uint64_t)i * size + rank);
            vmf_mtx_t t;
            uint64_t next = turn + 1;
            CHECK(vmf_mtx_begin(s, &t) == 0);
            CHECK(vmf_mtx_write(t, 0, 0, &next, 8) == 0);
            CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED);
            vmf_mtx_free(&t);
            CHECK(vmf_cond_broadcast(c) == 0);
            CHECK(vmf_cond_unlock(c) == 0);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(get64(s, 0, 0) == base + 50 * (uint64_t)size);
        CHECK(vmf_cond_unlock(c) == VMF_ERR_ARG); /* not held */
        CHECK(vmf_cond_signal(c) == 0);
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(vmf_cond_free(&c) == 0 && c == NULL);
        CHECK(vmf_cond_lock(c) == VMF_ERR_HANDLE);
    }
    vmf_cond_t c;
    CHECK(vmf_cond_create(MPI_COMM_WORLD, 7, &c) == VMF_ERR_ARG && c == NULL);
    /* A prepared transaction: every rank adds 1 to node 0's word 1 a hundred times by resetting only
     * the values of its compare and write items. */
    vmf_mtx_t t;
    uint64_t zero = 0;
    CHECK(vmf_mtx_begin(s, &t) == 0);
    CHECK(vmf_mtx_compare(t, 0, 8, &zero, 8) == 0 && vmf_mtx_write(t, 0, 8, &zero, 8) == 0);
    for (int i = 0; i < 100; i++)
        for (;;) {
            uint64_t v = get64(s, 0, 8), nv = v + 1;
            CHECK(vmf_mtx_set_compare(t, 0, &v, 8) == 0 && vmf_mtx_set_write(t, 0, &nv, 8) == 0);
            int rc = vmf_mtx_commit(t, VMF_MTX_BLOCKING);
            CHECK(rc == VMF_MTX_COMMITTED || rc == VMF_MTX_COMPARE_FAILED);
            if (rc == VMF_MTX_COMMITTED)
                break;
        }
    CHECK(vmf_mtx_set_compare(t, 0, &zero, 4) == VMF_ERR_ARG);
    CHECK(vmf_mtx_set_write(t, 1, &zero, 8) == VMF_ERR_ARG);
    vmf_mtx_free(&t);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(get64(s, 0, 8) == 100 * (uint64_t)size);
    CHECK(vmf_store_free(&s) == 0);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    vmf_store_t s;
    const int remote = argc > 1 && strcmp(argv[1], "remote") == 0;
    const size_t bytes = 4096;
    CHECK(vmf_store_create(MPI_COMM_WORLD, bytes, &s) == 0);
    int nodes;
    size_t nb;
    CHECK(vmf_store_size(s, &nodes, &nb) == 0 && nodes == size && nb == bytes);

    /* 1. One counter, every rank, high contention; blocking and try commits. */
    vmf_mtx_t t;
    CHECK(vmf_mtx_begin(s, &t) == 0);
    const int iters = 2000;
    long failures = 0;
    for (int i = 0; i < iters; i++) {
        for (;;) {
            uint64_t v = 0, nv;
            vmf_mtx_reset(t);
            CHECK(vmf_mtx_read(t, 0, 0, &v, 8) == 0);
            CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED);
            nv = v + 1;
            vmf_mtx_reset(t);
            CHECK(vmf_mtx_compare(t, 0, 0, &v, 8) == 0);
            CHECK(vmf_mtx_write(t, 0, 0, &nv, 8) == 0);
            int rc = vmf_mtx_commit(t, i % 2 ? VMF_MTX_TRY : VMF_MTX_BLOCKING);
            CHECK(rc >= 0);
            if (rc == VMF_MTX_COMMITTED)
                break;
            failures++;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(get64(s, 0, 0) == (uint64_t)size * iters);

    /* 2. Transfers between node r and node r+1 (two writes, two nodes), audited by every rank. */
    for (int i = 0; i < (size > 1 ? 500 : 0); i++) {
        int a = rank, b = (rank + 1) % size;
        for (;;) {
            int64_t x, y;
            vmf_mtx_reset(t);
            vmf_mtx_read(t, a, 64, &x, 8);
            vmf_mtx_read(t, b, 64, &y, 8);
            CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == 0);
            int64_t nx = x - 3, ny = y + 3;
            vmf_mtx_reset(t);
            vmf_mtx_compare(t, a, 64, &x, 8);
            vmf_mtx_compare(t, b, 64, &y, 8);
            vmf_mtx_write(t, a, 64, &nx, 8);
            vmf_mtx_write(t, b, 64, &ny, 8);
            if (vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMMITTED)
                break;
        }
        if (i % 50 == 0) {
            int64_t sum = 0, v[64];
            vmf_mtx_reset(t);
            for (int n = 0; n < size && n < 64; n++)
                vmf_mtx_read(t, n, 64, &v[n], 8);
            CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == 0);
            for (int n = 0; n < size && n < 64; n++)
                sum += v[n];
            CHECK(size > 64 || sum == 0);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);

    /* 3. A failing compare: its index, nothing written, reads filled. */
    uint64_t wrong = 12345, newv = 1, got = 0, one = 0;
    vmf_mtx_reset(t);
    CHECK(vmf_mtx_compare(t, rank, 1000, &one, 8) == 0);  /* holds (zero) */
    CHECK(vmf_mtx_compare(t, rank, 1008, &wrong, 8) == 0); /* fails */
    CHECK(vmf_mtx_read(t, 0, 0, &got, 8) == 0);
    CHECK(vmf_mtx_write(t, rank, 1000, &newv, 8) == 0);
    CHECK(vmf_mtx_commit(t, VMF_MTX_BLOCKING) == VMF_MTX_COMPARE_FAILED);
    CHECK(vmf_mtx_failed_item(t) == 1);
    CHECK(got == (uint64_t)size * iters);
    CHECK(get64(s, rank, 1000) == 0);

    /* 4. Bad arguments and stale handles: negative codes with messages, no crash. */
    vmf_mtx_reset(t);
    CHECK(vmf_mtx_write(t, size, 0, &newv, 8) == VMF_ERR_ARG);
    CHECK(strstr(vmf_strerror(VMF_ERR_ARG), "node") != NULL);
    CHECK(vmf_mtx_write(t, 0, bytes - 4, &newv, 8) == VMF_ERR_ARG);
    CHECK(vmf_mtx_read(t, -1, 0, &got, 8) == VMF_ERR_ARG);
    CHECK(vmf_mtx_read(t, 0, 0, NULL, 8) == VMF_ERR_ARG);
    CHECK(vmf_mtx_commit(t, 7) == VMF_ERR_ARG);
    CHECK(vmf_mtx_commit(NULL, VMF_MTX_TRY) == VMF_ERR_HANDLE);
    vmf_mtx_t other = t;
    CHECK(vmf_mtx_begin(NULL, &other) == VMF_ERR_HANDLE && other == NULL);
    vmf_mtx_t stale = t;
    CHECK(vmf_mtx_free(&t) == 0 && t == NULL);
    CHECK(vmf_mtx_commit(stale, VMF_MTX_TRY) == VMF_ERR_HANDLE);
    CHECK(vmf_mtx_free(&stale) == VMF_ERR_HANDLE);
    CHECK(vmf_mtx_begin(s, &t) == 0);
    vmf_store_t stale_s = s;
    CHECK(vmf_store_free(&s) == 0 && s == NULL);
    CHECK(vmf_mtx_write(t, 0, 0, &newv, 8) == VMF_ERR_HANDLE); /* its store is gone */
    CHECK(vmf_mtx_begin(stale_s, &t) == VMF_ERR_HANDLE);
    CHECK(vmf_store_free(&stale_s) == VMF_ERR_HANDLE);
    CHECK(vmf_store_open("/nonexistent/store", &s) == VMF_ERR_IO);

    barriers();
    if (remote) {
        vmf_cond_t c;
        CHECK(vmf_cond_create(MPI_COMM_WORLD, VMF_COND_BLOCK, &c) == VMF_ERR_REMOTE && c == NULL);
        CHECK(strstr(vmf_strerror(VMF_ERR_REMOTE), "host") != NULL);
    } else
        conds();
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS mtx%s (%ld retries)\n", remote ? " remote" : "", failures);
    MPI_Finalize();
    return 0;
}
