#pragma once
/// \file maxmin.cuh
/// CUDA kernels of the quantizers, stream-ordered, for device buffers:
/// `cgx::quant::device<Q>` for `Q = maxmin<Bits, BucketSize, Rounding>` and `Q = none`.
///
/// The kernels write and read exactly the bytes specified in wire_format.hpp, and the
/// per-bucket arithmetic (make_bucket_params, rounding_offsets, encode_value,
/// decode_value, pack_byte, unpack_code, wire_layout) is the one of wire_format.hpp,
/// shared with the host kernels of maxmin.hpp. `device<Q>::compress` therefore writes,
/// bit for bit, the bytes of `Q::compress` on the host for the same values and the same
/// `rng_state` (for __half / __nv_bfloat16 input: the host compress of the values
/// converted to float, which is exact). Decoding gives the host's values too: the product
/// code * unit is rounded on its own on both sides (detail::mul_rn: __fmul_rn on the
/// device, where nvcc would otherwise contract `min + code * unit` into an FMA as it does
/// by default, and an opaque product on the host, where GCC contracts as well: at -O3
/// -march=native it emits vfmadd231ss for the plain expression, ISO mode or not). A
/// contracted decode would differ by the rounding of the product, which is many ulp of
/// a result near 0, not only the last bit.
///
/// Usage, in the style of CUB's `cub::DeviceReduce`:
/// ```cpp
/// #include <cgx/quant.cuh>
/// using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
/// using D = cgx::quant::device<Q>;
/// std::byte* d_wire;  cudaMalloc(&d_wire, D::compressed_bytes<float>(n));
/// cgx::quant::rng_state rng{.seed = 42, .counter = step, .stream = rank};
/// D::compress(d_x, n, d_wire, rng, stream);        // d_x: const float*, __half*, bf16*, double*
/// D::decompress_add(d_wire, n, d_y, stream);       // d_y[i] += decoded value i
/// ```
///
/// Mapping: compress gives one bucket to a group of threads (a logical warp for buckets
/// of up to 256 values, a thread block otherwise); thread j of the group owns position j
/// of the bucket (values j + k S, k = 0..7), so loads and the byte planes are coalesced.
/// A thread's loop over its positions is unrolled fully up to 8 positions (buckets up to
/// 16384 values) and 4 at a time above (CGX_UNROLL_BOUNDED), which bounds the code of
/// huge buckets.
/// The bucket's min/max/finiteness is a CUB WarpReduce or BlockReduce. Decompress needs
/// no reduction: one thread per position over the whole buffer.
///
/// Errors: a failed launch throws `cgx::error` with `errc::cuda`. Kernel faults surface,
/// as in CUDA, at the next synchronizing call.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>
#include <cuda/std/limits>

// wire_format.hpp calls std::numeric_limits<>::max()/quiet_NaN() (constexpr __host__
// functions) from CGX_HOST_DEVICE code; nvcc warns (20013) unless
// --expt-relaxed-constexpr. The values are compile-time constants, so the device code is
// right; silence the warning for these headers only.
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 20013
#endif
#include "../config.hpp"
#include "../error.hpp"
#include "maxmin.hpp"
#include "none.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"
#if defined(__NVCC__)
#pragma nv_diagnostic pop
#endif

