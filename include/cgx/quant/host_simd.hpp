#pragma once
/// \file host_simd.hpp
/// Vectorized host kernels of the maxmin quantizer, written with the GCC/Clang vector
/// extension so that their speed does not depend on the auto-vectorizer's mood. They
/// evaluate exactly the expressions of wire_format.hpp (encode_value, decode_value,
/// pack_byte, unpack_code) lane by lane, so they produce the bytes of the scalar
/// reference. The width is 32 bytes: one AVX register, or two SSE registers where the
/// compiler targets plain x86-64.
///
/// Where AVX2 is enabled, float buckets are encoded by avx2::encode32 (32 positions per
/// iteration, codes narrowed to bytes before packing, Philox run in 64-bit lanes, see
/// avx2::philox8) and plane bytes are widened with vpmovzxbd (the vector extension's
/// conversion of bytes was scalarized by GCC 12). Measured on a 2-core AMD EPYC (Zen 3),
/// one thread, bucket 1024, 4 bits, 1 MiB of input (L2/L3): compress/nearest ~25 GB/s,
/// compress/stochastic ~10 GB/s with Philox4x32-7 (~7.8 GB/s with 10 rounds: the rounds
/// are most of its cost, 2 vpmuludq per 4 positions each), decode ~45 GB/s; a streaming
/// read of one core from memory is ~15-19 GB/s. bench/quant_bench.cpp measures it.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__AVX2__) && !defined(__CUDA_ARCH__)
#include <immintrin.h>
#endif

#include "../config.hpp"
#include "philox.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"

// Not under nvcc (not even its host pass): nvcc rejects some vector-extension casts;
// .cu files get the scalar reference, which writes the same bytes.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(CGX_NO_HOST_SIMD)
#define CGX_HAS_HOST_SIMD 1
#else
#define CGX_HAS_HOST_SIMD 0
#endif

