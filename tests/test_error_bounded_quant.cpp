// quant::error_bounded on one process: every decoded value within the bound (float and
// double, decoded to float or double), constant buckets in 9 bytes and exact,
// non-finite values and a non-positive bound escaped exactly, sizes as returned.
#include <doctest/doctest.h>

#include <cgx/quant/error_bounded.hpp>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

#include "eb_data.hpp"

namespace {
using cgx_test::eb_inputs;
using cgx_test::range_of;
using Q = cgx::quant::error_bounded<1024>;

// Compresses x with bound e, decodes to Out; returns the bytes and checks the bound.
template <class In, class Out>
std::size_t roundtrip_within(const std::vector<In>& x, double e, std::size_t& outside) {
  std::vector<std::byte> w(Q::max_compressed_bytes<In>(x.size()) + 1, std::byte{0x5a});
  const std::size_t bytes = Q::compress<In, Out>(x.data(), x.size(), w.data(), e);
  CHECK(bytes <= Q::max_compressed_bytes<In>(x.size()));
  CHECK(w[Q::max_compressed_bytes<In>(x.size())] == std::byte{0x5a});  // nothing past the bound
  std::vector<Out> y(x.size(), Out(-7));
  CHECK(Q::decompress<Out>(w.data(), x.size(), y.data()) == bytes);
  std::vector<Out> z(x.size(), Out(1));
  CHECK(Q::decompress_add<Out>(w.data(), x.size(), z.data()) == bytes);
  outside = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i])) <= e)) ++outside;
    // Add mode: 1 + decoded, in Out arithmetic.
    if (!(std::fabs(static_cast<double>(z[i]) - (1 + static_cast<double>(x[i]))) <=
          e + 2 * std::numeric_limits<Out>::epsilon() * (1 + std::fabs(static_cast<double>(x[i])))))
      ++outside;
  }
  return bytes;
}

template <class In, class Out>
void bound_matrix() {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1023}, std::size_t{1025}, std::size_t{12001}}) {
    const auto x = eb_inputs<In>(1, n, n);
    const double range = range_of(x) > 0 ? range_of(x) : 1.0;
    std::size_t last = 0;
    for (double rel : {1e-2, 1e-3, 1e-4, 1e-5, 1e-6}) {
      CAPTURE(n);
      CAPTURE(rel);
      std::size_t outside = 0;
      const std::size_t bytes = roundtrip_within<In, Out>(x, rel * range, outside);
      CHECK(outside == 0);
      CHECK(bytes >= last);  // a tighter bound never takes fewer bytes here
      last = bytes;
      const int bits_in = 8 * sizeof(In), bits_out = 8 * sizeof(Out);
      if (n == 12001)
        MESSAGE(bits_in << "-bit -> " << bits_out << "-bit, bound " << rel
                                << " x range: ratio " << static_cast<double>(n * sizeof(In)) / static_cast<double>(bytes));
    }
  }
}
}  // namespace

TEST_CASE("error_bounded: every value within the bound") {
  bound_matrix<float, float>();
  bound_matrix<float, double>();
  bound_matrix<double, double>();
  bound_matrix<double, float>();
}

TEST_CASE("error_bounded: compresses at loose bounds") {
  const auto x = eb_inputs<float>(0, 12000, 0);
  std::vector<std::byte> w(Q::max_compressed_bytes<float>(x.size()));
  const std::size_t bytes = Q::compress<float>(x.data(), x.size(), w.data(), 1e-2 * range_of(x));
  CHECK(bytes * 4 < x.size() * sizeof(float));  // better than 4x at 1e-2 of the range
}

TEST_CASE("error_bounded: a constant bucket takes 9 bytes and decodes exactly") {
  for (double v : {0.0, -3.5, 1e30, 7e-42}) {
    std::vector<double> x(2048, v);
    std::vector<std::byte> w(Q::max_compressed_bytes<double>(x.size()));
    CHECK(Q::compress<double>(x.data(), x.size(), w.data(), 1e-9) == 18);
    std::vector<double> y(x.size());
    Q::decompress<double>(w.data(), x.size(), y.data());
    CHECK(y == x);
  }
}

TEST_CASE("error_bounded: non-finite values, extreme ranges and a non-positive bound travel exactly") {
  const double inf = std::numeric_limits<double>::infinity();
  const double big = std::numeric_limits<double>::max();
  for (double e : {0.0, -1.0, std::nan(""), 1e-3}) {
    std::vector<double> x = {1.0, 2.0, inf, -big, big, 0.5, std::nan("")};
    x.resize(1500, 0.25);
    if (e == 1e-3) x[2] = 3.0, x[6] = 4.0;  // only the extreme range left
    std::vector<std::byte> w(Q::max_compressed_bytes<double>(x.size()));
    const std::size_t bytes = Q::compress<double>(x.data(), x.size(), w.data(), e);
    std::vector<double> y(x.size());
    CHECK(Q::decompress<double>(w.data(), x.size(), y.data()) == bytes);
    CHECK(std::memcmp(x.data(), y.data(), 1024 * sizeof(double)) == 0);  // first bucket escaped, bit for bit
    if (e > 0) CHECK(bytes < Q::max_compressed_bytes<double>(x.size()));  // the second bucket is constant
  }
}

TEST_CASE("error_bounded: bounds near the precision of the data") {
  // Values near 1000 in float: ulp 6e-5; a bound of 1e-4 must still hold or escape.
  std::vector<float> x(4096);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1000.0f + static_cast<float>(cgx_test::eb_unit(i));
  for (double e : {1e-3, 1e-4, 3e-5, 1e-7}) {
    std::size_t outside = 0;
    roundtrip_within<float, float>(x, e, outside);
    CHECK(outside == 0);
  }
}
