/* A communicator's life under libcgx_mpi (issue 47, item 3): the state the library keeps
 * for a communicator (its cgx_* hints, its plans) must end with the communicator, however
 * it ends, and a new communicator that MPI gives the same handle must start with none;
 * duplicates (MPI_Comm_dup and MPI_Comm_idup) keep the hints. Nothing in the environment
 * opts in: only hints (cgx_bits 4, cgx_min_bytes 64k).
 *
 *   1. a = split(world) into pairs {0,1},{2,3},... with hints; an opted-in sum (a plan);
 *      MPI_Comm_disconnect(a). b = split(world) into {0,2},{1,3} (2 or 3 ranks: one rank
 *      each), no hints: its sums must be exact (not compressed: no hints carried over)
 *      and over b's own group (not over a's old one).
 *   2. the same with MPI_Comm_free instead of MPI_Comm_disconnect.
 *   3. c = dup(world) with hints; MPI_Comm_idup(c) and MPI_Comm_dup(c) must be opted in
 *      (compressed: within max-min's bound, not exact); MPI_Comm_dup_with_info(c, an info
 *      without cgx keys) must not (exact).
 *
 * Each rank's values are rank + (i % 7) / 10 (4-bit max-min cannot sum them exactly).
 * Rank 0 prints "PASS lifecycle" or "FAIL ...". */
#include <mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { N = 16384 }; /* doubles: 128 KiB, above cgx_min_bytes */
static int rank, size, bad = 0;
static double buf[N];

static double value(int r, int i) { return r + (i % 7) / 10.0; }

static void hints(MPI_Comm c) {
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "cgx_bits", "4");
  MPI_Info_set(info, "cgx_min_bytes", "64k");
  MPI_Comm_set_info(c, info);
  MPI_Info_free(&info);
}

/* An opted-in-sized sum on c; `compressed`: 1 the result must be within 4-bit max-min's
 * bound and not exact, 0 it must be exact, -1 either (a plan is made). */
static void check_sum(MPI_Comm c, int compressed, const char* what) {
  int p = 0, r = 0;
  MPI_Comm_size(c, &p);
  MPI_Comm_rank(c, &r);
  /* The world ranks of c's members. */
  int* members = malloc(sizeof(int) * p);
  MPI_Allgather(&rank, 1, MPI_INT, members, 1, MPI_INT, c);
  for (int i = 0; i < N; ++i) buf[i] = value(rank, i);
  const int rc = MPI_Allreduce(MPI_IN_PLACE, buf, N, MPI_DOUBLE, MPI_SUM, c);
  /* max-min's bound (docs/preload.md): below sum_r u_r + u_s with u = range / 15; every
   * rank's bucket range is 0.6 and the sum's p * 0.6. */
  const double bound = (2.0 * p) * 0.6 / 15.0 * 1.01;
  int wrong = 0, inexact = 0;
  double worst = 0;
  for (int i = 0; i < N; ++i) {
    double want = 0;
    for (int k = 0; k < p; ++k) want += value(members[k], i);
    const double err = fabs(buf[i] - want);
    if (err > worst) worst = err;
    if (err > 1e-9) ++inexact;
    if (err > bound) ++wrong;
  }
  int ok = rc == MPI_SUCCESS && wrong == 0;
  if (compressed == 1) ok = ok && inexact > 0;
  if (compressed == 0) ok = ok && inexact == 0;
  if (!ok) bad = 1;
  printf("rank %d: %s (%d ranks): %s, %d of %d values inexact, %d beyond the bound, largest error %.3g%s\n", rank,
         what, p, rc == MPI_SUCCESS ? "succeeded" : "returned an error", inexact, N, wrong, worst,
         ok ? "" : " -- UNEXPECTED");
  fflush(stdout);
  free(members);
}

static void reuse(int disconnect) {
  MPI_Comm a, b;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &a);
  MPI_Comm_set_errhandler(a, MPI_ERRORS_RETURN);
  hints(a);
  check_sum(a, -1, "pairs {0,1},{2,3}.. with hints");
  const MPI_Comm old = a;
  if (disconnect)
    MPI_Comm_disconnect(&a);
  else
    MPI_Comm_free(&a);
  MPI_Comm_split(MPI_COMM_WORLD, size >= 4 ? rank % 2 : rank, rank, &b);
  MPI_Comm_set_errhandler(b, MPI_ERRORS_RETURN);
  printf("rank %d: after %s, the new communicator %s the old one's handle\n", rank,
         disconnect ? "MPI_Comm_disconnect" : "MPI_Comm_free", b == old ? "reuses" : "does not reuse");
  check_sum(b, 0, disconnect ? "new split after disconnect, no hints" : "new split after free, no hints");
  MPI_Comm_free(&b);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  alarm(150); /* a hang fails the test */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);

  reuse(1);
  reuse(0);
  reuse(1);

  MPI_Comm c, d, e, f;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  hints(c);
  MPI_Request req;
  MPI_Comm_idup(c, &d, &req);
  MPI_Wait(&req, MPI_STATUS_IGNORE);
  MPI_Comm_dup(c, &e);
  MPI_Info empty;
  MPI_Info_create(&empty);
  MPI_Info_set(empty, "unrelated_key", "1");
  MPI_Comm_dup_with_info(c, empty, &f);
  MPI_Info_free(&empty);
  if (size > 1) {
    check_sum(c, 1, "dup of world with hints");
    check_sum(d, 1, "MPI_Comm_idup of it");
    check_sum(e, 1, "MPI_Comm_dup of it");
    check_sum(f, 0, "MPI_Comm_dup_with_info of it without cgx keys");
  }
  MPI_Comm_disconnect(&d);
  MPI_Comm_free(&e);
  MPI_Comm_free(&f);
  /* A plan left on c (and its hints) until MPI_Finalize. */

  int all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf(all ? "FAIL: a result above was not as it should be\n" : "PASS lifecycle\n");
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
