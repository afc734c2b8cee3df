/*
 * mpi_pingpong.c -- OSU-style point-to-point micro-benchmarks for MPI.
 *
 * Used as the MPICH / Open MPI baseline for vmfabric (see bench/README.md).
 *
 *   mpi_pingpong latency|bw|bibw [--sizes 8,64,...] [--iters N]
 *                [--warmup N] [--window W] [--json FILE] [--label NAME]
 *
 * Exactly two ranks are used (rank 0 <-> rank 1); extra ranks idle.
 *
 * latency : blocking MPI_Send/MPI_Recv ping-pong.  After `warmup`
 *           untimed round trips, `iters` round trips are timed as a
 *           whole; latency_us = elapsed / (2 * iters)  (the MEAN half
 *           round trip, as the OSU micro-benchmarks report it).
 *           mb_per_s = size / latency_us.
 * bw      : rank 0 posts a window of 64 MPI_Isend, MPI_Waitall, then
 *           waits for a 4-byte ack from rank 1 (which posted 64
 *           MPI_Irecv + MPI_Waitall).  mb_per_s =
 *           size * window * iters / elapsed / 1e6.
 * bibw    : both ranks post a window of 64 MPI_Irecv and 64 MPI_Isend to
 *           each other, then MPI_Waitall; bytes of BOTH directions are
 *           counted (OSU osu_bibw convention): mb_per_s =
 *           2 * size * window * iters / elapsed / 1e6.
 *
 * As in OSU, all messages of a window share one send buffer and one
 * receive buffer.  Buffers are page-aligned and touched before timing.
 *
 * N defaults to 100000 (latency) / 10000 (bw, bibw).
 * Iterations for size s: max(20, min(N, N * 8192 / s)) so that large
 * sizes stay quick; warmup = max(2, iters / 10) unless --warmup given.
 *
 * JSON (rank 0 only):
 *   {"benchmark": "latency", "transport": "<label>",
 *    "results": [{"size": 8, "latency_us": 0.12, "mb_per_s": 66.1}, ...]}
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_SIZES 64
#define DEFAULT_WINDOW 64
#define TAG_DATA 1
#define TAG_ACK 2

enum mode { MODE_LATENCY, MODE_BW, MODE_BIBW };

static const long default_sizes[] = {8, 64, 512, 4096, 16384, 65536,
                                     262144, 1048576, 4194304};

struct result {
    long size;
    long iters;
    double latency_us; /* latency mode only */
    double mb_per_s;
};

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s latency|bw|bibw [--sizes 8,64,...] [--iters N]\n"
            "          [--warmup N] [--window W] [--json FILE] [--label NAME]\n"
            "defaults: sizes 8,64,512,4096,16384,65536,262144,1048576,4194304;\n"
            "          iters 100000 (latency) / 10000 (bw, bibw), scaled down for\n"
            "          large sizes as max(20, min(N, N*8192/size)); window 64\n",
            prog);
}

static long parse_long(const char *s, const char *what)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v <= 0) {
        fprintf(stderr, "mpi_pingpong: invalid %s: '%s'\n", what, s);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return v;
}

