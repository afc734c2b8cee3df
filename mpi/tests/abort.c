/* MPI_Abort ends the whole job with its code: the last rank aborts with 7 while the others block in a
 * receive that never completes. The job must exit with status 7. */
#include "check.h"
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, x;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == size - 1) {
        usleep(100000);
        MPI_Abort(MPI_COMM_WORLD, 7);
    } else {
        MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    fprintf(stderr, "abort: rank %d survived MPI_Abort\n", rank);
    return 0;
}
