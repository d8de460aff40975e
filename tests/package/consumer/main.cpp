// A user's program: a compressed allreduce of a small buffer over MPI_COMM_WORLD,
// checked against the exact sum within the quantizer's error bound.
#include <cgx/cgx.hpp>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

namespace {

// Rank r contributes (r + 1) * g(i), g in [0, 1].
float g(std::size_t i) { return 0.5f + 0.5f * std::sin(0.01f * static_cast<float>(i)); }

int run() {
  using plan_type = cgx::allreduce_plan<float, cgx::quant::maxmin<4, 1024, cgx::quant::nearest>,
                                        cgx::comm::scatter_reduce_allgather, cgx::comm::mpi>;
  constexpr std::size_t n = 3000;  // two full buckets and a partial one
  cgx::plan_options opts;
  opts.native_below_bytes = 0;  // compress even this small buffer (no MPI_Allreduce fallback)
  plan_type plan(cgx::comm::mpi(MPI_COMM_WORLD), n, opts);
  const int rank = plan.transport().rank();
  const int size = plan.transport().size();

  std::vector<float> buf(n);
  for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<float>(rank + 1) * g(i);
  plan(buf.data(), n);

  // Each rank's values span at most `size`, each partial sum at most s; one 4-bit
  // nearest rounding errs by at most half a unit (range / 15): a generous bound is s / 15.
  const double s = 0.5 * size * (size + 1);
  const double bound = s / 15.0 + 1e-4;
  double max_err = 0, sum_err = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(buf[i]) - s * g(i));
    max_err = std::max(max_err, err);
    sum_err += err;
  }
  int bad = (max_err <= bound && sum_err / n <= bound / 2) ? 0 : 1;
  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(lib, &len);
  const char* eol = std::strpbrk(lib, ",\n");  // the first line, up to its first comma
  const int head = eol != nullptr ? static_cast<int>(eol - lib) : len;
  if (rank == 0 || bad)
    std::printf("%s: %d ranks, rank %d, cgx %d.%d.%d, %.*s, n=%zu, max error %.3g (bound %.3g), mean error %.3g\n",
                any_bad ? "cgx consumer FAILED" : "cgx consumer OK", size, rank, CGX_VERSION_MAJOR,
                CGX_VERSION_MINOR, CGX_VERSION_PATCH, head, lib, n, max_err, bound, sum_err / n);
  return any_bad;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 1;
  try {
    rc = run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cgx consumer: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}
