// Issue 18 on one process: quant::error_bounded's decoder given the received length
// (every truncation of valid streams in each mode, tags no encoder writes, issue 18's
// minimal crash input 0a 0a 0a 0a, streams with bytes left over) throws
// errc::corrupt and reads nothing past the bytes it is given (the buffers are exactly
// sized: ASan builds see any over-read); the checked size helpers; sizes that wrap;
// and what a sum that overflows gives through quant::none and quant::maxmin's
// decode-add (+-Inf) and a max-min bucket holding +-Inf or spanning the whole range.
#include <doctest/doctest.h>

#include <cgx/comm/chunking.hpp>
#include <cgx/comm/error_bounded_schedules.hpp>
#include <cgx/detail/checked.hpp>
#include <cgx/error.hpp>
#include <cgx/quant/error_bounded.hpp>
#include <cgx/quant/maxmin.hpp>
#include <cgx/quant/none.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "thrown_code.hpp"

namespace {

using cgx::quant::eb_prediction;

using cgx_test::thrown_code;

// Values of kind k: 0 smooth (coded buckets), 1 constant (tag 0), 2 with NaN (escape).
std::vector<double> values(int k, std::size_t n) {
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = k == 1 ? 2.5 : std::sin(0.02 * static_cast<double>(i)) + 1e-3 * (i % 7);
  if (k == 2) x[n / 2] = std::nan("");
  return x;
}

template <class Q>
std::vector<std::byte> encode(const std::vector<double>& x, double e) {
  std::vector<std::byte> w(Q::template max_compressed_bytes<double>(x.size()));
  w.resize(Q::template compress<double>(x.data(), x.size(), w.data(), e));
  return w;
}

// Every prefix of a valid stream (exactly sized copy) throws errc::corrupt in both
// decoders; the whole stream decodes to its length; the stream with a byte appended
// decodes to the same length (the caller compares it with what it received).
template <class Q>
void every_truncation(const std::vector<double>& x, double e) {
  const std::vector<std::byte> w = encode<Q>(x, e);
  std::vector<double> y(x.size());
  for (std::size_t len = 0; len < w.size(); ++len) {
    std::vector<std::byte> cut(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(len));
    CHECK(thrown_code([&] { Q::template decompress<double>(cut.data(), len, x.size(), y.data()); }) == cgx::errc::corrupt);
    CHECK(thrown_code([&] { Q::template decompress_add<double>(cut.data(), len, x.size(), y.data()); }) ==
          cgx::errc::corrupt);
  }
  CHECK(Q::template decompress<double>(w.data(), w.size(), x.size(), y.data()) == w.size());
  std::vector<std::byte> longer = w;
  longer.push_back(std::byte{0});
  CHECK(Q::template decompress<double>(longer.data(), longer.size(), x.size(), y.data()) == w.size());
}

}  // namespace

TEST_CASE("error_bounded decoder: every truncation of a valid stream throws errc::corrupt, in each mode") {
  using Auto = cgx::quant::error_bounded<64, eb_prediction::automatic>;
  using Plain = cgx::quant::error_bounded<64, eb_prediction::none>;
  using Delta = cgx::quant::error_bounded<64, eb_prediction::delta>;
  for (int k = 0; k < 3; ++k)
    for (double e : {1e-1, 1e-4, 1e-9}) {
      const std::vector<double> x = values(k, 300);  // 4 full buckets and a short one
      every_truncation<Auto>(x, e);
      every_truncation<Plain>(x, e);
      every_truncation<Delta>(x, e);
    }
}

