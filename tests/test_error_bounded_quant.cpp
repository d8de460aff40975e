// quant::error_bounded on one process: every decoded value within the bound (float and
// double, decoded to float or double), constant buckets in 9 bytes and exact,
// non-finite values and a non-positive bound escaped exactly, sizes as returned; the
// delta mode (first-order prediction) on smooth, rough, constant, NaN/Inf,
// alternating-sign and ramp data, read back by an independent reading of the wire
// format, with the same decoded bits as the plain mode.
#include <doctest/doctest.h>

#include <cgx/quant/error_bounded.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
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
  CHECK(Q::decompress<Out>(w.data(), bytes, x.size(), y.data()) == bytes);
  std::vector<Out> z(x.size(), Out(1));
  CHECK(Q::decompress_add<Out>(w.data(), bytes, x.size(), z.data()) == bytes);
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
    CHECK(Q::decompress<double>(w.data(), 18, x.size(), y.data()) == 18);
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
    CHECK(Q::decompress<double>(w.data(), bytes, x.size(), y.data()) == bytes);
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

// ---- the delta mode (first-order prediction inside a bucket) ---------------------------
namespace {
using QAuto = cgx::quant::error_bounded<1024, cgx::quant::eb_prediction::automatic>;
using QDelta = cgx::quant::error_bounded<1024, cgx::quant::eb_prediction::delta>;
using QPlain = cgx::quant::error_bounded<1024, cgx::quant::eb_prediction::none>;

// What a stream holds, bucket by bucket, as read by ref_decode.
struct stream_census {
  std::size_t constant = 0, plain = 0, delta = 0, escaped = 0;
  std::vector<int> plain_widths, delta_widths;  // every width seen
};

template <class V>
V ref_get(const std::vector<std::byte>& s, std::size_t& at) {
  V v;
  std::memcpy(&v, s.data() + at, sizeof(V));
  at += sizeof(V);
  return v;
}

// An independent reading of the wire format in the file comment of error_bounded.hpp,
// one bit at a time: decodes n values of s into Out; returns the bytes read.
template <class Out>
std::size_t ref_decode(const std::vector<std::byte>& s, std::size_t n, std::size_t bucket, std::vector<Out>& y,
                       stream_census& census) {
  y.assign(n, Out(0));
  std::size_t at = 0;
  for (std::size_t first = 0; first < n; first += bucket) {
    const std::size_t count = std::min(bucket, n - first);
    const auto tag = static_cast<unsigned>(s.at(at++));
    auto value = [](double base, double step, std::uint64_t q) {
      return static_cast<Out>(base + static_cast<double>(q) * step);  // the documented expression
    };
    if (tag == 0xFE || tag == 0xFF) {
      ++census.escaped;
      for (std::size_t i = 0; i < count; ++i)
        y[first + i] = static_cast<Out>(tag == 0xFE ? static_cast<double>(ref_get<float>(s, at)) : ref_get<double>(s, at));
      continue;
    }
    const double base = ref_get<double>(s, at);
    if (tag == 0) {
      ++census.constant;
      for (std::size_t i = 0; i < count; ++i) y[first + i] = static_cast<Out>(base);
      continue;
    }
    const double step = ref_get<double>(s, at);
    const bool delta = tag >= 0x40;
    REQUIRE(((tag >= 1 && tag <= 44) || (tag >= 0x40 && tag <= 0x40 + 44)));
    const unsigned width = delta ? tag - 0x40 : tag;
    std::uint64_t q = 0, dlo = 0;
    std::size_t codes = count;
    if (delta) {
      q = ref_get<std::uint64_t>(s, at);
      dlo = ref_get<std::uint64_t>(s, at);
      codes = count - 1;
      y[first] = value(base, step, q);
      ++census.delta;
      census.delta_widths.push_back(static_cast<int>(width));
    } else {
      ++census.plain;
      census.plain_widths.push_back(static_cast<int>(width));
    }
    const std::size_t bits_at = at * 8;
    for (std::size_t k = 0; k < codes; ++k) {
      std::uint64_t c = 0;
      for (unsigned b = 0; b < width; ++b) {
        const std::size_t bit = bits_at + k * width + b;
        c |= static_cast<std::uint64_t>((static_cast<unsigned>(s.at(bit / 8)) >> (bit % 8)) & 1u) << b;
      }
      if (delta) {
        q += dlo + c;
        CHECK(q < (std::uint64_t{1} << 45));
        y[first + 1 + k] = value(base, step, q);
      } else {
        y[first + k] = value(base, step, c);
      }
    }
    at += (codes * width + 7) / 8;
  }
  return at;
}

// Compresses x with Qz and bound e into Out; checks the bound on every element (decompress
// and decompress_add), the bytes against the reference reading and the sizes; returns the
// stream's bytes and the decoded values.
template <class Qz, class In, class Out>
std::size_t checked_roundtrip(const std::vector<In>& x, double e, std::vector<Out>& y, stream_census& census) {
  const std::size_t cap = Qz::template max_compressed_bytes<In>(x.size());
  std::vector<std::byte> w(cap + 1, std::byte{0x5a});
  const std::size_t bytes = Qz::template compress<In, Out>(x.data(), x.size(), w.data(), e);
  CHECK(bytes <= cap);
  CHECK(w[cap] == std::byte{0x5a});
  w = std::vector<std::byte>(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(bytes));  // exact size: ASan sees over-reads
  y.assign(x.size(), Out(-7));
  CHECK(Qz::template decompress<Out>(w.data(), bytes, x.size(), y.data()) == bytes);
  std::vector<Out> ref;
  CHECK(ref_decode<Out>(w, x.size(), Qz::bucket_size, ref, census) == bytes);
  CHECK(std::memcmp(ref.data(), y.data(), x.size() * sizeof(Out)) == 0);  // the decoder is the documented format
  std::vector<Out> z(x.size(), Out(1));
  CHECK(Qz::template decompress_add<Out>(w.data(), bytes, x.size(), z.data()) == bytes);
  std::size_t outside = 0, wrong_nonfinite = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = static_cast<double>(x[i]);
    if (!std::isfinite(xi)) {  // travels exactly (escape)
      if (!(std::isnan(xi) ? std::isnan(static_cast<double>(y[i])) : static_cast<double>(y[i]) == xi)) ++wrong_nonfinite;
      continue;
    }
    if (!(std::fabs(static_cast<double>(y[i]) - xi) <= e)) ++outside;
    if (!(std::fabs(static_cast<double>(z[i]) - (1 + xi)) <= e + 2 * std::numeric_limits<Out>::epsilon() * (1 + std::fabs(xi))))
      ++outside;
  }
  CHECK(outside == 0);
  CHECK(wrong_nonfinite == 0);
  return bytes;
}

