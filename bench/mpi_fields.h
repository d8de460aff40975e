/* The data of the plain-MPI programs that run under libcgx_mpi (bench/mpi_allreduce_loop.c,
 * preload/tests/allreduce_c.c): a smooth field, the kind an error bound suits, and
 * gradient-like noise (signed, uneven magnitudes), the kind max-min quantization suits.
 * Rank r's value at index i; plain C99, nothing of cgx. */
#ifndef CGX_BENCH_MPI_FIELDS_H
#define CGX_BENCH_MPI_FIELDS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* Rank r's smooth field at i of n: two periodic modes. */
static inline double field_smooth(int r, size_t i, size_t n) {
  const double x = (double)i / (double)n;
  return sin(6.283185307179586 * x + 0.3 * r) + 0.5 * cos(12.566370614359172 * x * (r + 1));
}

/* Rank r's gradient-like value at i: a hashed uniform in [-0.005, 0.005) times 1..7. */
static inline double field_gradient(int r, size_t i) {
  uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + (uint64_t)(r + 1) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 31;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 29;
  const double u = (double)(z >> 11) / 9007199254740992.0; /* [0, 1) */
  return 0.01 * (u - 0.5) * (1.0 + (double)(i % 7));
}

#endif
