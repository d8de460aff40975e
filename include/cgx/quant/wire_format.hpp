#pragma once
/// \file wire_format.hpp
/// The bytes of `cgx::quant::maxmin` on the wire, and the per-bucket arithmetic that
/// produces them. Host kernels (maxmin.hpp) and CUDA kernels (maxmin.cuh) both call the
/// functions below, so a device result can be compared bit for bit with a host one.
///
/// # Wire format of maxmin<b, B> for n input values
///
/// The input is cut into nb = ceil(n / B) buckets of B consecutive values; the last
/// one holds r = n - (nb - 1) B values (1 <= r <= B). B is a multiple of 8.
///
/// ```
/// offset 0                : metadata, nb records of two M (M = float for float, __half and
///                           __nv_bfloat16 input, double for double input), little-endian:
///                             record i = { min_i, unit_i }, unit_i = (max_i - min_i) / (2^b - 1)
/// offset meta_bytes       : codes of bucket 0, then bucket 1, ... with no gaps
///   meta_bytes = nb * 2 * sizeof(M)
/// ```
///
/// Codes of one bucket. Let B' = B for a full bucket and B' = 8 ceil(r / 8) for the
/// last one, and S = B' / 8. The bucket is split into 8 strided slices: value
/// j + k S (0 <= j < S, 0 <= k < 8) is in slice k at position j. The 8 codes of
/// position j form one b-byte word W_j, the little-endian concatenation of b-bit codes:
///
/// ```
///   bits [k b, k b + b) of W_j  = code of value j + k S      (k = 0..7)
///   byte q of W_j (q = 0..b-1)  is stored at  bucket_codes + q S + j
/// ```
///
/// so a bucket's codes are b "planes" of S bytes each; plane q holds byte q of every
/// word. Every plane is written and read with unit stride: a CPU packs 16-32 positions
/// per vector instruction and GPU thread j touches byte j of each plane (coalesced).
/// For b = 8 the layout is the plain code array; for b = 4, byte j of plane q holds
/// the codes of values j + 2q S (low nibble) and j + (2q + 1) S (high nibble).
/// The padding values of a short last bucket (positions r..B'-1) encode as 0 and are
/// never decoded. A bucket's codes take b S bytes; the total is exact:
///
/// ```
///   compressed_bytes(n) = nb * 2 * sizeof(M) + b * ((nb - 1) * B / 8 + ceil(r / 8))   (n > 0)
///   compressed_bytes(0) = 0
/// ```
///
/// Alignment: the buffer needs no alignment (metadata are read with memcpy on the host);
/// planes are byte streams. Giving the buffer 16-byte alignment makes metadata loads aligned.
///
/// # Encoding one value (the same expression on host and device)
///
/// ```
///   d    = x - min                        (in M; x converted to M first)
///   v    = min(d * inv, 2^b - 1)          inv = 1 / unit (0 for a constant bucket)
///   code = (uint32) (v + o)               o = 1/2 (nearest) or u in [0, 1) (stochastic)
///   decode(code) = min + code * unit
/// ```
///
/// Every operation is the IEEE one, rounded to nearest on its own: products are never
/// contracted into an FMA (detail::mul_rn), nothing is flushed to zero and divisions are
/// exact, on every host path and on the device under any nvcc flags (detail::add_rn and
/// friends: inline PTX there), and the clamp sits between the product and the addition:
/// every path produces the same codes and the same decoded values.
/// A bucket whose unit is so small that 1/unit overflows (subnormal ranges) multiplies
/// d by 2^64 (2^256 for double) first and uses inv = 1 / (unit 2^64): exact rescaling.
/// A bucket holding NaN or +-Inf is stored as {NaN, NaN} with zero codes and decodes to
/// NaN. A "wide" bucket, whose max - min or (2^b - 1) unit overflows M (values near the
/// limits of the type), is stored the same way but encoded and decoded with
/// encode_value_wide / decode_value_wide, which never form the overflowing
/// intermediate; decoders recognize it from the stored {min, unit} with is_wide(). For
/// b = 1 the unit of such a bucket may itself exceed the largest M; it is clamped
/// there, which keeps the nearest-rounding bound (the error stays below (max - min)/2).
///
/// # Random bits of stochastic rounding
///
/// Position j of a bucket whose first value has global index P draws one Philox4x32-7
/// block (stochastic_philox_rounds, philox.hpp): counter {j, lo32(P), hi32(P), rng.counter}, key {lo32(seed) ^ stream,
/// hi32(seed)}. Value j + k S uses the 16-bit half (k & 1) of word k / 2 as
/// u = half * 2^-16. So u depends only on (seed, stream, counter, P, j, k).

