/* An erroneous MPI program whose ranks disagree on a count in a way that changes cgx's
 * size class, followed by correct calls (issue 47, item 2). Run under libcgx_mpi with
 * every communicator opted in (CGX_MPI_BITS=4, CGX_MPI_MIN_BYTES=64k) and
 * CGX_TIMEOUT_MS=5000, MPI_ERRORS_RETURN on the communicator:
 *
 *   1. a matched call of 2^19 doubles (a plan of that size class);
 *   2. the last rank passes one value more (2^19 + 1: the next size class): every rank
 *      must get an error;
 *   3. a matched call of 2^19: must succeed on every rank with exact sums;
 *   4. rank 0 passes one value more, then a matched call; the last rank passes half
 *      (a smaller size class), then a matched call; the last rank passes 2^20 + 1, then
 *      matched calls of 2^20 + 1 and 2^19.
 *
 * Every value a rank passes is rank + 1 (constant buffers: max-min sums them exactly),
 * so every matched call must return p (p + 1) / 2 everywhere. Every call must end within
 * 3 wait limits (a hang ends the program through alarm()). Rank 0 prints
 * "PASS sizeclass" or "FAIL ...". */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int rank, size, bad = 0;
static double* buf;

/* One MPI_Allreduce of n values; `want_error`: whether it must fail (1) or succeed with
 * exact sums (0). */
static void call(MPI_Comm comm, int n, int want_error, const char* what) {
  for (int i = 0; i < n; ++i) buf[i] = rank + 1;
  const double t0 = MPI_Wtime();
  const int rc = MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, comm);
  const double t = MPI_Wtime() - t0;
  int wrong = 0;
  const double want = 0.5 * size * (size + 1);
  if (rc == MPI_SUCCESS)
    for (int i = 0; i < n; ++i) wrong += buf[i] != want;
  const int ok = want_error ? rc != MPI_SUCCESS : (rc == MPI_SUCCESS && wrong == 0);
  if (!ok || t > 15.0) bad = 1;
  printf("rank %d: %s (%d values): %s, %d wrong, %.3f s%s\n", rank, what, n,
         rc == MPI_SUCCESS ? "succeeded" : "returned an error", wrong, t,
         ok && t <= 15.0 ? "" : (t > 15.0 ? " -- TOO SLOW" : " -- UNEXPECTED"));
  fflush(stdout);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  alarm(150); /* a hang fails the test */
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  const int big = 1 << 19, last = size - 1;
  buf = malloc(((size_t)2 * big + 2) * sizeof(double));

  call(comm, big, 0, "matched");
  call(comm, rank == last ? big + 1 : big, 1, "last rank one more (size class 2^20 there)");
  call(comm, big, 0, "matched after the mismatch");
  call(comm, big, 0, "matched again");
  call(comm, rank == 0 ? big + 1 : big, 1, "rank 0 one more");
  call(comm, big, 0, "matched after the mismatch");
  call(comm, rank == last ? big / 2 : big, 1, "last rank half (a smaller size class there)");
  call(comm, big, 0, "matched after the mismatch");
  call(comm, rank == last ? 2 * big + 1 : big, 1, "last rank 2^20 + 1");
  call(comm, 2 * big + 1, 0, "matched, 2^20 + 1");
  call(comm, big, 0, "matched, 2^19");

  int all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf(all ? "FAIL: a call did not end as it should on some rank (above)\n" : "PASS sizeclass\n");
  fflush(stdout);
  free(buf);
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return 0;
}