// Data of one kind: smooth (sinusoids + 1e-3 noise), rough (+ 10% noise), constant,
// NaN/Inf in a smooth field, alternating sign, a linear ramp.
enum class kind { smooth, rough, constant, nonfinite, alternating, ramp };
template <class T>
std::vector<T> make(kind k, std::size_t n) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double t = static_cast<double>(i);
    const double s = std::sin(0.003 * t) + 0.5 * std::sin(0.011 * t + 1) + 1e-3 * (2 * cgx_test::eb_unit(i) - 1);
    switch (k) {
      case kind::smooth: x[i] = static_cast<T>(s); break;
      case kind::rough: x[i] = static_cast<T>(s + 0.15 * (2 * cgx_test::eb_unit(i + 77777) - 1)); break;
      case kind::constant: x[i] = static_cast<T>(-2.75); break;
      case kind::nonfinite: {
        const double inf = std::numeric_limits<double>::infinity();
        x[i] = static_cast<T>(i % 1500 == 700 ? std::nan("") : i % 2100 == 3 ? inf : i % 2900 == 5 ? -inf : s);
        break;
      }
      case kind::alternating: x[i] = static_cast<T>((i % 2 ? -1.0 : 1.0) * (1.5 + s)); break;
      case kind::ramp: x[i] = static_cast<T>(0.125 * t - 40); break;
    }
  }
  return x;
}

const char* name_of(kind k) {
  constexpr const char* names[] = {"smooth", "rough", "constant", "nonfinite", "alternating", "ramp"};
  return names[static_cast<int>(k)];
}

