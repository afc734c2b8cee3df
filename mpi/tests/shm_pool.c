/* The shared pool: MPI_Alloc_mem buffers (large sends from them are copied by the receiver straight out
 * of the region) and the shared-memory collectives (per-communicator areas, released by MPI_Comm_free).
 * Payloads and results are checked exactly. Run with VMF_VERBOSE=1 and a small VMF_SHM_POOL, the driver
 * also checks that every communicator got its area (so areas are really given back). */
#include "check.h"

static int R, N;

static void pairs(size_t len, int src_alloc, int dst_alloc)
{
    int peer = R ^ 1;
    if (peer >= N) return;
    unsigned char *s, *d;
    if (src_alloc) MPI_Alloc_mem((MPI_Aint)len, MPI_INFO_NULL, &s); else s = malloc(len);
    if (dst_alloc) MPI_Alloc_mem((MPI_Aint)len, MPI_INFO_NULL, &d); else d = malloc(len);
    CHECK(s && d);
    fill(s, len, R + (int)len);
    memset(d, 0xEE, len);
    MPI_Status st;
    MPI_Sendrecv(s, (int)len, MPI_BYTE, peer, 5, d, (int)len, MPI_BYTE, peer, 5, MPI_COMM_WORLD, &st);
    int cnt;
    MPI_Get_count(&st, MPI_BYTE, &cnt);
    CHECK(cnt == (int)len && st.MPI_SOURCE == peer && st.MPI_TAG == 5);
    unsigned char *e = malloc(len);
    fill(e, len, peer + (int)len);
    CHECK(memcmp(d, e, len) == 0);
    free(e);
    if (src_alloc) MPI_Free_mem(s); else free(s);
    if (dst_alloc) MPI_Free_mem(d); else free(d);
}

static void truncation(void)
{
    int peer = R ^ 1;
    if (peer >= N) return;
    size_t len = 1 << 20;
    unsigned char *s, *d = malloc(len);
    MPI_Alloc_mem((MPI_Aint)len, MPI_INFO_NULL, &s);
    fill(s, len, 3);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Request rq;
    MPI_Isend(s, (int)len, MPI_BYTE, peer, 6, MPI_COMM_WORLD, &rq);
    MPI_Status st;
    int rc = MPI_Recv(d, (int)len / 2, MPI_BYTE, peer, 6, MPI_COMM_WORLD, &st);
    int cls;
    MPI_Error_class(rc, &cls);
    CHECK(cls == MPI_ERR_TRUNCATE);
    unsigned char *e = malloc(len);
    fill(e, len, 3);
    CHECK(memcmp(d, e, len / 2) == 0);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    free(e);
    free(d);
    MPI_Free_mem(s);
}

