#pragma once
/// \file rotated.hpp
/// `cgx::quant::rotated<Q, Seed>`: a max-min quantizer applied to each bucket after a
/// seeded randomized Hadamard rotation, and the rotation undone after decoding (the
/// THC / QuaRot idea: the rotation spreads a bucket's outliers over all its values, so
/// that max - min, and with it the quantization step, shrinks). The transform, its
/// signs, partial buckets and normalization are specified in hadamard.hpp; the bytes
/// are maxmin's wire format (wire_format.hpp) of the rotated values, so compressed
/// sizes are exactly Q's. CUDA kernels for the same bytes: rotated.cuh.
///
/// # How it composes with the schedules
///
/// `rotated` models the quantizer concept with maxmin's meaning of every operation:
/// compress(x) encodes F x, decompress gives F^-1 decode(...), decompress_add adds
/// F^-1 decode(...) to the caller's values. Every schedule (SRA, ring, tree,
/// hierarchical, the reduce-scatter and allgather plans, error feedback) therefore runs
/// it unchanged, and since F is linear the sum an owner re-quantizes is, up to float
/// rounding, the sum of the contributions in the rotated domain. The owner's last step
/// (add_requantize below) decodes the last contribution, compresses the sum and decodes
/// it bucket block by bucket block while they are in the cache, with the bytes and
/// values of the three separate calls: the device schedules make those three calls, and
/// host and device plans must keep producing the same bits. Keeping the owner's sum in
/// the rotated domain across all p - 1 contributions (two transforms per owner piece:
/// its own values forward, the re-quantized sum back, instead of the p + 1 of p - 1
/// decompress_adds, one compress and one decompress) would change the bits of the separate calls,
/// so it needs a schedule-level hook on the host and the device schedules alike; it is
/// not done here. The transforms' rounding is a few ulp of the values, far below a
/// quantization step.
///
/// # Error
///
/// Let y = F x be a bucket's rotated values, u_rot = (max y - min y) / (2^bits - 1) the
/// unit stored on the wire, e = decode(encode(y)) - y the error in the rotated domain and
/// x' = F^-1 (y + e) the decoded values. Then, up to the float rounding of the transforms
/// and of the decode (a few ulp of max |y|):
///
///  - rotated domain, per value (maxmin's bound): |e_j| <= u_rot / 2 (nearest), < u_rot
///    (stochastic, and E[e_j] = 0 up to the 2^-16 resolution of the rounding offsets).
///  - L2, per bucket: F^-1 = Q^T / c with Q orthonormal (block-diagonal for a partial
///    bucket) and c >= 1 (hadamard.hpp: c = 1 for even log2 B, sqrt(2) for odd), so
///    ||x' - x||_2 = ||e||_2 / c <= sqrt(r) u_rot / 2 (nearest; < sqrt(r) u_rot stochastic)
///    for a bucket of r values: the L2 bound of maxmin, with the rotated unit.
///  - per element, worst case: x'_i - x_i = (1 / (c sqrt(m))) sum_j (+-1) e_j over the
///    m values of i's dyadic block (m = B for a full bucket), so
///    |x'_i - x_i| <= sqrt(m) u_rot / (2 c) (nearest; < sqrt(m) u_rot / c stochastic).
///    The per-element bound of maxmin (u / 2 in the unrotated unit) does NOT carry over:
///    one element can in principle take the rotated errors of the whole block.
///  - per element, stochastic rounding: the m errors are independent, of mean 0, each in
///    an interval of length u_rot, so x'_i - x_i is a sum of independent zero-mean terms
///    of range u_rot / (c sqrt(m)): E[x'_i] = x_i, Var <= u_rot^2 / (4 c^2), and by
///    Hoeffding's inequality P(|x'_i - x_i| >= k u_rot / c) <= 2 exp(-2 k^2): at most
///    6.7e-4 for k = 2, 3.1e-7 for k = 2.8, whatever the data.
///  - rotated vs plain: u_rot <= 2 max|y| / (2^bits - 1) and max|y| <= c ||x||_2, while
///    maxmin's u >= max|x| / (2^bits - 1); for a bucket with a few large outliers
///    ||x||_2 is close to max|x| and u_rot is about 2 c / sqrt(B) ... 2 c of u (smaller
///    when the energy is spread out, larger by up to 2 c when it is not: a bucket of
///    Gaussian values gives u_rot ~ u).
///
/// Non-finite values: a NaN or +-Inf reaches, through the butterflies, rotated values of
/// its block; the bucket is then stored as maxmin stores a non-finite bucket ({NaN, NaN},
/// zero codes) and every value of the bucket decodes to NaN. Finite values so large that
/// the butterflies overflow (they add up to B values before the normalization: |x| above
/// about the largest finite value / B) are treated the same way: NaN, never a wrong
/// finite number. A constant bucket is not reproduced exactly (its rotation
/// is not constant); its values come back within the bounds above.
///
/// Bits are deterministic: the host (every instruction set, any thread count) and the
/// device produce the same bytes and the same decoded values (tests/test_rotation.cpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../config.hpp"
#include "hadamard.hpp"
#include "host_exec.hpp"
#include "host_simd.hpp"
#include "maxmin.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"

