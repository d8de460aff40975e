#pragma once
/// \file rotated_bodies.hpp
/// The work of the CUDA kernels of `rotated<maxmin<...>>` (rotated.cuh), written once as
/// CGX_HOST_DEVICE code over the execution contexts of kernel_bodies.hpp, so that the
/// host runs the very code the GPU runs (host_rotated_compress / host_rotated_decode
/// below; tests/test_rotation.cpp compares their bytes and values with the host codec
/// of rotated.hpp, and the simulated device runtime of the tests runs them).
///
/// One group of G = compress_shape<B>::group lanes per bucket, as maxmin's compress. The
/// group's shared slot holds the bucket (B values of meta_t<T>) and its parameters:
///
/// ```
///   compress:  each lane: load and flip signs  ->  sync
///              per stage h = 1 .. B/2: each lane its pairs  ->  sync
///              each lane: normalize its values  ->  sync
///              maxmin's compress phases (compress_body) on the rotated values
///   decode:    each lane: decode its positions into the slot  ->  sync
///              per stage: each lane its pairs  ->  sync
///              each lane: normalize, flip signs, store (or add to) the output  ->  sync
/// ```
///
/// Every group runs the same number of stages and barriers whatever its bucket's count,
/// so a device block of several groups passes its __syncthreads together.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "../config.hpp"
#include "hadamard.hpp"
#include "kernel_bodies.hpp"
#include "wire_format.hpp"

