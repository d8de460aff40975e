// host_kernels.inl: the vectorized host kernels of cgx::quant::maxmin, for one
// instruction set. No include guard: quant/host_simd.hpp includes this file once per
// instruction set, each time inside its own namespace (cgx::quant::simd::sse2, ::avx2,
// ::avx512, ::neon) and between CGX_TARGET_BEGIN/END, after declaring
//   inline constexpr int vector_bytes = 16 or 32;   // width of the generic vectors
// Everything here is a template or inline, so each namespace gets its own copy compiled
// for its instruction set.
//
// The kernels evaluate exactly the expressions of wire_format.hpp (encode_value,
// decode_value, pack_byte, unpack_code) lane by lane, with every product that an
// addition consumes kept apart from it (barrier below), so they write the bytes of the
// scalar reference (host_reference.hpp) on every instruction set. Float buckets on x86
// are encoded by encode_f32 (32 or 16 positions per iteration, codes narrowed to bytes
// before packing, Philox run in 64-bit lanes, see philox_groups); everything else uses
// the GCC/Clang vector extension at vector_bytes per vector, which the compiler maps
// onto SSE2, AVX2 or Advanced SIMD registers. Measured speeds: docs/results (quant-host)
// and bench/quant_bench.cpp.

template <class Meta>
struct vec_types;

template <>
struct vec_types<float> {
  static constexpr int lanes = vector_bytes / 4;
  typedef float real __attribute__((vector_size(vector_bytes)));
  typedef std::int32_t sint __attribute__((vector_size(vector_bytes)));
  typedef std::uint32_t uint __attribute__((vector_size(vector_bytes)));
  typedef std::uint8_t byte __attribute__((vector_size(vector_bytes / 4)));
};

template <>
struct vec_types<double> {
  static constexpr int lanes = vector_bytes / 8;
  typedef double real __attribute__((vector_size(vector_bytes)));
  typedef std::int32_t sint __attribute__((vector_size(vector_bytes / 2)));
  typedef std::uint32_t uint __attribute__((vector_size(vector_bytes / 2)));
  typedef std::uint8_t byte __attribute__((vector_size(vector_bytes / 8)));
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

template <class V, class S>
CGX_FORCEINLINE V splat(S s) {
  V v{};  // (zeroed: GCC 12 -march=native otherwise warns "may be used uninitialized"; folded away)
  for (std::size_t i = 0; i < sizeof(V) / sizeof(s); ++i) v[i] = s;
  return v;
}

/// v, hidden from the optimizer (see detail::opaque): the rounded product passed through
/// it is never fused with the addition that follows. Defined here so that vectors never
/// cross a function compiled for another instruction set.
template <class V>
CGX_FORCEINLINE V barrier(V v) {
#if defined(CGX_HOST_SIMD_X86)
  asm("" : "+x"(v));
#else
  asm("" : "+w"(v));
#endif
  return v;
}

typedef std::uint8_t bytes8 __attribute__((vector_size(8)));
typedef std::uint8_t bytes16 __attribute__((vector_size(16)));
typedef std::uint8_t bytes32 __attribute__((vector_size(32)));

/// The low byte of every 32-bit lane (values < 256), in lane order.
template <class U>
CGX_FORCEINLINE auto narrow(U v) {
  if constexpr (sizeof(U) == 32) {
    const bytes32 b = __builtin_bit_cast(bytes32, v);
    return __builtin_shufflevector(b, b, 0, 4, 8, 12, 16, 20, 24, 28);
  } else if constexpr (sizeof(U) == 16) {
    const bytes16 b = __builtin_bit_cast(bytes16, v);
    return __builtin_shufflevector(b, b, 0, 4, 8, 12);
  } else {
    static_assert(sizeof(U) == 8);
    const bytes8 b = __builtin_bit_cast(bytes8, v);
    return __builtin_shufflevector(b, b, 0, 4);
  }
}

/// N plane bytes at p (N = lanes of U), zero-extended to the 32-bit lanes of U.
template <class U>
CGX_FORCEINLINE U widen(const std::uint8_t* p) {
  constexpr int N = sizeof(U) / 4;
#if defined(CGX_HOST_SIMD_X86)
  if constexpr (vector_bytes == 32 && N == 8) {
    return __builtin_bit_cast(U, _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  } else if constexpr (N == 4) {
    std::int32_t w;
    std::memcpy(&w, p, 4);
    const __m128i z = _mm_setzero_si128();
    return __builtin_bit_cast(U, _mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(w), z), z));
  } else
#endif
  {
    U u{};
    for (int l = 0; l < N; ++l) u[l] = p[l];
    return u;
  }
}

