#pragma once
/// \file host_exec.hpp
/// How host kernels use threads. One thread by default: a caller that already runs
/// one rank per core must not get more threads than it asked for.

#include <algorithm>
#include <cstddef>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

namespace cgx::quant {

/// Execution settings of host kernels.
struct host_exec {
  int threads = 1;  ///< threads to split a call over (by whole buckets); 1 = the calling thread only
};

namespace detail {

/// The threaded part of for_each_range, compiled once per program rather than once per
/// kernel: fn(ctx, begin, end) on t ranges, range 0 on the calling thread. A thread that
/// cannot be started (std::system_error) leaves its ranges to the calling thread.
inline void for_each_range_threaded(std::size_t t, std::size_t count, void (*fn)(void*, std::size_t, std::size_t),
                                    void* ctx) {
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  std::size_t started = 1;
  for (; started < t; ++started) {
    const std::size_t i = started;
    try {
      pool.emplace_back([fn, ctx, i, t, count] { fn(ctx, count * i / t, count * (i + 1) / t); });
    } catch (const std::system_error&) {
      break;
    }
  }
  fn(ctx, 0, count / t);
  if (started < t) fn(ctx, count * started / t, count);
  for (auto& th : pool) th.join();
}

}  // namespace detail

/// Calls f(begin, end) on disjoint ranges covering [0, count), on up to ex.threads threads
/// (the calling thread takes the first range).
template <class F>
void for_each_range(host_exec ex, std::size_t count, F&& f) {
  const std::size_t t = ex.threads > 1 ? std::min<std::size_t>(static_cast<std::size_t>(ex.threads), count) : 1;
  if (t <= 1) {
    if (count > 0) f(std::size_t{0}, count);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  detail::for_each_range_threaded(
      t, count, [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

}  // namespace cgx::quant