static void colls(MPI_Comm c, int count)
{
    int r, n;
    MPI_Comm_rank(c, &r);
    MPI_Comm_size(c, &n);
    long *a = malloc(sizeof(long) * (size_t)count * n), *b = malloc(sizeof(long) * (size_t)count * n);
    for (int root = 0; root < n; root++) {
        for (int i = 0; i < count; i++) a[i] = r == root ? root * 100 + i : -1;
        MPI_Bcast(a, count, MPI_LONG, root, c);
        for (int i = 0; i < count; i++) CHECK(a[i] == root * 100 + i);
    }
    for (int i = 0; i < count; i++) a[i] = (r + 1) * (i + 1);
    MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_LONG, MPI_SUM, c);
    for (int i = 0; i < count; i++) CHECK(a[i] == (long)n * (n + 1) / 2 * (i + 1));
    for (int i = 0; i < count; i++) a[i] = r * 1000 + i;
    MPI_Reduce(a, b, count, MPI_LONG, MPI_MAX, n - 1, c);
    if (r == n - 1)
        for (int i = 0; i < count; i++) CHECK(b[i] == (n - 1) * 1000 + i);
    MPI_Allgather(a, count, MPI_LONG, b, count, MPI_LONG, c);
    for (int q = 0; q < n; q++)
        for (int i = 0; i < count; i++) CHECK(b[q * count + i] == q * 1000 + i);
    for (int q = 0; q < n; q++)
        for (int i = 0; i < count; i++) a[q * count + i] = r * 1000000 + q * 1000 + i;
    MPI_Alltoall(MPI_IN_PLACE, count, MPI_LONG, a, count, MPI_LONG, c);
    for (int q = 0; q < n; q++)
        for (int i = 0; i < count; i++) CHECK(a[q * count + i] == q * 1000000 + r * 1000 + i);
    for (int i = 0; i < count; i++) a[i] = r + i;
    MPI_Gather(a, count, MPI_LONG, b, count, MPI_LONG, 0, c);
    if (r == 0)
        for (int q = 0; q < n; q++)
            for (int i = 0; i < count; i++) CHECK(b[q * count + i] == q + i);
    if (r == 0)
        for (int q = 0; q < n; q++)
            for (int i = 0; i < count; i++) b[q * count + i] = q * 7 + i;
    MPI_Scatter(b, count, MPI_LONG, r == 0 ? MPI_IN_PLACE : a, count, MPI_LONG, 0, c);
    if (r != 0)
        for (int i = 0; i < count; i++) CHECK(a[i] == r * 7 + i);
    MPI_Barrier(c);
    free(a);
    free(b);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    int cycles = argc > 1 ? atoi(argv[1]) : 200;

    size_t sizes[] = {1, 100, 65537, 1 << 20, 4 << 20};
    for (int k = 0; k < 5; k++)
        for (int m = 0; m < 4; m++) pairs(sizes[k], m & 1, m >> 1);
    truncation();
    /* Larger than any pool partition: served by the system allocator, still usable for messages. */
    unsigned char *big;
    CHECK(MPI_Alloc_mem(64 << 20, MPI_INFO_NULL, &big) == MPI_SUCCESS);
    memset(big, 1, 64 << 20);
    MPI_Free_mem(big);
    /* Many allocate/free cycles never exhaust the pool (blocks coalesce back). */
    for (int i = 0; i < 500; i++) {
        void *p, *q;
        MPI_Alloc_mem(3 << 20, MPI_INFO_NULL, &p);
        MPI_Alloc_mem(5000 + i, MPI_INFO_NULL, &q);
        memset(p, i, 3 << 20);
        MPI_Free_mem(p);
        MPI_Free_mem(q);
    }
    pairs(4 << 20, 1, 1);

    /* Shared-memory collectives on many short-lived communicators: areas must be given back. */
    for (int i = 0; i < cycles; i++) {
        MPI_Comm d;
        MPI_Comm_dup(MPI_COMM_WORLD, &d);
        colls(d, 1 + i % 5);
        MPI_Comm_free(&d);
    }
    /* Mixed sizes on one communicator: small ones in shared memory, large ones point to point, and a
     * nonblocking collective in flight across blocking ones. */
    MPI_Comm s;
    MPI_Comm_split(MPI_COMM_WORLD, R % 2, N - R, &s);
    long *v = malloc(sizeof(long) * 40000);
    for (int it = 0; it < 20; it++) {
        int cnt = it % 2 ? 40000 : 3;
        MPI_Request rq;
        long x = R, y = -1;
        MPI_Iallreduce(&x, &y, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD, &rq);
        for (int i = 0; i < cnt; i++) v[i] = R + i;
        MPI_Allreduce(MPI_IN_PLACE, v, cnt, MPI_LONG, MPI_MAX, s);
        int sr, sn;
        MPI_Comm_rank(s, &sr);
        MPI_Comm_size(s, &sn);
        int maxr = (N - 1) % 2 == R % 2 ? N - 1 : N - 2;
        for (int i = 0; i < cnt; i++) CHECK(v[i] == maxr + i);
        colls(s, 1 + it);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
        CHECK(y == (long)N * (N - 1) / 2);
    }
    free(v);
    MPI_Comm_free(&s);
    MPI_Barrier(MPI_COMM_WORLD);
    if (R == 0) printf("PASS shm_pool (%d ranks)\n", N);
    MPI_Finalize();
    return 0;
}
