/*
 * imb_lite.c -- a small MPI benchmark that prints the Intel MPI Benchmarks
 * (IMB-MPI1) output format.
 *
 * Used by `vmfabric sweep` (and its tests) when the real IMB-MPI1 is not
 * installed: its output parses exactly like IMB-MPI1's.
 *
 *   mpicc.mpich -O2 -Wall -o /tmp/imb_lite bench/c/imb_lite.c
 *   mpiexec.mpich -n 4 /tmp/imb_lite [-iter N] [-time S] [-msglog A:B]
 *                                   [BENCH ...]
 *
 * -iter N     repetitions for small messages (default 1000).  As in IMB, the
 *             repetitions are scaled down for large messages so that each
 *             size moves a bounded volume:
 *                 reps = bytes == 0 ? N : min(N, max(1, 40 MiB / bytes))
 *             (IMB's default OVERALL_VOL is 40 MB).  A few untimed warm-up
 *             iterations (reps/10, at least 1, at most 50) come first.
 * -time S     as IMB's -time: the warm-up's time per iteration (largest over
 *             the ranks) caps reps so that the timed loop of one size takes
 *             about S seconds at most (default 1; IMB's default is 10).
 * -msglog A:B message sizes 0 and 2^A .. 2^B bytes (default 0:22, as IMB);
 *             -msglog B means 0:B.  B <= 30.
 * BENCH       case-insensitive: PingPong PingPing Sendrecv Bcast Allgather
 *             Allgatherv Gather Gatherv Scatter Scatterv Alltoall Alltoallv
 *             Reduce (default: all of them, in this order); Allreduce is
 *             accepted too but not run by default.
 * -help       usage, exit 0.
 * Unknown option or benchmark: an error on stderr (rank 0) and
 * MPI_Abort(MPI_COMM_WORLD, 1).
 *
 * Semantics, as IMB-MPI1:
 *  - PingPong, PingPing: ranks 0 and 1 only; the other ranks wait in
 *    MPI_Barrier ("# ( N additional processes waiting in MPI_Barrier)").
 *    Fewer than 2 ranks: "# PingPong needs 2 processes" and skipped.
 *    PingPong: MPI_Send/MPI_Recv; t = half round trip.  Rank 0 checks that
 *    the first byte that comes back is the one it sent (abort otherwise).
 *    PingPing: both ranks MPI_Isend + MPI_Recv + MPI_Wait at once;
 *    t = time per iteration.  t is the larger of the two ranks' times.
 *    Mbytes/sec = bytes / 2^20 / (t[usec] * 1e-6).
 *  - Sendrecv: periodic chain over all ranks (send to the right, receive
 *    from the left) with MPI_Sendrecv; t per iteration;
 *    Mbytes/sec = 2 * bytes / 2^20 / t_max (IMB takes throughput from t_max).
 *  - Collectives: time per call on each rank; t_min / t_max / t_avg over
 *    ranks (MPI_Reduce of the per-rank average).  Rooted collectives (Bcast,
 *    Gather(v), Scatter(v), Reduce) rotate the root every call, as IMB.
 *    #bytes is the per-rank block (Alltoall: bytes sent to each rank).
 *    Reduce/Allreduce: MPI_FLOAT, MPI_SUM, count = bytes / 4; sizes are
 *    rounded down to a multiple of 4 and duplicates dropped (0, 4, 8, ...),
 *    as IMB does.  The v variants use equal counts with displacement arrays.
 *  - An MPI_Barrier precedes each size's timing loop.
 *
 * Output: rank 0, stdout, flushed after every line; each table ends with an
 * empty line; before MPI_Finalize: "# All processes entering MPI_Finalize".
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define OVERALL_VOL (40L * 1024 * 1024)
#define MEGA 1048576.0
#define MAX_LOG 30

enum kind {
    K_PINGPONG,
    K_PINGPING,
    K_SENDRECV,
    K_BCAST,
    K_ALLGATHER,
    K_ALLGATHERV,
    K_GATHER,
    K_GATHERV,
    K_SCATTER,
    K_SCATTERV,
    K_ALLTOALL,
    K_ALLTOALLV,
    K_REDUCE,
    K_ALLREDUCE,
    K_COUNT
};

static const char *const bench_names[K_COUNT] = {
    "PingPong",  "PingPing",  "Sendrecv", "Bcast",     "Allgather",
    "Allgatherv", "Gather",   "Gatherv",  "Scatter",   "Scatterv",
    "Alltoall",  "Alltoallv", "Reduce",   "Allreduce",
};

/* Benchmarks run when none is named: all but Allreduce, in this order. */
#define N_DEFAULT 13

