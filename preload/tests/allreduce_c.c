/* An ordinary MPI program (C99) that knows nothing of the library it may run under: a
 * series of MPI_Allreduce calls (float, double, int; sum, max, a user-defined op and a
 * derived type; in place and not; scalars, small and large counts) on MPI_COMM_WORLD, on
 * duplicates that carry info hints, on a duplicate of one of those and on a split.
 *
 *   allreduce_c OUTDIR [--no-info]
 *
 * Rank 0 writes each result to OUTDIR/<id>.bin and prints one line per reduction:
 *   result <id> <type> <count> <op> <comm> <inplace> <input_range_sum> <output_range> <ranks_agree>
 * input_range_sum: the sum over ranks of (max - min) of that rank's input; output_range:
 * max - min of the result; ranks_agree: whether every rank got the same bytes.
 * --no-info: no communicator gets hints (the program then never asks for anything). */
#include <mpi.h>

#include "mpi_fields.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;
static const char* outdir;

static uint64_t fnv(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}


enum kind { K_F32, K_F64, K_INT };
static size_t elem(enum kind k) { return k == K_F32 ? sizeof(float) : k == K_F64 ? sizeof(double) : sizeof(int); }
static const char* kname(enum kind k) { return k == K_F32 ? "f32" : k == K_F64 ? "f64" : "int"; }
static MPI_Datatype ktype(enum kind k) { return k == K_F32 ? MPI_FLOAT : k == K_F64 ? MPI_DOUBLE : MPI_INT; }
static double get(enum kind k, const void* p, size_t i) {
  return k == K_F32 ? ((const float*)p)[i] : k == K_F64 ? ((const double*)p)[i] : ((const int*)p)[i];
}
static void put(enum kind k, void* p, size_t i, double v) {
  if (k == K_F32) ((float*)p)[i] = (float)v;
  else if (k == K_F64) ((double*)p)[i] = v;
  else ((int*)p)[i] = (int)lrint(v * 1000.0);
}
static double range_of(enum kind k, const void* p, size_t n) {
  double lo = get(k, p, 0), hi = lo;
  for (size_t i = 1; i < n; ++i) {
    const double v = get(k, p, i);
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return hi - lo;
}

/* A user-defined sum of floats, for MPI_FLOAT and for contiguous types of floats. */
static void user_sum(void* in, void* inout, int* len, MPI_Datatype* t) {
  int bytes = 0;
  MPI_Type_size(*t, &bytes);
  const int n = *len * (bytes / (int)sizeof(float));
  for (int i = 0; i < n; ++i) ((float*)inout)[i] += ((float*)in)[i];
}

/* One reduction: fills the input of this rank, reduces, reports. `dtype`/`dcount`: a
 * derived type of `per` elements (dcount = count / per), else the predefined one. */
static void run(const char* id, enum kind k, size_t count, MPI_Op op, const char* opname, MPI_Comm comm,
                const char* cname, int inplace, int grad, MPI_Datatype dtype, int per) {
  int crank;
  MPI_Comm_rank(comm, &crank);
  void* in = malloc(count * elem(k));
  void* out = malloc(count * elem(k));
  for (size_t i = 0; i < count; ++i) put(k, in, i, grad ? field_gradient(crank, i) : field_smooth(crank, i, count));
  const double my_range = range_of(k, in, count);
  MPI_Datatype t = dtype != MPI_DATATYPE_NULL ? dtype : ktype(k);
  const int n = dtype != MPI_DATATYPE_NULL ? (int)(count / (size_t)per) : (int)count;
  if (inplace) {
    memcpy(out, in, count * elem(k));
    MPI_Allreduce(MPI_IN_PLACE, out, n, t, op, comm);
  } else {
    MPI_Allreduce(in, out, n, t, op, comm);
  }
  double range_sum = 0;
  MPI_Allreduce(&my_range, &range_sum, 1, MPI_DOUBLE, MPI_SUM, comm);
  /* Every rank's bytes, compared on rank 0 of comm. */
  uint64_t h = fnv(out, count * elem(k));
  int csize;
  MPI_Comm_size(comm, &csize);
  uint64_t* all = (uint64_t*)malloc((size_t)csize * sizeof(uint64_t));
  MPI_Gather(&h, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, comm);
  int agree = 1;
  if (crank == 0)
    for (int r = 1; r < csize; ++r) agree &= all[r] == all[0];
  /* Rank 0 of WORLD writes: results of a split live on its own half only; its rank 0 is
   * world rank 0 (color of rank 0). */
  if (rank == 0) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.bin", outdir, id);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(out, elem(k), count, f) != count) {
      fprintf(stderr, "cannot write %s\n", path);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    fclose(f);
    printf("result %s %s %zu %s %s %d %.17g %.17g %d\n", id, kname(k), count, opname, cname, inplace, range_sum,
           range_of(k, out, count), agree);
    fflush(stdout);
  }
  free(all);
  free(in);
  free(out);
}

