#pragma once
/// \file rotated.cuh
/// CUDA kernels of `cgx::quant::rotated<maxmin<Bits, BucketSize, Rounding>, Seed>`
/// (rotated.hpp), stream-ordered, for device buffers: `cgx::quant::device<rotated<...>>`,
/// which the device plans and schedules use as they use device<maxmin<...>>.
///
/// The kernels run the bodies of rotated_bodies.hpp: one group of threads per bucket
/// (compress_shape<BucketSize>, as maxmin's compress), the bucket held in shared memory
/// (BucketSize values of meta_t<T>: at most 32 KiB), the sign flips and butterflies of
/// hadamard.hpp, then maxmin's compress phases on the rotated values; decoding is the
/// reverse, through shared memory too. Every operation is the exact one of the host
/// codec (detail::add_rn and friends: inline PTX without .ftz), so `compress` writes the
/// host's bytes and `decompress` / `decompress_add` the host's values, bit for bit, under
/// any nvcc flags (for __half / __nv_bfloat16: the host's of the values as float,
/// rounded to the type once at the end). The first call on a device runs maxmin's
/// self-test (maxmin.cuh), which checks the same exact arithmetic.
///
/// ```cpp
/// #include <cgx/quant.cuh>
/// using Q = cgx::quant::rotated<cgx::quant::maxmin<2, 128, cgx::quant::nearest>>;
/// cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, X> plan{...};
/// ```

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "maxmin.cuh"
#include "rotated.hpp"
#include "rotated_bodies.hpp"

namespace cgx::quant {

namespace detail {

/// The frame of the rotated kernels: the group-shared slots and the reduction's storage in
/// shared memory, this thread's group context, and work(ctx, b) for each bucket b of the
/// block's groups, every thread of the block taking part in the same number of rounds
/// (the bodies hold barriers).
template <std::size_t B, class M, class Work>
__device__ __forceinline__ void rotated_groups(std::size_t nb, Work&& work) {
  using Shape = compress_shape<B>;
  using ctx_t = device_group_ctx<Shape, minmax_acc<M>, rotated_slot<B, M>>;
  constexpr unsigned NG = Shape::groups;
  __shared__ typename ctx_t::temp_t temp;
  __shared__ rotated_slot<B, M> slots[NG];
  const unsigned g = threadIdx.x / Shape::group;
  ctx_t ctx{temp, slots[g], g, threadIdx.x % Shape::group};
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * NG; base < nb;
       base += static_cast<std::size_t>(gridDim.x) * NG) {
    work(ctx, base + g);
  }
}

/// Rotated compress: one group of Shape::group threads per bucket, Shape::groups buckets
/// per block; the work is rotated_compress_group (rotated_bodies.hpp).
template <int Bits, std::size_t B, class Rounding, std::uint64_t Seed, class T>
__global__ void __launch_bounds__(compress_shape<B>::threads)
    rotated_compress_kernel(const T* __restrict__ in, std::size_t n, std::byte* __restrict__ out, rng_state rng,
                            bool meta_aligned, std::uint32_t* nonfinite) {
  using M = meta_t<T>;
  if constexpr (std::is_same_v<Rounding, stochastic>)
    if (rng.device_calls != nullptr) rng.counter += *rng.device_calls;
  rotated_groups<B, M>(wire_layout<Bits, B, M>::buckets(n), [&](auto& ctx, std::size_t b) {
    rotated_compress_group<Bits, B, Rounding, T>(ctx, in, n, out, rng, meta_aligned, nonfinite, b, Seed);
  });
}

/// Rotated decode (Add = false) or decode-add: one group per bucket, as compress.
template <int Bits, std::size_t B, bool Add, std::uint64_t Seed, class T>
__global__ void __launch_bounds__(compress_shape<B>::threads)
    rotated_decode_kernel(const std::byte* __restrict__ in, std::size_t n, T* __restrict__ out, bool meta_aligned) {
  using M = meta_t<T>;
  rotated_groups<B, M>(wire_layout<Bits, B, M>::buckets(n), [&](auto& ctx, std::size_t b) {
    rotated_decode_group<Bits, B, Add, T>(ctx, in, n, out, meta_aligned, b, Seed);
  });
}

}  // namespace detail

