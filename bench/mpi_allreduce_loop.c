/* An MPI_Allreduce benchmark loop that knows nothing of cgx: plain C and MPI, for timing
 * an unmodified program with and without libcgx_mpi (docs/preload.md,
 * docs/results/preload.md; bench/preload-compare runs it).
 *
 *   mpi_allreduce_loop [--sizes 4M,16M,64M] [--type float|double] [--data smooth|grad]
 *                      [--iters 5] [--warmup 1]
 *
 * For each size (bytes per rank; k/K, m/M suffixes) it fills a buffer with this rank's
 * data (a smooth field, or gradient-like noise), then times MPI_Allreduce(MPI_IN_PLACE,
 * SUM, MPI_COMM_WORLD) `iters` times (the buffer refilled before each, a barrier, the
 * slowest rank's time), and prints, nccl-tests style, the median time, algbw, busbw
 * (algbw * 2 (p - 1) / p) and the largest error of the last result against the exact sum
 * of every rank's data, computed locally in double. */
#include <mpi.h>

#include "mpi_fields.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}
static size_t parse_size(const char* s, char** end) {
  size_t v = (size_t)strtoull(s, end, 10);
  if (**end == 'k' || **end == 'K') v <<= 10, ++*end;
  else if (**end == 'm' || **end == 'M') v <<= 20, ++*end;
  else if (**end == 'g' || **end == 'G') v <<= 30, ++*end;
  return v;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, p;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const char* sizes = "4M,16M,64M";
  int dbl = 0, grad = 0, iters = 5, warmup = 1;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "--sizes")) sizes = argv[a + 1];
    else if (!strcmp(argv[a], "--type")) dbl = !strcmp(argv[a + 1], "double");
    else if (!strcmp(argv[a], "--data")) grad = !strcmp(argv[a + 1], "grad");
    else if (!strcmp(argv[a], "--iters")) iters = atoi(argv[a + 1]);
    else if (!strcmp(argv[a], "--warmup")) warmup = atoi(argv[a + 1]);
  }
  if (iters < 1) iters = 1;
  const size_t es = dbl ? sizeof(double) : sizeof(float);
  const MPI_Datatype t = dbl ? MPI_DOUBLE : MPI_FLOAT;
  if (rank == 0) {
    printf("# mpi_allreduce_loop: %d ranks, %s, %s data, %d iterations (median), %d warm-up\n", p, dbl ? "double" : "float",
           grad ? "gradient-like" : "smooth", iters, warmup);
    printf("# %12s %12s %6s | %10s %9s %9s | %11s\n", "size", "count", "type", "time(ms)", "algbw", "busbw", "max_abs_err");
  }
  for (const char* s = sizes; *s;) {
    char* end;
    const size_t bytes = parse_size(s, &end);
    s = *end == ',' ? end + 1 : end;
    const size_t n = bytes / es;
    if (n == 0) continue;
    char* src = malloc(n * es);
    char* buf = malloc(n * es);
    for (size_t i = 0; i < n; ++i) {
      const double v = grad ? field_gradient(rank, i) : field_smooth(rank, i, n);
      if (dbl) ((double*)src)[i] = v;
      else ((float*)src)[i] = (float)v;
    }
    double* times = malloc((size_t)iters * sizeof(double));
    for (int it = -warmup; it < iters; ++it) {
      memcpy(buf, src, n * es);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, t, MPI_SUM, MPI_COMM_WORLD);
      double dt = MPI_Wtime() - t0, slowest = 0;
      MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= 0) times[it] = slowest;
    }
    double err = 0;
    for (size_t i = 0; i < n; ++i) {
      double exact = 0;
      for (int r = 0; r < p; ++r) {
        const double v = grad ? field_gradient(r, i) : field_smooth(r, i, n);
        exact += dbl ? v : (double)(float)v;
      }
      const double got = dbl ? ((double*)buf)[i] : (double)((float*)buf)[i];
      const double e = fabs(got - exact);
      if (e > err || e != e) err = e;
    }
    double worst = 0;
    MPI_Allreduce(&err, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    qsort(times, (size_t)iters, sizeof(double), cmp);
    const double med = times[iters / 2];
    const double algbw = (double)(n * es) / med / 1e9;
    if (rank == 0)
      printf("  %12zu %12zu %6s | %10.3f %9.3f %9.3f | %11.3g\n", n * es, n, dbl ? "double" : "float", med * 1e3, algbw,
             algbw * 2.0 * (p - 1) / p, worst);
    fflush(stdout);
    free(times);
    free(src);
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