static MPI_Comm with_hints(MPI_Comm parent, const char* k1, const char* v1, const char* k2, const char* v2, int dup_with_info,
                           int use_info) {
  MPI_Comm c;
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, k1, v1);
  MPI_Info_set(info, k2, v2);
  if (dup_with_info && use_info) {
    MPI_Comm_dup_with_info(parent, info, &c);
  } else {
    MPI_Comm_dup(parent, &c);
    if (use_info) MPI_Comm_set_info(c, info);
  }
  MPI_Info_free(&info);
  return c;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: allreduce_c OUTDIR [--no-info]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  outdir = argv[1];
  const int use_info = !(argc > 2 && strcmp(argv[2], "--no-info") == 0);
  const MPI_Datatype none = MPI_DATATYPE_NULL;

  /* MPI_COMM_WORLD, no hints. */
  run("w_f32_sum", K_F32, 1000000, MPI_SUM, "sum", MPI_COMM_WORLD, "world", 0, 0, none, 1);
  run("w_f64_sum_inplace", K_F64, 300000, MPI_SUM, "sum", MPI_COMM_WORLD, "world", 1, 0, none, 1);
  run("w_f32_max", K_F32, 1000000, MPI_MAX, "max", MPI_COMM_WORLD, "world", 0, 0, none, 1);
  run("w_int_sum", K_INT, 1000000, MPI_SUM, "sum", MPI_COMM_WORLD, "world", 1, 0, none, 1);
  run("w_f64_scalar", K_F64, 1, MPI_SUM, "sum", MPI_COMM_WORLD, "world", 1, 0, none, 1);
  run("w_f32_small", K_F32, 1000, MPI_SUM, "sum", MPI_COMM_WORLD, "world", 0, 0, none, 1);

  /* An error bound on a smooth field: set on a duplicate with MPI_Comm_set_info. */
  MPI_Comm eb = with_hints(MPI_COMM_WORLD, "cgx_error_bound", "1e-4", "cgx_min_bytes", "65536", 0, use_info);
  run("eb_f64_sum_inplace", K_F64, 500000, MPI_SUM, "sum", eb, "eb", 1, 0, none, 1);
  run("eb_f32_sum", K_F32, 1000000, MPI_SUM, "sum", eb, "eb", 0, 0, none, 1);
  run("eb_f64_small", K_F64, 100, MPI_SUM, "sum", eb, "eb", 1, 0, none, 1);
  run("eb_f64_max", K_F64, 500000, MPI_MAX, "max", eb, "eb", 0, 0, none, 1);
  run("eb_int_sum", K_INT, 500000, MPI_SUM, "sum", eb, "eb", 0, 0, none, 1);
  MPI_Op mysum;
  MPI_Op_create(user_sum, 1, &mysum);
  run("eb_f32_user_op", K_F32, 500000, mysum, "user", eb, "eb", 0, 0, none, 1);
  MPI_Datatype four;
  MPI_Type_contiguous(4, MPI_FLOAT, &four);
  MPI_Type_commit(&four);
  run("eb_f32_derived_user_op", K_F32, 400000, mysum, "user", eb, "eb", 1, 0, four, 4);

  /* 4 bits on gradient-like data: a duplicate made with MPI_Comm_dup_with_info. */
  MPI_Comm q4 = with_hints(MPI_COMM_WORLD, "cgx_bits", "4", "cgx_min_bytes", "64k", 1, use_info);
  run("q4_f32_sum_inplace", K_F32, 1 << 20, MPI_SUM, "sum", q4, "q4", 1, 1, none, 1);
  run("q4_f64_sum", K_F64, 200000, MPI_SUM, "sum", q4, "q4", 0, 1, none, 1);
  run("q4_f32_sum_large", K_F32, 2000000, MPI_SUM, "sum", q4, "q4", 0, 1, none, 1);
  run("q4_f32_sum_again", K_F32, 1 << 20, MPI_SUM, "sum", q4, "q4", 1, 1, none, 1);
  run("q4_f32_small", K_F32, 4096, MPI_SUM, "sum", q4, "q4", 1, 1, none, 1);

  /* A duplicate of an opted-in communicator keeps its hints; a split gets none. */
  MPI_Comm ebdup;
  MPI_Comm_dup(eb, &ebdup);
  run("ebdup_f64_sum", K_F64, 300000, MPI_SUM, "sum", ebdup, "ebdup", 0, 0, none, 1);
  MPI_Comm half;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  run("split_f32_sum", K_F32, 500000, MPI_SUM, "sum", half, "split", 1, 0, none, 1);

  /* Freed, and the handle value may come back for a communicator without hints. */
  MPI_Comm_free(&ebdup);
  MPI_Comm_free(&eb);
  MPI_Comm plain;
  MPI_Comm_dup(MPI_COMM_WORLD, &plain);
  run("plain_f64_sum", K_F64, 300000, MPI_SUM, "sum", plain, "plain", 0, 0, none, 1);

  MPI_Comm_free(&plain);
  MPI_Comm_free(&half);
  MPI_Comm_free(&q4);
  MPI_Type_free(&four);
  MPI_Op_free(&mysum);
  if (rank == 0) printf("done %d ranks\n", size);
  MPI_Finalize();
  return 0;
}
