/*
 * coll_args.h -- the options mpi_coll.c and alltoall_floor.c share, parsed alike so that both measure
 * the same sizes with the same iteration counts:
 *   --sizes a,b,...  --iters N  --warmup N  --json FILE  --label NAME
 */
#ifndef VMF_BENCH_COLL_ARGS_H
#define VMF_BENCH_COLL_ARGS_H
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64

struct coll_args {
    long sizes[MAX_SIZES];
    int nsizes;
    long iters, warmup;
    const char *json, *label;
};

/* Defaults: the sizes 8 B .. 1 MiB, 10000 iterations, warmup chosen per size, no JSON. */
static inline void coll_args_init(struct coll_args *a, const char *label)
{
    static const long def[] = {8, 64, 512, 4096, 32768, 262144, 1048576};
    memcpy(a->sizes, def, sizeof def);
    a->nsizes = (int)(sizeof def / sizeof def[0]);
    a->iters = 10000;
    a->warmup = -1;
    a->json = NULL;
    a->label = label;
}

/* If argv[*i] is one of the shared options, consume it (and its value) and return 1; else return 0. */
static inline int coll_args_take(struct coll_args *a, int argc, char **argv, int *i)
{
    const char *o = argv[*i];
    if (*i + 1 >= argc) return 0;
    if (!strcmp(o, "--iters")) a->iters = atol(argv[++*i]);
    else if (!strcmp(o, "--warmup")) a->warmup = atol(argv[++*i]);
    else if (!strcmp(o, "--json")) a->json = argv[++*i];
    else if (!strcmp(o, "--label")) a->label = argv[++*i];
    else if (!strcmp(o, "--sizes")) {
        char *tok;
        a->nsizes = 0;
        for (tok = strtok(argv[++*i], ","); tok && a->nsizes < MAX_SIZES; tok = strtok(NULL, ","))
            a->sizes[a->nsizes++] = atol(tok);
    } else return 0;
    return 1;
}

/* Iterations and warmup calls for size s: max(10, min(N, N * 8192 / s)); warmup max(2, iters / 10). */
static inline void coll_args_counts(const struct coll_args *a, long s, long *it, long *wu)
{
    long n = s > 0 ? a->iters * 8192 / s : a->iters;
    if (n > a->iters) n = a->iters;
    if (n < 10) n = 10;
    *it = n;
    *wu = a->warmup >= 0 ? a->warmup : (n / 10 > 2 ? n / 10 : 2);
}
#endif