#include <cmath>
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "../config.hpp"
#include "philox.hpp"
#include "rounding.hpp"

namespace cgx::quant {

/// Metadata type of a bucket for input type T: double for double, float otherwise.
template <class T>
using meta_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

/// Sizes and offsets of the maxmin wire format (see the file comment).
template <int Bits, std::size_t BucketSize, class Meta>
struct wire_layout {
  static constexpr std::size_t meta_record = 2 * sizeof(Meta);              ///< bytes of one bucket's min and unit
  static constexpr std::size_t full_code_bytes = Bits * (BucketSize / 8);  ///< bytes of a full bucket's codes

  /// Number of buckets for n values.
  CGX_HOST_DEVICE static constexpr std::size_t buckets(std::size_t n) { return (n + BucketSize - 1) / BucketSize; }
  /// Bytes of all metadata records.
  CGX_HOST_DEVICE static constexpr std::size_t meta_bytes(std::size_t n) { return buckets(n) * meta_record; }
  /// S (positions per slice) of bucket `i` when the buffer holds n values.
  CGX_HOST_DEVICE static constexpr std::size_t slice(std::size_t n, std::size_t i) {
    const std::size_t first = i * BucketSize;
    const std::size_t count = n - first < BucketSize ? n - first : BucketSize;
    return (count + 7) / 8;
  }
  /// Exact size of the compressed form of n values.
  CGX_HOST_DEVICE static constexpr std::size_t bytes(std::size_t n) {
    if (n == 0) return 0;
    const std::size_t nb = buckets(n);
    return nb * meta_record + Bits * ((nb - 1) * (BucketSize / 8) + slice(n, nb - 1));
  }
  /// Offset of bucket i's codes from the start of the buffer.
  CGX_HOST_DEVICE static constexpr std::size_t codes_offset(std::size_t n, std::size_t i) {
    return meta_bytes(n) + i * full_code_bytes;
  }
};

namespace detail {

/// wire_layout<Bits, bucket, Meta>::meta_bytes(n) (the same for every Bits) for a bucket
/// size known at run time: the host loops take it as an argument (host_loops.inl).
template <class Meta>
constexpr std::size_t meta_bytes(std::size_t n, std::size_t bucket) {
  return (n + bucket - 1) / bucket * (2 * sizeof(Meta));
}

/// Largest code of a b-bit quantizer.
template <int Bits>
inline constexpr std::uint32_t levels = (1u << Bits) - 1u;

/// Byte q of the word W built from 8 b-bit codes: the bits [8q, 8q + 8) of W.
/// C is std::uint32_t, or a vector of them in the host SIMD kernels.
template <int Bits, int Q, int K, class C>
CGX_HOST_DEVICE CGX_FORCEINLINE C pack_term(C c) {
  constexpr int s = K * Bits - 8 * Q;  // where code K starts relative to byte Q
  if constexpr (s >= 8 || s <= -Bits) {
    return c & 0u;
  } else if constexpr (s >= 0) {
    return c << s;
  } else {
    return c >> (-s);
  }
}

template <int Bits, int Q, class C, int... K>
CGX_HOST_DEVICE CGX_FORCEINLINE C pack_byte_impl(const C* c, std::integer_sequence<int, K...>) {
  return (pack_term<Bits, Q, K>(c[K]) | ...) & 0xffu;
}

/// Byte q (0 <= q < Bits) of the word holding codes c[0..7].
template <int Bits, int Q, class C>
CGX_HOST_DEVICE CGX_FORCEINLINE C pack_byte(const C* c) {
  return pack_byte_impl<Bits, Q>(c, std::make_integer_sequence<int, 8>{});
}

/// Code k (0 <= k < 8) of the word whose bytes are b[0..Bits-1].
template <int Bits, int K, class C>
CGX_HOST_DEVICE CGX_FORCEINLINE C unpack_code(const C* b) {
  constexpr int bit = K * Bits;
  constexpr int q = bit / 8;
  constexpr int r = bit % 8;
  C v = b[q] >> r;
  if constexpr (r + Bits > 8) v |= b[q + 1] << (8 - r);
  return v & levels<Bits>;
}

/// Exact power of two used to rescale subnormal ranges.
template <class Meta>
CGX_HOST_DEVICE constexpr Meta rescale_factor() {
  if constexpr (std::is_same_v<Meta, double>) {
    return 0x1p256;
  } else {
    return 0x1p64f;
  }
}

/// Largest finite Meta, and a quiet NaN: spelled out so that device code needs no
/// std::numeric_limits (not a __device__ function without --expt-relaxed-constexpr).
template <class Meta>
CGX_HOST_DEVICE constexpr Meta largest() {
  if constexpr (std::is_same_v<Meta, double>) {
    return 1.7976931348623157e308;
  } else {
    return 3.40282347e+38f;
  }
}
/// The smallest positive (subnormal) Meta: every difference of two finite Meta values is
/// a whole multiple of it.
template <class Meta>
CGX_HOST_DEVICE constexpr Meta smallest_subnormal() {
  if constexpr (std::is_same_v<Meta, double>) {
    return 0x1p-1074;
  } else {
    return 0x1p-149f;
  }
}
/// The Meta whose bit pattern is `d` (double) or `f` (float).
template <class Meta>
CGX_HOST_DEVICE inline Meta from_bits(std::uint64_t d, std::uint32_t f) {
  Meta v;
  if constexpr (std::is_same_v<Meta, double>) {
    std::memcpy(&v, &d, sizeof(v));
  } else {
    std::memcpy(&v, &f, sizeof(v));
  }
  return v;
}
template <class Meta>
CGX_HOST_DEVICE inline Meta quiet_nan() {
  return from_bits<Meta>(0x7ff8000000000000ull, 0x7fc00000u);
}
/// +Inf of Meta.
template <class Meta>
CGX_HOST_DEVICE inline Meta pos_inf() {
  return from_bits<Meta>(0x7ff0000000000000ull, 0x7f800000u);
}

/// x, hidden from the optimizer: a value passed through it is the rounded result of
/// its own operation, so a product passed through it is never fused with the addition
/// that uses it (contraction into an FMA, which GCC does at -O2 wherever the target
/// has FMA, e.g. inside the AVX2 kernels, and Clang within one expression). Every
/// product that an addition consumes goes through mul_rn, on every path: host SIMD
/// with or without FMA, the scalar reference, the device. Works on scalars and on the
/// host kernels' vectors.
template <class V>
CGX_HOST_DEVICE CGX_FORCEINLINE V opaque(V x) {
#if !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
  asm("" : "+x"(x));
#elif !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
  asm("" : "+w"(x));
#endif
  return x;
}

// Exact arithmetic of the quantizer: every operation whose result reaches the wire or
// the output goes through one of the functions below. Each is the IEEE operation
// rounded to nearest even, on its own: never contracted into an FMA, never flushed to
// zero, never an approximate division. On the host that is what `a + b`, `a / b` and
// an opaque product (detail::opaque) compile to, whatever the flags short of
// -ffast-math. On the device nvcc's flags rewrite even the _rn intrinsics:
// --use_fast_math or -ftz=true turn __fadd_rn/__fmul_rn/__fdiv_rn into add.rn.ftz.f32,
// mul.rn.ftz.f32, div.rn.ftz.f32 (subnormal operands and results become 0), comparisons
// into setp.ftz.f32 and float<->double conversions into cvt.ftz, and -prec-div=false
// turns a plain `1.0f / x` into rcp.approx. So the device takes fp32 operations from
// inline PTX without .ftz (ptxas compiles inline PTX as written, whatever the flags),
// and fp64 ones likewise (fp64 is never flushed, but -fmad=true would contract a plain
// a * b + c). A device result therefore equals the host's bit for bit under any nvcc
// flags; the first-use self-test of maxmin.cuh checks it on each device.
#if defined(__CUDA_ARCH__)
#define CGX_DETAIL_PTX_BINOP(name, op)                                                     \
  __device__ __forceinline__ float name(float a, float b) {                               \
    float r;                                                                               \
    asm(op ".f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));                                \
    return r;                                                                              \
  }                                                                                        \
  __device__ __forceinline__ double name(double a, double b) {                            \
    double r;                                                                              \
    asm(op ".f64 %0, %1, %2;" : "=d"(r) : "d"(a), "d"(b));                                \
    return r;                                                                              \
  }
CGX_DETAIL_PTX_BINOP(ptx_add, "add.rn")
CGX_DETAIL_PTX_BINOP(ptx_sub, "sub.rn")
CGX_DETAIL_PTX_BINOP(ptx_mul, "mul.rn")
CGX_DETAIL_PTX_BINOP(ptx_div, "div.rn")
#undef CGX_DETAIL_PTX_BINOP
/// b < a ? b : a, the comparison without .ftz.
__device__ __forceinline__ float ptx_lower(float a, float b) {
  float r;
  asm("{\n\t.reg .pred p;\n\tsetp.lt.f32 p, %2, %1;\n\tselp.f32 %0, %2, %1, p;\n\t}" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
/// b > a ? b : a, the comparison without .ftz.
__device__ __forceinline__ float ptx_upper(float a, float b) {
  float r;
  asm("{\n\t.reg .pred p;\n\tsetp.gt.f32 p, %2, %1;\n\tselp.f32 %0, %2, %1, p;\n\t}" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
#endif

/// The four operations of the exact arithmetic below.
enum class rn_op { add, sub, mul, div };

/// a `Op` b, rounded to nearest even on its own: the device's PTX without .ftz, the
/// host's operator (a product hidden by opaque(), so never contracted).
template <rn_op Op, class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M rn(M a, M b) {
#if defined(__CUDA_ARCH__)
  if constexpr (Op == rn_op::add) return ptx_add(a, b);
  else if constexpr (Op == rn_op::sub) return ptx_sub(a, b);
  else if constexpr (Op == rn_op::mul) return ptx_mul(a, b);
  else return ptx_div(a, b);
#else
  if constexpr (Op == rn_op::add) return a + b;
  else if constexpr (Op == rn_op::sub) return a - b;
  else if constexpr (Op == rn_op::mul) return opaque(a * b);
  else return a / b;
#endif
}

/// a * b rounded on its own (never contracted with a following addition, never flushed).
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M mul_rn(M a, M b) { return rn<rn_op::mul>(a, b); }
/// a + b, rounded to nearest, never flushed.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M add_rn(M a, M b) { return rn<rn_op::add>(a, b); }
/// a - b, rounded to nearest, never flushed.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M sub_rn(M a, M b) { return rn<rn_op::sub>(a, b); }
/// a / b, correctly rounded (never an approximate reciprocal), never flushed.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M div_rn(M a, M b) { return rn<rn_op::div>(a, b); }

/// b < a ? b : a (a when they compare equal or either is NaN); subnormals compared as
/// such, not as zero.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M lower(M a, M b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<M, float>) return ptx_lower(a, b);
#endif
  return b < a ? b : a;
}

/// b > a ? b : a (a when they compare equal or either is NaN); see lower().
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M upper(M a, M b) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<M, float>) return ptx_upper(a, b);
#endif
  return b > a ? b : a;
}

/// v == 0 (+0 or -0); a subnormal v is not zero (setp.eq.ftz would say it is).
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE bool is_zero(M v) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<M, float>) {
    unsigned r;
    asm("{\n\t.reg .pred p;\n\tsetp.eq.f32 p, %1, 0f00000000;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(r) : "f"(v));
    return r != 0;
  }
#endif
  return v == M(0);
}

/// float -> double, exact (a subnormal float stays itself; cvt.ftz would give 0).
CGX_HOST_DEVICE CGX_FORCEINLINE double widen(float v) {
#if defined(__CUDA_ARCH__)
  double r;
  asm("cvt.f64.f32 %0, %1;" : "=d"(r) : "f"(v));
  return r;
#else
  return static_cast<double>(v);
#endif
}

/// double -> float, rounded to nearest (a subnormal result is kept, not flushed).
CGX_HOST_DEVICE CGX_FORCEINLINE float narrow_rn(double v) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(v));
  return r;
#else
  return static_cast<float>(v);
#endif
}

template <class Meta>
CGX_HOST_DEVICE CGX_FORCEINLINE bool is_finite(Meta v) {
  // v - v is 0 for finite v and NaN for NaN or +-Inf; no <cmath> needed on the device.
  return (v - v) == Meta(0);
}

}  // namespace detail

/// Per-bucket parameters: what is stored (min, unit) and what encoding needs.
template <class Meta>
struct bucket_params {
  Meta min;     ///< stored: smallest value, NaN for a non-finite bucket
  Meta unit;    ///< stored: quantization step, NaN for a non-finite bucket
  Meta inv;     ///< 1 / unit (after rescaling), 0 for a constant bucket
  bool scaled;  ///< d is multiplied by rescale_factor<Meta>() before inv
  bool wide;    ///< max - min or L * unit overflows M: use encode_value_wide / decode_value_wide
  bool finite;  ///< false: write zero codes, decode gives NaN
};

/// True when decoding a bucket with these stored parameters must use decode_value_wide
/// (the intermediate code * unit of the plain formula would overflow). Decoders call it
/// once per bucket on the stored {min, unit}.
template <int Bits, class Meta>
CGX_HOST_DEVICE CGX_FORCEINLINE bool is_wide(Meta mn, Meta unit) {
  const Meta top = detail::mul_rn(static_cast<Meta>(detail::levels<Bits>), unit);
  return detail::is_finite(mn) && detail::is_finite(unit) && !(detail::is_finite(top) && detail::is_finite(detail::add_rn(mn, top)));
}

/// Scale of one bucket from its extremes. `finite` is false when any value of the
/// bucket is NaN or +-Inf.
template <int Bits, class Meta>
CGX_HOST_DEVICE inline bucket_params<Meta> make_bucket_params(Meta mn, Meta mx, bool finite) {
  constexpr Meta big = detail::largest<Meta>();
  constexpr Meta L = static_cast<Meta>(detail::levels<Bits>);
  bucket_params<Meta> p{};
  if (!finite || !detail::is_finite(mn) || !detail::is_finite(mx)) {
    const Meta nan = detail::quiet_nan<Meta>();
    p.min = nan;
    p.unit = nan;
    p.inv = Meta(0);
    p.scaled = false;
    p.wide = false;
    p.finite = false;
    return p;
  }
  p.finite = true;
  // +0 for a zero minimum whatever the order in which +0 and -0 were compared: the
  // stored bytes must not depend on the reduction order (host SIMD, scalar, device).
  mn = detail::add_rn(mn, Meta(0));
  mx = detail::add_rn(mx, Meta(0));
  p.min = mn;
  Meta unit;
  if constexpr (std::is_same_v<Meta, float>) {
    // The difference of two floats is exact in double; one rounding to float.
    const double u = detail::div_rn(detail::sub_rn(detail::widen(mx), detail::widen(mn)), static_cast<double>(L));
    unit = u > static_cast<double>(big) ? big : detail::narrow_rn(u);
  } else {
    unit = detail::div_rn(detail::sub_rn(mx, mn), L);
    if (!detail::is_finite(unit)) {
      unit = detail::sub_rn(detail::div_rn(mx, L), detail::div_rn(mn, L));
      if (!detail::is_finite(unit)) unit = big;
    }
  }
  // A range of fewer than L subnormal steps (max - min < L * smallest_subnormal / 2):
  // (max - min) / L rounds to 0, and every value would decode to min (an error of up to
  // the whole range). The smallest subnormal is then the unit: max - min and every
  // x - min are whole multiples of it, below L, so the codes are exact and so is the
  // decode (min + code * unit).
  if (detail::is_zero(unit) && !detail::is_zero(detail::sub_rn(mx, mn))) unit = detail::smallest_subnormal<Meta>();
  p.unit = unit;
  p.scaled = false;
  p.wide = !detail::is_finite(detail::sub_rn(mx, mn)) || is_wide<Bits, Meta>(mn, unit);
  if (p.wide) {
    p.inv = detail::div_rn(Meta(1), unit);  // unit >= max / L: no overflow, no rescaling
    return p;
  }
  if (detail::is_zero(unit)) {  // a subnormal unit is rescaled below, under -ftz=true too
    p.inv = Meta(0);
  } else {
    Meta inv = detail::div_rn(Meta(1), unit);
    if (!detail::is_finite(inv)) {
      p.scaled = true;
      inv = detail::div_rn(Meta(1), detail::mul_rn(unit, detail::rescale_factor<Meta>()));
    }
    p.inv = inv;
  }
  return p;
}

/// Rounding offset source for one position j of a bucket: 1/2 for nearest, 8 uniform
/// 16-bit fractions from one Philox block for stochastic.
template <class Rounding>
struct rounding_offsets;

/// Nearest rounding: every offset is 1/2.
template <>
struct rounding_offsets<nearest> {
  /// No state: the arguments are those of the stochastic source.
  CGX_HOST_DEVICE CGX_FORCEINLINE rounding_offsets(const rng_state&, std::uint64_t, std::uint32_t) {}
  /// 1/2.
  template <class Meta>
  CGX_HOST_DEVICE CGX_FORCEINLINE Meta get(int) const {
    return Meta(0.5);
  }
};

/// Stochastic rounding: offsets from one Philox block keyed by (seed, stream, call counter)
/// and indexed by (bucket, position), so that they do not depend on the thread layout.
template <>
struct rounding_offsets<stochastic> {
  philox_block r;  ///< the block: eight 16-bit fractions
  /// `bucket_first` is the global index of the bucket's first value, `j` the position.
  CGX_HOST_DEVICE CGX_FORCEINLINE rounding_offsets(const rng_state& s, std::uint64_t bucket_first,
                                                   std::uint32_t j) {
    const philox_block c{{j, static_cast<std::uint32_t>(bucket_first),
                          static_cast<std::uint32_t>(bucket_first >> 32), s.counter}};
    r = philox4x32<stochastic_philox_rounds>(c, static_cast<std::uint32_t>(s.seed) ^ s.stream, static_cast<std::uint32_t>(s.seed >> 32));
  }
  /// Offset k (0..7) of the block, in [0, 1) with 16 bits.
  template <class Meta>
  CGX_HOST_DEVICE CGX_FORCEINLINE Meta get(int k) const {
    const std::uint32_t h = (r.w[k >> 1] >> ((k & 1) * 16)) & 0xffffu;
    return static_cast<Meta>(static_cast<float>(h) * (1.0f / 65536.0f));
  }
};

/// Code of one value (see "Encoding one value" above).
template <int Bits, bool Scaled, class Meta>
CGX_HOST_DEVICE CGX_FORCEINLINE std::uint32_t encode_value(Meta x, Meta mn, Meta inv, Meta offset) {
  constexpr Meta L = static_cast<Meta>(detail::levels<Bits>);
  Meta d = detail::sub_rn(x, mn);
  if constexpr (Scaled) d = detail::mul_rn(d, detail::rescale_factor<Meta>());
  Meta v = detail::mul_rn(d, inv);
  v = v < L ? v : L;  // v >= 0: a flushed comparison (setp.ftz) would give the same answer
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(detail::add_rn(v, offset)));
}

