#pragma once
// Helpers shared by the MPI tests: reproducible per-rank inputs and cross-rank checks.
#include <cgx/allreduce_plan.hpp>
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "test_mix.hpp"

namespace cgx_test {

// Plan options that always run the reducer's schedule: no fallback to the transport's
// native allreduce for small messages (tests of the schedules need every size).
inline cgx::plan_options schedule_always(cgx::plan_options o = {}) {
  o.native_below_bytes = 0;
  return o;
}

// Plan options that check every call collectively, whatever its size.
inline cgx::plan_options checked(cgx::plan_options o = {}) {
  o.check = cgx::checking::collective;
  return o;
}

inline int world_rank() {
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// Rank r's input value i: gradient-like, reproducible on every rank.
inline double input_value(int r, std::size_t i, std::uint64_t salt = 0) {
  const std::uint64_t h = mix(salt * 1000003u + static_cast<std::uint64_t>(r) * 0x10001u + i);
  const double u = static_cast<double>(h >> 11) * 0x1p-53;            // [0, 1)
  const double scale = 0.5 + static_cast<double>((i / 1024) % 5);  // buckets of different ranges
  return (u - 0.5) * scale + 0.01 * r;
}

template <class T>
std::vector<T> inputs(int r, std::size_t n, std::uint64_t salt = 0) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(input_value(r, i, salt));
  return x;
}

// Integer-valued inputs in [-1000, 1000]: every schedule sums them exactly.
template <class T>
std::vector<T> integer_inputs(int r, std::size_t n) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = static_cast<T>(static_cast<int>(mix(i * 7 + static_cast<std::size_t>(r)) % 2001) - 1000);
  return x;
}

// MPI_Allreduce's sum of v: the reference a passthrough allreduce must equal exactly.
template <class T>
std::vector<T> mpi_sum(const std::vector<T>& v) {
  std::vector<T> out(v.size());
  MPI_Allreduce(v.data(), out.data(), static_cast<int>(v.size()), std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE,
                MPI_SUM, MPI_COMM_WORLD);
  return out;
}

// Every rank's result equals rank 0's, bit for bit.
template <class T>
bool identical_on_all_ranks(const std::vector<T>& v) {
  std::vector<T> root = v;
  if (!v.empty()) MPI_Bcast(root.data(), static_cast<int>(v.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = v.empty() || std::memcmp(root.data(), v.data(), v.size() * sizeof(T)) == 0 ? 1 : 0;
  int all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

// The code of the cgx::error that f() throws, or nothing if it throws none.
template <class F>
std::optional<cgx::errc> error_code_of(F&& f) {
  try {
    f();
  } catch (const cgx::error& e) {
    return e.code();
  }
  return std::nullopt;
}

}  // namespace cgx_test