#if CGX_HAS_HOST_SIMD
// 32-byte vector arguments of these always-inline helpers are an ABI note, not a problem,
// where the target has no AVX (plain x86-64): silence -Wpsabi for this file's functions.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpsabi"
#elif defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
namespace cgx::quant::simd {

template <class Meta>
struct vec_types;

template <>
struct vec_types<float> {
  static constexpr int lanes = 8;
  typedef float real __attribute__((vector_size(32)));
  typedef std::int32_t sint __attribute__((vector_size(32)));
  typedef std::uint32_t uint __attribute__((vector_size(32)));
  typedef std::uint8_t byte __attribute__((vector_size(8)));
};

template <>
struct vec_types<double> {
  static constexpr int lanes = 4;
  typedef double real __attribute__((vector_size(32)));
  typedef std::int32_t sint __attribute__((vector_size(16)));
  typedef std::uint32_t uint __attribute__((vector_size(16)));
  typedef std::uint8_t byte __attribute__((vector_size(4)));
};

template <class V>
CGX_FORCEINLINE V load(const void* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <class V>
CGX_FORCEINLINE void store(void* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

/// The low byte of every 32-bit lane (values < 256), in lane order.
CGX_FORCEINLINE vec_types<float>::byte narrow(vec_types<float>::uint v) {
  typedef std::uint8_t B32 __attribute__((vector_size(32)));
  const B32 b = reinterpret_cast<B32>(v);
  return __builtin_shufflevector(b, b, 0, 4, 8, 12, 16, 20, 24, 28);
}
CGX_FORCEINLINE vec_types<double>::byte narrow(vec_types<double>::uint v) {
  typedef std::uint8_t B16 __attribute__((vector_size(16)));
  const B16 b = reinterpret_cast<B16>(v);
  return __builtin_shufflevector(b, b, 0, 4, 8, 12);
}

template <class V, class S>
CGX_FORCEINLINE V splat(S s) {
  V v;
  for (std::size_t i = 0; i < sizeof(V) / sizeof(s); ++i) v[i] = s;
  return v;
}

/// min, max, all-finite of x[0..n) for float or double x, n >= 1. NaN is skipped by
/// the comparisons and Inf shows in min or max; the sum of the values is the cheap
/// witness of "all finite" (a NaN or Inf makes it non-finite); only when it is not
/// finite (NaN, Inf, or a finite overflow) are the values checked one by one.
template <class Meta>
inline void minmax(const Meta* CGX_RESTRICT x, std::size_t n, Meta& mn_out, Meta& mx_out, bool& finite) {
  using V = typename vec_types<Meta>::real;
  constexpr std::size_t L = vec_types<Meta>::lanes;
  constexpr int A = 4;  // independent accumulators: hide the latency of min/max
  const std::size_t nv = n - n % (A * L);
  std::size_t i = 0;
  Meta mn = x[0], mx = x[0], sum = Meta(0);
  if (nv > 0) {
    V lo[A], hi[A], sm[A];
    for (int a = 0; a < A; ++a) {
      lo[a] = load<V>(x + a * L);
      hi[a] = lo[a];
      sm[a] = lo[a];
    }
    for (i = A * L; i < nv; i += A * L) {
      CGX_UNROLL
      for (int a = 0; a < A; ++a) {
        const V v = load<V>(x + i + a * L);
        lo[a] = v < lo[a] ? v : lo[a];
        hi[a] = v > hi[a] ? v : hi[a];
        sm[a] = sm[a] + v;
      }
    }
    for (int a = 1; a < A; ++a) {
      lo[0] = lo[a] < lo[0] ? lo[a] : lo[0];
      hi[0] = hi[a] > hi[0] ? hi[a] : hi[0];
      sm[0] = sm[0] + sm[a];
    }
    mn = lo[0][0];
    mx = hi[0][0];
    for (std::size_t l = 0; l < L; ++l) {
      mn = lo[0][l] < mn ? lo[0][l] : mn;
      mx = hi[0][l] > mx ? hi[0][l] : mx;
      sum = sum + sm[0][l];
    }
  }
  for (std::size_t t = nv; t < n; ++t) {
    const Meta v = x[t];
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
    sum = sum + v;
  }
  mn_out = mn;
  mx_out = mx;
  finite = (sum - sum) == Meta(0);
  if (!finite) {
    Meta chk = Meta(0);
    for (std::size_t k = 0; k < n; ++k) chk = chk + (x[k] - x[k]);
    finite = chk == Meta(0);
  }
}

/// hi and lo halves of the 64-bit products a * m, lane by lane.
template <class U>
CGX_FORCEINLINE void mul_hi_lo(U a, std::uint32_t m, U& hi, U& lo) {
#if defined(__AVX2__)
  if constexpr (sizeof(U) == 32) {
    const __m256i va = reinterpret_cast<__m256i>(a);
    const __m256i vm = _mm256_set1_epi32(static_cast<int>(m));
    const __m256i pe = _mm256_mul_epu32(va, vm);                         // lanes 0,2,4,6
    const __m256i po = _mm256_mul_epu32(_mm256_srli_epi64(va, 32), vm);  // lanes 1,3,5,7
    lo = reinterpret_cast<U>(_mm256_blend_epi32(pe, _mm256_slli_epi64(po, 32), 0xAA));
    hi = reinterpret_cast<U>(_mm256_blend_epi32(_mm256_srli_epi64(pe, 32), po, 0xAA));
    return;
  }
#endif
  constexpr std::size_t N = sizeof(U) / 4;
  typedef std::uint64_t W __attribute__((vector_size(N * 8)));
  const W p = __builtin_convertvector(a, W) * m;
  hi = __builtin_convertvector(p >> 32, U);
  lo = __builtin_convertvector(p, U);
}

/// Philox4x32 (stochastic_philox_rounds rounds) on `lanes` counters at once, as philox4x32.
template <class U>
CGX_FORCEINLINE void philox_lanes(U (&c)[4], std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  CGX_UNROLL
  for (int r = 0; r < stochastic_philox_rounds; ++r) {
    U h0, l0, h1, l1;
    mul_hi_lo(c[0], m0, h0, l0);
    mul_hi_lo(c[2], m1, h1, l1);
    const U n0 = h1 ^ c[1] ^ k0;
    const U n2 = h0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = l1;
    c[2] = n2;
    c[3] = l0;
    k0 += w0;
    k1 += w1;
  }
}

#if defined(__AVX2__)
/// AVX2 kernels for float: 32 positions per iteration. The codes of a slice are narrowed
/// to bytes with saturating packs right after the conversion (they are <= 255, so the
/// packs are exact), the b-bit packing then runs on 32 bytes at once (16-bit shifts plus
/// masks that cut what a shift moves across a byte border), and one dword permutation
/// per plane undoes the lane interleave of the packs.
namespace avx2 {

/// Byte q of the words whose codes (one byte per position) are cb[0..7]; see pack_byte.
template <int Bits, int Q>
CGX_FORCEINLINE __m256i pack_plane(const __m256i (&cb)[8]) {
  __m256i acc = _mm256_setzero_si256();
  CGX_UNROLL
  for (int k = 0; k < 8; ++k) {
    const int s = k * Bits - 8 * Q;
    if (s >= 8 || s <= -Bits) continue;
    __m256i t = cb[k];
    if (s > 0) {
      t = _mm256_slli_epi16(t, s);
      if (s + Bits > 8) t = _mm256_and_si256(t, _mm256_set1_epi8(static_cast<char>((0xff << s) & 0xff)));
    } else if (s < 0) {
      t = _mm256_srli_epi16(t, -s);
      t = _mm256_and_si256(t, _mm256_set1_epi8(static_cast<char>(0xff >> -s)));
    }
    acc = k == 0 ? t : _mm256_or_si256(acc, t);
  }
  return acc;
}

/// Philox4x32 (stochastic_philox_rounds rounds, as philox4x32) of the counters (j + l, first, counter) of the
/// 8G positions l = 0..8G-1; on return w[g][i] holds output word i of position j + 8g + l
/// in 32-bit lane l. vpmuludq multiplies the low halves of 64-bit lanes into full 64-bit
/// products, so the rounds run there: per group, one register carries the even positions
/// and one the odd, each in the low halves of its 64-bit lanes. A product then *is* the
/// (lo, hi) pair a round needs: its low half is the new word, a 64-bit shift gives the
/// high half, and the high halves of the state carry bits that no multiply and no output
/// reads. Splitting and re-joining the halves (two blends and two shifts per product) is
/// done once per call instead of once per round. Words 1..3 of every counter are equal
/// across positions, so the first round's multiply of word 2 and the second round's of
/// word 0 are scalar.
template <int G>
CGX_FORCEINLINE void philox8(__m256i (&w)[G][4], std::uint32_t j, std::uint64_t first, std::uint32_t counter,
                             std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  constexpr int H = 2 * G;  // registers: even and odd positions of each group
  const __m256i M0 = _mm256_set1_epi32(static_cast<int>(m0)), M1 = _mm256_set1_epi32(static_cast<int>(m1));
  const auto splat32 = [](std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); };
  const auto mul = [](std::uint32_t a, std::uint32_t b) { return static_cast<std::uint64_t>(a) * b; };
  __m256i c[H][4];
  // Round 1: word 2 (first >> 32) is the same for all positions: its product is scalar,
  // and so is the new word 0 and word 1.
  const std::uint64_t q1 = mul(m1, static_cast<std::uint32_t>(first >> 32));
  const std::uint32_t r1w0 = static_cast<std::uint32_t>(q1 >> 32) ^ static_cast<std::uint32_t>(first) ^ k0;
  const std::uint32_t r1w1 = static_cast<std::uint32_t>(q1);
  {
    const __m256i ids = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i x3k = splat32(counter ^ k1);
    CGX_UNROLL
    for (int g = 0; g < G; ++g) {
      const __m256i pos = _mm256_add_epi32(ids, splat32(j + 8u * static_cast<std::uint32_t>(g)));
      const __m256i half[2] = {pos, _mm256_srli_epi64(pos, 32)};
      CGX_UNROLL
      for (int h = 0; h < 2; ++h) {
        const __m256i p0 = _mm256_mul_epu32(half[h], M0);
        c[2 * g + h][2] = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), x3k);
        c[2 * g + h][3] = p0;
      }
    }
  }
  k0 += w0;
  k1 += w1;
  // Round 2: word 0 is the scalar r1w0, so its product is scalar too.
  {
    const std::uint64_t q0 = mul(m0, r1w0);
    const __m256i x1k = splat32(r1w1 ^ k0);
    const __m256i h0k = splat32(static_cast<std::uint32_t>(q0 >> 32) ^ k1);
    const __m256i l0 = splat32(static_cast<std::uint32_t>(q0));
    CGX_UNROLL
    for (int t = 0; t < H; ++t) {
      const __m256i p1 = _mm256_mul_epu32(c[t][2], M1);
      const __m256i n0 = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), x1k);
      const __m256i n2 = _mm256_xor_si256(c[t][3], h0k);
      c[t][0] = n0;
      c[t][1] = p1;
      c[t][2] = n2;
      c[t][3] = l0;
    }
  }
  k0 += w0;
  k1 += w1;
  static_assert(stochastic_philox_rounds >= 2);
  CGX_UNROLL
  for (int r = 2; r < stochastic_philox_rounds; ++r) {
    const __m256i K0 = splat32(k0), K1 = splat32(k1);
    CGX_UNROLL
    for (int t = 0; t < H; ++t) {
      const __m256i p0 = _mm256_mul_epu32(c[t][0], M0);
      const __m256i p1 = _mm256_mul_epu32(c[t][2], M1);
      const __m256i n0 = _mm256_xor_si256(_mm256_srli_epi64(p1, 32), _mm256_xor_si256(c[t][1], K0));
      const __m256i n2 = _mm256_xor_si256(_mm256_srli_epi64(p0, 32), _mm256_xor_si256(c[t][3], K1));
      c[t][0] = n0;
      c[t][1] = p1;
      c[t][2] = n2;
      c[t][3] = p0;
    }
    k0 += w0;
    k1 += w1;
  }
  CGX_UNROLL
  for (int g = 0; g < G; ++g)
    CGX_UNROLL
    for (int i = 0; i < 4; ++i) w[g][i] = _mm256_blend_epi32(c[2 * g][i], _mm256_slli_epi64(c[2 * g + 1][i], 32), 0xAA);
}