TEST_CASE("error_bounded decoder: tags no encoder writes throw errc::corrupt (no shift by 64 or more)") {
  using Q = cgx::quant::error_bounded<8>;
  // A stream long enough for any bucket of 8 values: the tag alone makes it invalid.
  for (int tag = 0; tag < 256; ++tag) {
    std::vector<std::byte> w(1 + 32 + 8 * 8, std::byte{0x11});
    w[0] = static_cast<std::byte>(tag);
    const bool valid = tag <= Q::max_width || (tag >= Q::delta_tag && tag <= Q::delta_tag + Q::max_width) ||
                       tag == Q::escape_f32 || tag == Q::escape_f64;
    std::vector<float> y(8);
    if (valid) {
      CHECK(Q::decompress<float>(w.data(), w.size(), 8, y.data()) == 1 + Q::body_bytes(static_cast<std::uint8_t>(tag), 8));
    } else {
      CAPTURE(tag);
      CHECK(thrown_code([&] { Q::decompress<float>(w.data(), w.size(), 8, y.data()); }) == cgx::errc::corrupt);
      CHECK(Q::body_bytes(static_cast<std::uint8_t>(tag), 8) == std::numeric_limits<std::size_t>::max());
    }
  }
}

TEST_CASE("error_bounded decoder: issue 18's minimal crash input and empty messages") {
  using Q = cgx::quant::error_bounded<1024>;
  const std::vector<std::byte> crash = {std::byte{0x0a}, std::byte{0x0a}, std::byte{0x0a}, std::byte{0x0a}};
  std::vector<double> y(5000);
  for (std::size_t n : {std::size_t{1}, std::size_t{10}, std::size_t{2570}, std::size_t{5000}}) {
    CHECK(thrown_code([&] { Q::decompress<double>(crash.data(), crash.size(), n, y.data()); }) == cgx::errc::corrupt);
    CHECK(thrown_code([&] { Q::decompress_add<double>(crash.data(), crash.size(), n, y.data()); }) == cgx::errc::corrupt);
    CHECK(thrown_code([&] { Q::decompress<double>(nullptr, 0, n, y.data()); }) == cgx::errc::corrupt);
  }
  CHECK(Q::decompress<double>(nullptr, 0, 0, y.data()) == 0);  // no values: nothing to read
}

TEST_CASE("checked size helpers and sizes that used to wrap") {
  constexpr std::size_t max = std::numeric_limits<std::size_t>::max();
  CHECK(cgx::detail::checked_mul(3, 5) == 15);
  CHECK(cgx::detail::checked_add(max - 1, 1) == max);
  CHECK(thrown_code([&] { (void)cgx::detail::checked_mul(max / 2 + 1, 2); }) == cgx::errc::invalid_argument);
  CHECK(thrown_code([&] { (void)cgx::detail::checked_add(max, 1); }) == cgx::errc::invalid_argument);
  CHECK(thrown_code([&] { cgx::detail::check_raw_bytes(max, 4); }) == cgx::errc::invalid_argument);
  CHECK(thrown_code([&] { cgx::detail::check_raw_bytes((std::size_t{1} << 58) + 1, 4); }) == cgx::errc::invalid_argument);
  cgx::detail::check_raw_bytes(std::size_t{1} << 58, 4);  // exactly 2^60 bytes: accepted
  CHECK(thrown_code([&] { (void)cgx::detail::checked_round_to_line(max - 10); }) == cgx::errc::invalid_argument);
  // chunk_of no longer forms n + granule - 1 or units * r: the chunks of SIZE_MAX values
  // cover it exactly (the old code gave chunks of a wrapped count).
  for (int p : {1, 2, 3, 7}) {
    std::size_t covered = 0;
    for (int r = 0; r < p; ++r) {
      const cgx::comm::chunk c = cgx::comm::chunk_of(max, p, r, 1024);
      CHECK(c.begin == covered);
      covered += c.count;
    }
    CHECK(covered == max);
  }
  // The old cut, for counts where it does not wrap: the same chunks.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{1025}, std::size_t{100000}})
    for (int p : {1, 2, 3, 5})
      for (int r = 0; r < p; ++r) {
        const std::size_t units = (n + 1023) / 1024;
        const std::size_t b = std::min(n, units * static_cast<std::size_t>(r) / static_cast<std::size_t>(p) * 1024);
        const std::size_t e = std::min(n, units * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(p) * 1024);
        const cgx::comm::chunk c = cgx::comm::chunk_of(n, p, r, 1024);
        CHECK(c.begin == b);
        CHECK(c.count == e - b);
      }
  CHECK(cgx::quant::error_bounded<1024>::buckets(max) == max / 1024 + 1);
}