/// Value of one code: min + (code * unit), two roundings (never one fused multiply-add),
/// on every host path and on the device.
template <class Meta>
CGX_HOST_DEVICE CGX_FORCEINLINE Meta decode_value(std::uint32_t code, Meta mn, Meta unit) {
  return detail::add_rn(mn, detail::mul_rn(static_cast<Meta>(code), unit));
}

/// Code of one value of a wide bucket (max - min overflows M): the difference is taken
/// in double for float data (exact), at half scale for double data.
template <int Bits, class Meta>
CGX_HOST_DEVICE inline std::uint32_t encode_value_wide(Meta x, Meta mn, Meta inv, Meta offset) {
  constexpr double L = static_cast<double>(detail::levels<Bits>);
  double v;
  if constexpr (std::is_same_v<Meta, float>) {
    v = detail::mul_rn(detail::sub_rn(detail::widen(x), detail::widen(mn)), detail::widen(inv));
  } else {
    v = detail::mul_rn(detail::sub_rn(detail::mul_rn(x, 0.5), detail::mul_rn(mn, 0.5)), detail::mul_rn(inv, 2.0));
  }
  v = v < L ? v : L;
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(detail::add_rn(v, static_cast<double>(offset))));
}

/// Value of one code of a wide bucket: min + code * unit with one rounding (the product
/// alone may exceed the largest M even though the result does not).
template <class Meta>
CGX_HOST_DEVICE inline Meta decode_value_wide(std::uint32_t code, Meta mn, Meta unit) {
  if constexpr (std::is_same_v<Meta, float>) {
    return detail::narrow_rn(detail::add_rn(detail::widen(mn), detail::mul_rn(static_cast<double>(code), detail::widen(unit))));
  } else {
    // One explicit fma on host and device alike (a contraction left to the compiler
    // could differ between them); the halving is exact.
    return ::fma(static_cast<double>(code), unit * 0.5, mn * 0.5) * 2.0;
  }
}

}  // namespace cgx::quant