/// Byte Q of the words holding the codes c[0..7] (pack_byte, lane by lane).
template <int Bits, int Q, class U>
CGX_FORCEINLINE U pack_lanes(const U (&c)[8]) {
  U acc = c[0] & 0u;
  CGX_UNROLL
  for (int k = 0; k < 8; ++k) {
    const int s = k * Bits - 8 * Q;
    if (s >= 8 || s <= -Bits) continue;
    acc |= s >= 0 ? c[k] << s : c[k] >> -s;
  }
  return acc & 0xffu;
}

/// Code K of the words whose bytes are b[0..Bits-1] (unpack_code, lane by lane).
template <int Bits, int K, class U>
CGX_FORCEINLINE U unpack_lanes(const U (&b)[Bits]) {
  constexpr int bit = K * Bits;
  constexpr int q = bit / 8;
  constexpr int r = bit % 8;
  U v = b[q] >> r;
  if constexpr (r + Bits > 8) v |= b[q + 1] << (8 - r);
  return v & detail::levels<Bits>;
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
  constexpr std::size_t N = sizeof(U) / 4;
  typedef std::uint64_t W __attribute__((vector_size(N * 8)));
  const W p = __builtin_convertvector(a, W) * m;
  hi = __builtin_convertvector(p >> 32, U);
  lo = __builtin_convertvector(p, U);
}

/// Philox4x32 (stochastic_philox_rounds rounds) on the lanes of c at once, as philox4x32.
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

