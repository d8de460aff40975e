#pragma once
/// \file hadamard.hpp
/// The arithmetic of `cgx::quant::rotated` (rotated.hpp): the seeded randomized
/// Walsh-Hadamard transform of one bucket, written once as CGX_HOST_DEVICE code so that
/// the host codec, the CUDA kernels (rotated.cuh) and their host-run bodies
/// (rotated_bodies.hpp) compute the same bits.
///
/// # The transform of one bucket of r values (1 <= r <= B, B a power of two)
///
/// ```
///   forward:  y = F x,  F = S_fwd H~ D       inverse:  x = D H~ S_inv y
/// ```
///
/// - D: sign flips. Value i of the bucket with index `b` in its compress call (0 for the
///   call's first bucket) is negated when bit (i mod 32) of word (i / 32) mod 4 of
///   philox4x32<10>({i / 128, lo32(b), hi32(b), rotation_domain}, lo32(seed), hi32(seed))
///   is set. The key is the codec's compile-time seed; the counter does not contain the
///   call counter, the rank or the buffer position, because a decoder sees none of them:
///   every rank, host and device draws the same signs for the same (seed, b, i). A flip
///   is an exclusive or of the sign bit (exact under any compiler flag).
/// - H~: the butterflies of the Walsh-Hadamard transform, in stages h = 1, 2, 4, ..., B/2:
///   the pair (i, i + h), i with bit h clear, becomes (x_i + x_{i+h}, x_i - x_{i+h}),
///   each rounded to nearest on its own (detail::add_rn / sub_rn). A pair is transformed
///   only when the aligned block of 2h values holding it lies inside the bucket,
///   (i | (2h - 1)) < r. For a full bucket that is the whole Walsh-Hadamard matrix of
///   order B; a partial last bucket is thereby cut into the dyadic blocks of r's binary
///   digits, largest first (r = 1000 = 512 + 256 + 128 + 64 + 32 + 8: six blocks), each
///   transformed by its own Hadamard matrix. Every value is rotated, the codes stay
///   r (the bytes of maxmin are unchanged), and the transform is exactly invertible.
/// - Normalization: H_m H_m = m I for a block of m = 2^a values. After the butterflies
///   the forward transform multiplies each value of the block by 2^-floor(a/2), the
///   inverse by 2^-ceil(a/2) (detail::mul_rn, after all stages: the butterflies hold no
///   multiplication, so nothing can be contracted into an FMA and they vectorize):
///   F = c_a Q with Q orthonormal and c_a = 2^(a/2 - floor(a/2)), i.e. 1 for even a and
///   sqrt(2) for odd a (B = 128, 512, 2048: sqrt(2); B = 64, 256, 1024, 4096: 1). A
///   multiplication by a power of two is exact unless the result is subnormal, so the
///   normalization adds no rounding and F^-1 F = I up to the roundings of the
///   additions. The unscaled intermediates reach m max|x| (a block whose values exceed
///   the largest finite value / m overflows: rotated.hpp, non-finite values).
///   The block of value i is m = 2^a with a = floor(log2(i xor r)).
///
/// Both transforms are linear and fixed per (seed, b): stage order and the arithmetic of
/// each pair are fixed, and the pairs of a stage are independent, so the result does not
/// depend on the order in which threads or lanes visit them.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../config.hpp"
#include "philox.hpp"
#include "wire_format.hpp"

