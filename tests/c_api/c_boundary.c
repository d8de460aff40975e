/* The C API called from C99 (issue 47, item 4), where an exception cannot be caught:
 * with a malformed CGX_TIMEOUT_MS the three init functions return (at ad1d8b1 they threw
 * cgx::error into C: "terminate called after throwing an instance of 'cgx::error'" on
 * every rank), every create returns CGX_ERR_INVALID_ARGUMENT naming the variable and its
 * value, on every rank, with the "cgx: " prefix once; a plan with an explicit timeout_ms
 * works; cgx_*_free sets the handle to NULL and a later call gets a code. Rank 0 prints
 * "c_boundary: ok", or each failed check (and the exit status is non-zero). */
#define _POSIX_C_SOURCE 200112L
#include <cgx/c.h>
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank = 0;
static int failures = 0;

#define EXPECT(cond)                                                                                 \
  do {                                                                                               \
    if (!(cond)) {                                                                                   \
      ++failures;                                                                                    \
      fprintf(stderr, "c_boundary: rank %d: FAILED line %d: %s (last error: %s)\n", rank, __LINE__, \
              #cond, cgx_last_error());                                                              \
    }                                                                                                \
  } while (0)

/* The last message names the variable and its value, and carries the prefix once. */
static int names_variable(const char* who) {
  const char* m = cgx_last_error();
  return strstr(m, "CGX_TIMEOUT_MS='5s'") != NULL && strstr(m, who) != NULL && strncmp(m, "cgx: ", 5) == 0 &&
         strstr(m, "cgx: cgx:") == NULL;
}

int main(int argc, char** argv) {
  int p = 1, i, any = 0;
  cgx_options o;
  cgx_allreduce_config c;
  cgx_error_bounded_config e;
  cgx_allreduce_plan* plan = NULL;
  cgx_error_bounded_plan* eplan = NULL;
  float v[1000];
  double d[1000];

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  setenv("CGX_TIMEOUT_MS", "5s", 1);

  cgx_options_init(&o);
  EXPECT(o.timeout_ms == CGX_DEFAULT_TIMEOUT);
  EXPECT(names_variable("cgx_options_init"));
  cgx_allreduce_config_init(&c);
  EXPECT(names_variable("cgx_allreduce_config_init"));
  c.max_count = 1000;
  c.options.native_below_bytes = 0;
  cgx_error_bounded_config_init(&e);
  EXPECT(names_variable("cgx_error_bounded_config_init"));
  e.max_count = 1000;
  e.options.native_below_bytes = 0;

  EXPECT(cgx_allreduce_create(MPI_COMM_WORLD, &c, &plan) == CGX_ERR_INVALID_ARGUMENT);
  EXPECT(plan == NULL);
  EXPECT(names_variable("cgx_allreduce_create"));
  EXPECT(cgx_error_bounded_create(MPI_COMM_WORLD, &e, &eplan) == CGX_ERR_INVALID_ARGUMENT);
  EXPECT(eplan == NULL);
  EXPECT(names_variable("cgx_error_bounded_create"));

  /* An explicit timeout: the variable is not read. */
  c.options.timeout_ms = 60000;
  e.options.timeout_ms = 60000;
  EXPECT(cgx_allreduce_create(MPI_COMM_WORLD, &c, &plan) == CGX_OK);
  EXPECT(cgx_error_bounded_create(MPI_COMM_WORLD, &e, &eplan) == CGX_OK);
  for (i = 0; i < 1000; ++i) {
    v[i] = (float)(rank + 1);
    d[i] = 0.5 * (rank + 1);
  }
  EXPECT(plan != NULL && cgx_allreduce(plan, v, 1000, CGX_FLOAT) == CGX_OK);
  EXPECT(v[999] == 0.5f * (float)(p * (p + 1)));
  EXPECT(eplan != NULL && cgx_error_bounded_allreduce(eplan, d, 1000, CGX_DOUBLE, 1e-3) == CGX_OK);
#if CGX_C_API_VERSION >= 2
  EXPECT(cgx_allreduce_free(&plan) == CGX_OK);
  EXPECT(plan == NULL);
  EXPECT(cgx_allreduce(plan, v, 1000, CGX_FLOAT) == CGX_ERR_INVALID_ARGUMENT);
  EXPECT(strstr(cgx_last_error(), "the plan is NULL") != NULL);
  EXPECT(cgx_allreduce_free(&plan) == CGX_OK);
  EXPECT(cgx_error_bounded_free(&eplan) == CGX_OK);
  EXPECT(eplan == NULL);
  EXPECT(cgx_error_bounded_allreduce(eplan, d, 1000, CGX_DOUBLE, 1e-3) == CGX_ERR_INVALID_ARGUMENT);
  EXPECT(cgx_error_bounded_free(&eplan) == CGX_OK);
#else
  EXPECT(cgx_allreduce_destroy(plan) == CGX_OK);
  EXPECT(cgx_error_bounded_destroy(eplan) == CGX_OK);
#endif

  MPI_Allreduce(&failures, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    if (any == 0) printf("c_boundary: ok (%d ranks)\n", p);
    else printf("c_boundary: %d checks FAILED\n", any);
  }
  MPI_Finalize();
  return any == 0 ? 0 : 1;
}