namespace cgx::quant {

/// Device-side status of the stream-ordered calls. The kernels *add* to it, so the
/// caller zeroes it (cudaMemsetAsync) and reads it back when convenient, e.g. once per
/// step for a loss scaler, without decoding anything.
struct device_status {
  std::uint32_t nonfinite_buckets;  ///< buckets of the compressed input holding a NaN or +-Inf
};

/// CUDA kernels of quantizer Q on device buffers, enqueued on a `cudaStream_t`.
/// Specialized for `maxmin<...>` and `none`; other quantizers have no device kernels.
template <class Q>
struct device {
  static_assert(sizeof(Q) == 0,
                "cgx::quant::device<Q>: no CUDA kernels for this quantizer; use cgx::quant::maxmin<...> or "
                "cgx::quant::none");
};

namespace detail {

/// True for the input types the CUDA kernels take.
template <class T>
inline constexpr bool is_device_value_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                          std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// Conversions between an input type and its metadata/arithmetic type (exact for loads).
template <class T>
__host__ __device__ __forceinline__ meta_t<T> to_meta(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}

template <class T>
__host__ __device__ __forceinline__ T from_meta(meta_t<T> v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else {
    return v;
  }
}

/// Min, max and "all finite" of a set of values; the operands of the CUB reduction.
template <class M>
struct minmax_acc {
  M lo;
  M hi;
  int finite;
};

struct minmax_op {
  template <class M>
  __device__ __forceinline__ minmax_acc<M> operator()(const minmax_acc<M>& a, const minmax_acc<M>& b) const {
    return {b.lo < a.lo ? b.lo : a.lo, b.hi > a.hi ? b.hi : a.hi, a.finite & b.finite};
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
  /// Threads per bucket: a logical warp (power of two) for S <= 32, else a block of
  /// up to 256 threads.
  static constexpr unsigned group = S <= 32 ? pow2_ceil(S) : (S >= 256 ? 256u : (S + 31) / 32 * 32);
  /// Buckets per block.
  static constexpr unsigned groups = S <= 32 ? 256 / group : 1;
  static constexpr unsigned threads = group * groups;
  /// Positions per thread.
  static constexpr unsigned per_thread = (S + group - 1) / group;
  /// Values stay in registers between the reduction and the encoding (else: read twice).
  static constexpr bool cached = per_thread <= 4;
  static constexpr bool block_reduce = groups == 1 && group > 32;
};

template <class M>
__device__ __forceinline__ void dev_store_meta(std::byte* out, std::size_t i, M mn, M unit, bool aligned) {
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

template <class M>
__device__ __forceinline__ void dev_load_meta(const std::byte* in, std::size_t i, M& mn, M& unit, bool aligned) {
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
__device__ __forceinline__ void dev_store_planes(std::uint8_t* codes, std::uint32_t S, std::uint32_t j,
                                                 const std::uint32_t* c, std::integer_sequence<int, Q...>) {
  ((codes[static_cast<std::size_t>(Q) * S + j] = static_cast<std::uint8_t>(pack_byte<Bits, Q>(c))), ...);
}

/// Decodes value K of position j (if it exists) into y; Add: y += value. Wide: the
/// bucket's stored {min, unit} need decode_value_wide (see is_wide in wire_format.hpp).
template <int Bits, int K, bool Add, bool Wide, class T, class M>
__device__ __forceinline__ void dev_decode_one(const std::uint32_t* b, M mn, M unit, T* y, std::uint32_t S,
                                               std::uint32_t j, std::size_t count) {
  const std::size_t idx = static_cast<std::size_t>(K) * S + j;
  if (idx < count) {
    M v;
    if constexpr (Wide) {
      v = decode_value_wide<M>(unpack_code<Bits, K>(b), mn, unit);
    } else {
      v = decode_value<M>(unpack_code<Bits, K>(b), mn, unit);
    }
    if constexpr (Add) {
      y[idx] = from_meta<T>(to_meta<T>(y[idx]) + v);
    } else {
      y[idx] = from_meta<T>(v);
    }
  }
}

template <int Bits, bool Add, bool Wide, class T, class M, int... K>
__device__ __forceinline__ void dev_decode_position(const std::uint32_t* b, M mn, M unit, T* y, std::uint32_t S,
                                                    std::uint32_t j, std::size_t count,
                                                    std::integer_sequence<int, K...>) {
  (dev_decode_one<Bits, K, Add, Wide>(b, mn, unit, y, S, j, count), ...);
}

/// How a finite bucket's values are encoded (bucket_params::scaled / ::wide).
enum class encoding { plain, scaled, wide };

/// Encodes the positions of one bucket owned by this thread (j = lane + p G).
template <int Bits, class Rounding, encoding E, class Shape, class T, class M>
__device__ __forceinline__ void dev_encode_bucket(const T* __restrict__ x, const M (&cache)[Shape::cached ? Shape::per_thread : 1][8],
                                                  unsigned lane, std::uint32_t S, std::size_t count,
                                                  const bucket_params<M>& p, std::uint8_t* __restrict__ codes,
                                                  const rng_state& rng, std::uint64_t gfirst) {
  CGX_UNROLL_BOUNDED(Shape::per_thread)
  for (unsigned t = 0; t < Shape::per_thread; ++t) {
    const std::uint32_t j = lane + t * Shape::group;
    if (j < S) {
      const rounding_offsets<Rounding> off(rng, gfirst, j);
      std::uint32_t c[8];
      CGX_UNROLL
      for (int k = 0; k < 8; ++k) {
        const std::size_t idx = static_cast<std::size_t>(k) * S + j;
        M v = p.min;
        if (idx < count) {
          if constexpr (Shape::cached) {
            v = cache[t][k];
          } else {
            v = to_meta<T>(x[idx]);
          }
        }
        if constexpr (E == encoding::wide) {
          c[k] = encode_value_wide<Bits, M>(v, p.min, p.inv, off.template get<M>(k));
        } else {
          c[k] = encode_value<Bits, E == encoding::scaled>(v, p.min, p.inv, off.template get<M>(k));
        }
      }
      dev_store_planes<Bits>(codes, S, j, c, std::make_integer_sequence<int, Bits>{});
    }
  }
}

/// Compress: one group of Shape::group threads per bucket, Shape::groups buckets per block.
template <int Bits, std::size_t B, class Rounding, class T>
__global__ void __launch_bounds__(compress_shape<B>::threads)
    maxmin_compress_kernel(const T* __restrict__ in, std::size_t n, std::byte* __restrict__ out, rng_state rng,
                           bool meta_aligned, std::uint32_t* nonfinite) {
  using M = meta_t<T>;
  using Shape = compress_shape<B>;
  using layout = wire_layout<Bits, B, M>;
  using acc_t = minmax_acc<M>;
  constexpr unsigned G = Shape::group;
  constexpr unsigned NG = Shape::groups;
  constexpr unsigned P = Shape::per_thread;
  using block_reduce_t = cub::BlockReduce<acc_t, (Shape::block_reduce ? G : 32)>;
  using warp_reduce_t = cub::WarpReduce<acc_t, (G <= 32 ? G : 32)>;
  struct warp_storage {
    typename warp_reduce_t::TempStorage w[NG];
  };
  using temp_t = std::conditional_t<Shape::block_reduce, typename block_reduce_t::TempStorage, warp_storage>;
  __shared__ temp_t temp;
  __shared__ bucket_params<M> params[NG];

  const unsigned g = threadIdx.x / G;
  const unsigned lane = threadIdx.x % G;
  const std::size_t nb = layout::buckets(n);
  auto* codes_base = reinterpret_cast<std::uint8_t*>(out);

  // Every thread of the block runs the same number of rounds (barriers inside).
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * NG; base < nb;
       base += static_cast<std::size_t>(gridDim.x) * NG) {
    const std::size_t b = base + g;
    const bool active = b < nb;
    const std::size_t first = b * B;
    const std::size_t count = active ? (n - first < B ? n - first : B) : 0;
    const auto S = static_cast<std::uint32_t>((count + 7) / 8);
    const T* x = in + first;

    M cache[Shape::cached ? P : 1][8];
    acc_t a{::cuda::std::numeric_limits<M>::infinity(), -::cuda::std::numeric_limits<M>::infinity(), 1};
    M chk = M(0);  // NaN once a value is NaN or +-Inf
    CGX_UNROLL_BOUNDED(P)
    for (unsigned t = 0; t < P; ++t) {
      const std::uint32_t j = lane + t * G;
      if (j < S) {
        CGX_UNROLL
        for (int k = 0; k < 8; ++k) {
          const std::size_t idx = static_cast<std::size_t>(k) * S + j;
          if (idx < count) {
            const M v = to_meta<T>(x[idx]);
            if constexpr (Shape::cached) cache[t][k] = v;
            a.lo = v < a.lo ? v : a.lo;
            a.hi = v > a.hi ? v : a.hi;
            chk = chk + (v - v);
          }
        }
      }
    }
    a.finite = chk == M(0) ? 1 : 0;

    acc_t r;
    if constexpr (G == 1) {
      r = a;
    } else if constexpr (Shape::block_reduce) {
      r = block_reduce_t(temp).Reduce(a, minmax_op{});
    } else {
      r = warp_reduce_t(temp.w[g]).Reduce(a, minmax_op{});
    }
    if (lane == 0 && active) {
      const bucket_params<M> p = make_bucket_params<Bits, M>(r.lo, r.hi, r.finite != 0);
      params[g] = p;
      dev_store_meta<M>(out, b, p.min, p.unit, meta_aligned);
      if (!p.finite && nonfinite != nullptr) atomicAdd(nonfinite, 1u);
    }
    __syncthreads();

    if (active) {
      const bucket_params<M> p = params[g];
      std::uint8_t* codes = codes_base + layout::codes_offset(n, b);
      const std::uint64_t gfirst = rng.position + first;
      if (!p.finite) {
        for (std::uint32_t j = lane; j < S; j += G) {
          CGX_UNROLL
          for (int q = 0; q < Bits; ++q) codes[static_cast<std::size_t>(q) * S + j] = 0;
        }
      } else if (p.wide) {
        dev_encode_bucket<Bits, Rounding, encoding::wide, Shape>(x, cache, lane, S, count, p, codes, rng, gfirst);
      } else if (p.scaled) {
        dev_encode_bucket<Bits, Rounding, encoding::scaled, Shape>(x, cache, lane, S, count, p, codes, rng, gfirst);
      } else {
        dev_encode_bucket<Bits, Rounding, encoding::plain, Shape>(x, cache, lane, S, count, p, codes, rng, gfirst);
      }
    }
    __syncthreads();  // params[] and the reduction's storage are reused by the next round
  }
}

inline constexpr unsigned decode_threads = 256;

/// Decompress (Add = false) or decompress-add: one thread per position of the buffer.
template <int Bits, std::size_t B, bool Add, class T>
__global__ void __launch_bounds__(decode_threads)
    maxmin_decode_kernel(const std::byte* __restrict__ in, std::size_t n, T* __restrict__ out, bool meta_aligned) {
  using M = meta_t<T>;
  using layout = wire_layout<Bits, B, M>;
  constexpr std::size_t SF = B / 8;
  const std::size_t nb = layout::buckets(n);
  const std::size_t total = (nb - 1) * SF + layout::slice(n, nb - 1);
  const auto* codes_base = reinterpret_cast<const std::uint8_t*>(in);
  for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t b = t / SF;
    const auto j = static_cast<std::uint32_t>(t - b * SF);
    const std::size_t first = b * B;
    const std::size_t count = n - first < B ? n - first : B;
    const auto S = static_cast<std::uint32_t>((count + 7) / 8);
    M mn, unit;
    dev_load_meta<M>(in, b, mn, unit, meta_aligned);
    const std::uint8_t* codes = codes_base + layout::codes_offset(n, b);
    std::uint32_t w[Bits];
    CGX_UNROLL
    for (int q = 0; q < Bits; ++q) w[q] = codes[static_cast<std::size_t>(q) * S + j];
    if (is_wide<Bits, M>(mn, unit)) {
      dev_decode_position<Bits, Add, true>(w, mn, unit, out + first, S, j, count, std::make_integer_sequence<int, 8>{});
    } else {
      dev_decode_position<Bits, Add, false>(w, mn, unit, out + first, S, j, count, std::make_integer_sequence<int, 8>{});
    }
  }
}

/// y[i] += x[i], accumulated in meta_t<T> (fp32 for half types): `none`'s decompress_add.
template <class T>
__global__ void __launch_bounds__(decode_threads) add_kernel(const T* __restrict__ x, std::size_t n, T* __restrict__ y) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    y[i] = from_meta<T>(to_meta<T>(y[i]) + to_meta<T>(x[i]));
  }
}

/// Throws cgx::error(errc::cuda) when the last launch (or runtime call) failed.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear a non-sticky error
    throw error(errc::cuda, std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }
}

