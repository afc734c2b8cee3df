/* Hold a job open: every rank initialises, rank 0 prints HOLDING, all wait argv[1] seconds (default 10)
 * between two barriers, then PASS. Used to have a job running while another tries the same resources. */
#include "check.h"
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, secs = argc > 1 ? atoi(argv[1]) : 10;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        printf("HOLDING\n");
        fflush(stdout);
    }
    sleep(secs);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0)
        printf("PASS\n");
    MPI_Finalize();
    return 0;
}
