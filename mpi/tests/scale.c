/* Start-up at scale (issue 23): MPI_Init, a barrier and an allreduce whose sum is checked; rank 0 prints
 * how long MPI_Init took it and the two collectives. Run with many ranks on one host, e.g.
 * VMF_SHM_MAX_LOCAL=1024 vmfabric run -n 1024 ./scale */
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
  double t0 = MPI_Wtime();
  MPI_Init(&argc, &argv);
  int r, n; MPI_Comm_rank(MPI_COMM_WORLD, &r); MPI_Comm_size(MPI_COMM_WORLD, &n);
  double t1 = MPI_Wtime();
  MPI_Barrier(MPI_COMM_WORLD);
  long v = r, s = 0; MPI_Allreduce(&v, &s, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (s != (long)n * (n - 1) / 2) { printf("rank %d: bad sum %ld\n", r, s); MPI_Abort(MPI_COMM_WORLD, 2); }
  double t2 = MPI_Wtime();
  if (r == 0) printf("scale PASS: %d ranks, init %.3f s (rank 0), barrier+allreduce %.3f s\n", n, t1 - t0, t2 - t1);
  MPI_Finalize();
  return 0;
}