/// Blocks for `work` items at `per_block` items per block, capped at the grid limit.
inline unsigned grid_for(std::size_t work, std::size_t per_block) {
  const std::size_t blocks = (work + per_block - 1) / per_block;
  constexpr std::size_t cap = 0x7fffffffu;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

}  // namespace detail

/// CUDA kernels of `maxmin<Bits, BucketSize, Rounding>`. Input types: float, __half,
/// __nv_bfloat16 (fp32 metadata and fp32 arithmetic) and double (fp64). All calls are
/// asynchronous with respect to the host and ordered on `stream`; buffers are device
/// (or managed) memory and must not overlap. The compressed buffer needs no alignment
/// (metadata are read byte-wise when it is not aligned to the metadata type).
template <int Bits, std::size_t BucketSize, class Rounding>
struct device<maxmin<Bits, BucketSize, Rounding>> {
  /// The host quantizer whose wire format these kernels share.
  using quantizer = maxmin<Bits, BucketSize, Rounding>;

  /// Exact size in bytes of the compressed form of n values of type T (as the host's).
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return wire_layout<Bits, BucketSize, meta_t<T>>::bytes(n);
  }

  /// Compresses d_in[0..n) into d_out[0..compressed_bytes<T>(n)) on `stream`: the bytes
  /// of `quantizer::compress` on the host (for half types: of the values as float).
  /// When `d_status` is not null, the number of non-finite buckets is added to
  /// `d_status->nonfinite_buckets` (device memory). n = 0 enqueues nothing.
  /// \throws cgx::error (errc::cuda) when the launch fails.
  template <class T>
  static void compress(const T* d_in, std::size_t n, std::byte* d_out, const rng_state& rng = {},
                       cudaStream_t stream = nullptr, device_status* d_status = nullptr) {
    static_assert(detail::is_device_value_v<T>,
                  "cgx::quant::device<maxmin>: input must be float, double, __half or __nv_bfloat16");
    if (n == 0) return;
    using M = meta_t<T>;
    using shape = detail::compress_shape<BucketSize>;
    const std::size_t nb = wire_layout<Bits, BucketSize, M>::buckets(n);
    const bool aligned = reinterpret_cast<std::uintptr_t>(d_out) % alignof(M) == 0;
    detail::maxmin_compress_kernel<Bits, BucketSize, Rounding, T>
        <<<detail::grid_for(nb, shape::groups), shape::threads, 0, stream>>>(
            d_in, n, d_out, rng, aligned, d_status ? &d_status->nonfinite_buckets : nullptr);
    detail::check_cuda(cudaGetLastError(), "cgx::quant::device<maxmin>::compress: kernel launch");
  }

  /// Decodes compressed_bytes<T>(n) bytes at d_in into d_out[0..n) on `stream`.
  /// \throws cgx::error (errc::cuda) when the launch fails.
  template <class T>
  static void decompress(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream = nullptr) {
    decode<T, false>(d_in, n, d_out, stream, "cgx::quant::device<maxmin>::decompress: kernel launch");
  }

  /// d_out[i] += decoded value i, for i in [0, n), on `stream`: the fused
  /// decompress-and-add of a reduction. Half types accumulate in fp32 and round once.
  /// \throws cgx::error (errc::cuda) when the launch fails.
  template <class T>
  static void decompress_add(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream = nullptr) {
    decode<T, true>(d_in, n, d_out, stream, "cgx::quant::device<maxmin>::decompress_add: kernel launch");
  }

 private:
  template <class T, bool Add>
  static void decode(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream, const char* what) {
    static_assert(detail::is_device_value_v<T>,
                  "cgx::quant::device<maxmin>: output must be float, double, __half or __nv_bfloat16");
    if (n == 0) return;
    using M = meta_t<T>;
    using layout = wire_layout<Bits, BucketSize, M>;
    const std::size_t nb = layout::buckets(n);
    const std::size_t positions = (nb - 1) * (BucketSize / 8) + layout::slice(n, nb - 1);
    const bool aligned = reinterpret_cast<std::uintptr_t>(d_in) % alignof(M) == 0;
    detail::maxmin_decode_kernel<Bits, BucketSize, Add, T>
        <<<detail::grid_for(positions, detail::decode_threads), detail::decode_threads, 0, stream>>>(d_in, n, d_out,
                                                                                                     aligned);
    detail::check_cuda(cudaGetLastError(), what);
  }
};