namespace cgx::quant {

/// The key of the rotation's sign flips unless a codec names another (rotated<Q, Seed>).
inline constexpr std::uint64_t default_rotation_seed = 0x726f746174696f6eull;  // "rotation"

namespace detail {

/// Word 3 of the Philox counter of the sign flips: keeps them apart from any other use
/// of Philox with the same key.
inline constexpr std::uint32_t rotation_domain = 0x48414441u;

/// The 128 sign bits of values [128 q, 128 q + 128) of bucket `bucket` (see the file comment).
CGX_HOST_DEVICE CGX_FORCEINLINE philox_block rotation_signs(std::uint64_t seed, std::uint64_t bucket, std::uint32_t q) {
  const philox_block c{
      {q, static_cast<std::uint32_t>(bucket), static_cast<std::uint32_t>(bucket >> 32), rotation_domain}};
  return philox4x32<10>(c, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

/// The sign bit (0 or 1) of value i from the block of its 128 values.
CGX_HOST_DEVICE CGX_FORCEINLINE std::uint32_t rotation_sign_bit(const philox_block& s, std::uint32_t i) {
  return (s.w[(i >> 5) & 3u] >> (i & 31u)) & 1u;
}

/// v with its sign bit flipped when `bit` is 1: an integer operation, exact for every v
/// (a negation could be flushed to zero for a subnormal v under -ftz=true).
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M flip_sign(M v, std::uint32_t bit) {
  if constexpr (std::is_same_v<M, double>) {
    std::uint64_t u;
    std::memcpy(&u, &v, sizeof(u));
    u ^= static_cast<std::uint64_t>(bit) << 63;
    std::memcpy(&v, &u, sizeof(u));
  } else {
    std::uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    u ^= bit << 31;
    std::memcpy(&v, &u, sizeof(u));
  }
  return v;
}

/// Stages of a bucket of B values: log2(B).
/// floor(log2(v)) for v >= 1 (0 for v = 0).
CGX_HOST_DEVICE CGX_FORCEINLINE constexpr unsigned log2_floor(std::size_t v) {
  unsigned k = 0;
  while (v > 1) {
    v >>= 1;
    ++k;
  }
  return k;
}
template <std::size_t B>
inline constexpr unsigned hadamard_stages = log2_floor(B);

/// The butterfly of the pair (x[i], x[i + h]): (a + b, a - b), each rounded on its own.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE void hadamard_pair(M* x, std::size_t i, std::size_t h) {
  const M a = x[i], b = x[i + h];
  x[i] = add_rn(a, b);
  x[i + h] = sub_rn(a, b);
}

/// log2 of the dyadic block of value i (i < r) in a bucket of r values: floor(log2(i xor r)).
CGX_HOST_DEVICE CGX_FORCEINLINE unsigned hadamard_block_log2(std::size_t i, std::size_t r) {
  return log2_floor(i ^ r);
}

/// 2^-e (0 <= e <= 30) in M, built from its bits (exact, no library call on the device).
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M pow2_neg(unsigned e) {
  return from_bits<M>(static_cast<std::uint64_t>(1023u - e) << 52, (127u - e) << 23);
}

/// The normalization of a block of 2^a values: 2^-floor(a/2) forward, 2^-ceil(a/2) inverse.
template <bool Forward, class M>
CGX_HOST_DEVICE CGX_FORCEINLINE M hadamard_scale(unsigned a) {
  return pow2_neg<M>(Forward ? a / 2 : (a + 1) / 2);
}

/// Pair t (0 <= t < B / 2) of the stage of distance h = 2^s on a bucket of r values: its
/// first index, or B when the pair is not transformed (its aligned block of 2h values
/// reaches past r). The work of one lane of the device bodies.
template <std::size_t B>
CGX_HOST_DEVICE CGX_FORCEINLINE std::size_t hadamard_pair_index(std::size_t t, unsigned s, std::size_t r) {
  const std::size_t h = std::size_t{1} << s;
  const std::size_t i = ((t >> s) << (s + 1)) | (t & (h - 1));
  return (i | (2 * h - 1)) < r ? i : B;
}

/// One stage of pair distance h on x[0..r): every aligned block of 2h values inside
/// [begin, r). H is std::size_t, or a std::integral_constant for a distance the compiler
/// knows (its loops then vectorize even when h is below the vector width).
template <class H, class M>
CGX_FORCEINLINE void hadamard_stage(M* CGX_RESTRICT x, std::size_t begin, std::size_t r, H h) {
  for (std::size_t b = begin; b + 2 * h <= r; b += 2 * h) {
    M* CGX_RESTRICT lo = x + b;
    M* CGX_RESTRICT hi = x + b + h;
    for (std::size_t i = 0; i < h; ++i) {
      const M u = lo[i], v = hi[i];
      lo[i] = add_rn(u, v);
      hi[i] = sub_rn(u, v);
    }
  }
}

/// The butterflies H~ of the file comment on x[0..r), stage by stage: the serial form of
/// the host codec (rotated.hpp compiles it once per instruction set). Only additions and
/// subtractions: the compiler may vectorize them and has no product to contract.
template <class M>
CGX_FORCEINLINE void hadamard_butterflies_body(M* CGX_RESTRICT x, std::size_t r, unsigned stages) {
  // The first two stages together: each aligned group of 4 values inside [0, r).
  std::size_t c = 0;
  if (stages >= 2) {
    for (; c + 4 <= r; c += 4) {
      const M a = add_rn(x[c], x[c + 1]), b = sub_rn(x[c], x[c + 1]);
      const M d = add_rn(x[c + 2], x[c + 3]), e = sub_rn(x[c + 2], x[c + 3]);
      x[c] = add_rn(a, d);
      x[c + 2] = sub_rn(a, d);
      x[c + 1] = add_rn(b, e);
      x[c + 3] = sub_rn(b, e);
    }
  }
  // What is left of the first two stages (the tail of r below a multiple of 4), then the
  // rest; stages of 4, 8 and 16 with their pair distance known to the compiler, so that
  // they vectorize too.
  for (unsigned s = 0; s < stages; ++s) {
    if (s == 2) {
      hadamard_stage(x, 0, r, std::integral_constant<std::size_t, 4>{});
    } else if (s == 3) {
      hadamard_stage(x, 0, r, std::integral_constant<std::size_t, 8>{});
    } else if (s == 4) {
      hadamard_stage(x, 0, r, std::integral_constant<std::size_t, 16>{});
    } else {
      hadamard_stage(x, s < 2 ? c : 0, r, std::size_t{1} << s);
    }
  }
}

/// x[0..r) times the normalization of each value's block (hadamard_scale).
template <bool Forward, class M>
inline void hadamard_normalize(M* x, std::size_t r) {
  std::size_t start = 0;
  for (unsigned a = log2_floor(r) + 1; a-- > 0;) {
    const std::size_t m = std::size_t{1} << a;
    if ((r & m) == 0) continue;
    const M s = hadamard_scale<Forward, M>(a);
    if (!(s == M(1)))
      for (std::size_t i = start; i < start + m; ++i) x[i] = mul_rn(x[i], s);
    start += m;
  }
}

/// The sign masks of 4 values from 4 sign bits (a nibble): row k of the table, U the
/// unsigned integer of M's size.
template <class U>
struct sign_masks {
  U m[16][4];
  constexpr sign_masks() : m{} {
    for (unsigned v = 0; v < 16; ++v)
      for (unsigned k = 0; k < 4; ++k) m[v][k] = ((v >> k) & 1u) != 0 ? U{1} << (sizeof(U) * 8 - 1) : U{0};
  }
};

/// x[0..r) = D x (the sign flips of bucket `bucket`), in place: the host's form of
/// flip_sign, four values per table row (which a compiler turns into one vector xor).
template <class M>
inline void rotation_flip(M* x, std::size_t r, std::uint64_t seed, std::uint64_t bucket) {
  using U = std::conditional_t<sizeof(M) == 8, std::uint64_t, std::uint32_t>;
  static constexpr sign_masks<U> table{};
  for (std::size_t q = 0; q * 128 < r; ++q) {
    const philox_block s = rotation_signs(seed, bucket, static_cast<std::uint32_t>(q));
    const std::size_t e = r - q * 128 < 128 ? r : q * 128 + 128;
    std::size_t i = q * 128;
    for (; i + 4 <= e; i += 4) {
      const U* mask = table.m[(s.w[(i >> 5) & 3u] >> (i & 31u)) & 15u];
      U u[4];
      std::memcpy(u, x + i, sizeof(u));
      for (int k = 0; k < 4; ++k) u[k] ^= mask[k];
      std::memcpy(x + i, u, sizeof(u));
    }
    for (; i < e; ++i) x[i] = flip_sign(x[i], rotation_sign_bit(s, static_cast<std::uint32_t>(i)));
  }
}

}  // namespace detail

}  // namespace cgx::quant
