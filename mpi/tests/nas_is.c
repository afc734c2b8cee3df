/* An NPB-IS-like integer bucket sort: keys generated per rank, bucket counts with MPI_Allreduce,
 * key redistribution with MPI_Alltoall + MPI_Alltoallv, local sort, and full verification (global order
 * across ranks with MPI_Sendrecv, key count with MPI_Reduce, checksum with MPI_Allreduce). */
#include "check.h"

#define MAXKEY (1 << 16)

static unsigned rng(unsigned *s) { *s = *s * 1103515245u + 12345u; return (*s >> 8) & (MAXKEY - 1); }
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int R, N;
    MPI_Comm_rank(MPI_COMM_WORLD, &R);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    check_rank = R;
    const int nkeys = 1 << 17;
    for (int iter = 0; iter < 3; iter++) {
        int *keys = malloc(sizeof(int) * nkeys);
        unsigned seed = 314159u + R * 7919u + iter;
        long sum = 0;
        for (int i = 0; i < nkeys; i++) { keys[i] = rng(&seed); sum += keys[i]; }
        /* each rank owns a contiguous key range */
        int per = MAXKEY / N + 1;
        int *scnt = calloc(N, sizeof(int)), *rcnt = calloc(N, sizeof(int)), *sd = calloc(N, sizeof(int)), *rd = calloc(N, sizeof(int));
        for (int i = 0; i < nkeys; i++) scnt[keys[i] / per]++;
        int *bucket_tot = calloc(N, sizeof(int));
        MPI_Allreduce(scnt, bucket_tot, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Alltoall(scnt, 1, MPI_INT, rcnt, 1, MPI_INT, MPI_COMM_WORLD);
        int rtot = 0;
        for (int k = 0; k < N; k++) { rd[k] = rtot; rtot += rcnt[k]; }
        CHECK(rtot == bucket_tot[R]);
        int *sorted = malloc(sizeof(int) * nkeys), *pos = calloc(N, sizeof(int));
        for (int k = 1; k < N; k++) sd[k] = sd[k - 1] + scnt[k - 1];
        for (int i = 0; i < nkeys; i++) { int b = keys[i] / per; sorted[sd[b] + pos[b]++] = keys[i]; }
        int *mine = malloc(sizeof(int) * (rtot + 1));
        MPI_Alltoallv(sorted, scnt, sd, MPI_INT, mine, rcnt, rd, MPI_INT, MPI_COMM_WORLD);
        qsort(mine, rtot, sizeof(int), cmp);
        for (int i = 0; i < rtot; i++) {
            CHECK(mine[i] / per == R);
            if (i) CHECK(mine[i - 1] <= mine[i]);
        }
        /* boundary check with neighbours: my first key >= previous rank's last key */
        int last = rtot ? mine[rtot - 1] : -1, plast = -1;
        MPI_Sendrecv(&last, 1, MPI_INT, R + 1 < N ? R + 1 : MPI_PROC_NULL, 0, &plast, 1, MPI_INT, R > 0 ? R - 1 : MPI_PROC_NULL, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rtot && R > 0) CHECK(plast <= mine[0]);
        long mysum = 0, gsum = 0, gsum0 = 0;
        for (int i = 0; i < rtot; i++) mysum += mine[i];
        MPI_Allreduce(&mysum, &gsum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(&sum, &gsum0, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        CHECK(gsum == gsum0);
        long total = 0, lt = rtot;
        MPI_Reduce(&lt, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (R == 0) CHECK(total == (long)nkeys * N);
        free(keys); free(scnt); free(rcnt); free(sd); free(rd); free(bucket_tot); free(sorted); free(pos); free(mine);
    }
    if (R == 0) printf("PASS nas_is\n");
    MPI_Finalize();
    return 0;
}