namespace cgx::quant::detail {

/// The group-shared slot of the rotated kernels: one bucket and its parameters. No
/// initializers: it is a __shared__ array on the device.
template <std::size_t B, class M>
struct rotated_slot {
  bucket_params<M> p;  ///< the bucket's parameters (compress)
  M y[B];              ///< the bucket's values in the rotated domain
};

/// The butterflies of every stage on the group's slot, lane-parallel; r values in the
/// bucket. Each stage ends with a barrier.
template <std::size_t B, class M, class Ctx>
CGX_HOST_DEVICE CGX_BODY_INLINE void rotated_stages(Ctx& ctx, M* y, std::size_t r) {
  constexpr unsigned G = compress_shape<B>::group;
  for (unsigned s = 0; s < hadamard_stages<B>; ++s) {
    ctx.each_lane([&](unsigned lane) {
      for (std::size_t t = lane; t < B / 2; t += G) {
        const std::size_t i = hadamard_pair_index<B>(t, s, r);
        if (i < B) hadamard_pair(y, i, std::size_t{1} << s);
      }
    });
    ctx.sync();
  }
}

/// The rotated compress kernel's work on bucket b (a group past the last bucket takes
/// part in the synchronization only): the bytes of rotated<maxmin<Bits, B, Rounding>,
/// seed>::compress for that bucket. `nonfinite` (may be null) counts non-finite buckets.
template <int Bits, std::size_t B, class Rounding, class T, class Ctx>
CGX_HOST_DEVICE CGX_BODY_INLINE void rotated_compress_group(Ctx& ctx, const T* in, std::size_t n, std::byte* out,
                                                            const rng_state& rng, bool aligned,
                                                            std::uint32_t* nonfinite, std::size_t b,
                                                            std::uint64_t seed) {
  using M = meta_t<T>;
  using body = compress_body<Bits, B, Rounding, M>;  // maxmin's phases, reading the slot
  constexpr unsigned G = body::G;
  typename body::bucket bk;
  bk.index = b;
  bk.active = b < body::layout::buckets(n);
  bk.first = b * B;
  bk.count = bk.active ? (n - bk.first < B ? n - bk.first : B) : 0;
  bk.S = static_cast<std::uint32_t>((bk.count + 7) / 8);
  M* y = ctx.shared().y;
  bk.x = y;
  const T* x = in + bk.first * (bk.active ? 1 : 0);
  ctx.each_lane([&](unsigned lane) {
    for (std::size_t i = lane; i < bk.count; i += G) {
      const philox_block s = rotation_signs(seed, b, static_cast<std::uint32_t>(i >> 7));
      y[i] = flip_sign(to_meta<T>(x[i]), rotation_sign_bit(s, static_cast<std::uint32_t>(i)));
    }
  });
  ctx.sync();
  rotated_stages<B>(ctx, y, bk.count);
  ctx.each_lane([&](unsigned lane) {  // the forward normalization of each value's block
    for (std::size_t i = lane; i < bk.count; i += G)
      y[i] = mul_rn(y[i], hadamard_scale<true, M>(hadamard_block_log2(i, bk.count)));
  });
  ctx.sync();
  typename Ctx::template lane_array<typename body::lane_state> st(G);
  const typename body::acc_t r = ctx.reduce([&](unsigned lane) { return body::load(bk, lane, st[lane]); }, minmax_op{});
  ctx.leader([&] {
    if (bk.active) {
      ctx.shared().p = body::params(bk, r, out, aligned);
      if (!ctx.shared().p.finite) ctx.count(nonfinite);
    }
  });
  ctx.sync();
  ctx.each_lane([&](unsigned lane) {
    if (bk.active) body::encode(bk, lane, st[lane], ctx.shared().p, out, n, rng);
  });
  ctx.sync();  // the slot and the reduction's storage are reused by the next bucket
}

/// The rotated decode kernel's work on bucket b: its values decoded, rotated back and
/// stored in out (Add: added to out, in meta_t<T>, rounded once).
template <int Bits, std::size_t B, bool Add, class T, class Ctx>
CGX_HOST_DEVICE CGX_BODY_INLINE void rotated_decode_group(Ctx& ctx, const std::byte* in, std::size_t n, T* out,
                                                          bool aligned, std::size_t b, std::uint64_t seed) {
  using M = meta_t<T>;
  using layout = wire_layout<Bits, B, M>;
  constexpr unsigned G = compress_shape<B>::group;
  const bool active = b < layout::buckets(n);
  const std::size_t first = b * B;
  const std::size_t count = active ? (n - first < B ? n - first : B) : 0;
  const auto S = static_cast<std::uint32_t>((count + 7) / 8);
  M* y = ctx.shared().y;
  ctx.each_lane([&](unsigned lane) {
    if (!active) return;
    M mn, unit;
    body_load_meta<M>(in, b, mn, unit, aligned);
    const std::uint8_t* codes = reinterpret_cast<const std::uint8_t*>(in) + layout::codes_offset(n, b);
    const bool wide = is_wide<Bits, M>(mn, unit);
    for (std::uint32_t j = lane; j < S; j += G) {
      std::uint32_t w[Bits];
      CGX_UNROLL
      for (int q = 0; q < Bits; ++q) w[q] = codes[static_cast<std::size_t>(q) * S + j];
      if (wide)
        body_decode_word<Bits, false, true>(w, mn, unit, y, S, j, count, std::make_integer_sequence<int, 8>{});
      else
        body_decode_word<Bits, false, false>(w, mn, unit, y, S, j, count, std::make_integer_sequence<int, 8>{});
    }
  });
  ctx.sync();
  rotated_stages<B>(ctx, y, count);
  ctx.each_lane([&](unsigned lane) {
    for (std::size_t i = lane; i < count; i += G) {
      const philox_block s = rotation_signs(seed, b, static_cast<std::uint32_t>(i >> 7));
      const M z = mul_rn(y[i], hadamard_scale<false, M>(hadamard_block_log2(i, count)));
      const M v = flip_sign(z, rotation_sign_bit(s, static_cast<std::uint32_t>(i)));
      if constexpr (Add) {
        out[first + i] = from_meta<T>(add_rn(to_meta<T>(out[first + i]), v));
      } else {
        out[first + i] = from_meta<T>(v);
      }
    }
  });
  ctx.sync();
}

/// Runs the rotated compress kernel's body on the host for n values: every bucket, in
/// bucket order, lanes visited in `order` (reshuffled per bucket from `lanes_seed`).
/// Writes the bytes `device<rotated<maxmin<...>, seed>>::compress` writes.
template <int Bits, std::size_t B, class Rounding, class T>
void host_rotated_compress(const T* in, std::size_t n, std::byte* out, const rng_state& rng, std::uint64_t seed,
                           lane_order order, std::uint64_t lanes_seed = 0, std::uint32_t* nonfinite = nullptr) {
  if (n == 0) return;
  using M = meta_t<T>;
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % alignof(M) == 0;
  const std::size_t nb = wire_layout<Bits, B, M>::buckets(n);
  for (std::size_t b = 0; b < nb; ++b) {
    host_group_ctx<rotated_slot<B, M>> ctx(compress_shape<B>::group, order, lanes_seed + b);
    rotated_compress_group<Bits, B, Rounding, T>(ctx, in, n, out, rng, aligned, nonfinite, b, seed);
  }
}

/// Runs the rotated decode kernel's body on the host for every bucket (Add: out += the
/// decoded values), lanes visited in `order`.
template <int Bits, std::size_t B, bool Add, class T>
void host_rotated_decode(const std::byte* in, std::size_t n, T* out, std::uint64_t seed, lane_order order,
                         std::uint64_t lanes_seed = 0) {
  if (n == 0) return;
  using M = meta_t<T>;
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % alignof(M) == 0;
  const std::size_t nb = wire_layout<Bits, B, M>::buckets(n);
  for (std::size_t b = 0; b < nb; ++b) {
    host_group_ctx<rotated_slot<B, M>> ctx(compress_shape<B>::group, order, lanes_seed + b);
    rotated_decode_group<Bits, B, Add, T>(ctx, in, n, out, aligned, b, seed);
  }
}

}  // namespace cgx::quant::detail
