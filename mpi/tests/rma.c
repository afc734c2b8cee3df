/* One-sided communication: every window flavor with every synchronisation, accumulates and atomics
 * (exact results under contention), derived datatypes on origin and target, request-based operations,
 * shared-memory windows, MPI_Win_create on memory that spans partial and whole pages (shared in place), attributes,
 * and the errors MPI defines for misuse. Prints PASS on rank 0. */
#include "check.h"
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

static int rank, size;

enum { F_CREATE, F_CREATE_ALLOC, F_ALLOCATE, F_SHARED, F_DYNAMIC, NFLAVORS };
static const char *fname[] = {"create", "create(Alloc_mem)", "allocate", "allocate_shared", "dynamic"};

static int dyn_half; /* elements in the first of the two ranges a dynamic window attaches */

/* A window of `n` longs per rank; `*disp0` is the displacement of element 0 at every rank (dynamic
 * windows: the address, exchanged). */
static MPI_Win make(int flavor, int n, long **mem, MPI_Aint **disp0)
{
    MPI_Win w;
    MPI_Aint bytes = (MPI_Aint)n * sizeof(long);
    static MPI_Aint d[256];
    *disp0 = d;
    for (int i = 0; i < size; i++)
        d[i] = 0;
    switch (flavor) {
    case F_CREATE:
        *mem = calloc(n, sizeof(long));
        CHECK(MPI_Win_create(*mem, bytes, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &w) == MPI_SUCCESS);
        break;
    case F_CREATE_ALLOC:
        CHECK(MPI_Alloc_mem(bytes, MPI_INFO_NULL, mem) == MPI_SUCCESS);
        memset(*mem, 0, bytes);
        CHECK(MPI_Win_create(*mem, bytes, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &w) == MPI_SUCCESS);
        break;
    case F_ALLOCATE:
        CHECK(MPI_Win_allocate(bytes, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, mem, &w) == MPI_SUCCESS);
        memset(*mem, 0, bytes);
        break;
    case F_SHARED: {
        CHECK(MPI_Win_allocate_shared(bytes, sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, mem, &w) == MPI_SUCCESS);
        memset(*mem, 0, bytes);
        break;
    }
    case F_DYNAMIC: {
        CHECK(MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &w) == MPI_SUCCESS);
        *mem = calloc(n, sizeof(long));
        /* Attached as two adjacent halves: operations that cross from one into the other are allowed
         * (as in MPICH), and the tests below do. */
        dyn_half = n / 2;
        CHECK(MPI_Win_attach(w, *mem, dyn_half * sizeof(long)) == MPI_SUCCESS);
        CHECK(MPI_Win_attach(w, *mem + dyn_half, (n - dyn_half) * sizeof(long)) == MPI_SUCCESS);
        MPI_Aint a;
        MPI_Get_address(*mem, &a);
        MPI_Allgather(&a, 1, MPI_AINT, d, 1, MPI_AINT, MPI_COMM_WORLD);
        /* Displacements of dynamic windows are in bytes: element k of rank r is d[r] + 8k. */
        break;
    }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return w;
}

static MPI_Aint at(int flavor, MPI_Aint *d0, int r, int k)
{
    return flavor == F_DYNAMIC ? d0[r] + (MPI_Aint)k * (MPI_Aint)sizeof(long) : k;
}

static void unmake(int flavor, MPI_Win *w, long *mem)
{
    if (flavor == F_DYNAMIC) {
        CHECK(MPI_Win_detach(*w, mem) == MPI_SUCCESS);
        CHECK(MPI_Win_detach(*w, mem + dyn_half) == MPI_SUCCESS);
    }
    CHECK(MPI_Win_free(w) == MPI_SUCCESS);
    CHECK(*w == MPI_WIN_NULL);
    if (flavor == F_CREATE || flavor == F_DYNAMIC)
        free(mem);
    if (flavor == F_CREATE_ALLOC)
        MPI_Free_mem(mem);
}