static int parse_sizes(const char *arg, long *out)
{
    char *copy = strdup(arg);
    char *save = NULL;
    int n = 0;
    if (copy == NULL) {
        MPI_Abort(MPI_COMM_WORLD, 2);
        return 0;
    }
    for (char *tok = strtok_r(copy, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        if (*tok == '\0')
            continue;
        if (n >= MAX_SIZES) {
            fprintf(stderr, "mpi_pingpong: too many sizes (max %d)\n", MAX_SIZES);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        out[n++] = parse_long(tok, "size");
    }
    free(copy);
    if (n == 0) {
        fprintf(stderr, "mpi_pingpong: empty --sizes list\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return n;
}

static long iters_for_size(long n, long size)
{
    long scaled = (long)((int64_t)n * 8192 / size);
    long it = n < scaled ? n : scaled;
    return it > 20 ? it : 20;
}

static void *alloc_buffer(size_t bytes, int fill)
{
    long page = sysconf(_SC_PAGESIZE);
    void *p = NULL;
    if (page <= 0)
        page = 4096;
    if (bytes == 0)
        bytes = 1;
    if (posix_memalign(&p, (size_t)page, bytes) != 0) {
        fprintf(stderr, "mpi_pingpong: cannot allocate %zu bytes\n", bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(p, fill, bytes); /* touch every page before timing */
    return p;
}

static double run_latency(int rank, char *sbuf, char *rbuf, long size,
                          long warmup, long iters)
{
    double t0 = 0.0;
    int count = (int)size;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank == 0) {
            MPI_Send(sbuf, count, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD);
            MPI_Recv(rbuf, count, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(rbuf, count, MPI_CHAR, 0, TAG_DATA, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
            MPI_Send(sbuf, count, MPI_CHAR, 0, TAG_DATA, MPI_COMM_WORLD);
        }
    }
    double elapsed = MPI_Wtime() - t0;
    return elapsed * 1e6 / (2.0 * (double)iters); /* mean half round trip, us */
}

static double run_bw(int rank, char *sbuf, char *rbuf, long size, long warmup,
                     long iters, int window, MPI_Request *reqs,
                     MPI_Status *stats)
{
    double t0 = 0.0;
    int count = (int)size;
    char ack[4] = {0, 0, 0, 0};
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank == 0) {
            for (int w = 0; w < window; w++)
                MPI_Isend(sbuf, count, MPI_CHAR, 1, TAG_DATA, MPI_COMM_WORLD,
                          &reqs[w]);
            MPI_Waitall(window, reqs, stats);
            MPI_Recv(ack, 4, MPI_CHAR, 1, TAG_ACK, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            for (int w = 0; w < window; w++)
                MPI_Irecv(rbuf, count, MPI_CHAR, 0, TAG_DATA, MPI_COMM_WORLD,
                          &reqs[w]);
            MPI_Waitall(window, reqs, stats);
            MPI_Send(ack, 4, MPI_CHAR, 0, TAG_ACK, MPI_COMM_WORLD);
        }
    }
    double elapsed = MPI_Wtime() - t0;
    return (double)size * window * (double)iters / elapsed / 1e6;
}

static double run_bibw(int rank, char *sbuf, char *rbuf, long size,
                       long warmup, long iters, int window, MPI_Request *reqs,
                     MPI_Status *stats)
{
    double t0 = 0.0;
    int count = (int)size;
    int peer = rank == 0 ? 1 : 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (long i = 0; i < warmup + iters; i++) {
        if (i == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank <= 1) {
            for (int w = 0; w < window; w++)
                MPI_Irecv(rbuf, count, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD,
                          &reqs[w]);
            for (int w = 0; w < window; w++)
                MPI_Isend(sbuf, count, MPI_CHAR, peer, TAG_DATA, MPI_COMM_WORLD,
                          &reqs[window + w]);
            MPI_Waitall(2 * window, reqs, stats);
        }
    }
    double elapsed = MPI_Wtime() - t0;
    return 2.0 * (double)size * window * (double)iters / elapsed / 1e6;
}

static void json_escape(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int write_json(const char *path, const char *bench, const char *label,
                      const struct result *res, int n, enum mode mode)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "mpi_pingpong: cannot write %s: %s\n", path,
                strerror(errno));
        return -1;
    }
    fprintf(f, "{\"benchmark\": ");
    json_escape(f, bench);
    fprintf(f, ", \"transport\": ");
    json_escape(f, label);
    fprintf(f, ", \"results\": [");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s{\"size\": %ld", i ? ", " : "", res[i].size);
        if (mode == MODE_LATENCY)
            fprintf(f, ", \"latency_us\": %.4f", res[i].latency_us);
        fprintf(f, ", \"mb_per_s\": %.2f}", res[i].mb_per_s);
    }
    fprintf(f, "]}\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "mpi_pingpong: error closing %s\n", path);
        return -1;
    }
    return 0;
}

static void default_label(char *out, size_t len)
{
    char ver[MPI_MAX_LIBRARY_VERSION_STRING];
    int vlen = 0;
    MPI_Get_library_version(ver, &vlen);
    if (strstr(ver, "Open MPI") != NULL)
        snprintf(out, len, "openmpi");
    else if (strstr(ver, "MPICH") != NULL)
        snprintf(out, len, "mpich");
    else
        snprintf(out, len, "mpi");
}

int main(int argc, char **argv)
{
    int rank = 0, nprocs = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);

    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        if (rank == 0)
            usage(argc < 2 ? stderr : stdout, argv[0]);
        MPI_Finalize();
        return argc < 2 ? 2 : 0;
    }

    enum mode mode;
    if (strcmp(argv[1], "latency") == 0)
        mode = MODE_LATENCY;
    else if (strcmp(argv[1], "bw") == 0)
        mode = MODE_BW;
    else if (strcmp(argv[1], "bibw") == 0)
        mode = MODE_BIBW;
    else {
        if (rank == 0) {
            fprintf(stderr, "mpi_pingpong: unknown mode '%s'\n", argv[1]);
            usage(stderr, argv[0]);
        }
        MPI_Finalize();
        return 2;
    }

    long sizes[MAX_SIZES];
    int nsizes = (int)(sizeof(default_sizes) / sizeof(default_sizes[0]));
    memcpy(sizes, default_sizes, sizeof(default_sizes));
    long n_iters = mode == MODE_LATENCY ? 100000 : 10000;
    long warmup_opt = -1;
    int window = DEFAULT_WINDOW;
    const char *json_path = NULL;
    char label[256];
    default_label(label, sizeof(label));

    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--sizes") == 0 && v) {
            nsizes = parse_sizes(v, sizes);
            i++;
        } else if (strcmp(a, "--iters") == 0 && v) {
            n_iters = parse_long(v, "--iters");
            i++;
        } else if (strcmp(a, "--warmup") == 0 && v) {
            warmup_opt = strcmp(v, "0") == 0 ? 0 : parse_long(v, "--warmup");
            i++;
        } else if (strcmp(a, "--window") == 0 && v) {
            window = (int)parse_long(v, "--window");
            i++;
        } else if (strcmp(a, "--json") == 0 && v) {
            json_path = v;
            i++;
        } else if (strcmp(a, "--label") == 0 && v) {
            snprintf(label, sizeof(label), "%s", v);
            i++;
        } else {
            if (rank == 0) {
                fprintf(stderr, "mpi_pingpong: bad argument '%s'\n", a);
                usage(stderr, argv[0]);
            }
            MPI_Finalize();
            return 2;
        }
    }

    if (nprocs < 2) {
        if (rank == 0)
            fprintf(stderr, "mpi_pingpong: needs at least 2 ranks (got %d)\n",
                    nprocs);
        MPI_Finalize();
        return 2;
    }

    long max_size = 4;
    for (int i = 0; i < nsizes; i++) {
        if (sizes[i] > max_size)
            max_size = sizes[i];
        if (sizes[i] > 0x7fffffffL) {
            if (rank == 0)
                fprintf(stderr, "mpi_pingpong: size %ld too large\n", sizes[i]);
            MPI_Finalize();
            return 2;
        }
    }

    char *sbuf = alloc_buffer((size_t)max_size, 'a' + rank);
    char *rbuf = alloc_buffer((size_t)max_size, 0);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * (size_t)window);
    /* a real status array (not MPI_STATUSES_IGNORE): GCC 12 warns
     * -Wstringop-overflow on the MPI_STATUSES_IGNORE sentinel */
    MPI_Status *stats = malloc(sizeof(MPI_Status) * 2 * (size_t)window);
    struct result *res = calloc((size_t)nsizes, sizeof(*res));
    if (reqs == NULL || stats == NULL || res == NULL) {
        fprintf(stderr, "mpi_pingpong: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
        return 1;
    }

    static const char *names[] = {"latency", "bw", "bibw"};
    if (rank == 0) {
        if (mode == MODE_LATENCY)
            printf("# mpi_pingpong latency  transport=%s  ranks=%d  "
                   "(mean half round trip)\n", label, nprocs);
        else
            printf("# mpi_pingpong %s  transport=%s  ranks=%d  window=%d  (%s)\n",
                   names[mode], label, nprocs, window,
                   mode == MODE_BW ? "unidirectional"
                                   : "both directions counted");
        if (mode == MODE_LATENCY)
            printf("%10s %10s %14s %14s\n", "size", "iters", "latency_us",
                   "mb_per_s");
        else
            printf("%10s %10s %14s\n", "size", "iters", "mb_per_s");
        fflush(stdout);
    }

    for (int s = 0; s < nsizes; s++) {
        long size = sizes[s];
        long iters = iters_for_size(n_iters, size);
        long warmup = warmup_opt >= 0 ? warmup_opt : (iters / 10 > 2 ? iters / 10 : 2);
        struct result *r = &res[s];
        r->size = size;
        r->iters = iters;
        if (mode == MODE_LATENCY) {
            r->latency_us = run_latency(rank, sbuf, rbuf, size, warmup, iters);
            r->mb_per_s = (double)size / r->latency_us;
        } else if (mode == MODE_BW) {
            r->mb_per_s = run_bw(rank, sbuf, rbuf, size, warmup, iters, window, reqs, stats);
        } else {
            r->mb_per_s = run_bibw(rank, sbuf, rbuf, size, warmup, iters, window, reqs, stats);
        }
        if (rank == 0) {
            if (mode == MODE_LATENCY)
                printf("%10ld %10ld %14.3f %14.2f\n", size, iters, r->latency_us,
                       r->mb_per_s);
            else
                printf("%10ld %10ld %14.2f\n", size, iters, r->mb_per_s);
            fflush(stdout);
        }
    }

    int rc = 0;
    if (rank == 0 && json_path != NULL)
        rc = write_json(json_path, names[mode], label, res, nsizes, mode) == 0 ? 0 : 1;

    free(res);
    free(stats);
    free(reqs);
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return rc;
}
