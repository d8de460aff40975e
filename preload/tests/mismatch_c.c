/* An erroneous MPI program (its ranks pass different counts to one MPI_Allreduce) with
 * MPI_ERRORS_RETURN on MPI_COMM_WORLD, then a correct call. Under libcgx_mpi with every
 * communicator opted in (CGX_MPI_BITS, CGX_MPI_MIN_BYTES) the first call must return an
 * error on every rank, not hang, and the second must succeed. Rank 0 prints "PASS
 * mismatch" or "FAIL ...". (Without the library the first call is undefined behaviour.) */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  const int n = rank == 0 ? 300000 : 600000;
  float* buf = malloc(600000 * sizeof(float));
  for (int i = 0; i < 600000; ++i) buf[i] = 1.0f;
  const int rc1 = MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (int i = 0; i < 600000; ++i) buf[i] = 1.0f;
  const int rc2 = MPI_Allreduce(MPI_IN_PLACE, buf, 300000, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  int ok = rc1 != MPI_SUCCESS && rc2 == MPI_SUCCESS && buf[0] == (float)size && buf[299999] == (float)size;
  printf("rank %d: first call %s, second call %s (%g)\n", rank, rc1 == MPI_SUCCESS ? "succeeded" : "returned an error",
         rc2 == MPI_SUCCESS ? "succeeded" : "returned an error", (double)buf[0]);
  fflush(stdout);
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) printf(all ? "PASS mismatch\n" : "FAIL: a rank did not see the error, or the next call failed\n");
  free(buf);
  MPI_Finalize();
  return 0;
}
