/* MPI_ERRORS_ARE_FATAL (the default): a send to a rank outside the job prints the error, the rank and the
 * call, and ends the job with a non-zero status. */
#include "check.h"

int main(int argc, char **argv)
{
    int rank, size, x = 1;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (rank == 0)
        MPI_Send(&x, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD);
    else
        MPI_Recv(&x, 1, MPI_INT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    fprintf(stderr, "fatal: rank %d survived an erroneous call\n", rank);
    MPI_Finalize();
    return 0;
}
