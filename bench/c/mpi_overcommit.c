/*
 * mpi_overcommit.c -- MPI twin of `vmfabric bench overcommit`.
 *
 * Communication patterns that suffer when waiting ranks burn the CPU that
 * the ranks they wait for need (more ranks than cores).  Used as the MPICH /
 * Open MPI baseline for vmfabric's wait policies (see bench/README.md).
 *
 *   mpi_overcommit [--pattern ring|alltoall] [--rounds N] [--compute U]
 *                  [--noise] [--json FILE] [--label NAME] [--wait-label W]
 *
 * ring     : an 8-byte token goes 0 -> 1 -> ... -> K-1 -> 0, `rounds` laps
 *            (rank 0 sends then receives, the others receive then send;
 *            blocking MPI_Send/MPI_Recv, tag 1).  Default 10000 laps.
 * alltoall : each round every rank posts MPI_Irecv of a 64-byte (tag 2) and
 *            an 8192-byte (tag 3) message from every other rank, then
 *            MPI_Isend of the same to every other rank in the order
 *            (me+1)%K, (me+2)%K, ..., MPI_Waitall, then compute(U): about
 *            U microseconds of serial arithmetic.  Default 2000 rounds, U=50.
 *
 * Wall time is measured by rank 0 between two barriers; cpu_s is the sum
 * over ranks of user+system CPU time (getrusage RUSAGE_SELF) spent in the
 * measured section.  --noise: rank 0 runs `sh -c 'while :; do :; done'`
 * for the duration (a CPU burner, like a noisy neighbour VM).
 *
 * JSON (rank 0 only):
 *   {"benchmark": "overcommit", "pattern": "alltoall", "ranks": 4,
 *    "wait": "<wait-label>", "wall_s": 0.25, "cpu_s": 0.5, "rounds": 2000,
 *    "us_per_round": 125.0, "noise": false, "implementation": "<label>"}
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define SMALL 64
#define MEDIUM 8192
#define TAG_RING 1
#define TAG_SMALL 2
#define TAG_MEDIUM 3

enum pattern { PAT_RING, PAT_ALLTOALL };

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [--pattern ring|alltoall] [--rounds N] [--compute U]\n"
            "          [--noise] [--json FILE] [--label NAME] [--wait-label W]\n"
            "defaults: pattern alltoall; rounds 10000 (ring) / 2000 (alltoall);\n"
            "          compute 50 units (about 1 us each) between all-to-all rounds\n",
            prog);
}

static long parse_long(const char *s, const char *what, long min)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < min) {
        fprintf(stderr, "mpi_overcommit: invalid %s: '%s'\n", what, s);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return v;
}

/* About `units` microseconds of arithmetic the optimiser cannot remove. */
static uint64_t compute(long units)
{
    volatile uint64_t x = 0x9E3779B97F4A7C15ULL;
    for (long i = 0; i < units * 750; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

static double cpu_time_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0.0;
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
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

static pid_t start_noise(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        execlp("sh", "sh", "-c", "while :; do :; done", (char *)NULL);
        _exit(127);
    }
    if (pid < 0)
        fprintf(stderr, "mpi_overcommit: cannot start the noise process: %s\n",
                strerror(errno));
    return pid;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);

    enum pattern pat = PAT_ALLTOALL;
    long rounds = -1, units = 50;
    int noise = 0;
    const char *json_path = NULL, *label = "mpi", *wait_label = "default";

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--pattern") == 0 && v) {
            if (strcmp(v, "ring") == 0)
                pat = PAT_RING;
            else if (strcmp(v, "alltoall") == 0)
                pat = PAT_ALLTOALL;
            else {
                if (me == 0)
                    fprintf(stderr, "mpi_overcommit: unknown pattern '%s'\n", v);
                MPI_Abort(MPI_COMM_WORLD, 2);
            }
            i++;
        } else if (strcmp(a, "--rounds") == 0 && v) {
            rounds = parse_long(v, "--rounds", 1);
            i++;
        } else if (strcmp(a, "--compute") == 0 && v) {
            units = parse_long(v, "--compute", 0);
            i++;
        } else if (strcmp(a, "--noise") == 0) {
            noise = 1;
        } else if (strcmp(a, "--json") == 0 && v) {
            json_path = v;
            i++;
        } else if (strcmp(a, "--label") == 0 && v) {
            label = v;
            i++;
        } else if (strcmp(a, "--wait-label") == 0 && v) {
            wait_label = v;
            i++;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            if (me == 0)
                usage(stdout, argv[0]);
            MPI_Finalize();
            return 0;
        } else {
            if (me == 0) {
                fprintf(stderr, "mpi_overcommit: bad argument '%s'\n", a);
                usage(stderr, argv[0]);
            }
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (rounds < 0)
        rounds = pat == PAT_RING ? 10000 : 2000;
    if (n < 2) {
        fprintf(stderr, "mpi_overcommit: needs at least 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    pid_t noise_pid = -1;
    if (noise && me == 0)
        noise_pid = start_noise();

    char small[SMALL], *medium = malloc(MEDIUM);
    char *rs = malloc((size_t)n * SMALL), *rm = malloc((size_t)n * MEDIUM);
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 4 * (size_t)n);
    /* a real status array (not MPI_STATUSES_IGNORE): GCC 12 warns
     * -Wstringop-overflow on the MPI_STATUSES_IGNORE sentinel */
    MPI_Status *stats = malloc(sizeof(MPI_Status) * 4 * (size_t)n);
    if (!medium || !rs || !rm || !reqs || !stats) {
        fprintf(stderr, "mpi_overcommit: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(small, 1, SMALL);
    memset(medium, 2, MEDIUM);
    memset(rs, 0, (size_t)n * SMALL);
    memset(rm, 0, (size_t)n * MEDIUM);
    uint64_t sink = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    double cpu0 = cpu_time_s();
    double t0 = MPI_Wtime();
    if (pat == PAT_RING) {
        int next = (me + 1) % n, prev = (me + n - 1) % n;
        uint64_t tok = 0;
        for (long lap = 0; lap < rounds; lap++) {
            if (me == 0) {
                uint64_t out = (uint64_t)lap;
                MPI_Send(&out, 8, MPI_BYTE, next, TAG_RING, MPI_COMM_WORLD);
                MPI_Recv(&tok, 8, MPI_BYTE, prev, TAG_RING, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                if (tok != (uint64_t)lap) {
                    fprintf(stderr, "mpi_overcommit: token corrupted\n");
                    MPI_Abort(MPI_COMM_WORLD, 1);
                }
            } else {
                MPI_Recv(&tok, 8, MPI_BYTE, prev, TAG_RING, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE);
                MPI_Send(&tok, 8, MPI_BYTE, next, TAG_RING, MPI_COMM_WORLD);
            }
        }
    } else {
        for (long r = 0; r < rounds; r++) {
            int nr = 0;
            for (int p = 0; p < n; p++) {
                if (p == me)
                    continue;
                MPI_Irecv(rs + (size_t)p * SMALL, SMALL, MPI_BYTE, p, TAG_SMALL,
                          MPI_COMM_WORLD, &reqs[nr++]);
                MPI_Irecv(rm + (size_t)p * MEDIUM, MEDIUM, MPI_BYTE, p, TAG_MEDIUM,
                          MPI_COMM_WORLD, &reqs[nr++]);
            }
            for (int k = 1; k < n; k++) {
                int p = (me + k) % n;
                MPI_Isend(small, SMALL, MPI_BYTE, p, TAG_SMALL, MPI_COMM_WORLD,
                          &reqs[nr++]);
                MPI_Isend(medium, MEDIUM, MPI_BYTE, p, TAG_MEDIUM, MPI_COMM_WORLD,
                          &reqs[nr++]);
            }
            MPI_Waitall(nr, reqs, stats);
            sink += compute(units);
        }
        for (int p = 0; p < n; p++) {
            if (p != me && (rs[(size_t)p * SMALL] != 1 ||
                            rm[(size_t)p * MEDIUM + MEDIUM - 1] != 2)) {
                fprintf(stderr, "mpi_overcommit: rank %d: payload mismatch\n", me);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double wall = MPI_Wtime() - t0;
    double cpu = cpu_time_s() - cpu0, total = 0.0;
    MPI_Reduce(&cpu, &total, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);

    if (noise_pid > 0) {
        kill(noise_pid, SIGKILL);
        waitpid(noise_pid, NULL, 0);
    }

    if (me == 0) {
        const char *pname = pat == PAT_RING ? "ring" : "alltoall";
        double us = wall * 1e6 / (double)rounds;
        printf("overcommit %s: %d ranks on %ld cpus, %s wait %s%s: wall %.4f s, "
               "cpu %.4f s, %.2f us/round (%ld rounds)\n",
               pname, n, sysconf(_SC_NPROCESSORS_ONLN), label, wait_label,
               noise ? ", with noise" : "", wall, total, us, rounds);
        if (json_path) {
            FILE *f = fopen(json_path, "w");
            if (!f) {
                fprintf(stderr, "mpi_overcommit: cannot write %s: %s\n", json_path,
                        strerror(errno));
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
            fprintf(f, "{\"benchmark\": \"overcommit\", \"pattern\": \"%s\", "
                       "\"ranks\": %d, \"wait\": ", pname, n);
            json_escape(f, wait_label);
            fprintf(f, ", \"wall_s\": %.9g, \"cpu_s\": %.9g, \"rounds\": %ld, "
                       "\"us_per_round\": %.9g, \"noise\": %s, \"implementation\": ",
                    wall, total, rounds, us, noise ? "true" : "false");
            json_escape(f, label);
            fprintf(f, "}\n");
            if (fclose(f) != 0) {
                fprintf(stderr, "mpi_overcommit: cannot write %s\n", json_path);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    if (sink == 42) /* keep the compute results alive */
        fprintf(stderr, "%s", "");
    free(medium);
    free(rs);
    free(rm);
    free(reqs);
    free(stats);
    MPI_Finalize();
    return 0;
}
