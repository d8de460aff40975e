#pragma once
/// \file kernel_bodies.hpp
/// The work of the CUDA kernels of `maxmin` (maxmin.cuh), written once as CGX_HOST_DEVICE
/// code over an *execution context*, so that the host runs the very code the GPU runs
/// and tests compare its bytes with the host quantizer's (tests/test_kernel_bodies.cpp).
///
/// Compress gives one bucket to a group of G = compress_shape<B>::group lanes. Its body
/// (compress_group) is three phases separated by the context's operations:
///
/// ```
///   r = ctx.reduce(load, minmax_op)   each lane: loads, its partial min/max/finite;
///                                     the group's reduction (valid at the leader)
///   ctx.leader(params)                the leader: bucket parameters, metadata, the
///                                     non-finite count; ctx.shared() = parameters
///   ctx.sync()
///   ctx.each_lane(encode)             each lane: codes of its positions
///   ctx.sync()                        ctx.shared() may be reused
/// ```
///
/// A context provides: `reduce(f, op)` (f(lane) is lane's operand; the result is needed
/// at the leader only), `leader(f)`, `each_lane(f)` (f(lane)), `sync()`, `shared()` (the
/// group's bucket_params slot), `count(std::uint32_t*)` (adds 1 to a counter that may be
/// null), and `lane_array<S>` (per-lane state kept between phases). The device context
/// (maxmin.cuh) is one thread per lane: CUB WarpReduce/BlockReduce, __syncthreads, a
/// __shared__ slot, atomicAdd, and a lane_array that is the thread's own registers.
/// host_group_ctx below runs each phase for every lane in turn, in a given lane order
/// (ascending, descending or shuffled: the bytes must not depend on it), and reduces
/// serially in that order.
///
/// Decompress and decompress-add need no group: decode_position is the work of one
/// thread (one position of the buffer), and the host runs it for every position.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "../config.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"

namespace cgx::quant::detail {

/// Loads and stores of an input type T through its metadata type meta_t<T> (exact for
/// loads). float and double: identity. __half and __nv_bfloat16: device_types.hpp.
template <class T>
struct value_conv {
  CGX_HOST_DEVICE CGX_FORCEINLINE static meta_t<T> to_meta(T v) { return v; }
  CGX_HOST_DEVICE CGX_FORCEINLINE static T from_meta(meta_t<T> v) { return v; }
};

template <class T>
CGX_HOST_DEVICE CGX_FORCEINLINE meta_t<T> to_meta(T v) {
  return value_conv<T>::to_meta(v);
}
template <class T>
CGX_HOST_DEVICE CGX_FORCEINLINE T from_meta(meta_t<T> v) {
  return value_conv<T>::from_meta(v);
}

/// Min, max and "all finite" of a set of values; the operands of the group reduction.
template <class M>
struct minmax_acc {
  M lo;
  M hi;
  int finite;
};

/// Combines two minmax_acc: commutative and associative on the values a bucket can hold
/// (+0 and -0 compare equal, and make_bucket_params maps either to +0; a NaN clears
/// `finite`, and the bucket's min and max are then not used).
struct minmax_op {
  template <class M>
  CGX_HOST_DEVICE CGX_FORCEINLINE minmax_acc<M> operator()(const minmax_acc<M>& a, const minmax_acc<M>& b) const {
    return {lower(a.lo, b.lo), upper(a.hi, b.hi), a.finite & b.finite};
  }
};

constexpr unsigned pow2_ceil(unsigned v) {
  unsigned p = 1;
  while (p < v) p *= 2;
  return p;
}

/// Thread layout of the compress kernel for a bucket of B values (S = B / 8 positions).
template <std::size_t B>
struct compress_shape {
  static constexpr unsigned S = static_cast<unsigned>(B / 8);
  /// Lanes per bucket: a logical warp (power of two) for S <= 32, else a block of up
  /// to 256 threads.
  static constexpr unsigned group = S <= 32 ? pow2_ceil(S) : (S >= 256 ? 256u : (S + 31) / 32 * 32);
  /// Buckets per block (device).
  static constexpr unsigned groups = S <= 32 ? 256 / group : 1;
  static constexpr unsigned threads = group * groups;
  /// Positions per lane.
  static constexpr unsigned per_thread = (S + group - 1) / group;
  /// Values stay in registers between the reduction and the encoding (else: read twice).
  static constexpr bool cached = per_thread <= 4;
  static constexpr bool block_reduce = groups == 1 && group > 32;
};

/// Stores bucket i's {min, unit}; byte-wise when `out` is not aligned to M.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE void body_store_meta(std::byte* out, std::size_t i, M mn, M unit, bool aligned) {
  std::byte* p = out + i * 2 * sizeof(M);
  if (aligned) {
    M* q = reinterpret_cast<M*>(p);
    q[0] = mn;
    q[1] = unit;
  } else {
    const M rec[2] = {mn, unit};
    unsigned char bytes[sizeof(rec)];
    std::memcpy(bytes, rec, sizeof(rec));
    for (std::size_t k = 0; k < sizeof(rec); ++k) reinterpret_cast<unsigned char*>(p)[k] = bytes[k];
  }
}

