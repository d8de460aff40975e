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
///   tag w = 1..44      : base (f64), step (f64), codes      value i decodes to base + q_i * step, q_i = c_i
///                        codes: c_0 .. c_{count-1}, w bits each
///   tag 0x40 + w,      : base (f64), step (f64),            delta mode (first-order prediction):
///     w = 0..44          q0 (u64), dlo (i64), codes           q_0 = q0, q_i = q_{i-1} + dlo + c_i (i >= 1),
///                        codes: c_1 .. c_{count-1}, w bits each   value i decodes to base + q_i * step
///   tag 0xFE           : count raw f32 values (escape)
///   tag 0xFF           : count raw f64 values (escape)
/// ```
///
/// No other tag is valid: a decoder given a tag above 0x40 + 44 or in 45..0x3F, or a
/// stream shorter than its buckets' sizes, throws cgx::error(errc::corrupt) without
/// reading past the bytes it was given.
///
/// Codes are a little-endian bit stream (bit k of the bucket's stream is bit k % 8 of
/// byte k / 8), ceil(w m / 8) bytes for m codes. All multi-byte fields are
/// little-endian and unaligned. The decoded value is `Out(base + double(q) * step)`,
/// evaluated in double, in both coded modes. `step` is chosen as m 2^k with an integer
/// m < 2^8, and every q_i is below 2^45, so `double(q) * step` is exact: the sum has a
/// single rounding whether or not a compiler fuses it into an FMA, and encoder and
/// decoder (or CPU and GPU) agree bit for bit.
///
/// The delta mode carries the *same* q_i as the plain mode (the grid index of value i,
/// (x_i - base) / step rounded), as differences q_i - q_{i-1} offset by their smallest
/// value dlo:
/// the prediction of value i is the decoded value i - 1, and the residual is
/// quantized on the same grid, so errors do not accumulate along the bucket and the
/// decoded values, hence the guarantee and the encoder's check, are those of the plain
/// mode. The decoder rebuilds q_i with integer additions (mod 2^64; the encoder's q_i
/// are all below 2^45). On a smooth field (neighbours closer than the bucket's range)
/// the differences need far fewer bits than the values: on a 4096 x 4096 field of
/// sinusoids with 1e-3 noise, 4 ranks, SRA, bounds 1e-2 .. 1e-4 of the range, an
/// allreduce sent 2.9x to 1.8x fewer bytes than with the plain mode alone, and 1.2x to
/// 1.1x fewer with 10% noise (docs/results/README.md, bench/allreduce_bench --eb).
///
/// # Choice of width and mode
///
/// e' = e (1 - 2^-20) minus the rounding of the decode (2^-50 max|x| in double, plus
/// 2^-24 max|x| when Out is float); step = 2 e' rounded down to 8 significant bits;
/// q_i = (x_i - min) / step rounded to nearest, w = bit width of the largest q_i (plain) or of
/// max(q_i - q_{i-1}) - dlo (delta). A bucket whose range is at most 2 e' takes tag 0
/// (a constant bucket is always tag 0 and decodes exactly). The encoder checks every
/// decoded value against e, then writes the smaller of the two modes (plain on a tie;
/// the Prediction parameter can restrict this, see eb_prediction). A mode is only
/// written when it is smaller than the escape (17 + ceil(w count / 8) or 33 + ceil(w
/// (count - 1) / 8) bytes against 1 + count sizeof(In); buckets of at most 8 raw bytes
/// are always escaped) and w <= 44; when neither is, or the plain width exceeds 44, or
/// the check fails, the bucket is escaped: no bucket takes more than 1 + count sizeof(In).
///
/// Speed: scalar code that packs whole 32-bit words (widths up to 32); one bucket after
/// another (the stream has no index, so `host_exec` threads are not used).

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "../error.hpp"

namespace cgx::quant {

/// Which coded modes quant::error_bounded may write (every decoder reads all of them).
enum class eb_prediction {
  automatic,  ///< per bucket, the smaller of the plain and the delta mode (the default)
  none,       ///< the plain mode only: the format and sizes of the codec before the delta mode (exact ties now round up)
  delta,      ///< the delta mode wherever it is allowed (width <= 44, smaller than the escape), else plain; for tests
};

/// Error-bounded quantizer: per-bucket width 0..44 bits, plain or delta-coded (first-order
/// prediction), or an escape to raw values; nearest rounding; an absolute error bound
/// given per call (see the file comment).
///
/// \tparam BucketSize  values per bucket, 1 .. 2^20
/// \tparam Prediction  the coded modes the encoder may pick (eb_prediction::automatic)
template <std::size_t BucketSize = 1024, eb_prediction Prediction = eb_prediction::automatic>
struct error_bounded {
  static_assert(BucketSize >= 1 && BucketSize <= (std::size_t{1} << 20),
                "cgx::quant::error_bounded: BucketSize must be between 1 and 2^20");