/// Rounding offsets of slice k for the 8 positions whose Philox outputs are w[0..3].
CGX_FORCEINLINE __m256 offset16(const __m256i (&w)[4], int k) {
  const __m256i h = (k & 1) ? _mm256_srli_epi32(w[k >> 1], 16) : _mm256_and_si256(w[k >> 1], _mm256_set1_epi32(0xffff));
  return _mm256_cvtepi32_ps(h);
}

/// IntClamp: clamp the codes to 2^b - 1 after the conversion (a byte min, or the packs'
/// saturation for b = 8) instead of clamping v before the rounding offset is added. For
/// v <= L both compute trunc(v + o); for v > L the reference gives trunc(L + o) = L
/// (L + o is exact) and the integer clamp gives min(trunc(v + o), L) = L, as long as v + o
/// converts without overflow, which the caller guarantees (no overflow of x - min).
template <int Bits, class Rounding, bool Scaled, bool IntClamp>
inline std::uint32_t encode32(const float* CGX_RESTRICT x, std::uint32_t S, float mn, float inv,
                              std::uint8_t* CGX_RESTRICT codes, const rng_state& rng, std::uint64_t first,
                              const float* prefetch) {
  constexpr int G = 4;  // groups of 8 positions per iteration
  const std::uint32_t Sv = S - S % (8 * G);
  const __m256 vmn = _mm256_set1_ps(mn), vinv = _mm256_set1_ps(inv);
  const __m256 vL = _mm256_set1_ps(static_cast<float>(detail::levels<Bits>));
  const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const std::uint32_t k0 = static_cast<std::uint32_t>(rng.seed) ^ rng.stream;
  const std::uint32_t k1 = static_cast<std::uint32_t>(rng.seed >> 32);
  for (std::uint32_t j = 0; j < Sv; j += 8 * G) {
    if (prefetch != nullptr) {
      CGX_UNROLL
      for (std::size_t e = 0; e < 8 * 8 * G; e += 16) __builtin_prefetch(prefetch + 8 * std::size_t{j} + e, 0, 3);
    }
    __m256i w[G][4];
    if constexpr (std::is_same_v<Rounding, stochastic>) {
      // two groups at a time: their 16 state registers fit the register file
      CGX_UNROLL
      for (int g = 0; g < G; g += 2)
        philox8<2>(reinterpret_cast<__m256i(&)[2][4]>(w[g]), j + 8u * static_cast<std::uint32_t>(g), first,
                   rng.counter, k0, k1);
    }
    __m256i cb[8];
    CGX_UNROLL
    for (int k = 0; k < 8; ++k) {
      __m256i ci[G];
      CGX_UNROLL
      for (int g = 0; g < G; ++g) {
        __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + std::size_t(k) * S + j + 8 * g), vmn);
        if constexpr (Scaled) d = _mm256_mul_ps(d, _mm256_set1_ps(detail::rescale_factor<float>()));
        __m256 v = _mm256_mul_ps(d, vinv);
        if constexpr (!IntClamp) v = _mm256_min_ps(v, vL);  // v < L ? v : L
        if constexpr (std::is_same_v<Rounding, stochastic>) {
          // v + h 2^-16: the product is exact, so one fused rounding equals the reference's
#if defined(__FMA__)
          v = _mm256_fmadd_ps(offset16(w[g], k), _mm256_set1_ps(1.0f / 65536.0f), v);
#else
          v = _mm256_add_ps(v, _mm256_mul_ps(offset16(w[g], k), _mm256_set1_ps(1.0f / 65536.0f)));
#endif
        } else {
          v = _mm256_add_ps(v, _mm256_set1_ps(0.5f));
        }
        ci[g] = _mm256_cvttps_epi32(v);
      }
      cb[k] = _mm256_packus_epi16(_mm256_packus_epi32(ci[0], ci[1]), _mm256_packus_epi32(ci[2], ci[3]));
      if constexpr (IntClamp && Bits < 8)
        cb[k] = _mm256_min_epu8(cb[k], _mm256_set1_epi8(static_cast<char>(detail::levels<Bits>)));
    }
    [&]<int... Q>(std::integer_sequence<int, Q...>) {
      ((_mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + std::size_t(Q) * S + j),
                            _mm256_permutevar8x32_epi32(pack_plane<Bits, Q>(cb), perm))),
       ...);
    }(std::make_integer_sequence<int, Bits>{});
  }
  return Sv;
}

