#pragma once
/// \file error_bounded.hpp
/// `cgx::quant::error_bounded`: a quantizer that guarantees an absolute error bound per
/// value, with deterministic (nearest) rounding and a data-dependent bit width per
/// bucket. Its compressed size depends on the data: it is a *variable-size* quantizer
/// (`variable_size == true`); `max_compressed_bytes` is an upper bound and `compress`
/// returns the bytes it wrote. Plans move its messages with comm/varsize.hpp.
///
/// # Guarantee
///
/// `compress<In, Out>(x, n, out, e)` followed by `decompress<Out>` gives values d with
///
///     |d_i - x_i| <= e     for every i, evaluated exactly (d_i as the Out value the decoder returns)
///
/// for every finite input and every e > 0, *except* where no value of Out is that close
/// (e below half an ulp of Out at x_i, only possible when In is wider than Out): there
/// the escape below stores x_i exactly and the decoder returns x_i rounded to Out.
/// The encoder checks the bound on every value with the decoder's own arithmetic and
/// falls back to the escape for a bucket where the check fails, so the guarantee does
/// not rest on a floating-point error analysis. Non-finite values travel exactly (escape).
/// `decompress_add<Out>` adds the decoded value to out[i] in Out arithmetic: its
/// rounding is the caller's (a plan accumulates in double).
///
/// # Wire format (one stream per call; buckets of B = BucketSize values, the last may be short)
///
/// Buckets follow each other with no index; each starts with one tag byte:
///
/// ```
///   tag w = 0          : base (f64)                         every value decodes to base
///   tag w = 1..44      : base (f64), step (f64), codes      value i decodes to base + c_i * step
///                        codes: c_0 .. c_{count-1}, w bits each, little-endian bit stream
///                        (bit k of the bucket's stream is bit k % 8 of byte k / 8), ceil(w count / 8) bytes
///   tag 0xFE           : count raw f32 values (escape)
///   tag 0xFF           : count raw f64 values (escape)
/// ```
///
/// All multi-byte fields are little-endian and unaligned. The decoded value is
/// `Out(base + double(c) * step)`, evaluated in double. `step` is chosen as m 2^k with
/// an integer m < 2^8, so `double(c) * step` is exact for c < 2^45: the sum has a
/// single rounding whether or not a compiler fuses it into an FMA, and encoder and
/// decoder (or CPU and GPU) agree bit for bit.
///
/// # Choice of width
///
/// e' = e (1 - 2^-20) minus the rounding of the decode (2^-50 max|x| in double, plus
/// 2^-24 max|x| when Out is float); step = 2 e' rounded down to 8 significant bits;
/// c_i = round((x_i - min) / step), w = bit width of the largest code. A bucket whose
/// range is at most 2 e' takes w = 0 (a constant bucket is always w = 0 and decodes
/// exactly). When the coded bucket would not be smaller than the escape (16 + ceil(w
/// count / 8) >= count sizeof(In); buckets of at most 8 raw bytes), w > 44, or the
/// check fails, the bucket is escaped: no bucket takes more than 1 + count sizeof(In).
///
/// Speed: a scalar bit packer (a few hundred MB/s per core); one bucket after another
/// (the stream has no index, so `host_exec` threads are not used).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace cgx::quant {

/// Error-bounded quantizer: per-bucket width 0..44 bits or an escape to raw values,
/// nearest rounding, an absolute error bound given per call (see the file comment).
///
/// \tparam BucketSize  values per bucket, 1 .. 2^20
template <std::size_t BucketSize = 1024>
struct error_bounded {
  static_assert(BucketSize >= 1 && BucketSize <= (std::size_t{1} << 20),
                "cgx::quant::error_bounded: BucketSize must be between 1 and 2^20");

  static constexpr std::size_t bucket_size = BucketSize;
  /// The compressed size depends on the data: plans send a length before each message.
  static constexpr bool variable_size = true;
  /// Not lossless, but every value is within the bound given to compress().
  static constexpr bool lossless = false;
  /// Largest width of a coded bucket.
  static constexpr int max_width = 44;
  /// Tags of the escape buckets.
  static constexpr std::uint8_t escape_f32 = 0xFE, escape_f64 = 0xFF;