/// Loads bucket i's {min, unit}; byte-wise when `in` is not aligned to M.
template <class M>
CGX_HOST_DEVICE CGX_FORCEINLINE void body_load_meta(const std::byte* in, std::size_t i, M& mn, M& unit, bool aligned) {
  const std::byte* p = in + i * 2 * sizeof(M);
  if (aligned) {
    const M* q = reinterpret_cast<const M*>(p);
    mn = q[0];
    unit = q[1];
  } else {
    unsigned char bytes[2 * sizeof(M)];
    for (std::size_t k = 0; k < sizeof(bytes); ++k) bytes[k] = reinterpret_cast<const unsigned char*>(p)[k];
    M rec[2];
    std::memcpy(rec, bytes, sizeof(rec));
    mn = rec[0];
    unit = rec[1];
  }
}

/// Stores byte q of the word of codes c[0..7] at codes[q S + j], q = 0..Bits-1.
template <int Bits, int... Q>
CGX_HOST_DEVICE CGX_FORCEINLINE void body_store_planes(std::uint8_t* codes, std::uint32_t S, std::uint32_t j,
                                                       const std::uint32_t* c, std::integer_sequence<int, Q...>) {
  ((codes[static_cast<std::size_t>(Q) * S + j] = static_cast<std::uint8_t>(pack_byte<Bits, Q>(c))), ...);
}

/// How a finite bucket's values are encoded (bucket_params::scaled / ::wide).
enum class encoding { plain, scaled, wide };

/// The phases of the compress kernel for one bucket; compress_group strings them together.
template <int Bits, std::size_t B, class Rounding, class T>
struct compress_body {
  using M = meta_t<T>;
  using shape = compress_shape<B>;
  using layout = wire_layout<Bits, B, M>;
  using acc_t = minmax_acc<M>;
  static constexpr unsigned G = shape::group;
  static constexpr unsigned P = shape::per_thread;

  /// The bucket a group works on; `active` is false for a group past the last bucket.
  struct bucket {
    const T* x;
    std::size_t index;
    std::size_t first;
    std::size_t count;
    std::uint32_t S;
    bool active;
  };

  /// What a lane keeps between the load and the encode phase.
  struct lane_state {
    M cache[shape::cached ? P : 1][8];
  };

  CGX_HOST_DEVICE CGX_BODY_INLINE static bucket locate(const T* in, std::size_t n, std::size_t b) {
    bucket bk;
    bk.index = b;
    bk.active = b < layout::buckets(n);
    bk.first = b * B;
    bk.count = bk.active ? (n - bk.first < B ? n - bk.first : B) : 0;
    bk.S = static_cast<std::uint32_t>((bk.count + 7) / 8);
    bk.x = in + (bk.active ? bk.first : 0);
    return bk;
  }