template <class In, class Out>
void delta_matrix() {
  for (kind k : {kind::smooth, kind::rough, kind::constant, kind::nonfinite, kind::alternating, kind::ramp}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{1023}, std::size_t{1025},
                          std::size_t{6001}}) {
      const auto x = make<In>(k, n);
      for (double e : {1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6}) {
        CAPTURE(name_of(k));
        CAPTURE(n);
        CAPTURE(e);
        std::vector<Out> ya, yd, yp;
        stream_census ca, cd, cp;
        const std::size_t ba = checked_roundtrip<QAuto>(x, e, ya, ca);
        const std::size_t bd = checked_roundtrip<QDelta>(x, e, yd, cd);
        const std::size_t bp = checked_roundtrip<QPlain>(x, e, yp, cp);
        // The modes carry the same grid indices: identical decoded bits whichever is written.
        CHECK(std::memcmp(ya.data(), yp.data(), n * sizeof(Out)) == 0);
        CHECK(std::memcmp(yd.data(), yp.data(), n * sizeof(Out)) == 0);
        CHECK(cp.delta == 0);                   // eb_prediction::none writes the plain mode only
        CHECK(ba <= bp);                        // the smaller mode per bucket: never more bytes
        CHECK(ba <= bd);
        CHECK(ca.escaped == cp.escaped);        // the same buckets escape
        CHECK(cd.plain + cd.delta == cp.plain); // forced: every coded bucket that can take the delta mode does
        // The predictor path is exercised wherever the plain mode codes a bucket (not where
        // Out cannot hold the bound at the data's magnitude: float at 1e-6 of a ramp to 700).
        if (n >= 1023 && cp.plain > 0) CHECK(cd.delta > 0);
        if (k == kind::constant) {
          std::size_t want = 0;  // 9 bytes a bucket; a bucket of at most 8 raw bytes escapes
          for (std::size_t first = 0; first < n; first += QAuto::bucket_size) {
            const std::size_t count = std::min(QAuto::bucket_size, n - first);
            want += count * sizeof(In) <= 8 ? 1 + count * sizeof(In) : 9;
          }
          CHECK(ba == want);
          CHECK(std::equal(x.begin(), x.end(), ya.begin(), [](In a, Out b) { return static_cast<double>(a) == static_cast<double>(b); }));
        }
        if (k == kind::smooth && n >= 1023 && e <= 1e-2 && e >= 1e-5) {
          CHECK(ca.delta == ca.plain + ca.delta);  // smooth: every coded bucket predicted
          CHECK(ba * 3 < bp * 2);                  // and at least 1.5x fewer bytes
        }
        if (k == kind::alternating && n >= 1023) CHECK(ca.delta == 0);  // differences twice the values: plain wins
        if (k == kind::nonfinite && n >= 1023) CHECK(ca.escaped > 0);
        if (k == kind::ramp && n >= 1023 && cp.plain == QAuto::buckets(n))
          CHECK(ba * 5 < bp);  // steps of 1/8 on the grid: differences of one or two values, 1 bit
      }
    }
  }
}
}  // namespace

TEST_CASE("error_bounded delta mode: smooth, rough, constant, NaN/Inf, alternating sign, ramp") {
  delta_matrix<float, float>();
  delta_matrix<float, double>();
  delta_matrix<double, double>();
  delta_matrix<double, float>();
}

TEST_CASE("error_bounded delta mode: widths 0 to 44 in both modes match the reference reading") {
  // Smooth doubles over a range of 2 at bounds 1e-1 .. 1e-13 (plain widths up to ~44,
  // both packers: whole words up to 32 bits, bytes above), and a ramp on the grid.
  std::vector<double> x(3000);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = std::sin(0.002 * static_cast<double>(i)) + 1e-9 * cgx_test::eb_unit(i);
  std::set<int> plain, delta;
  for (double e = 1e-1; e > 1e-13; e /= 3) {
    CAPTURE(e);
    std::vector<double> ya, yd, yp;
    stream_census ca, cd, cp;
    checked_roundtrip<QAuto>(x, e, ya, ca);
    checked_roundtrip<QDelta>(x, e, yd, cd);
    checked_roundtrip<QPlain>(x, e, yp, cp);
    CHECK(ya == yp);
    CHECK(yd == yp);
    plain.insert(cp.plain_widths.begin(), cp.plain_widths.end());
    delta.insert(cd.delta_widths.begin(), cd.delta_widths.end());
  }
  CHECK(plain.size() >= 25);
  CHECK(delta.size() >= 25);
  CHECK(*plain.rbegin() > 32);  // the byte packer ran
  CHECK(*delta.rbegin() > 32);
  // Width 0: every difference equal (integers, a bound that makes the step exactly 1).
  std::vector<double> ramp(1024);
  for (std::size_t i = 0; i < ramp.size(); ++i) ramp[i] = 3.0 + static_cast<double>(i);
  std::vector<double> y;
  stream_census c;
  CHECK(checked_roundtrip<QAuto>(ramp, 0.502, y, c) == 33);  // tag, base, step, q0, dlo
  CHECK(c.delta_widths == std::vector<int>{0});
  CHECK(y == ramp);
}