namespace cgx::quant {

namespace detail {
// The host butterflies (hadamard_butterflies_body) compiled once per x86 instruction set
// and chosen at run time with maxmin's kernels (host_isa.hpp): the same operations in the
// same order on each, so the same bits; wider vectors only. The targets leave out FMA:
// nothing here may be contracted (there is no product to contract).
namespace rotation_base {
template <class M>
inline void butterflies(M* x, std::size_t r, unsigned stages) {
  hadamard_butterflies_body(x, r, stages);
}
}  // namespace rotation_base
#if defined(CGX_HOST_SIMD_X86)
CGX_TARGET_BEGIN("avx2")
namespace rotation_avx2 {
template <class M>
inline void butterflies(M* x, std::size_t r, unsigned stages) {
  hadamard_butterflies_body(x, r, stages);
}
}  // namespace rotation_avx2
CGX_TARGET_END
CGX_TARGET_BEGIN("avx2,avx512f,avx512bw,avx512dq,avx512vl")
namespace rotation_avx512 {
template <class M>
inline void butterflies(M* x, std::size_t r, unsigned stages) {
  hadamard_butterflies_body(x, r, stages);
}
}  // namespace rotation_avx512
CGX_TARGET_END
#endif

/// The butterflies of one bucket with the kernels of instruction set `isa`.
template <class M>
inline void hadamard_butterflies(host_isa isa, M* x, std::size_t r, unsigned stages) {
#if defined(CGX_HOST_SIMD_X86)
  if (isa == host_isa::avx512) return rotation_avx512::butterflies(x, r, stages);
  if (isa == host_isa::avx2) return rotation_avx2::butterflies(x, r, stages);
#endif
  (void)isa;
  rotation_base::butterflies(x, r, stages);
}
}  // namespace detail

template <class Q, std::uint64_t Seed = default_rotation_seed>
struct rotated;

/// The rotated max-min quantizer (see the file comment): maxmin<Bits, BucketSize,
/// Rounding> on the values of each bucket after the randomized Hadamard transform keyed
/// by `Seed` (hadamard.hpp), the transform undone after decoding. Every rank must use the
/// same Seed. BucketSize must be a power of two between 8 and 4096 (the CUDA kernels keep
/// a bucket in shared memory).
template <int Bits, std::size_t BucketSize, class Rounding, std::uint64_t Seed>
struct rotated<maxmin<Bits, BucketSize, Rounding>, Seed> {
  static_assert((BucketSize & (BucketSize - 1)) == 0 && BucketSize >= 8 && BucketSize <= 4096,
                "cgx::quant::rotated: the bucket size must be a power of two between 8 and 4096");

  using inner = maxmin<Bits, BucketSize, Rounding>;       ///< the quantizer of the rotated values
  static constexpr int bits = Bits;                       ///< bits per value, 1..8
  static constexpr std::size_t bucket_size = BucketSize;  ///< values per bucket (one rotation each)
  using rounding = Rounding;                              ///< quant::nearest or quant::stochastic
  static constexpr std::uint64_t seed = Seed;             ///< key of the sign flips
  /// Decompress(compress(x)) == x for every x: false.
  static constexpr bool lossless = false;
  /// What plan signatures (plan_common.hpp) mix in besides bits, bucket and rounding: a
  /// rotated quantizer never pairs with the plain maxmin of the same settings, nor with
  /// a rotated one of another Seed.
  static constexpr std::uint64_t signature_tag = 0x726f746174656400ull ^ (Seed * 0x9E3779B97F4A7C15ull);
  /// log2(BucketSize): the stages of a full bucket's transform.
  static constexpr unsigned stages = detail::hadamard_stages<BucketSize>;