TEST_CASE("a sum that overflows: +-Inf through quant::none and maxmin's decode-add") {
  constexpr float big = std::numeric_limits<float>::max();
  constexpr float inf = std::numeric_limits<float>::infinity();
  // none: the raw values added in T, as MPI_Allreduce adds them.
  const std::vector<float> x = {big, -big, 1.0f, big * 0.75f};
  std::vector<std::byte> w(cgx::quant::none::compressed_bytes<float>(x.size()));
  cgx::quant::none::compress<float>(x.data(), x.size(), w.data());
  std::vector<float> acc = {big, -big, 1.0f, big * 0.75f};
  cgx::quant::none::decompress_add<float>(w.data(), x.size(), acc.data());
  CHECK(acc[0] == inf);
  CHECK(acc[1] == -inf);
  CHECK(acc[2] == 2.0f);
  CHECK(acc[3] == inf);

  // maxmin: a finite bucket near the top of the range decodes to finite values, and
  // adding them to an accumulator that overflows gives +-Inf, not NaN.
  using Q = cgx::quant::maxmin<4, 64, cgx::quant::nearest>;
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = big * (0.5f + 0.25f * static_cast<float>(i % 3));
  std::vector<std::byte> c(Q::compressed_bytes<float>(v.size()));
  Q::compress<float>(v.data(), v.size(), c.data());
  std::vector<float> a(v.size(), big), b(v.size(), -big);
  Q::decompress_add<float>(c.data(), v.size(), a.data());
  std::vector<float> neg(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) neg[i] = -v[i];
  Q::compress<float>(neg.data(), neg.size(), c.data());
  Q::decompress_add<float>(c.data(), v.size(), b.data());
  for (std::size_t i = 0; i < v.size(); ++i) {
    CHECK(a[i] == inf);
    CHECK(b[i] == -inf);
  }
}

TEST_CASE("maxmin: a bucket spanning the whole range decodes finite; a bucket holding +-Inf decodes to NaN") {
  // The documented behaviour (README "Guarantees"): a max-min bucket whose max - min
  // overflows is a "wide" bucket and decodes to finite values within the bound; one that
  // holds an infinity (for instance a partial sum that overflowed) decodes to NaN for the
  // whole bucket: non-finite, so loss scalers see it, but not the +-Inf of MPI_Allreduce.
  constexpr float big = std::numeric_limits<float>::max();
  using Q = cgx::quant::maxmin<8, 64, cgx::quant::nearest>;
  std::vector<float> v(64);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = (i % 2 == 0 ? 0.9f : -0.9f) * big;
  std::vector<std::byte> c(Q::compressed_bytes<float>(v.size()));
  Q::compress<float>(v.data(), v.size(), c.data());
  std::vector<float> y(v.size());
  Q::decompress<float>(c.data(), v.size(), y.data());
  for (float d : y) CHECK(std::isfinite(d));
  v[3] = std::numeric_limits<float>::infinity();
  Q::compress<float>(v.data(), v.size(), c.data());
  Q::decompress<float>(c.data(), v.size(), y.data());
  for (float d : y) CHECK(std::isnan(d));
}