  /// Values per bucket.
  static constexpr std::size_t bucket_size = BucketSize;
  /// The coded modes this encoder may write.
  static constexpr eb_prediction prediction = Prediction;
  /// The compressed size depends on the data: plans send a length before each message.
  static constexpr bool variable_size = true;
  /// Not lossless, but every value is within the bound given to compress().
  static constexpr bool lossless = false;
  /// Largest width of a coded bucket (plain or delta).
  static constexpr int max_width = 44;
  /// Tag of a bucket escaped to raw f32 values.
  static constexpr std::uint8_t escape_f32 = 0xFE;
  /// Tag of a bucket escaped to raw f64 values.
  static constexpr std::uint8_t escape_f64 = 0xFF;
  /// Tag of a delta-mode bucket of width w: delta_tag + w, w = 0 .. max_width.
  static constexpr std::uint8_t delta_tag = 0x40;

  /// Upper bound of the bytes compress<In>() writes for n values (every bucket escaped).
  template <class In>
  static constexpr std::size_t max_compressed_bytes(std::size_t n) noexcept {
    return buckets(n) + n * sizeof(In);
  }

  /// Number of buckets for n values.
  static constexpr std::size_t buckets(std::size_t n) noexcept { return n / BucketSize + (n % BucketSize != 0 ? 1 : 0); }

  /// Compresses in[0..n) into out (at least max_compressed_bytes<In>(n) bytes) so that
  /// decompress<Out> returns every value within `e` of its input (see the file comment);
  /// returns the bytes written. `e` must be > 0 (otherwise every bucket is escaped).
  /// Uses BucketSize x 8 bytes of scratch: on the stack up to a bucket of 4096 values,
  /// allocated once per call above that.
  template <class In, class Out = In>
  static std::size_t compress(const In* in, std::size_t n, std::byte* out, double e) {
    static_assert(std::is_same_v<In, float> || std::is_same_v<In, double>,
                  "cgx::quant::error_bounded compresses float or double");
    static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, double>,
                  "cgx::quant::error_bounded decodes to float or double");
    std::byte* w = out;
    auto run = [&](std::byte* scratch) {
      for (std::size_t first = 0; first < n; first += BucketSize)
        w = encode_bucket<In, Out>(in + first, std::min(BucketSize, n - first), w, e, scratch);
    };
    if constexpr (BucketSize <= 4096) {
      alignas(std::uint64_t) std::byte scratch[BucketSize * sizeof(std::uint64_t)];
      run(scratch);
    } else {
      std::vector<std::uint64_t> scratch(std::min(n, BucketSize));
      run(reinterpret_cast<std::byte*>(scratch.data()));
    }
    return static_cast<std::size_t>(w - out);
  }

  /// Decodes the stream of n values at in[0..bytes) (as written by compress) into
  /// out[0..n); returns the bytes read (at most `bytes`: a caller that received a whole
  /// message checks that it equals the message's length). Never reads past in + bytes:
  /// throws cgx::error(errc::corrupt) if a bucket's tag is not one of the file comment's
  /// or a bucket needs more bytes than are left; out[] then holds the buckets decoded
  /// before it.
  template <class Out>
  static std::size_t decompress(const std::byte* in, std::size_t bytes, std::size_t n, Out* out) {
    return decode<Out, false>(in, bytes, n, out);
  }

  /// out[i] = Out(out[i] + decoded value i) for i in [0, n), from the stream at
  /// in[0..bytes); returns the bytes read; throws cgx::error(errc::corrupt) as decompress.
  template <class Out>
  static std::size_t decompress_add(const std::byte* in, std::size_t bytes, std::size_t n, Out* out) {
    return decode<Out, true>(in, bytes, n, out);
  }

  /// Bytes a bucket of `count` values with tag `tag` takes after its tag byte, or
  /// SIZE_MAX for a tag no encoder writes (width above max_width, unused values).
  static constexpr std::size_t body_bytes(std::uint8_t tag, std::size_t count) noexcept {
    if (tag == escape_f32) return count * sizeof(float);
    if (tag == escape_f64) return count * sizeof(double);
    if (tag == 0) return sizeof(double);
    if (tag <= max_width) return 2 * sizeof(double) + code_bytes(tag, count);
    if (tag >= delta_tag && tag <= delta_tag + max_width)
      return 4 * sizeof(double) + (tag == delta_tag ? 0 : code_bytes(tag - delta_tag, count - 1));
    return std::numeric_limits<std::size_t>::max();
  }