/// Codes of 8 positions of plane-byte vectors, widened to 32-bit lanes.
CGX_FORCEINLINE __m256i widen8(const std::uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

}  // namespace avx2
#endif

/// Encodes positions [0, S_vec) of a full bucket (S_vec a multiple of the lane count);
/// returns the number of positions done. Same codes as detail::host_encode_bucket.
template <int Bits, class Rounding, bool Scaled, class Meta>
inline std::uint32_t encode_full(const Meta* CGX_RESTRICT x, std::uint32_t S, Meta mn, Meta inv,
                                 std::uint8_t* CGX_RESTRICT codes, const rng_state& rng, std::uint64_t first,
                                 const Meta* prefetch = nullptr) {
  using T = vec_types<Meta>;
  using V = typename T::real;
  using U = typename T::uint;
  using SI = typename T::sint;
  constexpr std::uint32_t L = T::lanes;
  constexpr Meta levels = static_cast<Meta>(detail::levels<Bits>);
  const std::uint32_t Sv = S - S % L;
  const V vmn = splat<V>(mn), vinv = splat<V>(inv), vL = splat<V>(levels);
  U lane_ids;
  for (std::uint32_t l = 0; l < L; ++l) lane_ids[l] = l;
  std::uint32_t j = 0;
#if defined(__AVX2__)
  if constexpr (std::is_same_v<Meta, float>) {
    // inv >= 2^-120 (or 0) bounds max - min below FLT_MAX: x - min cannot overflow.
    if (!Scaled && !(inv > 0.0f && inv < 0x1p-120f))
      j = avx2::encode32<Bits, Rounding, Scaled, true>(x, S, mn, inv, codes, rng, first, prefetch);
    else
      j = avx2::encode32<Bits, Rounding, Scaled, false>(x, S, mn, inv, codes, rng, first, prefetch);
  }
#endif
  for (; j < Sv; j += L) {
    if (prefetch != nullptr) {
      // Pull the next bucket into L1 while this one is encoded: its min/max pass then
      // runs from cache and the memory stream never stalls.
      constexpr std::size_t line = 64 / sizeof(Meta);
      CGX_UNROLL
      for (std::size_t e = 0; e < 8 * L; e += line) __builtin_prefetch(prefetch + 8 * std::size_t{j} + e, 0, 3);
    }
    V off[8];
    if constexpr (std::is_same_v<Rounding, stochastic>) {
      U c[4] = {lane_ids + j, splat<U>(static_cast<std::uint32_t>(first)),
                splat<U>(static_cast<std::uint32_t>(first >> 32)), splat<U>(rng.counter)};
      philox_lanes(c, static_cast<std::uint32_t>(rng.seed) ^ rng.stream, static_cast<std::uint32_t>(rng.seed >> 32));
      CGX_UNROLL
      for (int k = 0; k < 8; ++k) {
        const U h = (c[k >> 1] >> ((k & 1) * 16)) & 0xffffu;
        off[k] = __builtin_convertvector(__builtin_convertvector(h, SI), V) * static_cast<Meta>(1.0f / 65536.0f);
      }
    } else {
      CGX_UNROLL
      for (int k = 0; k < 8; ++k) off[k] = splat<V>(Meta(0.5));
    }
    U cv[8];
    CGX_UNROLL
    for (int k = 0; k < 8; ++k) {
      V d = load<V>(x + static_cast<std::size_t>(k) * S + j) - vmn;
      if constexpr (Scaled) d = d * detail::rescale_factor<Meta>();
      V v = d * vinv;
      v = v < vL ? v : vL;
      cv[k] = __builtin_convertvector(__builtin_convertvector(v + off[k], SI), U);
    }
    [&]<int... Q>(std::integer_sequence<int, Q...>) {
      ((store(codes + static_cast<std::size_t>(Q) * S + j,
              narrow(detail::pack_byte_impl<Bits, Q>(cv, std::make_integer_sequence<int, 8>{})))),
       ...);
    }(std::make_integer_sequence<int, Bits>{});
  }
  return Sv;
}