/// CUDA kernels of `rotated<maxmin<Bits, BucketSize, Rounding>, Seed>`: the interface of
/// device<maxmin<...>> (maxmin.cuh) with the rotated codec's bytes and values. Input
/// types: float, __half, __nv_bfloat16 (fp32 arithmetic) and double (fp64).
template <int Bits, std::size_t BucketSize, class Rounding, std::uint64_t Seed>
struct device<rotated<maxmin<Bits, BucketSize, Rounding>, Seed>> {
  /// The host quantizer whose bytes and values these kernels reproduce.
  using quantizer = rotated<maxmin<Bits, BucketSize, Rounding>, Seed>;

  /// Exact size in bytes of the compressed form of n values of type T (as the host's).
  template <class T>
  static constexpr std::size_t compressed_bytes(std::size_t n) noexcept {
    return wire_layout<Bits, BucketSize, meta_t<T>>::bytes(n);
  }

  /// Compresses d_in[0..n) into d_out on `stream`: the bytes of `quantizer::compress` on
  /// the host. `d_status` (may be null) counts non-finite buckets, as device<maxmin>.
  /// \throws cgx::error (errc::cuda) when the launch fails.
  template <class T>
  static void compress(const T* d_in, std::size_t n, std::byte* d_out, const rng_state& rng = {},
                       cudaStream_t stream = nullptr, device_status* d_status = nullptr) {
    static_assert(detail::is_device_value_v<T>,
                  "cgx::quant::device<rotated>: input must be float, double, __half or __nv_bfloat16");
    if (n == 0) return;
    detail::self_test_once(stream);
    using M = meta_t<T>;
    using shape = detail::compress_shape<BucketSize>;
    const std::size_t nb = wire_layout<Bits, BucketSize, M>::buckets(n);
    const bool aligned = reinterpret_cast<std::uintptr_t>(d_out) % alignof(M) == 0;
    detail::rotated_compress_kernel<Bits, BucketSize, Rounding, Seed, T>
        <<<detail::grid_for(nb, shape::groups), shape::threads, 0, stream>>>(
            d_in, n, d_out, rng, aligned, d_status ? &d_status->nonfinite_buckets : nullptr);
    detail::check_cuda(cudaGetLastError(), "cgx::quant::device<rotated>::compress: kernel launch");
  }

  /// Decodes compressed_bytes<T>(n) bytes at d_in into d_out[0..n) on `stream`, rotated back.
  template <class T>
  static void decompress(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream = nullptr) {
    decode<T, false>(d_in, n, d_out, stream, "cgx::quant::device<rotated>::decompress: kernel launch");
  }

  /// d_out[i] += decoded value i (rotated back), on `stream`; half types accumulate in fp32.
  template <class T>
  static void decompress_add(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream = nullptr) {
    decode<T, true>(d_in, n, d_out, stream, "cgx::quant::device<rotated>::decompress_add: kernel launch");
  }

 private:
  template <class T, bool Add>
  static void decode(const std::byte* d_in, std::size_t n, T* d_out, cudaStream_t stream, const char* what) {
    static_assert(detail::is_device_value_v<T>,
                  "cgx::quant::device<rotated>: output must be float, double, __half or __nv_bfloat16");
    if (n == 0) return;
    detail::self_test_once(stream);
    using M = meta_t<T>;
    using shape = detail::compress_shape<BucketSize>;
    const std::size_t nb = wire_layout<Bits, BucketSize, M>::buckets(n);
    const bool aligned = reinterpret_cast<std::uintptr_t>(d_in) % alignof(M) == 0;
    detail::rotated_decode_kernel<Bits, BucketSize, Add, Seed, T>
        <<<detail::grid_for(nb, shape::groups), shape::threads, 0, stream>>>(d_in, n, d_out, aligned);
    detail::check_cuda(cudaGetLastError(), what);
  }
};

}  // namespace cgx::quant
