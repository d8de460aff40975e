/* A rank that skips an opted-in MPI_Allreduce, or comes to it late (issue 47, items 1
 * and 2). Under libcgx_mpi (CGX_MPI_BITS=4, CGX_MPI_MIN_BYTES=64k, CGX_TIMEOUT_MS: the limit, read here too;
 * MPI_ERRORS_RETURN) every call must end within the wait limit (plus a margin), never
 * hang, and a late rank must fail too:
 *
 *   1. the first opted-in call on a new communicator (cgx has built nothing for it yet):
 *      the last rank skips it and goes on to MPI_Barrier; the others must get an error;
 *   2. two matched calls (must work: nothing was agreed in the skipped call);
 *   3. the last rank comes 1.5 limits late to a call: every rank must get an
 *      error, the late one too (it never succeeds with the others' next call);
 *   4. at once, no barrier: two matched calls (must work on every rank);
 *   5. a later call (a plan exists): the last rank skips it and goes on to MPI_Barrier;
 *      the others must get an error. (Its calls are then one behind the others': MPI
 *      pairs collectives by position, and so does cgx; the program ends here.)
 *
 * The barriers are on MPI_COMM_WORLD (`--barrier comm`: on the communicator itself).
 * Every value is rank + 1 (exact sums). Rank 0 prints "PASS skip" or "FAIL ...". */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { N = 1 << 17 }; /* floats: 512 KiB */
static int rank, size, bad = 0;
static float buf[N];
static double limit_s = 5.0; /* CGX_TIMEOUT_MS, as cgx reads it (whole ms) */
static const double margin_s = 10.0;

/* Returns 1 when the call succeeded. `want`: 1 must succeed, 0 must fail, -1 either. */
static int call_as(MPI_Comm comm, int skip, int want, const char* what) {
  if (skip) {
    printf("rank %d: %s: skipped\n", rank, what);
    fflush(stdout);
    return 0;
  }
  for (int i = 0; i < N; ++i) buf[i] = (float)(rank + 1);
  const double t0 = MPI_Wtime();
  const int rc = MPI_Allreduce(MPI_IN_PLACE, buf, N, MPI_FLOAT, MPI_SUM, comm);
  const double t = MPI_Wtime() - t0;
  int wrong = 0;
  if (rc == MPI_SUCCESS)
    for (int i = 0; i < N; ++i) wrong += buf[i] != (float)(0.5 * size * (size + 1));
  const int good = rc == MPI_SUCCESS && wrong == 0;
  const int ok = (want < 0 || want == good) && (rc != MPI_SUCCESS || wrong == 0) && t < limit_s + margin_s;
  if (!ok) bad = 1;
  printf("rank %d: %s: %s, %d wrong, %.3f s%s\n", rank, what, rc == MPI_SUCCESS ? "succeeded" : "returned an error",
         wrong, t, ok ? "" : " -- UNEXPECTED");
  fflush(stdout);
  return good;
}

/* A call that some rank skipped must fail; a matched one must succeed, exact. */
static void call(MPI_Comm comm, int skip, const char* what) { call_as(comm, skip, strstr(what, "skips") == NULL, what); }

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  alarm(120); /* a hang fails the test */
  const char* ms = getenv("CGX_TIMEOUT_MS");
  if (ms != NULL && atoi(ms) > 0) limit_s = atoi(ms) / 1000.0;
  /* Late by 1.5 limits: past the others' limit in that call, and before their next call
   * (which they start at 1 limit) runs out at 2 limits. Half a limit of margin each way. */
  const useconds_t late_us = (useconds_t)(1.5e6 * limit_s);
  const int on_comm = argc > 2 && strcmp(argv[1], "--barrier") == 0 && strcmp(argv[2], "comm") == 0;
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  const int last = size - 1;
  const MPI_Comm barrier = on_comm ? comm : MPI_COMM_WORLD;

  call(comm, rank == last, "first call, the last rank skips it");
  MPI_Barrier(barrier);
  call(comm, 0, "matched call after the barrier");
  call(comm, 0, "matched call");

  if (rank == last) usleep(late_us);
  call_as(comm, 0, 0, "the last rank comes past the limit");
  call(comm, 0, "matched call right after the late one");
  call(comm, 0, "matched call");

  call(comm, rank == last, "a later call, the last rank skips it");
  MPI_Barrier(barrier);

  int all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf(all ? "FAIL: a call did not end as it should on some rank (above)\n" : "PASS skip\n");
  fflush(stdout);
  MPI_Comm_free(&comm);
  MPI_Finalize();
  return 0;
}