namespace {

// A transport of two ranks seen from rank 0: each receive takes the next bytes of a
// script (what rank 1 would have sent); sends are dropped.
struct script_transport {
  struct request {};
  std::vector<std::byte> script;
  std::size_t at = 0;
  int rank() const { return 0; }
  int size() const { return 2; }
  request isend(const void*, std::size_t, int, int) { return {}; }
  request irecv(void* buf, std::size_t bytes, int, int) {
    if (script.size() - at < bytes) throw std::runtime_error("the script ran out");
    std::memcpy(buf, script.data() + at, bytes);
    at += bytes;
    return {};
  }
  void wait_all(std::span<request>) {}
  void max_all(std::span<std::int64_t>) {}
};

using QS = cgx::quant::error_bounded<64>;

// The two messages rank 0 of 2 receives in one call of R's error-bounded schedule for n
// values (SRA: rank 1's part of chunk 0, then the sum of chunk 1; ring: chunk 1 at the
// reduce step, then chunk 0 at the allgather step), each a valid stream of its count.
template <class R>
std::vector<std::vector<std::byte>> messages(std::size_t n) {
  const cgx::comm::chunk c0 = cgx::comm::chunk_of(n, 2, 0, 64), c1 = cgx::comm::chunk_of(n, 2, 1, 64);
  const bool ring = std::is_same_v<R, cgx::comm::ring>;
  std::vector<std::vector<std::byte>> m;
  for (const cgx::comm::chunk& c : {ring ? c1 : c0, ring ? c0 : c1}) {
    std::vector<double> x(c.count);
    for (std::size_t i = 0; i < c.count; ++i) x[i] = std::sin(0.01 * static_cast<double>(c.begin + i)) + 0.5;
    m.push_back(encode<QS>(x, 1e-4));
  }
  return m;
}

// The script of those messages, message 0 changed by edit(payload, length header).
template <class Edit>
std::vector<std::byte> script_of(std::vector<std::vector<std::byte>> m, Edit edit) {
  std::uint64_t len0 = m[0].size();
  edit(m[0], len0);
  std::vector<std::byte> s;
  auto put = [&](const void* p, std::size_t bytes) {
    const auto* b = static_cast<const std::byte*>(p);
    s.insert(s.end(), b, b + bytes);
  };
  put(&len0, 8);
  put(m[0].data(), m[0].size());
  const std::uint64_t len1 = m[1].size();
  put(&len1, 8);
  put(m[1].data(), m[1].size());
  return s;
}

// Runs rank 0's side of one call over the script; the errc it throws, or nullopt.
template <class R, class Edit>
std::optional<cgx::errc> run_script(Edit edit) {
  const std::size_t n = 1000;
  using S = typename cgx::comm::error_bounded_schedule<R>::template schedule<float, QS, script_transport>;
  script_transport x{script_of(messages<R>(n), edit)};
  std::vector<float> buf(n, 0.25f);
  std::vector<std::byte> ws(S::workspace_bytes(n, 2));
  S s(x);
  try {
    s.run(buf.data(), n, x, ws.data(), 1e-4);
  } catch (const cgx::error& e) {
    return e.code();
  }
  return std::nullopt;
}

template <class R>
void malformed_messages() {
  auto none = [](std::vector<std::byte>&, std::uint64_t&) {};
  CHECK(run_script<R>(none) == std::nullopt);  // the valid script runs through
  // Cut by one byte: the old decoder read the missing byte from the stale workspace.
  CHECK(run_script<R>([](std::vector<std::byte>& p, std::uint64_t& len) {
          p.pop_back();
          len = p.size();
        }) == cgx::errc::corrupt);
  // An empty message where values were expected: the old decoder decoded stale bytes.
  CHECK(run_script<R>([](std::vector<std::byte>& p, std::uint64_t& len) {
          p.clear();
          len = 0;
        }) == cgx::errc::corrupt);
  // A byte left over: the old schedule never compared the lengths.
  CHECK(run_script<R>([](std::vector<std::byte>& p, std::uint64_t& len) {
          p.push_back(std::byte{0});
          len = p.size();
        }) == cgx::errc::corrupt);
  // A width tag above 44: the old decoder shifted by it (undefined behaviour).
  CHECK(run_script<R>([](std::vector<std::byte>& p, std::uint64_t&) { p[0] = std::byte{45}; }) == cgx::errc::corrupt);
  // A length header larger than the receive slot.
  CHECK(run_script<R>([](std::vector<std::byte>& p, std::uint64_t& len) {
          len = std::uint64_t{1} << 40;
          p.clear();
        }) == cgx::errc::corrupt);
}

}  // namespace

TEST_CASE("error-bounded SRA and ring schedules: malformed messages throw errc::corrupt, never read past them") {
  malformed_messages<cgx::comm::scatter_reduce_allgather>();
  malformed_messages<cgx::comm::ring>();
}