#if defined(CGX_HOST_SIMD_X86)
/// The x86 operations of encode_f32 on one register: x86_sse2 (16 bytes) and x86_avx2
/// (32 bytes) name the same operations; `x86` is the one of this instruction set (the
/// other is never instantiated here: templates, so that no function of another
/// instruction set is even declared with its vector types).
template <class = void>
struct x86_sse2 {
  static constexpr int lanes = 4;  // 32-bit lanes per register
  using vi = __m128i;
  using vf = __m128;
  static CGX_FORCEINLINE vf loadu(const float* p) { return _mm_loadu_ps(p); }
  static CGX_FORCEINLINE void storeu(float* p, vf v) { _mm_storeu_ps(p, v); }
  static CGX_FORCEINLINE vf set1(float v) { return _mm_set1_ps(v); }
  static CGX_FORCEINLINE vi set1(std::uint32_t v) { return _mm_set1_epi32(static_cast<int>(v)); }
  static CGX_FORCEINLINE vi set1_8(std::uint8_t v) { return _mm_set1_epi8(static_cast<char>(v)); }
  static CGX_FORCEINLINE vi ids() { return _mm_setr_epi32(0, 1, 2, 3); }  ///< 0, 1, ..., lanes - 1
  static CGX_FORCEINLINE vf sub(vf a, vf b) { return _mm_sub_ps(a, b); }
  static CGX_FORCEINLINE vf mul(vf a, vf b) { return _mm_mul_ps(a, b); }
  static CGX_FORCEINLINE vf add(vf a, vf b) { return _mm_add_ps(a, b); }
  static CGX_FORCEINLINE vf min(vf a, vf b) { return _mm_min_ps(a, b); }  ///< a < b ? a : b
  static CGX_FORCEINLINE vi cvtt(vf a) { return _mm_cvttps_epi32(a); }
  static CGX_FORCEINLINE vf cvt(vi a) { return _mm_cvtepi32_ps(a); }
  static CGX_FORCEINLINE vi add32(vi a, vi b) { return _mm_add_epi32(a, b); }
  static CGX_FORCEINLINE vi bxor(vi a, vi b) { return _mm_xor_si128(a, b); }
  static CGX_FORCEINLINE vi band(vi a, vi b) { return _mm_and_si128(a, b); }
  static CGX_FORCEINLINE vi bor(vi a, vi b) { return _mm_or_si128(a, b); }
  /// The high halves of the 64-bit lanes, moved to the low halves.
  static CGX_FORCEINLINE vi hi64(vi a) { return _mm_srli_epi64(a, 32); }
  /// Full 64-bit products of the low halves of the 64-bit lanes.
  static CGX_FORCEINLINE vi mul64(vi a, vi b) { return _mm_mul_epu32(a, b); }
  /// 32-bit lanes: even ones from the low halves of `even`, odd ones from the low halves of `odd`.
  static CGX_FORCEINLINE vi join(vi even, vi odd) {
    return _mm_or_si128(_mm_and_si128(even, _mm_set_epi32(0, -1, 0, -1)), _mm_slli_epi64(odd, 32));
  }
  /// Each 32-bit lane's high (H) or low 16 bits.
  template <bool H>
  static CGX_FORCEINLINE vi half16(vi a) {
    if constexpr (H) return _mm_srli_epi32(a, 16); else return _mm_and_si128(a, _mm_set1_epi32(0xffff));
  }
  /// Four registers of codes (each in [0, 2^31)), saturated to bytes in one register.
  /// SSE2 has no unsigned 32->16 pack; the signed one saturates such codes to 32767,
  /// which the 16->8 pack saturates to 255 as the unsigned one would.
  static CGX_FORCEINLINE vi pack_bytes(vi a, vi b, vi c, vi d) {
    return _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d));
  }
  template <int S>
  static CGX_FORCEINLINE vi shl16(vi a) { return _mm_slli_epi16(a, S); }
  template <int S>
  static CGX_FORCEINLINE vi shr16(vi a) { return _mm_srli_epi16(a, S); }
  /// Stores a plane register made by pack_bytes, in position order.
  static CGX_FORCEINLINE void store_plane(std::uint8_t* p, vi v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }
};

