#pragma once
// A per-element error bound that holds for any reduction schedule, given the number
// of quantizations on an element's path.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <cgx/quant/rounding.hpp>

#include "mpi_test_util.hpp"

namespace cgx_test {

// Any schedule: each of the K quantizations on an element's path quantizes a partial
// sum of some ranks' inputs (plus the error so far); its unit is at most (sum of all
// ranks' bucket ranges + 2 err) / L and it adds at most c * unit to the error.
// This form checks got[lo, hi), quantized in buckets of B values counted from lo, with
// `bits` bits (0: not quantized, only the rounding of the sum is allowed) and c = 1/2
// (nearest) or 1 (stochastic), against the exact sum over r < p of x(r, i).
template <class T, class X>
std::size_t outside_bound_in(const T* got, std::size_t lo, std::size_t hi, int p, std::size_t B, int bits, double c,
                             int K, X&& x) {
  const double L = bits > 0 ? (1 << bits) - 1 : 1;
  if (bits == 0) K = 0;
  std::size_t bad = 0;
  for (std::size_t b0 = lo; b0 < hi; b0 += B) {
    const std::size_t b1 = std::min(hi, b0 + B);
    double ranges = 0, mag = 0;
    for (int r = 0; r < p; ++r) {
      double mn = static_cast<double>(x(r, b0)), mx = mn;
      for (std::size_t i = b0 + 1; i < b1; ++i) {
        const double v = static_cast<double>(x(r, i));
        mn = std::min(mn, v);
        mx = std::max(mx, v);
      }
      ranges += mx - mn;
      mag += std::max(std::fabs(mn), std::fabs(mx));
    }
    double err = 0;
    for (int k = 0; k < K; ++k) err += c * (ranges + 2 * err) / L;
    const double bound = err + 8 * (K + p) * std::numeric_limits<T>::epsilon() * (mag + err);
    for (std::size_t i = b0; i < b1; ++i) {
      double exact = 0;
      for (int r = 0; r < p; ++r) exact += static_cast<double>(x(r, i));
      if (!(std::fabs(static_cast<double>(got[i]) - exact) <= bound)) ++bad;
    }
  }
  return bad;
}

// The bound above for a whole buffer reduced over all ranks with quantizer Q, the
// inputs being inputs<T>(r, n, salt).
template <class T, class Q>
std::size_t outside_generic_bound(const std::vector<T>& got, std::uint64_t salt, int K) {
  const int p = world_size();
  const std::size_t n = got.size();
  const double c = std::is_same_v<typename Q::rounding, cgx::quant::nearest> ? 0.5 : 1.0;
  std::vector<std::vector<T>> x(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) x[static_cast<std::size_t>(r)] = inputs<T>(r, n, salt);
  return outside_bound_in(got.data(), 0, n, p, Q::bucket_size, Q::bits, c, K,
                          [&](int r, std::size_t i) { return x[static_cast<std::size_t>(r)][i]; });
}

}  // namespace cgx_test