static int g_rank, g_size;
static double g_time_limit = 1.0; /* -time: seconds per message size */

/* rank 0 only: print one line (or more) and flush */
static void out(const char *fmt, ...)
{
    va_list ap;
    if (g_rank != 0)
        return;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* rank 0 prints the message to stderr; everyone ends up in MPI_Abort(1) */
static void fail(const char *fmt, ...)
{
    if (g_rank == 0) {
        va_list ap;
        fprintf(stderr, "imb_lite: ");
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\n");
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* let rank 0 print before the job is torn down */
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* a fatal error seen by one rank only (allocation, data check) */
static void die_local(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "imb_lite (rank %d): ", g_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: imb_lite [-iter N] [-time S] [-msglog A:B] [BENCH ...]\n"
            "  -iter N      repetitions for small messages (default 1000),\n"
            "               scaled down as min(N, max(1, 40 MiB / bytes))\n"
            "  -time S      at most about S seconds per message size (default 1)\n"
            "  -msglog A:B  sizes 0 and 2^A..2^B bytes (default 0:22)\n"
            "  BENCH        PingPong PingPing Sendrecv Bcast Allgather Allgatherv\n"
            "               Gather Gatherv Scatter Scatterv Alltoall Alltoallv\n"
            "               Reduce (default: all, in this order), Allreduce\n");
}

static int parse_int(const char *s, int lo, int hi, int *v)
{
    char *end = NULL;
    long x;
    errno = 0;
    x = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || x < lo || x > hi)
        return -1;
    *v = (int)x;
    return 0;
}

static void *xmalloc(size_t bytes, int fill)
{
    void *p;
    if (bytes == 0)
        bytes = 1;
    p = malloc(bytes);
    if (p == NULL)
        die_local("cannot allocate %zu bytes", bytes);
    memset(p, fill, bytes); /* touch every page before timing */
    return p;
}

static long reps_for(long n_iter, long bytes)
{
    long r;
    if (bytes <= 0)
        return n_iter;
    r = OVERALL_VOL / bytes;
    if (r < 1)
        r = 1;
    return r < n_iter ? r : n_iter;
}

static long warmup_for(long reps)
{
    long w = reps / 10;
    if (w < 1)
        w = 1;
    return w > 50 ? 50 : w;
}

/*
 * Time bound (IMB's -time): from the warm-up's time per iteration (the
 * largest over all ranks; every rank calls this and gets the same answer),
 * cut reps so that the timed loop takes about g_time_limit seconds at most.
 */
static long budget_reps(double warm_elapsed, long w, long reps)
{
    double per = warm_elapsed / (double)w, worst = 0.0;
    MPI_Allreduce(&per, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (worst > 0.0 && (double)reps * worst > g_time_limit) {
        long cap = (long)(g_time_limit / worst);
        reps = cap < 1 ? 1 : cap;
    }
    return reps;
}

static void rule(int ncols)
{
    /* IMB: the dashed line is as wide as the table (13 chars a column) */
    char line[128];
    int n = 13 * ncols - 1, i;
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[0] = '#';
    for (i = 1; i <= n; i++)
        line[i] = '-';
    line[n + 1] = '\0';
    out("%s\n", line);
}

static int ncols_of(enum kind k)
{
    if (k == K_PINGPONG || k == K_PINGPING)
        return 4;
    if (k == K_SENDRECV)
        return 6;
    return 5;
}

static void header(enum kind k, int nprocs)
{
    int ncols = ncols_of(k);
    int idle = g_size - nprocs;
    rule(ncols);
    out("# Benchmarking %s \n", bench_names[k]);
    out("# #processes = %d \n", nprocs);
    if (idle == 1)
        out("# ( %d additional process waiting in MPI_Barrier)\n", idle);
    else if (idle > 1)
        out("# ( %d additional processes waiting in MPI_Barrier)\n", idle);
    rule(ncols);
    if (ncols == 4)
        out("%13s%13s%13s%13s\n", "#bytes", "#repetitions", "t[usec]",
            "Mbytes/sec");
    else if (ncols == 6)
        out("%13s%13s%13s%13s%13s%13s\n", "#bytes", "#repetitions",
            "t_min[usec]", "t_max[usec]", "t_avg[usec]", "Mbytes/sec");
    else
        out("%13s%13s%13s%13s%13s\n", "#bytes", "#repetitions",
            "t_min[usec]", "t_max[usec]", "t_avg[usec]");
}

static double mbps(double bytes, double t_usec)
{
    if (t_usec <= 0.0)
        return 0.0;
    return bytes / MEGA / (t_usec * 1e-6);
}

/* ---------------------------------------------------------------- */
/* point to point: ranks 0 and 1                                     */

/* n iterations of PingPong or PingPing on ranks 0 and 1; elapsed seconds */
static double loop_p2p(enum kind k, char *sbuf, char *rbuf, int bytes,
                       long first, long n)
{
    long i;
    int peer = 1 - g_rank;
    double t0 = MPI_Wtime();
    MPI_Request req;
    for (i = first; i < first + n; i++) {
        if (k == K_PINGPING) {
            MPI_Isend(sbuf, bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req);
            MPI_Recv(rbuf, bytes, MPI_BYTE, peer, 2, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            MPI_Wait(&req, MPI_STATUS_IGNORE);
        } else if (g_rank == 0) {
            char mark = (char)('A' + i % 26);
            if (bytes > 0) {
                sbuf[0] = mark;
                rbuf[0] = 0;
            }
            MPI_Send(sbuf, bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(rbuf, bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            if (bytes > 0 && rbuf[0] != mark)
                die_local("PingPong data check failed at %d bytes: sent "
                          "first byte 0x%02x, received 0x%02x",
                          bytes, (unsigned char)mark,
                          (unsigned char)rbuf[0]);
        } else {
            MPI_Recv(rbuf, bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            /* echo what arrived, so rank 0 checks the whole round trip */
            MPI_Send(rbuf, bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
        }
    }
    return MPI_Wtime() - t0;
}

static void bench_p2p(enum kind k, long n_iter, const int *sizes, int nsizes)
{
    int s, maxb = 0, active = g_rank < 2;
    char *sbuf, *rbuf;
    if (g_size < 2) {
        out("# %s needs 2 processes\n\n", bench_names[k]);
        return;
    }
    for (s = 0; s < nsizes; s++)
        if (sizes[s] > maxb)
            maxb = sizes[s];
    sbuf = xmalloc((size_t)maxb, 's');
    rbuf = xmalloc((size_t)maxb, 'r');
    header(k, 2);
    for (s = 0; s < nsizes; s++) {
        int bytes = sizes[s];
        long reps = reps_for(n_iter, bytes);
        long w = warmup_for(reps);
        double t = 0.0, tmax = 0.0;
        MPI_Barrier(MPI_COMM_WORLD);
        if (active)
            t = loop_p2p(k, sbuf, rbuf, bytes, 0, w);
        reps = budget_reps(t, w, reps);
        MPI_Barrier(MPI_COMM_WORLD);
        t = 0.0;
        if (active) {
            t = loop_p2p(k, sbuf, rbuf, bytes, w, reps) / (double)reps;
            if (k == K_PINGPONG)
                t /= 2.0; /* half round trip */
        }
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        tmax *= 1e6;
        out("%13d%13ld%13.2f%13.2f\n", bytes, reps, tmax,
            mbps((double)bytes, tmax));
    }
    out("\n");
    free(sbuf);
    free(rbuf);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- */
/* Sendrecv and the collectives: all ranks                           */

struct bufs {
    char *s, *r;
    int *counts, *displs;
};

/* n calls of benchmark k on all ranks; elapsed seconds */
static double loop_all(enum kind k, struct bufs *b, int bytes, long first,
                       long count)
{
    long i;
    int n = g_size, me = g_rank, j;
    int right = (me + 1) % n, left = (me + n - 1) % n;
    int fcount = bytes / 4;
    double t0;

    if (k == K_GATHERV || k == K_SCATTERV || k == K_ALLGATHERV ||
        k == K_ALLTOALLV)
        for (j = 0; j < n; j++) {
            b->counts[j] = bytes;
            b->displs[j] = j * bytes;
        }

    t0 = MPI_Wtime();
    for (i = first; i < first + count; i++) {
        int root = (int)(i % n); /* rotating root, as IMB */
        switch (k) {
        case K_SENDRECV:
            MPI_Sendrecv(b->s, bytes, MPI_BYTE, right, 3, b->r, bytes,
                         MPI_BYTE, left, 3, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
            break;
        case K_BCAST:
            MPI_Bcast(b->s, bytes, MPI_BYTE, root, MPI_COMM_WORLD);
            break;
        case K_ALLGATHER:
            MPI_Allgather(b->s, bytes, MPI_BYTE, b->r, bytes, MPI_BYTE,
                          MPI_COMM_WORLD);
            break;
        case K_ALLGATHERV:
            MPI_Allgatherv(b->s, bytes, MPI_BYTE, b->r, b->counts, b->displs,
                           MPI_BYTE, MPI_COMM_WORLD);
            break;
        case K_GATHER:
            MPI_Gather(b->s, bytes, MPI_BYTE, b->r, bytes, MPI_BYTE, root,
                       MPI_COMM_WORLD);
            break;
        case K_GATHERV:
            MPI_Gatherv(b->s, bytes, MPI_BYTE, b->r, b->counts, b->displs,
                        MPI_BYTE, root, MPI_COMM_WORLD);
            break;
        case K_SCATTER:
            MPI_Scatter(b->s, bytes, MPI_BYTE, b->r, bytes, MPI_BYTE, root,
                        MPI_COMM_WORLD);
            break;
        case K_SCATTERV:
            MPI_Scatterv(b->s, b->counts, b->displs, MPI_BYTE, b->r, bytes,
                         MPI_BYTE, root, MPI_COMM_WORLD);
            break;
        case K_ALLTOALL:
            MPI_Alltoall(b->s, bytes, MPI_BYTE, b->r, bytes, MPI_BYTE,
                         MPI_COMM_WORLD);
            break;
        case K_ALLTOALLV:
            MPI_Alltoallv(b->s, b->counts, b->displs, MPI_BYTE, b->r,
                          b->counts, b->displs, MPI_BYTE, MPI_COMM_WORLD);
            break;
        case K_REDUCE:
            MPI_Reduce(b->s, b->r, fcount, MPI_FLOAT, MPI_SUM, root,
                       MPI_COMM_WORLD);
            break;
        case K_ALLREDUCE:
            MPI_Allreduce(b->s, b->r, fcount, MPI_FLOAT, MPI_SUM,
                          MPI_COMM_WORLD);
            break;
        default:
            break;
        }
    }
    return MPI_Wtime() - t0;
}

static void bench_all(enum kind k, long n_iter, const int *sizes, int nsizes)
{
    int s, maxb = 0, last = -1;
    int reduce = k == K_REDUCE || k == K_ALLREDUCE;
    size_t blen;
    struct bufs b;

    for (s = 0; s < nsizes; s++)
        if (sizes[s] > maxb)
            maxb = sizes[s];
    /* Gather/Scatter/Allgather/Alltoall need a block per rank */
    blen = (size_t)maxb;
    if (k != K_SENDRECV && k != K_BCAST && !reduce)
        blen *= (size_t)g_size;
    if (k != K_SENDRECV && k != K_BCAST && !reduce &&
        (double)maxb * (double)g_size > 2147483647.0)
        fail("%s: %d bytes x %d processes overflows an int displacement",
             bench_names[k], maxb, g_size);
    b.s = xmalloc(blen, 0);
    b.r = xmalloc(blen, 0);
    if (reduce) {
        /* sum small floats: no overflow, no NaN */
        float *f = (float *)b.s;
        size_t j;
        for (j = 0; j < blen / sizeof(float); j++)
            f[j] = 1.0f;
    }
    b.counts = xmalloc((size_t)g_size * sizeof(int), 0);
    b.displs = xmalloc((size_t)g_size * sizeof(int), 0);

    header(k, g_size);
    for (s = 0; s < nsizes; s++) {
        int bytes = sizes[s];
        long reps, w;
        double t, tmin = 0.0, tmax = 0.0, tsum = 0.0;
        if (reduce) {
            bytes = bytes / 4 * 4;
            if (bytes == last)
                continue;
        }
        last = bytes;
        reps = reps_for(n_iter, bytes);
        w = warmup_for(reps);
        MPI_Barrier(MPI_COMM_WORLD);
        t = loop_all(k, &b, bytes, 0, w);
        reps = budget_reps(t, w, reps);
        MPI_Barrier(MPI_COMM_WORLD);
        t = loop_all(k, &b, bytes, w, reps) / (double)reps;
        MPI_Reduce(&t, &tmin, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
        MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        MPI_Reduce(&t, &tsum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        tmin *= 1e6;
        tmax *= 1e6;
        tsum = tsum * 1e6 / (double)g_size;
        if (k == K_SENDRECV)
            out("%13d%13ld%13.2f%13.2f%13.2f%13.2f\n", bytes, reps, tmin,
                tmax, tsum, mbps(2.0 * (double)bytes, tmax));
        else
            out("%13d%13ld%13.2f%13.2f%13.2f\n", bytes, reps, tmin, tmax,
                tsum);
    }
    out("\n");
    free(b.s);
    free(b.r);
    free(b.counts);
    free(b.displs);
    MPI_Barrier(MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- */

int main(int argc, char **argv)
{
    int n_iter = 1000, lo = 0, hi = 22, i, nb = 0, nsizes = 0;
    enum kind todo[64];
    int sizes[MAX_LOG + 2];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-iter") == 0) {
            if (i + 1 >= argc ||
                parse_int(argv[i + 1], 1, 1000000000, &n_iter) != 0)
                fail("-iter needs a positive integer");
            i++;
        } else if (strcmp(a, "-time") == 0) {
            char *end = NULL;
            double v = 0.0;
            if (i + 1 < argc) {
                errno = 0;
                v = strtod(argv[i + 1], &end);
            }
            if (i + 1 >= argc || errno != 0 || end == argv[i + 1] ||
                *end != '\0' || !(v > 0.0) || v > 1e6)
                fail("-time needs a positive number of seconds");
            g_time_limit = v;
            i++;
        } else if (strcmp(a, "-msglog") == 0) {
            char buf[64], *colon;
            if (i + 1 >= argc || strlen(argv[i + 1]) >= sizeof buf)
                fail("-msglog needs A:B (0 <= A <= B <= %d)", MAX_LOG);
            strcpy(buf, argv[i + 1]);
            colon = strchr(buf, ':');
            if (colon != NULL) {
                *colon = '\0';
                if (parse_int(buf, 0, MAX_LOG, &lo) != 0 ||
                    parse_int(colon + 1, 0, MAX_LOG, &hi) != 0 || lo > hi)
                    fail("bad -msglog '%s' (want A:B, 0 <= A <= B <= %d)",
                         argv[i + 1], MAX_LOG);
            } else {
                lo = 0;
                if (parse_int(buf, 0, MAX_LOG, &hi) != 0)
                    fail("bad -msglog '%s' (want A:B, 0 <= A <= B <= %d)",
                         argv[i + 1], MAX_LOG);
            }
            i++;
        } else if (strcmp(a, "-help") == 0 || strcmp(a, "-h") == 0 ||
                   strcmp(a, "--help") == 0) {
            if (g_rank == 0)
                usage(stdout);
            MPI_Finalize();
            return 0;
        } else if (a[0] == '-') {
            if (g_rank == 0)
                usage(stderr);
            fail("unknown option '%s'", a);
        } else {
            int k, found = -1;
            for (k = 0; k < K_COUNT; k++)
                if (strcasecmp(a, bench_names[k]) == 0)
                    found = k;
            if (found < 0) {
                if (g_rank == 0)
                    usage(stderr);
                fail("unknown benchmark '%s'", a);
            }
            if (nb >= (int)(sizeof todo / sizeof todo[0]))
                fail("too many benchmarks named");
            todo[nb++] = (enum kind)found;
        }
    }
    if (nb == 0)
        for (nb = 0; nb < N_DEFAULT; nb++)
            todo[nb] = (enum kind)nb;

    sizes[nsizes++] = 0;
    for (i = lo; i <= hi; i++)
        sizes[nsizes++] = 1 << i;

    out("#------------------------------------------------------------\n");
    out("#    imb_lite (vmfabric), IMB-MPI1 output format\n");
    out("#------------------------------------------------------------\n");
    out("# Calling sequence was: \n\n#");
    for (i = 0; i < argc; i++)
        out(" %s", argv[i]);
    out("\n\n");
    out("# Minimum message length in bytes:   %d\n", 0);
    out("# Maximum message length in bytes:   %d\n", sizes[nsizes - 1]);
    out("#\n");
    out("# MPI_Datatype                   :   MPI_BYTE \n");
    out("# MPI_Datatype for reductions    :   MPI_FLOAT \n");
    out("# MPI_Op                         :   MPI_SUM  \n");
    out("#\n#\n\n");
    out("# List of Benchmarks to run:\n\n");
    for (i = 0; i < nb; i++)
        out("# %s\n", bench_names[todo[i]]);
    out("\n");

    for (i = 0; i < nb; i++) {
        if (todo[i] == K_PINGPONG || todo[i] == K_PINGPING)
            bench_p2p(todo[i], n_iter, sizes, nsizes);
        else
            bench_all(todo[i], n_iter, sizes, nsizes);
    }

    MPI_Barrier(MPI_COMM_WORLD);
    out("\n\n# All processes entering MPI_Finalize\n\n");
    MPI_Finalize();
    return 0;
}