static void test_flavor(int f)
{
    const int N = 64;
    long *mem;
    MPI_Aint *d0;
    MPI_Win w = make(f, N, &mem, &d0);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;

    /* Attributes. */
    int *flav, *model, flag;
    CHECK(MPI_Win_get_attr(w, MPI_WIN_CREATE_FLAVOR, &flav, &flag) == MPI_SUCCESS && flag);
    int want[] = {MPI_WIN_FLAVOR_CREATE, MPI_WIN_FLAVOR_CREATE, MPI_WIN_FLAVOR_ALLOCATE, MPI_WIN_FLAVOR_SHARED,
                  MPI_WIN_FLAVOR_DYNAMIC};
    CHECK(*flav == want[f]);
    CHECK(MPI_Win_get_attr(w, MPI_WIN_MODEL, &model, &flag) == MPI_SUCCESS && flag && *model == MPI_WIN_UNIFIED);
    if (f != F_DYNAMIC) {
        void *base;
        MPI_Aint *sz;
        int *du;
        CHECK(MPI_Win_get_attr(w, MPI_WIN_BASE, &base, &flag) == MPI_SUCCESS && flag && base == (void *)mem);
        CHECK(MPI_Win_get_attr(w, MPI_WIN_SIZE, &sz, &flag) == MPI_SUCCESS && flag && *sz == N * (MPI_Aint)sizeof(long));
        CHECK(MPI_Win_get_attr(w, MPI_WIN_DISP_UNIT, &du, &flag) == MPI_SUCCESS && flag && *du == (int)sizeof(long));
    }

    /* Fence: put my rank into slot `rank` of the right neighbour, get it back from the left one's. */
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    long v = 1000 + rank;
    CHECK(MPI_Put(&v, 1, MPI_LONG, right, at(f, d0, right, rank), 1, MPI_LONG, w) == MPI_SUCCESS);
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    CHECK(mem[left] == 1000 + left);
    long g = -1;
    CHECK(MPI_Get(&g, 1, MPI_LONG, left, at(f, d0, left, left == 0 ? size - 1 : left - 1), 1, MPI_LONG, w) == MPI_SUCCESS);
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    CHECK(g == 1000 + (left == 0 ? size - 1 : left - 1));

    /* Accumulate: every rank adds rank+1 to slot 10 of every rank; MPI_MAX into slot 11. */
    mem[10] = 0;
    mem[11] = -5;
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    for (int r = 0; r < size; r++) {
        long a = rank + 1;
        CHECK(MPI_Accumulate(&a, 1, MPI_LONG, r, at(f, d0, r, 10), 1, MPI_LONG, MPI_SUM, w) == MPI_SUCCESS);
        CHECK(MPI_Accumulate(&a, 1, MPI_LONG, r, at(f, d0, r, 11), 1, MPI_LONG, MPI_MAX, w) == MPI_SUCCESS);
    }
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    CHECK(mem[10] == (long)size * (size + 1) / 2);
    CHECK(mem[11] == size);

    /* Passive target under contention: fetch-and-add and a compare-and-swap increment on rank 0. */
    mem[12] = 0;
    mem[13] = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    const int ITER = 200;
    CHECK(MPI_Win_lock_all(0, w) == MPI_SUCCESS);
    for (int i = 0; i < ITER; i++) {
        long one = 1, old;
        CHECK(MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, at(f, d0, 0, 12), MPI_SUM, w) == MPI_SUCCESS);
        CHECK(MPI_Win_flush(0, w) == MPI_SUCCESS);
        CHECK(old >= 0 && old < (long)size * ITER);
        long cur, res;
        CHECK(MPI_Fetch_and_op(NULL, &cur, MPI_LONG, 0, at(f, d0, 0, 13), MPI_NO_OP, w) == MPI_SUCCESS);
        CHECK(MPI_Win_flush(0, w) == MPI_SUCCESS);
        for (;;) {
            long nw = cur + 1;
            CHECK(MPI_Compare_and_swap(&nw, &cur, &res, MPI_LONG, 0, at(f, d0, 0, 13), w) == MPI_SUCCESS);
            CHECK(MPI_Win_flush(0, w) == MPI_SUCCESS);
            if (res == cur)
                break;
            cur = res;
        }
    }
    CHECK(MPI_Win_unlock_all(w) == MPI_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        CHECK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, w) == MPI_SUCCESS);
        long c12, c13;
        CHECK(MPI_Get(&c12, 1, MPI_LONG, 0, at(f, d0, 0, 12), 1, MPI_LONG, w) == MPI_SUCCESS);
        CHECK(MPI_Get(&c13, 1, MPI_LONG, 0, at(f, d0, 0, 13), 1, MPI_LONG, w) == MPI_SUCCESS);
        CHECK(MPI_Win_unlock(0, w) == MPI_SUCCESS);
        CHECK(c12 == (long)size * ITER);
        CHECK(c13 == (long)size * ITER);
    }

    /* Exclusive locks make a get-modify-put atomic. */
    mem[14] = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < 50; i++) {
        long x;
        CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w) == MPI_SUCCESS);
        CHECK(MPI_Get(&x, 1, MPI_LONG, 0, at(f, d0, 0, 14), 1, MPI_LONG, w) == MPI_SUCCESS);
        CHECK(MPI_Win_flush(0, w) == MPI_SUCCESS);
        x += 1;
        CHECK(MPI_Put(&x, 1, MPI_LONG, 0, at(f, d0, 0, 14), 1, MPI_LONG, w) == MPI_SUCCESS);
        CHECK(MPI_Win_unlock(0, w) == MPI_SUCCESS);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w) == MPI_SUCCESS);
        CHECK(MPI_Win_sync(w) == MPI_SUCCESS);
        CHECK(mem[14] == 50L * size);
        CHECK(MPI_Win_unlock(0, w) == MPI_SUCCESS);
    }

    /* PSCW ring: each rank exposes to its left neighbour, accesses its right neighbour. */
    MPI_Group wg, lg, rg;
    CHECK(MPI_Win_get_group(w, &wg) == MPI_SUCCESS);
    int gs;
    MPI_Group_size(wg, &gs);
    CHECK(gs == size);
    MPI_Group_incl(wg, 1, &left, &lg);
    MPI_Group_incl(wg, 1, &right, &rg);
    for (int rep = 0; rep < 3; rep++) {
        CHECK(MPI_Win_post(lg, 0, w) == MPI_SUCCESS);
        CHECK(MPI_Win_start(rg, 0, w) == MPI_SUCCESS);
        long x = rank * 100 + rep;
        CHECK(MPI_Put(&x, 1, MPI_LONG, right, at(f, d0, right, 20), 1, MPI_LONG, w) == MPI_SUCCESS);
        CHECK(MPI_Win_complete(w) == MPI_SUCCESS);
        if (rep == 2) {
            int done = 0;
            while (!done)
                CHECK(MPI_Win_test(w, &done) == MPI_SUCCESS);
        } else {
            CHECK(MPI_Win_wait(w) == MPI_SUCCESS);
        }
        CHECK(mem[20] == left * 100 + rep);
    }
    MPI_Group_free(&lg);
    MPI_Group_free(&rg);
    MPI_Group_free(&wg);

    /* One contiguous put over slots 28..35, which a dynamic window attached as two ranges (split at 32). */
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    long eight[8];
    for (int k = 0; k < 8; k++)
        eight[k] = rank * 100 + k;
    CHECK(MPI_Put(eight, 8, MPI_LONG, right, at(f, d0, right, 28), 8, MPI_LONG, w) == MPI_SUCCESS);
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    for (int k = 0; k < 8; k++)
        CHECK(mem[28 + k] == left * 100 + k);

    /* Derived datatypes: a strided vector at the target, contiguous at the origin, and back. */
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    for (int k = 30; k < 46; k++)
        mem[k] = -1;
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    MPI_Datatype vec;
    MPI_Type_vector(4, 1, 3, MPI_LONG, &vec); /* slots 30, 33, 36, 39 */
    MPI_Type_commit(&vec);
    long four[4] = {rank * 10 + 1, rank * 10 + 2, rank * 10 + 3, rank * 10 + 4};
    CHECK(MPI_Put(four, 4, MPI_LONG, right, at(f, d0, right, 30), 1, vec, w) == MPI_SUCCESS);
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    for (int k = 0; k < 4; k++)
        CHECK(mem[30 + 3 * k] == left * 10 + k + 1);
    CHECK(mem[31] == -1 && mem[32] == -1);
    long back[12];
    for (int k = 0; k < 12; k++)
        back[k] = -7;
    CHECK(MPI_Get(back, 1, vec, left, at(f, d0, left, 30), 1, vec, w) == MPI_SUCCESS);
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    int lleft = (left + size - 1) % size;
    for (int k = 0; k < 4; k++)
        CHECK(back[3 * k] == lleft * 10 + k + 1);
    CHECK(back[1] == -7);
    /* Accumulate through the vector, and get-accumulate with a contiguous result. */
    long ones[4] = {1, 1, 1, 1}, prev[4];
    CHECK(MPI_Get_accumulate(ones, 4, MPI_LONG, prev, 4, MPI_LONG, right, at(f, d0, right, 30), 1, vec, MPI_SUM, w) ==
          MPI_SUCCESS);
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    for (int k = 0; k < 4; k++) {
        CHECK(prev[k] == rank * 10 + k + 1);
        CHECK(mem[30 + 3 * k] == left * 10 + k + 2);
    }
    MPI_Type_free(&vec);

    /* MAXLOC on (double, int) pairs. */
    struct {
        double v;
        int i;
    } pr = {(double)rank, rank}, *tgt = (void *)&mem[50];
    tgt->v = -1.0;
    tgt->i = -1;
    CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
    CHECK(MPI_Accumulate(&pr, 1, MPI_DOUBLE_INT, 0, at(f, d0, 0, 50), 1, MPI_DOUBLE_INT, MPI_MAXLOC, w) == MPI_SUCCESS);
    CHECK(MPI_Win_fence(MPI_MODE_NOSUCCEED, w) == MPI_SUCCESS);
    if (rank == 0)
        CHECK(tgt->v == (double)(size - 1) && tgt->i == size - 1);

    /* Request-based operations in a lock_all epoch. */
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(MPI_Win_lock_all(0, w) == MPI_SUCCESS);
    MPI_Request rq[2];
    long out = 7000 + rank, in = -1;
    CHECK(MPI_Rput(&out, 1, MPI_LONG, right, at(f, d0, right, 55), 1, MPI_LONG, w, &rq[0]) == MPI_SUCCESS);
    CHECK(MPI_Wait(&rq[0], MPI_STATUS_IGNORE) == MPI_SUCCESS);
    CHECK(MPI_Win_flush_all(w) == MPI_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(MPI_Rget(&in, 1, MPI_LONG, left, at(f, d0, left, 55), 1, MPI_LONG, w, &rq[1]) == MPI_SUCCESS);
    CHECK(MPI_Wait(&rq[1], MPI_STATUS_IGNORE) == MPI_SUCCESS);
    CHECK(in == 7000 + lleft);
    CHECK(MPI_Win_unlock_all(w) == MPI_SUCCESS);

    /* Errors, reported to the window's handler (MPI_ERRORS_RETURN here). */
    MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN);
    long e = 0;
    CHECK_RC(MPI_Put(&e, 1, MPI_LONG, right, at(f, d0, right, 0), 1, MPI_LONG, w), MPI_ERR_RMA_SYNC);
    CHECK_RC(MPI_Win_unlock(right, w), MPI_ERR_RMA_SYNC);
    CHECK_RC(MPI_Win_lock(12345, right, 0, w), MPI_ERR_LOCKTYPE);
    CHECK_RC(MPI_Win_flush(right, w), MPI_ERR_RMA_SYNC);
    CHECK_RC(MPI_Win_complete(w), MPI_ERR_RMA_SYNC);
    CHECK(MPI_Win_lock(MPI_LOCK_SHARED, right, 0, w) == MPI_SUCCESS);
    {
        /* Past the window: MPI_ERR_RMA_RANGE at the call (a dynamic window may also report it only when
         * the operation completes, at the unlock below). */
        int cls, rc = MPI_Put(&e, 1, MPI_LONG, right, at(f, d0, right, N), 1, MPI_LONG, w);
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_ERR_RMA_RANGE || (f == F_DYNAMIC && cls == MPI_SUCCESS));
    }
    CHECK_RC(MPI_Put(&e, 1, MPI_LONG, size + 3, 0, 1, MPI_LONG, w), MPI_ERR_RANK);
    int rc = MPI_Win_unlock(right, w);
    if (f == F_DYNAMIC) { /* the range error of the dynamic window shows at completion, if at all */
        int cls;
        MPI_Error_class(rc, &cls);
        CHECK(cls == MPI_SUCCESS || cls == MPI_ERR_RMA_RANGE || cls == MPI_ERR_OTHER);
    } else {
        CHECK(rc == MPI_SUCCESS);
    }
    /* An invalid window has no handler of its own: MPI_COMM_WORLD's is used, as in MPICH. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    CHECK_RC(MPI_Win_free(&(MPI_Win){MPI_WIN_NULL}), MPI_ERR_WIN);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Barrier(MPI_COMM_WORLD);
    unmake(f, &w, mem);
    if (rank == 0)
        printf("flavor %s ok\n", fname[f]);
}

static void test_shared(void)
{
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    int nr, ns;
    MPI_Comm_rank(node, &nr);
    MPI_Comm_size(node, &ns);
    MPI_Win w;
    int *mine;
    CHECK(MPI_Win_allocate_shared((nr + 1) * sizeof(int), sizeof(int), MPI_INFO_NULL, node, &mine, &w) ==
          MPI_SUCCESS);
    for (int k = 0; k <= nr; k++)
        mine[k] = nr * 1000 + k;
    MPI_Win_fence(0, w);
    MPI_Barrier(node);
    MPI_Win_fence(0, w);
    /* Contiguous by default: rank r's part follows rank r-1's. */
    int *p0;
    MPI_Aint sz;
    int du;
    CHECK(MPI_Win_shared_query(w, 0, &sz, &du, &p0) == MPI_SUCCESS);
    CHECK(sz == sizeof(int) && du == sizeof(int));
    int off = 0;
    for (int r = 0; r < ns; r++) {
        int *p;
        CHECK(MPI_Win_shared_query(w, r, &sz, &du, &p) == MPI_SUCCESS);
        CHECK(sz == (MPI_Aint)((r + 1) * sizeof(int)));
        CHECK(p == p0 + off);
        for (int k = 0; k <= r; k++)
            CHECK(p[k] == r * 1000 + k); /* loads straight from the peer's memory */
        off += r + 1;
    }
    /* Stores by one rank seen by all after a sync. */
    MPI_Barrier(node);
    MPI_Win_lock_all(0, w);
    if (nr == 0)
        p0[0] = 4242;
    MPI_Win_sync(w);
    MPI_Barrier(node);
    MPI_Win_sync(w);
    CHECK(p0[0] == 4242);
    MPI_Win_unlock_all(w);
    MPI_Win_free(&w);
    MPI_Comm_free(&node);
}

