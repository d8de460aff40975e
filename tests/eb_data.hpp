#pragma once
// Inputs for the error-bounded tests: smooth regions, noise, constant regions and
// outliers, reproducible on every rank; and the data range they span.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "test_mix.hpp"

namespace cgx_test {

inline double eb_unit(std::uint64_t h) { return static_cast<double>(mix(h) >> 11) * 0x1p-53; }  // [0, 1)

// Value i of rank r: regions of 1500 values (not aligned to buckets) cycling through
// smooth, noisy, constant, and smooth with outliers (every 97th value +-500).
inline double eb_value(int r, std::size_t i, std::uint64_t salt = 0) {
  const double t = static_cast<double>(i);
  const double u = eb_unit(salt * 1000003u + static_cast<std::uint64_t>(r) * 0x10001u + i);
  switch ((i / 1500 + salt) % 4) {
    case 0: return 10 * std::sin(0.01 * t + r);
    case 1: return 5 * (2 * u - 1) + r;
    case 2: return 3.25 + r;
    default: return 2 * std::cos(0.003 * t) + (i % 97 == 0 ? (u < 0.5 ? -500.0 : 500.0) : 0.0);
  }
}

template <class T>
std::vector<T> eb_inputs(int r, std::size_t n, std::uint64_t salt = 0) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(eb_value(r, i, salt));
  return x;
}

// max - min over the values of a vector.
template <class T>
double range_of(const std::vector<T>& x) {
  if (x.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
  return static_cast<double>(*hi) - static_cast<double>(*lo);
}

}  // namespace cgx_test