  /// Phase 1: the lane's values (positions lane + t G), cached when shape::cached, and
  /// their min, max and finiteness.
  CGX_HOST_DEVICE CGX_BODY_INLINE static acc_t load(const bucket& bk, unsigned lane, lane_state& st) {
    acc_t a{pos_inf<M>(), -pos_inf<M>(), 1};
    M chk = M(0);  // NaN once a value is NaN or +-Inf
    CGX_UNROLL_BOUNDED(P)
    for (unsigned t = 0; t < P; ++t) {
      const std::uint32_t j = lane + t * G;
      if (j < bk.S) {
        CGX_UNROLL
        for (int k = 0; k < 8; ++k) {
          const std::size_t idx = static_cast<std::size_t>(k) * bk.S + j;
          if (idx < bk.count) {
            const M v = to_meta<T>(bk.x[idx]);
            if constexpr (shape::cached) st.cache[t][k] = v;
            a.lo = lower(a.lo, v);
            a.hi = upper(a.hi, v);
            chk = chk + (v - v);
          }
        }
      }
    }
    a.finite = chk == M(0) ? 1 : 0;
    return a;
  }

  /// Phase 2 (the leader of an active group): parameters from the reduced extremes, and
  /// the bucket's metadata record.
  CGX_HOST_DEVICE CGX_BODY_INLINE static bucket_params<M> params(const bucket& bk, const acc_t& r, std::byte* out,
                                                                 bool aligned) {
    const bucket_params<M> p = make_bucket_params<Bits, M>(r.lo, r.hi, r.finite != 0);
    body_store_meta<M>(out, bk.index, p.min, p.unit, aligned);
    return p;
  }

  template <encoding E>
  CGX_HOST_DEVICE CGX_BODY_INLINE static void encode_positions(const bucket& bk, unsigned lane, const lane_state& st,
                                                               const bucket_params<M>& p, std::uint8_t* codes,
                                                               const rng_state& rng, std::uint64_t gfirst) {
    CGX_UNROLL_BOUNDED(P)
    for (unsigned t = 0; t < P; ++t) {
      const std::uint32_t j = lane + t * G;
      if (j < bk.S) {
        const rounding_offsets<Rounding> off(rng, gfirst, j);
        std::uint32_t c[8];
        CGX_UNROLL
        for (int k = 0; k < 8; ++k) {
          const std::size_t idx = static_cast<std::size_t>(k) * bk.S + j;
          M v = p.min;
          if (idx < bk.count) {
            if constexpr (shape::cached) {
              v = st.cache[t][k];
            } else {
              v = to_meta<T>(bk.x[idx]);
            }
          }
          if constexpr (E == encoding::wide) {
            c[k] = encode_value_wide<Bits, M>(v, p.min, p.inv, off.template get<M>(k));
          } else {
            c[k] = encode_value<Bits, E == encoding::scaled>(v, p.min, p.inv, off.template get<M>(k));
          }
        }
        body_store_planes<Bits>(codes, bk.S, j, c, std::make_integer_sequence<int, Bits>{});
      }
    }
  }

  /// Phase 3: the codes of the lane's positions (zeros for a non-finite bucket).
  CGX_HOST_DEVICE CGX_BODY_INLINE static void encode(const bucket& bk, unsigned lane, const lane_state& st,
                                                     const bucket_params<M>& p, std::byte* out, std::size_t n,
                                                     const rng_state& rng) {
    std::uint8_t* codes = reinterpret_cast<std::uint8_t*>(out) + layout::codes_offset(n, bk.index);
    const std::uint64_t gfirst = rng.position + bk.first;
    if (!p.finite) {
      for (std::uint32_t j = lane; j < bk.S; j += G) {
        CGX_UNROLL
        for (int q = 0; q < Bits; ++q) codes[static_cast<std::size_t>(q) * bk.S + j] = 0;
      }
    } else if (p.wide) {
      encode_positions<encoding::wide>(bk, lane, st, p, codes, rng, gfirst);
    } else if (p.scaled) {
      encode_positions<encoding::scaled>(bk, lane, st, p, codes, rng, gfirst);
    } else {
      encode_positions<encoding::plain>(bk, lane, st, p, codes, rng, gfirst);
    }
  }
};