/* MPI_Win_create on the program's own memory, 40 bytes past a page boundary and 3 pages + 600 bytes long:
 * partial pages at both edges, whole pages inside. vmfabric shares the pages in place (co-resident peers
 * then use loads and stores): all of them while no other thread runs, only the whole ones otherwise (the
 * edges by single copy); `with_thread` runs a thread meanwhile. Operations lie in each part and cross
 * between them; the bytes around the window, on the same pages, must survive. */
static volatile int helper_stop;
static void *helper(void *a)
{
    (void)a;
    while (!helper_stop)
        usleep(500);
    return NULL;
}

static unsigned char pat(int r, int i, int k) { return (unsigned char)(r * 31 + i * 7 + k + 1); }

static void test_create_in_place(int with_thread)
{
    pthread_t th;
    if (with_thread) {
        helper_stop = 0;
        pthread_create(&th, NULL, helper, NULL);
    }
    enum { NB = 3 * 4096 + 600 };
    unsigned char *raw = malloc(NB + 2 * 4096);
    unsigned char *buf = (unsigned char *)(((uintptr_t)raw + 4095) / 4096 * 4096 + 40);
    memset(buf - 40, 0x5a, 40);
    memset(buf + NB, 0xa5, 24);
    for (int k = 0; k < NB; k++)
        buf[k] = (unsigned char)(k * 7 + rank);
    memset(buf + 8, 0, 8);    /* counters: head page, interior */
    memset(buf + 5000, 0, 8); /* (buf + 8 and buf + 5000 are 8-byte aligned) */
    MPI_Win w;
    CHECK(MPI_Win_create(buf, NB, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &w) == MPI_SUCCESS);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    /* head partial page: [0, 4056); whole pages: [4056, 12248); tail: [12248, NB) */
    enum { NR = 7 };
    int offs[NR] = {20, 4000, 4200, 6000, 12200, 12320, NB - 64}; /* disjoint (one epoch) */
    int lens[NR] = {16, 200, 64, 64, 100, 64, 64};
    unsigned char src[NR][256];
    for (int i = 0; i < NR; i++)
        for (int k = 0; k < lens[i]; k++)
            src[i][k] = pat(rank, i, k);
    MPI_Win_fence(0, w);
    for (int i = 0; i < NR; i++)
        CHECK(MPI_Put(src[i], lens[i], MPI_BYTE, right, offs[i], lens[i], MPI_BYTE, w) == MPI_SUCCESS);
    MPI_Win_fence(0, w);
    for (int i = 0; i < NR; i++)
        for (int k = 0; k < lens[i]; k++)
            CHECK(buf[offs[i] + k] == pat(left, i, k));
    /* Bytes no operation touched keep their values. */
    int keep[] = {0, 19, 36, 3999, 4264, 5999, 6064, 12199, 12300, 12319, 12384, NB - 65};
    for (unsigned i = 0; i < sizeof keep / sizeof keep[0]; i++)
        CHECK(buf[keep[i]] == (unsigned char)(keep[i] * 7 + rank));
    /* Gets of every part from the right neighbour (which received from us). */
    unsigned char back[NR][256];
    for (int i = 0; i < NR; i++)
        CHECK(MPI_Get(back[i], lens[i], MPI_BYTE, right, offs[i], lens[i], MPI_BYTE, w) == MPI_SUCCESS);
    MPI_Win_fence(0, w);
    for (int i = 0; i < NR; i++)
        CHECK(memcmp(back[i], src[i], lens[i]) == 0);
    /* Atomics from every rank on rank 0's counters, one in the head page, one inside. */
    MPI_Win_lock_all(0, w);
    long one = 1, old;
    for (int rep = 0; rep < 50; rep++) {
        CHECK(MPI_Fetch_and_op(&one, &old, MPI_LONG, 0, 8, MPI_SUM, w) == MPI_SUCCESS);
        CHECK(MPI_Accumulate(&one, 1, MPI_LONG, 0, 5000, 1, MPI_LONG, MPI_SUM, w) == MPI_SUCCESS);
    }
    MPI_Win_unlock_all(w);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        long a, b;
        memcpy(&a, buf + 8, 8);
        memcpy(&b, buf + 5000, 8);
        CHECK(a == 50L * size && b == 50L * size);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(MPI_Win_free(&w) == MPI_SUCCESS);
    /* After the window: the memory keeps its contents, and the neighbours on its pages theirs. */
    for (int k = 0; k < 40; k++)
        CHECK(buf[k - 40] == 0x5a);
    for (int k = 0; k < 24; k++)
        CHECK(buf[NB + k] == 0xa5);
    for (int i = 0; i < NR; i++)
        CHECK(buf[offs[i]] == pat(left, i, 0));
    buf[100] = 1;
    free(raw);
    if (with_thread) {
        helper_stop = 1;
        pthread_join(th, NULL);
    }
    if (rank == 0)
        printf("create in place (%s) ok\n", with_thread ? "with a thread" : "alone");
}

