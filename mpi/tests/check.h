/* Shared helpers of the MPI semantic tests: CHECK aborts the job (exit code 99) with file:line. */
#ifndef VMF_MPI_CHECK_H
#define VMF_MPI_CHECK_H
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_rank __attribute__((unused)) = -1;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "CHECK FAILED on rank %d at %s:%d: %s\n", check_rank, __FILE__,  \
                    __LINE__, #cond);                                                        \
            fflush(stderr);                                                                  \
            MPI_Abort(MPI_COMM_WORLD, 99);                                                   \
        }                                                                                    \
    } while (0)

#define CHECK_RC(call, want)                                                                 \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        int cls_ = -1;                                                                       \
        MPI_Error_class(rc_, &cls_);                                                         \
        if (cls_ != (want)) {                                                                \
            fprintf(stderr, "CHECK FAILED on rank %d at %s:%d: %s returned %d (class %d), "  \
                    "expected class %d\n", check_rank, __FILE__, __LINE__, #call, rc_, cls_, \
                    (want));                                                                 \
            fflush(stderr);                                                                  \
            MPI_Abort(MPI_COMM_WORLD, 99);                                                   \
        }                                                                                    \
    } while (0)

__attribute__((unused)) static void fill(unsigned char *b, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(i * 31 + seed * 7 + (i >> 8));
}

__attribute__((unused)) static int same(const unsigned char *b, size_t n, int seed)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(i * 31 + seed * 7 + (i >> 8)))
            return 0;
    return 1;
}
#endif