  /// Exact size in bytes of the compressed form of n values of type T: maxmin's.
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return inner::template compressed_bytes<T>(n);
  }

  /// Compresses in[0..n) into out[0..compressed_bytes<T>(n)): maxmin's bytes of the
  /// rotated values (bucket b of this call rotated with the signs of index b).
  /// Stochastic rounding draws its bits as maxmin does, from rng (position included).
  template <class T>
  static void compress(const T* in, std::size_t n, std::byte* out, const rng_state& rng = {}, host_exec ex = {}) {
    for_blocks<T>(n, ex, [&](host_isa isa, std::size_t b, std::size_t e, T* scratch, std::byte* tmp) {
      compress_block<T>(isa, in, n, out, rng, b, e, scratch, tmp);
    });
  }

  /// Decodes compressed_bytes<T>(n) bytes at in into out[0..n) and rotates them back.
  template <class T>
  static void decompress(const std::byte* in, std::size_t n, T* out, host_exec ex = {}) {
    for_blocks<T>(n, ex, [&](host_isa isa, std::size_t b, std::size_t e, T*, std::byte*) {
      decode_block<T>(isa, in, n, out, b, e);
    });
  }

  /// out[i] += decoded (rotated back) value i, for i in [0, n); each sum rounded once.
  template <class T>
  static void decompress_add(const std::byte* in, std::size_t n, T* out, host_exec ex = {}) {
    for_blocks<T>(n, ex, [&](host_isa isa, std::size_t b, std::size_t e, T* scratch, std::byte* tmp) {
      decode_add_block<T>(isa, in, n, out, b, e, scratch, tmp);
    });
  }

  /// The owner's last step (quant::add_requantize): buf += decoded `addend` (when not
  /// null), compress(buf) into out, buf = decompress(out): the bytes and values of those
  /// three calls, done a block of buckets (about 16 KiB) at a time while it is cached.
  template <class T>
  static void add_requantize(const std::byte* addend, T* buf, std::size_t n, std::byte* out, const rng_state& rng = {},
                             host_exec ex = {}) {
    for_blocks<T>(n, ex, [&](host_isa isa, std::size_t b, std::size_t e, T* scratch, std::byte* tmp) {
      if (addend != nullptr) decode_add_block<T>(isa, addend, n, buf, b, e, scratch, tmp);
      compress_block<T>(isa, buf, n, out, rng, b, e, scratch, tmp);
      decode_block<T>(isa, out, n, buf, b, e);
    });
  }

  /// The rotation of one bucket in place: x[0..r) = F x (forward) or F^-1 x, for the
  /// bucket of index `bucket` in its compress call (1 <= r <= BucketSize).
  template <class M>
  static void rotate(M* x, std::size_t r, std::uint64_t bucket, bool forward) {
    rotate(active_host_isa(), x, r, bucket, forward);
  }

 private:
  template <class M>
  static void rotate(host_isa isa, M* x, std::size_t r, std::uint64_t bucket, bool forward) {
    if (forward) {
      detail::rotation_flip(x, r, Seed, bucket);
      detail::hadamard_butterflies(isa, x, r, stages);
      detail::hadamard_normalize<true>(x, r);
    } else {
      detail::hadamard_butterflies(isa, x, r, stages);
      detail::hadamard_normalize<false>(x, r);
      detail::rotation_flip(x, r, Seed, bucket);
    }
  }

  /// Buckets per block: about 16 KiB of values, at least one bucket.
  template <class T>
  static constexpr std::size_t block = BucketSize * sizeof(T) >= 16384 ? 1 : 16384 / (BucketSize * sizeof(T));
  /// Bytes of the compressed form of one block of full buckets.
  template <class T>
  static constexpr std::size_t block_bytes = inner::template compressed_bytes<T>(block<T> * BucketSize);

