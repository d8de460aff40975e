/* A user's C program: a 4-bit compressed allreduce and an error-bounded one over
 * MPI_COMM_WORLD, checked against the exact sums. */
#include <cgx/c.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>

#define N 3000 /* two full buckets and a partial one */

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1, bad = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  cgx_allreduce_config c;
  cgx_allreduce_config_init(&c);
  c.bits = 4;
  c.rounding = CGX_NEAREST;
  c.max_count = N;
  c.options.native_below_bytes = 0; /* compress even this small buffer */
  cgx_allreduce_plan* plan = NULL;
  if (cgx_allreduce_create(MPI_COMM_WORLD, &c, &plan) != CGX_OK) {
    fprintf(stderr, "cgx_allreduce_create: %s\n", cgx_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  static float buf[N];
  static double eb[N];
  for (int i = 0; i < N; ++i) {
    buf[i] = (float)(rank + 1) * (0.5f + 0.5f * sinf(0.01f * (float)i));
    eb[i] = (rank + 1) * cos(0.002 * i);
  }
  if (cgx_allreduce(plan, buf, N, CGX_FLOAT) != CGX_OK) bad = 1;
  /* Rank r's values span at most r + 1, a partial sum at most s: one 4-bit nearest
   * rounding errs by half a unit (range / 15); SRA rounds a contribution, then the sum. */
  const double s = 0.5 * size * (size + 1), bound = s / 15.0 + 1e-4;
  double worst = 0;
  for (int i = 0; i < N; ++i) {
    const double err = fabs(buf[i] - s * (0.5 + 0.5 * sin(0.01 * i)));
    if (err > worst) worst = err;
  }
  if (!(worst <= bound)) bad = 1;
  cgx_allreduce_destroy(plan);

  cgx_error_bounded_config e;
  cgx_error_bounded_config_init(&e);
  e.max_count = N;
  e.options.native_below_bytes = 0;
  cgx_error_bounded_plan* ebp = NULL;
  double ebworst = 0;
  if (cgx_error_bounded_create(MPI_COMM_WORLD, &e, &ebp) != CGX_OK ||
      cgx_error_bounded_allreduce(ebp, eb, N, CGX_DOUBLE, 1e-5) != CGX_OK) {
    fprintf(stderr, "error-bounded: %s\n", cgx_last_error());
    bad = 1;
  }
  for (int i = 0; i < N; ++i) {
    const double err = fabs(eb[i] - s * cos(0.002 * i));
    if (err > ebworst) ebworst = err;
  }
  if (!(ebworst <= 1e-5 + 1e-12)) bad = 1;
  cgx_error_bounded_destroy(ebp);

  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 || bad)
    printf("%s: %d ranks, rank %d, cgx %s, max-min error %.3g (bound %.3g), error-bounded %.3g (bound 1e-5)\n",
           any_bad ? "cgx C consumer FAILED" : "cgx C consumer OK", size, rank, cgx_version(), worst, bound, ebworst);
  MPI_Finalize();
  return any_bad;
}