  /// The value grid index q (< 2^45) of a coded bucket decodes to (exactly this
  /// expression, everywhere).
  template <class Out>
  static Out decode_value(double base, double step, std::uint64_t q) noexcept {
    return static_cast<Out>(decode_double(base, step, q));
  }

  /// base + q step in double, one rounding (q step is exact for q < 2^45). q goes
  /// through int64, which converts the same as uint64 below 2^63 in one instruction.
  static double decode_double(double base, double step, std::uint64_t q) noexcept {
    return base + static_cast<double>(static_cast<std::int64_t>(q)) * step;
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
  static void put_le32(std::byte* w, std::uint32_t v) noexcept {
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(w, &v, 4);
    } else {
      for (int k = 0; k < 4; ++k) w[k] = static_cast<std::byte>(v >> (8 * k));
    }
  }
  static std::uint32_t get_le32(const std::byte* r) noexcept {
    std::uint32_t v;
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(&v, r, 4);
    } else {
      v = 0;
      for (int k = 0; k < 4; ++k) v |= static_cast<std::uint32_t>(static_cast<std::uint8_t>(r[k])) << (8 * k);
    }
    return v;
  }

  /// 2 e' rounded down to m 2^k with m < 2^8 (0 if it underflows).
  static double coarse_step(double two_e) noexcept {
    int ex = 0;
    const double m = std::frexp(two_e, &ex);  // two_e = m 2^ex, m in [0.5, 1)
    return std::ldexp(std::floor(std::ldexp(m, 8)), ex - 8);
  }

  /// Writes the m codes code(0) .. code(m - 1), `width` bits each (1..44), as the bit
  /// stream of the file comment; returns the end. Whole 32-bit words up to width 32.
  template <class Code>
  static std::byte* pack(std::byte* w, std::size_t m, int width, Code code) noexcept {
    std::uint64_t acc = 0;
    int nbits = 0;
    if (width <= 32) {
      for (std::size_t i = 0; i < m; ++i) {
        acc |= code(i) << nbits;  // nbits < 32, code < 2^32: fits
        nbits += width;
        if (nbits >= 32) {
          put_le32(w, static_cast<std::uint32_t>(acc));
          w += 4;
          acc >>= 32;
          nbits -= 32;
        }
      }
    } else {
      for (std::size_t i = 0; i < m; ++i) {
        acc |= code(i) << nbits;  // nbits < 8, code < 2^44
        nbits += width;
        while (nbits >= 8) {
          *w++ = static_cast<std::byte>(acc & 0xFF);
          acc >>= 8;
          nbits -= 8;
        }
      }
    }
    for (; nbits > 0; nbits -= 8) {
      *w++ = static_cast<std::byte>(acc & 0xFF);
      acc >>= 8;
    }
    return w;
  }

  /// Reads m codes of `width` bits (1..44) from r, calling sink(i, code) for each;
  /// returns the end (exactly ceil(width m / 8) bytes on; nothing past it is read).
  template <class Sink>
  static const std::byte* unpack(const std::byte* r, std::size_t m, int width, Sink sink) noexcept {
    const std::byte* const end = r + (static_cast<std::size_t>(width) * m + 7) / 8;
    const std::uint64_t mask = (std::uint64_t{1} << width) - 1;
    std::uint64_t acc = 0;
    int nbits = 0;
    for (std::size_t i = 0; i < m; ++i) {
      if (nbits < width) {
        if (width <= 32 && end - r >= 4) {  // nbits < 32: the word fits
          acc |= static_cast<std::uint64_t>(get_le32(r)) << nbits;
          r += 4;
          nbits += 32;
        } else {
          while (nbits < width) {
            acc |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(*r++)) << nbits;
            nbits += 8;
          }
        }
      }
      sink(i, acc & mask);
      acc >>= width;
      nbits -= width;
    }
    return end;
  }

  template <class In>
  static std::byte* escape(const In* x, std::size_t count, std::byte* w) noexcept {
    *w++ = static_cast<std::byte>(std::is_same_v<In, float> ? escape_f32 : escape_f64);
    std::memcpy(w, x, count * sizeof(In));
    return w + count * sizeof(In);
  }

  static constexpr std::size_t code_bytes(int width, std::size_t m) noexcept {
    return (static_cast<std::size_t>(width) * m + 7) / 8;
  }

  /// Encodes one bucket; `scratch` holds `count` grid indices (8 bytes each).
  template <class In, class Out>
  static std::byte* encode_bucket(const In* x, std::size_t count, std::byte* w, double e, std::byte* scratch) {
    In lo = x[0], hi = x[0];
    bool finite = true;
    if constexpr (std::is_same_v<In, float>) {
      // On the bits, so that the loop vectorizes: a float's bits, with the magnitude bits
      // flipped when negative, order like the values (-0 just below +0); an exponent of
      // all ones (NaN, Inf) carries into bit 31 when 2^23 is added.
      auto key = [](std::uint32_t b) {
        return static_cast<std::int32_t>(b ^ (static_cast<std::uint32_t>(static_cast<std::int32_t>(b) >> 31) & 0x7fffffffu));
      };
      std::int32_t klo = std::numeric_limits<std::int32_t>::max(), khi = std::numeric_limits<std::int32_t>::min();
      std::uint32_t special = 0;
      for (std::size_t i = 0; i < count; ++i) {
        const auto b = std::bit_cast<std::uint32_t>(x[i]);
        special |= (b & 0x7f800000u) + 0x00800000u;
        const std::int32_t k = key(b);
        klo = k < klo ? k : klo;
        khi = k > khi ? k : khi;
      }
      finite = (special >> 31) == 0;
      lo = std::bit_cast<float>(static_cast<std::uint32_t>(key(static_cast<std::uint32_t>(klo))));  // key is its own inverse
      hi = std::bit_cast<float>(static_cast<std::uint32_t>(key(static_cast<std::uint32_t>(khi))));
    } else {
      for (std::size_t i = 0; i < count; ++i) {
        const In v = x[i];
        finite = finite && std::isfinite(v);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
    }
    const double mn = static_cast<double>(lo), mx = static_cast<double>(hi);
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
    if (width > max_width) return escape(x, count, w);
    const bool plain_ok = 16 + code_bytes(width, count) < raw;
    if (!plain_ok && Prediction == eb_prediction::none) return escape(x, count, w);
    // Grid indices below 2^31 take the 32-bit path: its conversions vectorize on any x86-64.
    // (The byte scratch provides storage for either kind of index: C++20 implicit objects.)
    if (width <= 31)
      return code_bucket<In, Out>(x, count, w, e, mn, step, top, width, plain_ok, reinterpret_cast<std::uint32_t*>(scratch));
    return code_bucket<In, Out>(x, count, w, e, mn, step, top, width, plain_ok, reinterpret_cast<std::uint64_t*>(scratch));
  }

  /// Quantizes a bucket on the grid (mn, step), checks every decoded value against e,
  /// then writes the smaller mode (or escapes). Index is std::uint32_t for top < 2^31,
  /// std::uint64_t otherwise.
  template <class In, class Out, class Index>
  static std::byte* code_bucket(const In* x, std::size_t count, std::byte* w, double e, double mn, double step,
                                double top, int width, bool plain_ok, Index* q) {
    using signed_index = std::make_signed_t<Index>;
    // The grid indices, each checked as the decoder will decode it (both modes decode
    // q_i). t is in [0, top + 1) (x_i >= mn) and is clamped to top; q_i = t rounded to
    // nearest (ties up: t + 0.5 is exact below 2^45, the conversion truncates). Any
    // rounding would do: the decoder reads q, and the check is on what it decodes.
    // No branch, so that the loop vectorizes (SSE2 has the 32-bit conversions): a value
    // outside the bound makes e - |d - x| negative (a difference of distinct doubles is
    // never 0), and the sign bits are or-ed together.
    const double inv = 1 / step;
    std::uint64_t outside = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double t = (static_cast<double>(x[i]) - mn) * inv;
      t = t < top ? t : top;
      const auto c = static_cast<signed_index>(t + 0.5);
      const Out d = static_cast<Out>(mn + static_cast<double>(c) * step);  // decode_value, from the signed index
      outside |= std::bit_cast<std::uint64_t>(e - std::fabs(static_cast<double>(d) - static_cast<double>(x[i])));
      q[i] = static_cast<Index>(c);
    }
    if ((outside >> 63) != 0) return escape(x, count, w);

    // The delta mode's width: the spread of the differences (each in (-2^45, 2^45)).
    int dwidth = max_width + 1;
    std::uint64_t dlo = 0;
    if constexpr (Prediction != eb_prediction::none) {
      signed_index lo = std::numeric_limits<signed_index>::max(), hi = std::numeric_limits<signed_index>::min();
      for (std::size_t i = 1; i < count; ++i) {
        const auto d = static_cast<signed_index>(q[i] - q[i - 1]);  // |d| <= top: no overflow
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
      }
      dwidth = std::bit_width(static_cast<std::uint64_t>(static_cast<std::int64_t>(hi) - static_cast<std::int64_t>(lo)));
      dlo = static_cast<std::uint64_t>(static_cast<std::int64_t>(lo));
    }
    const bool delta_ok = dwidth <= max_width && 32 + code_bytes(dwidth, count - 1) < count * sizeof(In);
    const std::size_t plain_bytes = 17 + code_bytes(width, count);
    const std::size_t delta_bytes = 33 + code_bytes(dwidth, count - 1);
    bool use_delta = false;
    if constexpr (Prediction == eb_prediction::delta) use_delta = delta_ok;
    if constexpr (Prediction == eb_prediction::automatic) use_delta = delta_ok && (!plain_ok || delta_bytes < plain_bytes);
    if (!use_delta && !plain_ok) return escape(x, count, w);

    if (!use_delta) {
      *w++ = static_cast<std::byte>(width);
      put(w, mn);
      put(w, step);
      return pack(w, count, width, [q](std::size_t i) { return static_cast<std::uint64_t>(q[i]); });
    }
    *w++ = static_cast<std::byte>(delta_tag + dwidth);
    put(w, mn);
    put(w, step);
    put(w, static_cast<std::uint64_t>(q[0]));
    put(w, dlo);
    if (dwidth == 0) return w;  // every difference is dlo
    const Index* qd = q + 1;
    return pack(w, count - 1, dwidth, [q, qd, dlo](std::size_t i) {
      return static_cast<std::uint64_t>(qd[i]) - static_cast<std::uint64_t>(q[i]) - dlo;  // mod 2^64: d_i - dlo
    });
  }

  template <class Out, bool Add>
  static void emit(Out* y, std::size_t i, double v) noexcept {
    if constexpr (Add)
      y[i] = static_cast<Out>(static_cast<double>(y[i]) + v);
    else
      y[i] = static_cast<Out>(v);
  }

  /// Value q of a coded bucket, into y[i] (plain) or added to it in double (Add).
  template <class Out, bool Add>
  static void emit_coded(Out* y, std::size_t i, double base, double step, std::uint64_t q) noexcept {
    if constexpr (Add)
      emit<Out, Add>(y, i, decode_double(base, step, q));
    else
      y[i] = decode_value<Out>(base, step, q);
  }

  [[noreturn]] static void corrupt(std::size_t first, std::size_t at, std::size_t bytes, const char* what) {
    throw error(errc::corrupt, "quant::error_bounded: the stream is malformed at the bucket of value " +
                                   std::to_string(first) + " (byte " + std::to_string(at) + " of " +
                                   std::to_string(bytes) + "): " + what);
  }

  template <class Out, bool Add>
  static std::size_t decode(const std::byte* in, std::size_t bytes, std::size_t n, Out* y) {
    const std::byte* r = in;
    for (std::size_t first = 0; first < n; first += BucketSize) {
      const std::size_t count = std::min(BucketSize, n - first);
      Out* o = y + first;
      // Each bucket's size follows from its tag and count: checked before it is read, so
      // the loops below read only bytes that are there.
      const auto at = static_cast<std::size_t>(r - in);
      if (at == bytes) corrupt(first, at, bytes, "the stream ends before this bucket");
      const auto tag = static_cast<std::uint8_t>(*r++);
      const std::size_t body = body_bytes(tag, count);
      if (body == std::numeric_limits<std::size_t>::max()) corrupt(first, at, bytes, "no bucket has this tag");
      if (body > bytes - at - 1) corrupt(first, at, bytes, "the stream ends inside this bucket");
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
      if (tag < delta_tag) {
        r = unpack(r, count, tag, [&](std::size_t i, std::uint64_t c) { emit_coded<Out, Add>(o, i, base, step, c); });
        continue;
      }
      const int width = tag - delta_tag;
      std::uint64_t q = get<std::uint64_t>(r);
      const auto dlo = get<std::uint64_t>(r);
      emit_coded<Out, Add>(o, 0, base, step, q);
      if (width == 0) {
        for (std::size_t i = 1; i < count; ++i) emit_coded<Out, Add>(o, i, base, step, q += dlo);
        continue;
      }
      Out* o1 = o + 1;
      r = unpack(r, count - 1, width, [&](std::size_t i, std::uint64_t c) {
        q += dlo + c;  // mod 2^64: the encoder's q_i are below 2^45
        emit_coded<Out, Add>(o1, i, base, step, q);
      });
    }
    return static_cast<std::size_t>(r - in);
  }
};

}  // namespace cgx::quant