  /// Runs f(isa, b, e, scratch, tmp) on blocks [b, e) of whole buckets, the buckets split
  /// over ex's threads, each thread with its own scratch (block<T> buckets of T) and tmp
  /// (the compressed bytes of one block).
  template <class T, class F>
  static void for_blocks(std::size_t n, host_exec ex, F&& f) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "cgx::quant::rotated host kernels take float or double");
    if (n == 0) return;
    const host_isa isa = active_host_isa();
    for_each_range(ex, wire_layout<Bits, BucketSize, meta_t<T>>::buckets(n), [&](std::size_t b0, std::size_t b1) {
      alignas(64) T scratch[block<T> * BucketSize];
      alignas(64) std::byte tmp[block_bytes<T>];
      for (std::size_t b = b0; b < b1; b += block<T>) f(isa, b, std::min(b1, b + block<T>), scratch, tmp);
    });
  }

  /// Values in bucket b of n.
  static std::size_t count_of(std::size_t n, std::size_t b) {
    const std::size_t first = b * BucketSize;
    return n - first < BucketSize ? n - first : BucketSize;
  }

  /// Buckets [b, e) of in, rotated in scratch, compressed (as one call of their values at
  /// position rng.position + b B) into tmp, whose metadata records and codes are then
  /// copied to their places in out: the bytes of a compress of the whole buffer, since
  /// the records, and the codes of consecutive buckets, are contiguous in both.
  template <class T>
  static void compress_block(host_isa isa, const T* in, std::size_t n, std::byte* out, const rng_state& rng,
                             std::size_t b, std::size_t e, T* scratch, std::byte* tmp) {
    using L = wire_layout<Bits, BucketSize, meta_t<T>>;
    const std::size_t first = b * BucketSize;
    const std::size_t m = std::min(n, e * BucketSize) - first;  // values of the block
    std::memcpy(scratch, in + first, m * sizeof(T));
    for (std::size_t k = b; k < e; ++k) rotate(isa, scratch + (k - b) * BucketSize, count_of(n, k), k, true);
    rng_state r = rng;
    r.position = rng.position + first;
    simd::compress_buckets<Bits, Rounding, T>(isa, scratch, m, BucketSize, tmp, r, 0, e - b);
    std::memcpy(out + b * L::meta_record, tmp, (e - b) * L::meta_record);
    std::memcpy(out + L::codes_offset(n, b), tmp + L::meta_bytes(m), L::bytes(m) - L::meta_bytes(m));
  }

  /// Buckets [b, e) of in decoded into out and rotated back there.
  template <class T>
  static void decode_block(host_isa isa, const std::byte* in, std::size_t n, T* out, std::size_t b, std::size_t e) {
    simd::decode_buckets<Bits, false, T>(isa, in, n, BucketSize, out, b, e);
    for (std::size_t k = b; k < e; ++k) rotate(isa, out + k * BucketSize, count_of(n, k), k, false);
  }

  /// out += buckets [b, e) of in rotated back: their bytes gathered into tmp (one call's
  /// layout, as compress_block writes it), decoded into scratch, rotated back, added.
  template <class T>
  static void decode_add_block(host_isa isa, const std::byte* in, std::size_t n, T* out, std::size_t b, std::size_t e,
                               T* scratch, std::byte* tmp) {
    using L = wire_layout<Bits, BucketSize, meta_t<T>>;
    const std::size_t first = b * BucketSize;
    const std::size_t m = std::min(n, e * BucketSize) - first;
    std::memcpy(tmp, in + b * L::meta_record, (e - b) * L::meta_record);
    std::memcpy(tmp + L::meta_bytes(m), in + L::codes_offset(n, b), L::bytes(m) - L::meta_bytes(m));
    simd::decode_buckets<Bits, false, T>(isa, tmp, m, BucketSize, scratch, 0, e - b);
    for (std::size_t k = b; k < e; ++k) rotate(isa, scratch + (k - b) * BucketSize, count_of(n, k), k, false);
    T* y = out + first;
    for (std::size_t i = 0; i < m; ++i) y[i] = detail::add_rn(y[i], scratch[i]);
  }
};

}  // namespace cgx::quant