/* Large puts and gets (the sizes a helper thread shares with the origin and may still be copying when
 * MPI_Put returns; complete at the next flush, unlock or fence): several back to back into overlapping
 * ranges (the last one wins), to the right neighbour and to self, checked after every kind of completion;
 * the origin buffer is reused right after MPI_Win_flush_local. */
static unsigned char bigpat(int who, int k, size_t i) { return (unsigned char)(who * 13 + k * 29 + i % 251 + 3); }

static void test_large_copies(void)
{
    const size_t cap = 4u << 20;
    const size_t sizes[] = {65536, 100000, (1u << 20) + 12345, cap - 4096};
    const size_t nsz = sizeof sizes / sizeof *sizes;
    unsigned char *mem, *buf = malloc(cap), *got = malloc(cap);
    CHECK(buf && got);
    MPI_Win w;
    CHECK(MPI_Win_allocate((MPI_Aint)cap, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &mem, &w) == MPI_SUCCESS);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    for (int round = 0; round < 3; round++) {
        /* Puts of every size into the start of the right neighbour's window, then one to self: the
         * largest is last, so it is what both windows hold. */
        memset(mem, 0, cap);
        MPI_Barrier(MPI_COMM_WORLD);
        if (round == 0)
            MPI_Win_lock_all(0, w);
        else if (round == 1)
            MPI_Win_fence(0, w);
        else
            MPI_Win_lock(MPI_LOCK_SHARED, right, 0, w);
        for (size_t k = 0; k < nsz; k++) {
            for (size_t i = 0; i < sizes[k]; i++)
                buf[i] = bigpat(rank, (int)k, i);
            CHECK(MPI_Put(buf, (int)sizes[k], MPI_BYTE, right, 0, (int)sizes[k], MPI_BYTE, w) == MPI_SUCCESS);
            /* The origin buffer may be reused once the put is complete locally. */
            if (round == 0)
                CHECK(MPI_Win_flush_local(right, w) == MPI_SUCCESS);
            else if (round == 2)
                CHECK(MPI_Win_flush(right, w) == MPI_SUCCESS);
            else
                CHECK(MPI_Win_fence(0, w) == MPI_SUCCESS);
        }
        if (round == 0) {
            CHECK(MPI_Win_flush_all(w) == MPI_SUCCESS);
            MPI_Win_unlock_all(w);
        } else if (round == 1) {
            MPI_Win_fence(0, w);
        } else {
            MPI_Win_unlock(right, w);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        size_t last = sizes[nsz - 1];
        int bad = -1;
        for (size_t i = 0; i < last && bad < 0; i++)
            if (mem[i] != bigpat(left, (int)nsz - 1, i))
                bad = (int)i;
        if (bad >= 0)
            fprintf(stderr, "round %d: byte %d of the window differs after the puts from %d\n", round, bad, left);
        CHECK(bad < 0);
        /* Gets back from the left neighbour's window (which holds what its own left put there). */
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Win_lock_all(0, w);
        int ll = (left + size - 1) % size;
        for (size_t k = 0; k < nsz; k++) {
            memset(got, 0, sizes[k]);
            CHECK(MPI_Get(got, (int)sizes[k], MPI_BYTE, left, 0, (int)sizes[k], MPI_BYTE, w) == MPI_SUCCESS);
            CHECK((k % 2 ? MPI_Win_flush(left, w) : MPI_Win_flush_local_all(w)) == MPI_SUCCESS);
            /* From the end: the helper copies the last chunks, so an incomplete get shows there first. */
            bad = -1;
            for (size_t i = sizes[k]; i-- > 0 && bad < 0;)
                if (got[i] != bigpat(ll, (int)nsz - 1, i))
                    bad = (int)i;
            if (bad >= 0)
                fprintf(stderr, "round %d: byte %d of a %zu-byte get from %d differs\n", round, bad, sizes[k], left);
            CHECK(bad < 0);
        }
        /* A put to self, completed by one flush, once every get from this window is done. */
        MPI_Barrier(MPI_COMM_WORLD);
        for (size_t i = 0; i < sizes[2]; i++)
            buf[i] = bigpat(rank, 7, i);
        CHECK(MPI_Put(buf, (int)sizes[2], MPI_BYTE, rank, 0, (int)sizes[2], MPI_BYTE, w) == MPI_SUCCESS);
        CHECK(MPI_Win_flush(rank, w) == MPI_SUCCESS);
        CHECK(memcmp(mem, buf, sizes[2]) == 0);
        MPI_Win_unlock_all(w);
    }
    MPI_Win_free(&w);
    free(buf);
    free(got);
    if (rank == 0)
        printf("large puts and gets ok\n");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    check_rank = rank;
    for (int f = 0; f < NFLAVORS; f++) {
        if (f == F_SHARED) {
            /* allocate_shared over COMM_WORLD needs every rank on one node */
            MPI_Comm node;
            int ns;
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
            MPI_Comm_size(node, &ns);
            MPI_Comm_free(&node);
            int all = ns == size, every;
            MPI_Allreduce(&all, &every, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
            if (!every)
                continue;
        }
        test_flavor(f);
    }
    test_shared();
    test_create_in_place(0);
    test_create_in_place(1);
    test_large_copies();
    /* Names and info. */
    MPI_Win w;
    long *m;
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "no_locks", "true");
    CHECK(MPI_Win_allocate(64, 1, info, MPI_COMM_WORLD, &m, &w) == MPI_SUCCESS);
    MPI_Info_free(&info);
    CHECK(MPI_Win_set_name(w, "my window") == MPI_SUCCESS);
    char name[MPI_MAX_OBJECT_NAME];
    int len;
    CHECK(MPI_Win_get_name(w, name, &len) == MPI_SUCCESS && strcmp(name, "my window") == 0 && len == 9);
    MPI_Info used;
    char val[64];
    int flag;
    CHECK(MPI_Win_get_info(w, &used) == MPI_SUCCESS);
    CHECK(MPI_Info_get(used, "no_locks", sizeof val - 1, val, &flag) == MPI_SUCCESS && flag && strcmp(val, "true") == 0);
    MPI_Info_free(&used);
    MPI_Win_free(&w);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS\n");
    MPI_Finalize();
    return 0;
}
