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
template <class T, class Q>
std::size_t outside_generic_bound(const std::vector<T>& got, std::uint64_t salt, int K) {
  const int p = world_size();
  const std::size_t n = got.size();
  constexpr std::size_t B = Q::bucket_size;
  const double L = (1 << Q::bits) - 1;
  const double c = std::is_same_v<typename Q::rounding, cgx::quant::nearest> ? 0.5 : 1.0;
  std::vector<std::vector<T>> x(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) x[static_cast<std::size_t>(r)] = inputs<T>(r, n, salt);
  std::size_t bad = 0;
  for (std::size_t b0 = 0; b0 < n; b0 += B) {
    const std::size_t b1 = std::min(n, b0 + B);
    double ranges = 0, mag = 0;
    for (int r = 0; r < p; ++r) {
      const auto& xr = x[static_cast<std::size_t>(r)];
      const auto [lo, hi] = std::minmax_element(xr.begin() + static_cast<std::ptrdiff_t>(b0),
                                                xr.begin() + static_cast<std::ptrdiff_t>(b1));
      ranges += static_cast<double>(*hi) - static_cast<double>(*lo);
      mag += std::max(std::fabs(static_cast<double>(*lo)), std::fabs(static_cast<double>(*hi)));
    }
    double err = 0;
    for (int k = 0; k < K; ++k) err += c * (ranges + 2 * err) / L;
    const double bound = err + 8 * (K + p) * std::numeric_limits<T>::epsilon() * (mag + err);
    for (std::size_t i = b0; i < b1; ++i) {
      double exact = 0;
      for (int r = 0; r < p; ++r) exact += static_cast<double>(x[static_cast<std::size_t>(r)][i]);
      if (!(std::fabs(static_cast<double>(got[i]) - exact) <= bound)) ++bad;
    }
  }
  return bad;
}

}  // namespace cgx_test