  /// Upper bound of the bytes compress<In>() writes for n values (every bucket escaped).
  template <class In>
  static constexpr std::size_t max_compressed_bytes(std::size_t n) noexcept {
    return buckets(n) + n * sizeof(In);
  }

  /// Number of buckets for n values.
  static constexpr std::size_t buckets(std::size_t n) noexcept { return (n + BucketSize - 1) / BucketSize; }

  /// Compresses in[0..n) into out (at least max_compressed_bytes<In>(n) bytes) so that
  /// decompress<Out> returns every value within `e` of its input (see the file comment);
  /// returns the bytes written. `e` must be > 0 (otherwise every bucket is escaped).
  template <class In, class Out = In>
  static std::size_t compress(const In* in, std::size_t n, std::byte* out, double e) {
    static_assert(std::is_same_v<In, float> || std::is_same_v<In, double>,
                  "cgx::quant::error_bounded compresses float or double");
    static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, double>,
                  "cgx::quant::error_bounded decodes to float or double");
    std::byte* w = out;
    for (std::size_t first = 0; first < n; first += BucketSize)
      w = encode_bucket<In, Out>(in + first, std::min(BucketSize, n - first), w, e);
    return static_cast<std::size_t>(w - out);
  }

  /// Decodes the stream at `in` (as written by compress for n values) into out[0..n);
  /// returns the bytes read.
  template <class Out>
  static std::size_t decompress(const std::byte* in, std::size_t n, Out* out) {
    return decode<Out, false>(in, n, out);
  }

  /// out[i] = Out(out[i] + decoded value i) for i in [0, n); returns the bytes read.
  template <class Out>
  static std::size_t decompress_add(const std::byte* in, std::size_t n, Out* out) {
    return decode<Out, true>(in, n, out);
  }

  /// The value code c of a coded bucket decodes to (exactly this expression, everywhere).
  template <class Out>
  static Out decode_value(double base, double step, std::uint64_t c) noexcept {
    return static_cast<Out>(base + static_cast<double>(c) * step);
  }

 private:
  template <class V>
  static void put(std::byte*& w, V v) noexcept {
    std::memcpy(w, &v, sizeof(V));
    w += sizeof(V);
  }
  template <class V>
  static V get(const std::byte*& r) noexcept {
    V v;
    std::memcpy(&v, r, sizeof(V));
    r += sizeof(V);
    return v;
  }

  /// 2 e' rounded down to m 2^k with m < 2^8 (0 if it underflows).
  static double coarse_step(double two_e) noexcept {
    int ex = 0;
    const double m = std::frexp(two_e, &ex);  // two_e = m 2^ex, m in [0.5, 1)
    return std::ldexp(std::floor(std::ldexp(m, 8)), ex - 8);
  }

  template <class In>
  static std::byte* escape(const In* x, std::size_t count, std::byte* w) noexcept {
    *w++ = static_cast<std::byte>(std::is_same_v<In, float> ? escape_f32 : escape_f64);
    std::memcpy(w, x, count * sizeof(In));
    return w + count * sizeof(In);
  }

  template <class In, class Out>
  static std::byte* encode_bucket(const In* x, std::size_t count, std::byte* w, double e) {
    double mn = static_cast<double>(x[0]), mx = mn;
    bool finite = true;
    for (std::size_t i = 0; i < count; ++i) {
      const double v = static_cast<double>(x[i]);
      finite = finite && std::isfinite(v);
      mn = v < mn ? v : mn;
      mx = v > mx ? v : mx;
    }
    const std::size_t raw = count * sizeof(In);  // an escape takes 1 + raw bytes
    if (!finite || raw <= 8 || !std::isfinite(mx - mn)) return escape(x, count, w);
    if (mn == mx) {  // constant: width 0, exact whatever the bound
      *w++ = std::byte{0};
      put(w, mn);
      return w;
    }
    if (!(e > 0)) return escape(x, count, w);
    const double mag = std::max(std::fabs(mn), std::fabs(mx));
    double e1 = e * (1 - 0x1p-20) - mag * 0x1p-50;
    if constexpr (std::is_same_v<Out, float>) e1 -= mag * 0x1p-24;
    if (!(e1 > 0)) return escape(x, count, w);
    auto within = [&](Out d, In v) { return std::fabs(static_cast<double>(d) - static_cast<double>(v)) <= e; };

    if (mx - mn <= 2 * e1) {  // width 0: everything decodes to one value
      const double base = mn + (mx - mn) / 2;
      const Out d = static_cast<Out>(base);
      for (std::size_t i = 0; i < count; ++i)
        if (!within(d, x[i])) return escape(x, count, w);
      *w++ = std::byte{0};
      put(w, base);
      return w;
    }
    const double step = coarse_step(2 * e1);
    if (!(step > 0)) return escape(x, count, w);
    const double top = std::nearbyint((mx - mn) / step);
    const int width = top < 0x1p45 ? std::bit_width(static_cast<std::uint64_t>(top)) : max_width + 1;
    if (width > max_width || 16 + (static_cast<std::size_t>(width) * count + 7) / 8 >= raw)
      return escape(x, count, w);

    std::byte* const start = w;
    *w++ = static_cast<std::byte>(width);
    put(w, mn);
    put(w, step);
    const double inv = 1 / step;
    const auto cap = static_cast<std::uint64_t>(top);
    std::uint64_t acc = 0;
    int nbits = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double v = static_cast<double>(x[i]);
      const double q = std::nearbyint((v - mn) * inv);
      std::uint64_t c = q > 0 ? static_cast<std::uint64_t>(q) : 0;
      c = c > cap ? cap : c;
      if (!within(decode_value<Out>(mn, step, c), x[i])) return escape(x, count, start);
      acc |= c << nbits;
      nbits += width;
      while (nbits >= 8) {
        *w++ = static_cast<std::byte>(acc & 0xFF);
        acc >>= 8;
        nbits -= 8;
      }
    }
    if (nbits > 0) *w++ = static_cast<std::byte>(acc & 0xFF);
    return w;
  }

  template <class Out, bool Add>
  static void emit(Out* y, std::size_t i, double v) noexcept {
    if constexpr (Add)
      y[i] = static_cast<Out>(static_cast<double>(y[i]) + v);
    else
      y[i] = static_cast<Out>(v);
  }

  template <class Out, bool Add>
  static std::size_t decode(const std::byte* in, std::size_t n, Out* y) {
    const std::byte* r = in;
    for (std::size_t first = 0; first < n; first += BucketSize) {
      const std::size_t count = std::min(BucketSize, n - first);
      Out* o = y + first;
      const auto tag = static_cast<std::uint8_t>(*r++);
      if (tag == escape_f32 || tag == escape_f64) {
        for (std::size_t i = 0; i < count; ++i)
          emit<Out, Add>(o, i, tag == escape_f32 ? static_cast<double>(get<float>(r)) : get<double>(r));
        continue;
      }
      const double base = get<double>(r);
      if (tag == 0) {
        // Add mode sums in double like the coded path; plain mode returns Out(base).
        for (std::size_t i = 0; i < count; ++i) emit<Out, Add>(o, i, Add ? base : static_cast<double>(static_cast<Out>(base)));
        continue;
      }
      const double step = get<double>(r);
      const int width = tag;
      const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
      std::uint64_t acc = 0;
      int nbits = 0;
      for (std::size_t i = 0; i < count; ++i) {
        while (nbits < width) {
          acc |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(*r++)) << nbits;
          nbits += 8;
        }
        const std::uint64_t c = acc & mask;
        acc >>= width;
        nbits -= width;
        if constexpr (Add)
          emit<Out, Add>(o, i, base + static_cast<double>(c) * step);
        else
          o[i] = decode_value<Out>(base, step, c);
      }
    }
    return static_cast<std::size_t>(r - in);
  }
};

}  // namespace cgx::quant