/// CUDA counterpart of `none`: the wire holds the values as they are. compress and
/// decompress are device-to-device copies; decompress_add is y += x (fp32 accumulation
/// for half types). `none` does not inspect values: `d_status` is left untouched.
template <>
struct device<none> {
  using quantizer = none;  ///< the host quantizer this one matches byte for byte

  /// n * sizeof(T): the raw bytes.
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return n * sizeof(T);
  }

  /// Copies the n values to d_out, in stream order.
  template <class T>
  static void compress(const T* d_in, std::size_t n, std::byte* d_out, const rng_state& = {},
                       cudaStream_t stream = nullptr, device_status* = nullptr) {
    if (n == 0) return;
    detail::check_cuda(cudaMemcpyAsync(d_out, d_in, n * sizeof(T), cudaMemcpyDeviceToDevice, stream),
                       "cgx::quant::device<none>::compress: cudaMemcpyAsync");
  }

  /// Copies n values from d_in, in stream order.
  template <class T>
  static void decompress(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream = nullptr) {
    if (n == 0) return;
    detail::check_cuda(cudaMemcpyAsync(d_out, d_in, n * sizeof(T), cudaMemcpyDeviceToDevice, stream),
                       "cgx::quant::device<none>::decompress: cudaMemcpyAsync");
  }

  /// d_out[i] += value i. The wire buffer must be aligned to alignof(T).
  template <class T>
  static void decompress_add(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream = nullptr) {
    static_assert(detail::is_device_value_v<T>,
                  "cgx::quant::device<none>: decompress_add takes float, double, __half or __nv_bfloat16");
    if (n == 0) return;
    if (reinterpret_cast<std::uintptr_t>(d_in) % alignof(T) != 0) {
      throw error(errc::invalid_argument, "cgx::quant::device<none>::decompress_add: misaligned input");
    }
    detail::add_kernel<T><<<detail::grid_for(n, detail::decode_threads), detail::decode_threads, 0, stream>>>(
        reinterpret_cast<const T*>(d_in), n, d_out);
    detail::check_cuda(cudaGetLastError(), "cgx::quant::device<none>::decompress_add: kernel launch");
  }
};

}  // namespace cgx::quant
