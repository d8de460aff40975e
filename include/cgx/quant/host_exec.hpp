#pragma once
/// \file host_exec.hpp
/// How host kernels use threads. One thread by default: a caller that already runs
/// one rank per core must not get more threads than it asked for.

#include <cstddef>
#include <thread>
#include <vector>

namespace cgx::quant {

/// Execution settings of host kernels.
struct host_exec {
  int threads = 1;  ///< threads to split a call over (by whole buckets); 1 = the calling thread only
};

/// Calls f(begin, end) on disjoint ranges covering [0, count), on up to ex.threads threads
/// (the calling thread takes the first range).
template <class F>
void for_each_range(host_exec ex, std::size_t count, F&& f) {
  const std::size_t t = ex.threads > 1 ? std::min<std::size_t>(static_cast<std::size_t>(ex.threads), count) : 1;
  if (t <= 1) {
    if (count > 0) f(std::size_t{0}, count);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  for (std::size_t i = 1; i < t; ++i) {
    pool.emplace_back([&f, i, t, count] { f(count * i / t, count * (i + 1) / t); });
  }
  f(std::size_t{0}, count / t);
  for (auto& th : pool) th.join();
}

}  // namespace cgx::quant