/// The compress kernel's work on bucket b (a group past the last bucket takes part in
/// the synchronization only), over execution context ctx (see the file comment).
/// `nonfinite` (may be null) counts the buckets holding NaN or +-Inf.
template <int Bits, std::size_t B, class Rounding, class T, class Ctx>
CGX_HOST_DEVICE CGX_BODY_INLINE void compress_group(Ctx& ctx, const T* in, std::size_t n, std::byte* out,
                                                    const rng_state& rng, bool aligned, std::uint32_t* nonfinite,
                                                    std::size_t b) {
  using body = compress_body<Bits, B, Rounding, T>;
  const typename body::bucket bk = body::locate(in, n, b);
  typename Ctx::template lane_array<typename body::lane_state> st(body::G);
  const typename body::acc_t r = ctx.reduce([&](unsigned lane) { return body::load(bk, lane, st[lane]); }, minmax_op{});
  ctx.leader([&] {
    if (bk.active) {
      ctx.shared() = body::params(bk, r, out, aligned);
      if (!ctx.shared().finite) ctx.count(nonfinite);
    }
  });
  ctx.sync();
  ctx.each_lane([&](unsigned lane) {
    if (bk.active) body::encode(bk, lane, st[lane], ctx.shared(), out, n, rng);
  });
  ctx.sync();  // the shared slot and the reduction's storage are reused by the next bucket
}

/// Positions (threads) of the decode kernel for n > 0 values: S of every bucket.
template <int Bits, std::size_t B, class M>
CGX_HOST_DEVICE CGX_FORCEINLINE std::size_t decode_positions(std::size_t n) {
  using layout = wire_layout<Bits, B, M>;
  const std::size_t nb = layout::buckets(n);
  return (nb - 1) * (B / 8) + layout::slice(n, nb - 1);
}

/// Decodes value K of position j (if it exists) into y; Add: y += value. Wide: the
/// bucket's stored {min, unit} need decode_value_wide (see is_wide in wire_format.hpp).
template <int Bits, int K, bool Add, bool Wide, class T, class M>
CGX_HOST_DEVICE CGX_BODY_INLINE void body_decode_one(const std::uint32_t* w, M mn, M unit, T* y, std::uint32_t S,
                                                     std::uint32_t j, std::size_t count) {
  const std::size_t idx = static_cast<std::size_t>(K) * S + j;
  if (idx < count) {
    M v;
    if constexpr (Wide) {
      v = decode_value_wide<M>(unpack_code<Bits, K>(w), mn, unit);
    } else {
      v = decode_value<M>(unpack_code<Bits, K>(w), mn, unit);
    }
    if constexpr (Add) {
      y[idx] = from_meta<T>(add_rn(to_meta<T>(y[idx]), v));
    } else {
      y[idx] = from_meta<T>(v);
    }
  }
}

template <int Bits, bool Add, bool Wide, class T, class M, int... K>
CGX_HOST_DEVICE CGX_BODY_INLINE void body_decode_word(const std::uint32_t* w, M mn, M unit, T* y, std::uint32_t S,
                                                      std::uint32_t j, std::size_t count,
                                                      std::integer_sequence<int, K...>) {
  (body_decode_one<Bits, K, Add, Wide>(w, mn, unit, y, S, j, count), ...);
}

/// The decode kernel's work on position t of the buffer (t < decode_positions(n)): the
/// up to 8 values of that position; Add: out[i] += value, in meta_t<T>, rounded once.
template <int Bits, std::size_t B, bool Add, class T>
CGX_HOST_DEVICE CGX_BODY_INLINE void decode_position(const std::byte* in, std::size_t n, T* out, bool aligned,
                                                     std::size_t t) {
  using M = meta_t<T>;
  using layout = wire_layout<Bits, B, M>;
  constexpr std::size_t SF = B / 8;
  const std::size_t b = t / SF;
  const auto j = static_cast<std::uint32_t>(t - b * SF);
  const std::size_t first = b * B;
  const std::size_t count = n - first < B ? n - first : B;
  const auto S = static_cast<std::uint32_t>((count + 7) / 8);
  M mn, unit;
  body_load_meta<M>(in, b, mn, unit, aligned);
  const std::uint8_t* codes = reinterpret_cast<const std::uint8_t*>(in) + layout::codes_offset(n, b);
  std::uint32_t w[Bits];
  CGX_UNROLL
  for (int q = 0; q < Bits; ++q) w[q] = codes[static_cast<std::size_t>(q) * S + j];
  if (is_wide<Bits, M>(mn, unit)) {
    body_decode_word<Bits, Add, true>(w, mn, unit, out + first, S, j, count, std::make_integer_sequence<int, 8>{});
  } else {
    body_decode_word<Bits, Add, false>(w, mn, unit, out + first, S, j, count, std::make_integer_sequence<int, 8>{});
  }
}

