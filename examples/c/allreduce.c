/* cgx from C: compressed allreduces (max-min, several bit widths, buckets, roundings and
 * both schedules, float and double, blocking and start/wait) and error-bounded ones
 * (absolute bounds) over MPI_COMM_WORLD, each result checked element by element
 * against an exact MPI_Allreduce (in double) of the same data:
 *
 * - max-min: within the schedule's bound (include/cgx/comm/scatter_reduce_allgather.hpp,
 *   ring.hpp), computed here from every rank's bucket ranges;
 * - error-bounded: within the bound asked for.
 *
 * Prints one line per case and exits with 1 if any bound was violated on any rank.
 *
 *   mpirun -np 4 ./cgx_c_allreduce [count]
 */
#include <cgx/c.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

/* Stops the job on an API failure, with the library's message. */
static void check(cgx_errc rc, const char* what) {
  if (rc != CGX_OK) {
    fprintf(stderr, "%s failed: %s (%s)\n", what, cgx_errc_name(rc), cgx_last_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}

/* Rank r's value at i: a smooth field scaled by r + 1, plus a little noise. */
static double value(int r, size_t i) {
  unsigned long long h = (unsigned long long)i * 0x9E3779B97F4A7C15ull ^ (unsigned long long)(r + 1) * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  return (r + 1) * sin(0.001 * (double)i) + 0.1 * ((double)(h % 1000) / 1000.0 - 0.5);
}

/* The max-min bound of element i's bucket: R is the sum over ranks of the bucket's range,
 * L = 2^bits - 1, c = 1/2 (nearest) or 1 (stochastic). SRA quantizes each contribution
 * once (units summing to at most R / L) and the sum once (its range at most R plus twice
 * the error so far); the ring re-quantizes the running sum at each of its p hops. The
 * slack covers the floating-point rounding of the sums, scales and decodes. */
static double maxmin_bound(cgx_schedule s, double c, double L, double R, double M, int p) {
  double e = 0;
  if (s == CGX_SRA) {
    e = c * R / L;
    e += c * (R + 2 * e) / L;
  } else {
    for (int k = 0; k < p; ++k) e += c * (R + 2 * e) / L;
  }
  return e + 1e-6 * (R + M);
}

typedef struct maxmin_case {
  cgx_datatype type;
  int bits;
  size_t bucket;
  cgx_rounding rounding;
  cgx_schedule schedule;
  int nonblocking;
} maxmin_case;

/* Runs one max-min case; returns 1 if every element on this rank is within its bound. */
static int run_maxmin(const maxmin_case* k, size_t n, int rank, int p) {
  cgx_allreduce_config cfg;
  cgx_allreduce_config_init(&cfg);
  cfg.type = k->type;
  cfg.bits = k->bits;
  cfg.bucket = k->bucket;
  cfg.rounding = k->rounding;
  cfg.schedule = k->schedule;
  cfg.max_count = n;
  cfg.options.native_below_bytes = 0; /* always compress, even on one node */
  cgx_allreduce_plan* plan = NULL;
  check(cgx_allreduce_create(MPI_COMM_WORLD, &cfg, &plan), "cgx_allreduce_create");

  const size_t nb = (n + k->bucket - 1) / k->bucket;
  double* mine = malloc(n * sizeof(double));
  double* exact = malloc(n * sizeof(double));
  double* stat = malloc(2 * nb * sizeof(double)); /* per bucket: range, max |x| */
  double* stats = malloc(2 * nb * sizeof(double));
  void* buf = malloc(n * (k->type == CGX_FLOAT ? sizeof(float) : sizeof(double)));
  if (!mine || !exact || !stat || !stats || !buf) MPI_Abort(MPI_COMM_WORLD, 3);
  for (size_t i = 0; i < n; ++i) {
    /* The value this rank passes, as the type holds it. */
    mine[i] = k->type == CGX_FLOAT ? (double)(float)value(rank, i) : value(rank, i);
    if (k->type == CGX_FLOAT) ((float*)buf)[i] = (float)mine[i];
    else ((double*)buf)[i] = mine[i];
  }
  for (size_t b = 0; b < nb; ++b) {
    double lo = mine[b * k->bucket], hi = lo, big = 0;
    for (size_t i = b * k->bucket; i < n && i < (b + 1) * k->bucket; ++i) {
      lo = fmin(lo, mine[i]);
      hi = fmax(hi, mine[i]);
      big = fmax(big, fabs(mine[i]));
    }
    stat[2 * b] = hi - lo;
    stat[2 * b + 1] = big;
  }
  MPI_Allreduce(mine, exact, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(stat, stats, (int)(2 * nb), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

  if (k->nonblocking) {
    check(cgx_allreduce_start(plan, buf, n, k->type), "cgx_allreduce_start");
    check(cgx_allreduce_wait(plan), "cgx_allreduce_wait");
  } else {
    check(cgx_allreduce(plan, buf, n, k->type), "cgx_allreduce");
  }
  cgx_stats st;
  check(cgx_allreduce_stats(plan, &st), "cgx_allreduce_stats");

  const double c = k->rounding == CGX_NEAREST ? 0.5 : 1.0;
  const double L = (double)((1 << k->bits) - 1);
  double worst = 0; /* the largest error / bound */
  int ok = st.count == n && !st.native && st.compressed_bytes > 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t b = i / k->bucket;
    const double got = k->type == CGX_FLOAT ? (double)((float*)buf)[i] : ((double*)buf)[i];
    const double bound = maxmin_bound(k->schedule, c, L, stats[2 * b], stats[2 * b + 1], p);
    const double err = fabs(got - exact[i]);
    if (!(err <= bound)) ok = 0;
    if (err / bound > worst) worst = err / bound;
  }
  double all_worst = 0;
  MPI_Allreduce(&worst, &all_worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    printf("max-min %-6s bits %d bucket %4zu %-10s %-4s %-9s: worst error / bound %.3f, %zu -> %zu bytes%s\n",
           k->type == CGX_FLOAT ? "float" : "double", k->bits, k->bucket,
           k->rounding == CGX_NEAREST ? "nearest" : "stochastic", k->schedule == CGX_SRA ? "SRA" : "ring",
           k->nonblocking ? "start/wait" : "blocking", all_worst, st.raw_bytes, st.compressed_bytes,
           all_worst <= 1 ? "" : "  BOUND VIOLATED");
  check(cgx_allreduce_free(&plan), "cgx_allreduce_free"); /* plan is NULL from here */
  free(mine);
  free(exact);
  free(stat);
  free(stats);
  free(buf);
  return ok;
}

/* Runs the error-bounded allreduce of a smooth double field at bound rel * range. */
static int run_error_bounded(cgx_schedule s, double rel, size_t n, int rank, int p) {
  cgx_error_bounded_config cfg;
  cgx_error_bounded_config_init(&cfg);
  cfg.schedule = s;
  cfg.max_count = n;
  cfg.options.native_below_bytes = 0;
  cgx_error_bounded_plan* plan = NULL;
  check(cgx_error_bounded_create(MPI_COMM_WORLD, &cfg, &plan), "cgx_error_bounded_create");
  double* buf = malloc(n * sizeof(double));
  double* exact = malloc(n * sizeof(double));
  if (!buf || !exact) MPI_Abort(MPI_COMM_WORLD, 3);
  for (size_t i = 0; i < n; ++i) buf[i] = (rank + 1) * cos(0.0005 * (double)i) + 0.01 * rank * sin(0.01 * (double)i);
  MPI_Allreduce(buf, exact, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  double lo = exact[0], hi = exact[0];
  for (size_t i = 0; i < n; ++i) {
    lo = fmin(lo, exact[i]);
    hi = fmax(hi, exact[i]);
  }
  const double bound = rel * (hi - lo);
  check(cgx_error_bounded_allreduce(plan, buf, n, CGX_DOUBLE, bound), "cgx_error_bounded_allreduce");
  cgx_stats st;
  check(cgx_error_bounded_stats(plan, &st), "cgx_error_bounded_stats");
  /* The plan's promise holds up to the rounding of the sum itself (~1e-16 relative). */
  const double slack = 1e-13 * (fabs(hi) + fabs(lo));
  double worst = 0;
  int ok = st.count == n && !st.native && st.bound == bound;
  for (size_t i = 0; i < n; ++i) {
    const double err = fabs(buf[i] - exact[i]);
    if (!(err <= bound + slack)) ok = 0;
    if (err > worst) worst = err;
  }
  double all_worst = 0;
  MPI_Allreduce(&worst, &all_worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  unsigned long long b[2] = {st.compressed_bytes, st.schedule_raw_bytes}, tb[2] = {0, 0};
  MPI_Allreduce(b, tb, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0)
    printf("error-bounded double %-4s bound %.1e x range = %.3e: worst error %.3e (%.3f of it), wire %llu of %llu bytes%s\n",
           s == CGX_SRA ? "SRA" : "ring", rel, bound, all_worst, all_worst / bound, tb[0], tb[1],
           all_worst <= bound + slack ? "" : "  BOUND VIOLATED");
  (void)p;
  check(cgx_error_bounded_free(&plan), "cgx_error_bounded_free");
  free(buf);
  free(exact);
  return ok;
}

int main(int argc, char** argv) {
  int provided = 0;
  /* start/wait runs the reduction on a thread of the library: SERIALIZED at least. */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const size_t n = argc > 1 ? (size_t)strtoull(argv[1], NULL, 10) : 100003; /* odd: a partial bucket */
  if (rank == 0) printf("cgx %s C example: %d ranks, %zu values\n", cgx_version(), p, n);

  const maxmin_case cases[] = {
      {CGX_FLOAT, 4, CGX_BUCKET_DEFAULT, CGX_STOCHASTIC, CGX_SRA, 0},
      {CGX_FLOAT, 2, CGX_BUCKET_SMALL, CGX_NEAREST, CGX_SRA, 0},
      {CGX_DOUBLE, 8, CGX_BUCKET_SMALL, CGX_NEAREST, CGX_RING, 0},
      {CGX_DOUBLE, 3, CGX_BUCKET_DEFAULT, CGX_STOCHASTIC, CGX_RING, 0},
      {CGX_FLOAT, 1, CGX_BUCKET_DEFAULT, CGX_NEAREST, CGX_RING, 0},
      {CGX_DOUBLE, 5, CGX_BUCKET_DEFAULT, CGX_STOCHASTIC, CGX_SRA, provided >= MPI_THREAD_SERIALIZED},
  };
  int ok = 1;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; ++k) ok = run_maxmin(&cases[k], n, rank, p) && ok;
  ok = run_error_bounded(CGX_SRA, 1e-4, n, rank, p) && ok;
  ok = run_error_bounded(CGX_RING, 1e-6, n, rank, p) && ok;

  int all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) printf("%s\n", all_ok ? "cgx C example: every bound held on every element of every rank" : "cgx C example: BOUND VIOLATED");
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