/// 8 (float) or 4 (double) plane bytes at p, zero-extended to 32-bit lanes.
template <class U, class BV>
CGX_FORCEINLINE U widen(const std::uint8_t* p) {
#if defined(__AVX2__)
  if constexpr (sizeof(U) == 32) return reinterpret_cast<U>(avx2::widen8(p));
#endif
  const BV b = load<BV>(p);
  const BV z = {};
  if constexpr (sizeof(BV) == 8) {
    typedef std::uint8_t B32 __attribute__((vector_size(32)));
    const B32 w = __builtin_shufflevector(b, z, 0, 8, 8, 8, 1, 8, 8, 8, 2, 8, 8, 8, 3, 8, 8, 8, 4, 8, 8, 8, 5, 8, 8,
                                          8, 6, 8, 8, 8, 7, 8, 8, 8);
    return reinterpret_cast<U>(w);
  } else {
    typedef std::uint8_t B16 __attribute__((vector_size(16)));
    const B16 w = __builtin_shufflevector(b, z, 0, 4, 4, 4, 1, 4, 4, 4, 2, 4, 4, 4, 3, 4, 4, 4);
    return reinterpret_cast<U>(w);
  }
}

/// Decodes positions [0, S_vec) of a full bucket; returns the number of positions done.
/// `next`, when not null, is the output of the next bucket: it is prefetched meanwhile.
/// The decode is written as decode_value's expression so that the compiler contracts it
/// (or not) exactly as it does the scalar reference.
template <int Bits, bool Add, class Meta>
inline std::uint32_t decode_full(const std::uint8_t* CGX_RESTRICT codes, std::uint32_t S, Meta mn, Meta unit,
                                 Meta* CGX_RESTRICT y, const Meta* next = nullptr) {
  using T = vec_types<Meta>;
  using V = typename T::real;
  using U = typename T::uint;
  using SI = typename T::sint;
  using BV = typename T::byte;
  constexpr std::uint32_t L = T::lanes;
  const std::uint32_t Sv = S - S % L;
  const V vmn = splat<V>(mn), vunit = splat<V>(unit);
  for (std::uint32_t j = 0; j < Sv; j += L) {
    if (next != nullptr) {
      constexpr std::size_t line = 64 / sizeof(Meta);
      CGX_UNROLL
      for (std::size_t e = 0; e < 8 * L; e += line) __builtin_prefetch(next + 8 * std::size_t{j} + e, 1, 3);
    }
    U b[Bits];
    CGX_UNROLL
    for (int q = 0; q < Bits; ++q) b[q] = widen<U, BV>(codes + static_cast<std::size_t>(q) * S + j);
    [&]<int... K>(std::integer_sequence<int, K...>) {
      (
          [&] {
            Meta* p = y + static_cast<std::size_t>(K) * S + j;
            const U code = detail::unpack_code<Bits, K>(b);
            const V v = vmn + __builtin_convertvector(__builtin_convertvector(code, SI), V) * vunit;
            if constexpr (Add) {
              store(p, load<V>(p) + v);
            } else {
              store(p, v);
            }
          }(),
          ...);
    }(std::make_integer_sequence<int, 8>{});
  }
  return Sv;
}

}  // namespace cgx::quant::simd
#if defined(__clang__)
#pragma clang diagnostic pop
#elif defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
#endif