/// y[i] += x[i] in meta_t<T>, rounded once: the work of `device<none>::decompress_add`.
template <class T>
CGX_HOST_DEVICE CGX_BODY_INLINE void add_value(const T* x, T* y, std::size_t i) {
  y[i] = from_meta<T>(add_rn(to_meta<T>(y[i]), to_meta<T>(x[i])));
}

// ---- the host execution context ------------------------------------------------------

/// Order in which host_group_ctx visits the lanes of a phase.
enum class lane_order { ascending, descending, shuffled };

/// Host execution context of one group of G lanes: each phase runs for every lane in
/// the context's lane order (ascending, descending, or a permutation drawn from `seed`),
/// reductions fold serially in that order. Shared is the group-shared slot's type.
template <class Shared>
class host_group_ctx {
 public:
  /// One S per lane, kept between phases.
  template <class S>
  struct lane_array {
    explicit lane_array(unsigned group) : v(group) {}
    S& operator[](unsigned lane) { return v[lane]; }
    std::vector<S> v;
  };

  host_group_ctx(unsigned group, lane_order order, std::uint64_t seed = 0) : order_(group) {
    std::iota(order_.begin(), order_.end(), 0u);
    if (order == lane_order::descending) std::reverse(order_.begin(), order_.end());
    if (order == lane_order::shuffled) {
      std::mt19937_64 gen(seed);
      std::shuffle(order_.begin(), order_.end(), gen);
    }
  }

  template <class F, class Op>
  auto reduce(F&& f, Op op) {
    auto acc = f(order_[0]);
    for (std::size_t i = 1; i < order_.size(); ++i) acc = op(acc, f(order_[i]));
    return acc;
  }
  template <class F>
  void leader(F&& f) {
    f();
  }
  template <class F>
  void each_lane(F&& f) {
    for (const unsigned lane : order_) f(lane);
  }
  void sync() { ++syncs_; }
  Shared& shared() { return shared_; }
  void count(std::uint32_t* counter) {
    if (counter != nullptr) ++*counter;
  }
  /// Barriers passed so far (a test can check that every group passes the same number).
  std::size_t syncs() const { return syncs_; }
  unsigned group() const { return static_cast<unsigned>(order_.size()); }

 private:
  std::vector<unsigned> order_;
  Shared shared_{};
  std::size_t syncs_ = 0;
};

/// Runs the compress kernel's body on the host for n values: every bucket, in bucket
/// order, on one host_group_ctx whose lanes are visited in `order` (reshuffled per
/// bucket from `seed`). Writes the bytes `device<maxmin<...>>::compress` writes.
template <int Bits, std::size_t B, class Rounding, class T>
void host_compress(const T* in, std::size_t n, std::byte* out, const rng_state& rng, lane_order order,
                   std::uint64_t seed = 0, std::uint32_t* nonfinite = nullptr) {
  if (n == 0) return;
  using body = compress_body<Bits, B, Rounding, T>;
  const bool aligned = reinterpret_cast<std::uintptr_t>(out) % alignof(typename body::M) == 0;
  const std::size_t nb = body::layout::buckets(n);
  for (std::size_t b = 0; b < nb; ++b) {
    host_group_ctx<bucket_params<typename body::M>> ctx(body::G, order, seed + b);
    compress_group<Bits, B, Rounding, T>(ctx, in, n, out, rng, aligned, nonfinite, b);
  }
}

/// Runs the decode kernel's body on the host for every position, ascending or (any
/// other order) descending: decompress (Add = false) or decompress-add.
template <int Bits, std::size_t B, bool Add, class T>
void host_decode(const std::byte* in, std::size_t n, T* out, lane_order order = lane_order::ascending) {
  if (n == 0) return;
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % alignof(meta_t<T>) == 0;
  const std::size_t total = decode_positions<Bits, B, meta_t<T>>(n);
  for (std::size_t i = 0; i < total; ++i) {
    const std::size_t t = order == lane_order::ascending ? i : total - 1 - i;
    decode_position<Bits, B, Add, T>(in, n, out, aligned, t);
  }
}

}  // namespace cgx::quant::detail
