// libFuzzer harness: quant::error_bounded's decoder on arbitrary bytes, and its encoder on
// arbitrary values.
//
// Input: byte 0 = mode, bytes 1-2 = n (little-endian), byte 3 = bound exponent, then the
// payload. mode bit 4 clear: decode the payload as a stream of n values (bit 0: to double,
// else float; bit 1: decompress_add, else decompress; bits 2-3: bucket of 1024, 16, 3 or
// 1 values). The payload is the stream exactly (libFuzzer's buffer, so ASan sees any read
// past it); the decoder must return at most its length or throw errc::corrupt.
// mode bit 4 set: the payload is values (bit 0: double, else float), compressed with the
// prediction of bits 5-6 (automatic, none, delta) and a bound of 2^-(byte 3 % 64) times the
// largest finite magnitude (or 2^-(byte 3 % 64) for all-zero data), decoded and checked:
// the size within max_compressed_bytes, every finite value within the bound, +-Inf
// exactly, NaN as NaN.
#include <cgx/error.hpp>
#include <cgx/quant/error_bounded.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_input.hpp"

namespace {

template <class Q, class Out>
void decode(const std::uint8_t* data, std::size_t size, std::size_t n, bool add) {
  std::vector<Out> out(n, Out(1));
  const auto* in = reinterpret_cast<const std::byte*>(data);
  try {
    const std::size_t used = add ? Q::template decompress_add<Out>(in, size, n, out.data())
                                 : Q::template decompress<Out>(in, size, n, out.data());
    if (used > size) std::abort();
  } catch (const cgx::error& e) {
    if (e.code() != cgx::errc::corrupt) std::abort();
  }
}

template <std::size_t B, class Out>
void decode_bucket(const std::uint8_t* data, std::size_t size, std::size_t n, bool add) {
  decode<cgx::quant::error_bounded<B>, Out>(data, size, n, add);
}

template <class Q, class T>
void roundtrip(const std::uint8_t* data, std::size_t size, int exponent) {
  const std::size_t n = size / sizeof(T);
  std::vector<T> x(n);
  if (n != 0) std::memcpy(x.data(), data, n * sizeof(T));
  double mag = 0;
  for (T v : x)
    if (std::isfinite(v)) mag = std::fmax(mag, std::fabs(static_cast<double>(v)));
  const double e = std::ldexp(mag > 0 ? mag : 1.0, -exponent);
  if (!(e > 0)) return;  // underflow: compress escapes every bucket, nothing to check
  const std::size_t cap = Q::template max_compressed_bytes<T>(n);
  std::vector<std::byte> w(cap);
  const std::size_t bytes = Q::template compress<T>(x.data(), n, w.data(), e);
  if (bytes > cap) std::abort();
  w.resize(bytes);  // exact size: a decoder read past it is an ASan report
  std::vector<T> y(n);
  if (Q::template decompress<T>(w.data(), bytes, n, y.data()) != bytes) std::abort();
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isfinite(x[i])) {
      if (!(std::fabs(static_cast<double>(y[i]) - static_cast<double>(x[i])) <= e)) std::abort();
    } else if (std::isnan(x[i]) ? !std::isnan(y[i]) : y[i] != x[i]) {
      std::abort();  // NaN stays NaN (a signalling NaN comes back quiet: the decoder widens to double), Inf stays Inf
    }
  }
}

template <cgx::quant::eb_prediction P>
void roundtrip_prediction(const std::uint8_t* data, std::size_t size, bool dbl, int exponent) {
  using Q = cgx::quant::error_bounded<64, P>;  // small buckets: many per input
  if (dbl)
    roundtrip<Q, double>(data, size, exponent);
  else
    roundtrip<Q, float>(data, size, exponent);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cgx_fuzz::input in{data, size};
  const unsigned mode = in.byte();
  const std::size_t n = in.u16();
  const int exponent = in.byte() % 64;
  const bool dbl = (mode & 1) != 0;
  if ((mode & 0x10) == 0) {
    const bool add = (mode & 2) != 0;
    switch ((mode >> 2) & 3) {
      case 0: dbl ? decode_bucket<1024, double>(in.p, in.left, n, add) : decode_bucket<1024, float>(in.p, in.left, n, add); break;
      case 1: dbl ? decode_bucket<16, double>(in.p, in.left, n, add) : decode_bucket<16, float>(in.p, in.left, n, add); break;
      case 2: dbl ? decode_bucket<3, double>(in.p, in.left, n, add) : decode_bucket<3, float>(in.p, in.left, n, add); break;
      default: dbl ? decode_bucket<1, double>(in.p, in.left, n, add) : decode_bucket<1, float>(in.p, in.left, n, add); break;
    }
    return 0;
  }
  switch ((mode >> 5) & 3) {
    case 1: roundtrip_prediction<cgx::quant::eb_prediction::none>(in.p, in.left, dbl, exponent); break;
    case 2: roundtrip_prediction<cgx::quant::eb_prediction::delta>(in.p, in.left, dbl, exponent); break;
    default: roundtrip_prediction<cgx::quant::eb_prediction::automatic>(in.p, in.left, dbl, exponent); break;
  }
  return 0;
}