template <class = void>
struct x86_avx2 {
  static constexpr int lanes = 8;
  using vi = __m256i;
  using vf = __m256;
  static CGX_FORCEINLINE vf loadu(const float* p) { return _mm256_loadu_ps(p); }
  static CGX_FORCEINLINE void storeu(float* p, vf v) { _mm256_storeu_ps(p, v); }
  static CGX_FORCEINLINE vf set1(float v) { return _mm256_set1_ps(v); }
  static CGX_FORCEINLINE vi set1(std::uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
  static CGX_FORCEINLINE vi set1_8(std::uint8_t v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static CGX_FORCEINLINE vi ids() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
  static CGX_FORCEINLINE vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
  static CGX_FORCEINLINE vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
  static CGX_FORCEINLINE vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
  static CGX_FORCEINLINE vf min(vf a, vf b) { return _mm256_min_ps(a, b); }
  static CGX_FORCEINLINE vi cvtt(vf a) { return _mm256_cvttps_epi32(a); }
  static CGX_FORCEINLINE vf cvt(vi a) { return _mm256_cvtepi32_ps(a); }
  static CGX_FORCEINLINE vi add32(vi a, vi b) { return _mm256_add_epi32(a, b); }
  static CGX_FORCEINLINE vi bxor(vi a, vi b) { return _mm256_xor_si256(a, b); }
  static CGX_FORCEINLINE vi band(vi a, vi b) { return _mm256_and_si256(a, b); }
  static CGX_FORCEINLINE vi bor(vi a, vi b) { return _mm256_or_si256(a, b); }
  static CGX_FORCEINLINE vi hi64(vi a) { return _mm256_srli_epi64(a, 32); }
  static CGX_FORCEINLINE vi mul64(vi a, vi b) { return _mm256_mul_epu32(a, b); }
  static CGX_FORCEINLINE vi join(vi even, vi odd) { return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA); }
  template <bool H>
  static CGX_FORCEINLINE vi half16(vi a) {
    if constexpr (H) return _mm256_srli_epi32(a, 16); else return _mm256_and_si256(a, _mm256_set1_epi32(0xffff));
  }
  static CGX_FORCEINLINE vi pack_bytes(vi a, vi b, vi c, vi d) {
    return _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
  }
  template <int S>
  static CGX_FORCEINLINE vi shl16(vi a) { return _mm256_slli_epi16(a, S); }
  template <int S>
  static CGX_FORCEINLINE vi shr16(vi a) { return _mm256_srli_epi16(a, S); }
  /// AVX2's packs work within 128-bit halves: one dword permutation undoes their interleave.
  static CGX_FORCEINLINE void store_plane(std::uint8_t* p, vi v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
};

using x86 = std::conditional_t<vector_bytes == 32, x86_avx2<>, x86_sse2<>>;

/// Byte q of the words whose codes (one byte per position) are cb[0..7]; see pack_byte.
/// 16-bit shifts plus masks that cut what a shift moves across a byte border.
template <int Bits, int Q>
CGX_FORCEINLINE x86::vi pack_plane(const x86::vi (&cb)[8]) {
  x86::vi acc{};
  [&]<int... K>(std::integer_sequence<int, K...>) {
    (
        [&] {
          constexpr int s = K * Bits - 8 * Q;
          if constexpr (s < 8 && s > -Bits) {
            x86::vi t = cb[K];
            if constexpr (s > 0) {
              t = x86::shl16<s>(t);
              if constexpr (s + Bits > 8) t = x86::band(t, x86::set1_8(static_cast<std::uint8_t>((0xff << s) & 0xff)));
            } else if constexpr (s < 0) {
              t = x86::band(x86::shr16<-s>(t), x86::set1_8(static_cast<std::uint8_t>(0xff >> -s)));
            }
            acc = K == 0 ? t : x86::bor(acc, t);
          }
        }(),
        ...);
  }(std::make_integer_sequence<int, 8>{});
  return acc;
}

/// Philox4x32 (stochastic_philox_rounds rounds, as philox4x32) of the counters (j + l,
/// first, counter) of the G lanes-wide groups of positions l = 0..G lanes - 1; on return
/// w[g][i] (g < G: w points to G groups of 4 words) holds output word i of position
/// j + lanes g + l in 32-bit lane l.
/// pmuludq multiplies the low halves of 64-bit lanes into full 64-bit products, so the
/// rounds run there: per group, one register carries the even positions and one the
/// odd, each in the low halves of its 64-bit lanes. A product then *is* the (lo, hi)
/// pair a round needs: its low half is the new word, a 64-bit shift gives the high half,
/// and the high halves of the state carry bits that no multiply and no output reads.
/// Splitting and re-joining the halves is done once per call instead of once per
/// round. Words 1..3 of every counter are equal across positions, so the first round's
/// multiply of word 2 and the second round's of word 0 are scalar.
template <int G>
CGX_FORCEINLINE void philox_groups(x86::vi (*w)[4], std::uint32_t j, std::uint64_t first, std::uint32_t counter,
                                   std::uint32_t k0, std::uint32_t k1) {
  using vi = x86::vi;
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  constexpr int H = 2 * G;  // registers: even and odd positions of each group
  const vi M0 = x86::set1(m0), M1 = x86::set1(m1);
  const auto mul = [](std::uint32_t a, std::uint32_t b) { return static_cast<std::uint64_t>(a) * b; };
  vi c[H][4];
  // Round 1: word 2 (first >> 32) is the same for all positions: its product is scalar,
  // and so is the new word 0 and word 1.
  const std::uint64_t q1 = mul(m1, static_cast<std::uint32_t>(first >> 32));
  const std::uint32_t r1w0 = static_cast<std::uint32_t>(q1 >> 32) ^ static_cast<std::uint32_t>(first) ^ k0;
  const std::uint32_t r1w1 = static_cast<std::uint32_t>(q1);
  {
    const vi x3k = x86::set1(counter ^ k1);
    CGX_UNROLL
    for (int g = 0; g < G; ++g) {
      const vi pos = x86::add32(x86::ids(), x86::set1(j + static_cast<std::uint32_t>(x86::lanes * g)));
      const vi half[2] = {pos, x86::hi64(pos)};
      CGX_UNROLL
      for (int h = 0; h < 2; ++h) {
        const vi p0 = x86::mul64(half[h], M0);
        c[2 * g + h][2] = x86::bxor(x86::hi64(p0), x3k);
        c[2 * g + h][3] = p0;
      }
    }
  }
  k0 += w0;
  k1 += w1;
  // Round 2: word 0 is the scalar r1w0, so its product is scalar too.
  {
    const std::uint64_t q0 = mul(m0, r1w0);
    const vi x1k = x86::set1(r1w1 ^ k0);
    const vi h0k = x86::set1(static_cast<std::uint32_t>(q0 >> 32) ^ k1);
    const vi l0 = x86::set1(static_cast<std::uint32_t>(q0));
    CGX_UNROLL
    for (int t = 0; t < H; ++t) {
      const vi p1 = x86::mul64(c[t][2], M1);
      const vi n0 = x86::bxor(x86::hi64(p1), x1k);
      const vi n2 = x86::bxor(c[t][3], h0k);
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
    const vi K0 = x86::set1(k0), K1 = x86::set1(k1);
    CGX_UNROLL
    for (int t = 0; t < H; ++t) {
      const vi p0 = x86::mul64(c[t][0], M0);
      const vi p1 = x86::mul64(c[t][2], M1);
      const vi n0 = x86::bxor(x86::hi64(p1), x86::bxor(c[t][1], K0));
      const vi n2 = x86::bxor(x86::hi64(p0), x86::bxor(c[t][3], K1));
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
    for (int i = 0; i < 4; ++i) w[g][i] = x86::join(c[2 * g][i], c[2 * g + 1][i]);
}

/// Encodes positions [0, S_vec) of a full float bucket, 4 lanes-wide groups of positions
/// per iteration (S_vec a multiple of 4 lanes); returns S_vec. `scale` is
/// rescale_factor<float>() for a scaled bucket and 1 otherwise (d * 1 == d exactly): one
/// kernel serves both, which halves what every including file compiles.
/// `back`, when not null, receives each position's decoded value, decode_value(code, mn,
/// unit), computed from the code in registers: what decoding the codes just written
/// gives, without reading and unpacking them again. It may be x itself (each value is
/// read before its decoded value is stored, and no other position reads it): x is
/// therefore not declared restrict.
template <int Bits, class Rounding>
inline std::uint32_t encode_f32(const float* x, std::uint32_t S, float mn, float inv, float scale,
                                std::uint8_t* CGX_RESTRICT codes, const rng_state& rng, std::uint64_t first,
                                const float* prefetch, float* back, float unit) {
  using vi = x86::vi;
  using vf = x86::vf;
  constexpr int G = 4;                        // groups of lanes positions per iteration
  constexpr std::uint32_t step = x86::lanes * G;  // positions per iteration
  const std::uint32_t Sv = S - S % step;
  const vf vmn = x86::set1(mn), vinv = x86::set1(inv), vscale = x86::set1(scale);
  const vf vL = x86::set1(static_cast<float>(detail::levels<Bits>));
  const vf vunit = x86::set1(unit);
  const std::uint32_t k0 = static_cast<std::uint32_t>(rng.seed) ^ rng.stream;
  const std::uint32_t k1 = static_cast<std::uint32_t>(rng.seed >> 32);
  for (std::uint32_t j = 0; j < Sv; j += step) {
    if (prefetch != nullptr) {
      // Pull the next bucket into L1 while this one is encoded: its min/max pass then
      // runs from cache and the memory stream never stalls.
      CGX_UNROLL
      for (std::size_t e = 0; e < 8 * step; e += 16) __builtin_prefetch(prefetch + 8 * std::size_t{j} + e, 0, 3);
    }
    vi w[G][4];
    if constexpr (std::is_same_v<Rounding, stochastic>) {
      // two groups at a time: their 16 state registers fit the register file
      CGX_UNROLL
      for (int g = 0; g < G; g += 2)
        philox_groups<2>(w + g, j + static_cast<std::uint32_t>(x86::lanes * g), first,
                         rng.counter, k0, k1);
    }
    vi cb[8];
    CGX_UNROLL
    for (int k = 0; k < 8; ++k) {
      vi ci[G];
      CGX_UNROLL
      for (int g = 0; g < G; ++g) {
        const vf d = x86::mul(x86::sub(x86::loadu(x + std::size_t(k) * S + j + x86::lanes * g), vmn), vscale);
        const vf v0 = x86::min(barrier(x86::mul(d, vinv)), vL);  // v < L ? v : L
        vf v;
        if constexpr (std::is_same_v<Rounding, stochastic>) {
          // v + h 2^-16: the product is exact (fused or not, the same sum)
          const vi h = (k & 1) ? x86::half16<true>(w[g][k >> 1]) : x86::half16<false>(w[g][k >> 1]);
          v = x86::add(v0, x86::mul(x86::cvt(h), x86::set1(1.0f / 65536.0f)));
        } else {
          v = x86::add(v0, x86::set1(0.5f));
        }
        ci[g] = x86::cvtt(v);
        if (back != nullptr)  // decode_value: min + (code * unit), the product rounded on its own
          x86::storeu(back + std::size_t(k) * S + j + x86::lanes * g,
                      x86::add(vmn, barrier(x86::mul(x86::cvt(ci[g]), vunit))));
      }
      cb[k] = x86::pack_bytes(ci[0], ci[1], ci[2], ci[3]);
    }
    [&]<int... Q>(std::integer_sequence<int, Q...>) {
      (x86::store_plane(codes + std::size_t(Q) * S + j, pack_plane<Bits, Q>(cb)), ...);
    }(std::make_integer_sequence<int, Bits>{});
  }
  return Sv;
}
#endif

/// Encodes positions [0, S_vec) of a full bucket (S_vec a multiple of the lane count);
/// returns the number of positions done. Same codes as host_encode_bucket; `scale` is
/// rescale_factor<Meta>() for a scaled bucket, else 1.
/// `back`, when not null, receives the decoded values of the positions done (see
/// encode_f32; it may be x).
template <int Bits, class Rounding, class Meta>
inline std::uint32_t encode_full(const Meta* x, std::uint32_t S, Meta mn, Meta inv, Meta scale,
                                 std::uint8_t* CGX_RESTRICT codes, const rng_state& rng, std::uint64_t first,
                                 const Meta* prefetch = nullptr, Meta* back = nullptr, Meta unit = 0) {
  using T = vec_types<Meta>;
  using V = typename T::real;
  using U = typename T::uint;
  using SI = typename T::sint;
  constexpr std::uint32_t L = T::lanes;
  constexpr Meta levels = static_cast<Meta>(detail::levels<Bits>);
  const std::uint32_t Sv = S - S % L;
  const V vmn = splat<V>(mn), vinv = splat<V>(inv), vL = splat<V>(levels), vscale = splat<V>(scale);
  U lane_ids;
  for (std::uint32_t l = 0; l < L; ++l) lane_ids[l] = l;
  std::uint32_t j = 0;
#if defined(CGX_HOST_SIMD_X86)
  if constexpr (std::is_same_v<Meta, float>)
    j = encode_f32<Bits, Rounding>(x, S, mn, inv, scale, codes, rng, first, prefetch, back, unit);
#endif
  for (; j < Sv; j += L) {
    if (prefetch != nullptr) {
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
      const V d = (load<V>(x + static_cast<std::size_t>(k) * S + j) - vmn) * vscale;
      V v = barrier(d * vinv);
      v = v < vL ? v : vL;
      cv[k] = __builtin_convertvector(__builtin_convertvector(v + off[k], SI), U);
      if (back != nullptr)  // decode_value, as decode_full
        store(back + static_cast<std::size_t>(k) * S + j,
              splat<V>(mn) + barrier(__builtin_convertvector(__builtin_convertvector(cv[k], SI), V) * splat<V>(unit)));
    }
    [&]<int... Q>(std::integer_sequence<int, Q...>) {
      ((store(codes + static_cast<std::size_t>(Q) * S + j, narrow(pack_lanes<Bits, Q>(cv)))), ...);
    }(std::make_integer_sequence<int, Bits>{});
  }
  return Sv;
}

/// Decodes positions [0, S_vec) of a full bucket; returns the number of positions done.
/// `next`, when not null, is the output of the next bucket: it is prefetched meanwhile.
template <int Bits, bool Add, class Meta>
inline std::uint32_t decode_full(const std::uint8_t* CGX_RESTRICT codes, std::uint32_t S, Meta mn, Meta unit,
                                 Meta* CGX_RESTRICT y, const Meta* next = nullptr) {
  using T = vec_types<Meta>;
  using V = typename T::real;
  using U = typename T::uint;
  using SI = typename T::sint;
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
    for (int q = 0; q < Bits; ++q) b[q] = widen<U>(codes + static_cast<std::size_t>(q) * S + j);
    [&]<int... K>(std::integer_sequence<int, K...>) {
      (
          [&] {
            Meta* p = y + static_cast<std::size_t>(K) * S + j;
            const U code = unpack_lanes<Bits, K>(b);
            // decode_value: min + (code * unit), the product rounded on its own
            const V v = vmn + barrier(__builtin_convertvector(__builtin_convertvector(code, SI), V) * vunit);
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

/// This instruction set's kernels, as the bucket loops of host_simd.hpp call them (one
/// call per bucket: the loops themselves need no particular instruction set).
struct kernels {
  template <class Meta>
  static void bucket_minmax(const Meta* x, std::size_t n, Meta& mn, Meta& mx, bool& finite) {
    minmax<Meta>(x, n, mn, mx, finite);
  }
  template <int Bits, class Rounding, class Meta>
  static std::uint32_t bucket_encode(const Meta* x, std::uint32_t S, Meta mn, Meta inv, Meta scale,
                                     std::uint8_t* codes, const rng_state& rng, std::uint64_t first,
                                     const Meta* prefetch, Meta* back, Meta unit) {
    return encode_full<Bits, Rounding, Meta>(x, S, mn, inv, scale, codes, rng, first, prefetch, back, unit);
  }
  template <int Bits, bool Add, class Meta>
  static std::uint32_t bucket_decode(const std::uint8_t* codes, std::uint32_t S, Meta mn, Meta unit, Meta* y,
                                     const Meta* next) {
    return decode_full<Bits, Add, Meta>(codes, S, mn, unit, y, next);
  }
};
