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
/// code * unit is rounded on its own on both sides (detail::mul_rn: inline-PTX mul.rn on
/// the device, where nvcc would otherwise contract `min + code * unit` into an FMA as it
/// does by default, and an opaque product on the host, where GCC contracts as well: at
/// -O3 -march=native it emits vfmadd231ss for the plain expression, ISO mode or not). A
/// contracted decode would differ by the rounding of the product, which is many ulp of
/// a result near 0, not only the last bit. No device operation is flushed to zero or
/// approximate under --use_fast_math / -ftz=true / -prec-div=false either (wire_format.hpp,
/// detail::add_rn and friends), and a self-test checks it at first use on each device
/// (device_self_test below): a difference throws cgx::error instead of diverging silently.
///
/// The kernels' work is written once, as CGX_HOST_DEVICE code over an execution context,
/// in kernel_bodies.hpp; this file holds the device context (CUB, __syncthreads), the
/// kernels and their launches. tests/test_kernel_bodies.cpp runs the same bodies on the
/// host and compares them with the host quantizer, without a GPU.
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
#include <mutex>
#include <string>
#include <vector>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/warp/warp_reduce.cuh>

// wire_format.hpp calls std::numeric_limits<>::max()/quiet_NaN() (constexpr __host__
// functions) from CGX_HOST_DEVICE code; nvcc warns (20013) unless
// --expt-relaxed-constexpr. The values are compile-time constants, so the device code is
// right; silence the warning for these headers only.
#if defined(__NVCC__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 20013
#endif
#include "../comm/runtime.cuh"
#include "../config.hpp"
#include "../error.hpp"
#include "maxmin.hpp"
#include "none.hpp"
#include "rounding.hpp"
#include "wire_format.hpp"
#include "kernel_bodies.hpp"
#include "device_types.hpp"
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

/// Device execution context of the kernel bodies (kernel_bodies.hpp): one thread per
/// lane of a group of Shape::group threads; Shape::groups groups per block. The group
/// reduction is a CUB WarpReduce (logical warp of G threads) or BlockReduce, the barrier
/// __syncthreads (block-wide: every thread of the block calls it the same number of
/// times), the shared slot a __shared__ element of the kernel, the count an atomicAdd,
/// and a lane's state the thread's own registers.
template <class Shape, class Acc, class Shared>
struct device_group_ctx {
  static constexpr unsigned G = Shape::group;
  using block_reduce_t = cub::BlockReduce<Acc, (Shape::block_reduce ? G : 32)>;
  using warp_reduce_t = cub::WarpReduce<Acc, (G <= 32 ? G : 32)>;
  struct warp_storage {
    typename warp_reduce_t::TempStorage w[Shape::groups];
  };
  /// The kernel's __shared__ storage of the reduction.
  using temp_t = std::conditional_t<Shape::block_reduce, typename block_reduce_t::TempStorage, warp_storage>;

  template <class S>
  struct lane_array {
    __device__ __forceinline__ explicit lane_array(unsigned) {}
    __device__ __forceinline__ S& operator[](unsigned) { return s; }
    S s;
  };

  temp_t& temp;
  Shared& slot;
  unsigned g;
  unsigned lane;

  template <class F, class Op>
  __device__ __forceinline__ Acc reduce(F&& f, Op op) {
    const Acc a = f(lane);
    if constexpr (G == 1) {
      return a;
    } else if constexpr (Shape::block_reduce) {
      return block_reduce_t(temp).Reduce(a, op);
    } else {
      return warp_reduce_t(temp.w[g]).Reduce(a, op);
    }
  }
  template <class F>
  __device__ __forceinline__ void leader(F&& f) {
    if (lane == 0) f();
  }
  template <class F>
  __device__ __forceinline__ void each_lane(F&& f) {
    f(lane);
  }
  __device__ __forceinline__ void sync() { __syncthreads(); }
  __device__ __forceinline__ Shared& shared() { return slot; }
  __device__ __forceinline__ void count(std::uint32_t* counter) {
    if (counter != nullptr) atomicAdd(counter, 1u);
  }
};

/// Compress: one group of Shape::group threads per bucket, Shape::groups buckets per
/// block; the work is compress_group (kernel_bodies.hpp).
template <int Bits, std::size_t B, class Rounding, class T>
__global__ void __launch_bounds__(compress_shape<B>::threads)
    maxmin_compress_kernel(const T* __restrict__ in, std::size_t n, std::byte* __restrict__ out, rng_state rng,
                           bool meta_aligned, std::uint32_t* nonfinite) {
  using M = meta_t<T>;
  using Shape = compress_shape<B>;
  using ctx_t = device_group_ctx<Shape, minmax_acc<M>, bucket_params<M>>;
  constexpr unsigned NG = Shape::groups;
  __shared__ typename ctx_t::temp_t temp;
  __shared__ bucket_params<M> params[NG];

  const unsigned g = threadIdx.x / Shape::group;
  ctx_t ctx{temp, params[g], g, threadIdx.x % Shape::group};
  // A device plan's call counter, read when the kernel runs (a graph replay's, not the
  // capture's): rounding.hpp, rng_state::device_calls.
  if constexpr (std::is_same_v<Rounding, stochastic>)
    if (rng.device_calls != nullptr) rng.counter += *rng.device_calls;
  const std::size_t nb = wire_layout<Bits, B, M>::buckets(n);
  // Every thread of the block runs the same number of rounds (barriers inside).
  for (std::size_t base = static_cast<std::size_t>(blockIdx.x) * NG; base < nb;
       base += static_cast<std::size_t>(gridDim.x) * NG) {
    compress_group<Bits, B, Rounding, T>(ctx, in, n, out, rng, meta_aligned, nonfinite, base + g);
  }
}

inline constexpr unsigned decode_threads = 256;

/// Decompress (Add = false) or decompress-add: one thread per position of the buffer;
/// the work is decode_position (kernel_bodies.hpp).
template <int Bits, std::size_t B, bool Add, class T>
__global__ void __launch_bounds__(decode_threads)
    maxmin_decode_kernel(const std::byte* __restrict__ in, std::size_t n, T* __restrict__ out, bool meta_aligned) {
  const std::size_t total = decode_positions<Bits, B, meta_t<T>>(n);
  for (std::size_t t = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    decode_position<Bits, B, Add, T>(in, n, out, meta_aligned, t);
  }
}

/// y[i] += x[i], accumulated in meta_t<T> (fp32 for half types): `none`'s decompress_add.
template <class T>
__global__ void __launch_bounds__(decode_threads) add_kernel(const T* __restrict__ x, std::size_t n, T* __restrict__ y) {
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    add_value<T>(x, y, i);
  }
}

/// *p += 1: comm::cuda_runtime::increment_u32 (a device plan's call counter).
__global__ void increment_u32_kernel(std::uint32_t* p) { *p += 1u; }

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

// ---- first-use self-test --------------------------------------------------------------
// In an unnamed namespace on purpose: each translation unit gets its own copy, compiled
// with that unit's nvcc flags (--use_fast_math, -ftz=true, -prec-div=false ...), with its
// own "done" flags. An inline function would be merged by the linker into one copy from
// whichever unit it picked; this way the device<maxmin> call that runs (itself one
// merged copy) calls the self-test compiled with the same flags as the kernels it
// launches.
namespace {

/// The quantizer the self-test runs: 5 bits, buckets of 64, stochastic rounding.
using self_test_quantizer = maxmin<5, 64, stochastic>;
inline constexpr std::size_t self_test_bucket = 64;
inline constexpr std::size_t self_test_n = 5 * self_test_bucket - 3;  // a partial last bucket

/// Fixed input of the self-test in M: bucket 0 normal values, 1 a wide range (max - min
/// overflows M), 2 subnormal values (rescaled encoding: 1/unit overflows), 3 a range
/// from a subnormal to tiny normals, 4 (partial) normal values around a large offset.
template <class M>
void self_test_input(M* x) {
  const M big = largest<M>();
  M tiny = M(1);  // the smallest subnormal of M
  for (int e = 0; e < (std::is_same_v<M, double> ? 1074 : 149); ++e) tiny = tiny / M(2);
  for (std::size_t i = 0; i < self_test_n; ++i) {
    const std::size_t b = i / self_test_bucket, k = i % self_test_bucket;
    const M f = static_cast<M>((k * 37) % 61) / M(61);  // in [0, 1)
    switch (b) {
      case 0: x[i] = (f - M(0.4)) * M(3.75); break;
      case 1: x[i] = (f * M(2) - M(1)) * big * M(0.875); break;
      case 2: x[i] = (f - M(0.25)) * tiny * M(4000); break;
      case 3: x[i] = k == 5 ? tiny * M(3) : f * tiny * M(1e9); break;
      default: x[i] = M(1e4) + f * M(0.001); break;
    }
  }
}

/// Compresses and decodes the fixed buckets with the device kernels of this translation
/// unit and with the host code; throws cgx::error (errc::cuda) if a byte or a decoded
/// value differs.
template <class M>
void self_test_type(cudaStream_t s) {
  using Q = self_test_quantizer;
  constexpr std::size_t n = self_test_n;
  const std::size_t bytes = Q::compressed_bytes<M>(n);
  M x[n];
  self_test_input<M>(x);
  const rng_state rng{.seed = 0x5e1f7e57u, .counter = 3, .stream = 1, .position = (std::uint64_t{1} << 32) + 5};
  std::byte ref[Q::compressed_bytes<M>(self_test_n)];
  M ref_dec[n];
  Q::compress(x, n, ref, rng);
  Q::decompress(ref, n, ref_dec);

  void* mem = nullptr;
  check_cuda(cudaMalloc(&mem, n * sizeof(M) * 2 + bytes), "cgx::quant::device<maxmin> self-test: cudaMalloc");
  struct freer {
    void* p;
    ~freer() { (void)cudaFree(p); }
  } guard{mem};
  M* d_x = static_cast<M*>(mem);
  M* d_y = d_x + n;
  auto* d_wire = reinterpret_cast<std::byte*>(d_y + n);
  std::byte got[sizeof(ref)];
  M got_dec[n];
  check_cuda(cudaMemcpyAsync(d_x, x, sizeof(x), cudaMemcpyHostToDevice, s), "cgx self-test: cudaMemcpyAsync");
  using shape = compress_shape<self_test_bucket>;
  maxmin_compress_kernel<5, self_test_bucket, stochastic, M>
      <<<grid_for(n / self_test_bucket + 1, shape::groups), shape::threads, 0, s>>>(d_x, n, d_wire, rng, true, nullptr);
  check_cuda(cudaGetLastError(), "cgx self-test: compress launch");
  maxmin_decode_kernel<5, self_test_bucket, false, M><<<1, decode_threads, 0, s>>>(d_wire, n, d_y, true);
  check_cuda(cudaGetLastError(), "cgx self-test: decode launch");
  check_cuda(cudaMemcpyAsync(got, d_wire, bytes, cudaMemcpyDeviceToHost, s), "cgx self-test: cudaMemcpyAsync");
  check_cuda(cudaMemcpyAsync(got_dec, d_y, sizeof(got_dec), cudaMemcpyDeviceToHost, s), "cgx self-test: cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(s), "cgx self-test: cudaStreamSynchronize");
  std::size_t bad_byte = bytes, bad_value = n;
  for (std::size_t i = 0; i < bytes && bad_byte == bytes; ++i)
    if (got[i] != ref[i]) bad_byte = i;
  for (std::size_t i = 0; i < n && bad_value == n; ++i) {
    const bool both_nan = ref_dec[i] != ref_dec[i] && got_dec[i] != got_dec[i];
    if (!both_nan && std::memcmp(&ref_dec[i], &got_dec[i], sizeof(M)) != 0) bad_value = i;
  }
  if (bad_byte != bytes || bad_value != n) {
    throw error(errc::cuda,
                std::string("cgx::quant::device<maxmin> self-test: the device's ") +
                    (sizeof(M) == 8 ? "fp64" : "fp32") + " quantizer " +
                    (bad_byte != bytes ? "bytes differ from the host's (first at byte " + std::to_string(bad_byte)
                                       : "decoded values differ from the host's (first at value " +
                                             std::to_string(bad_value)) +
                    "); device and host would not agree bit for bit. Was this translation unit compiled "
                    "with flags that change floating-point arithmetic in a way cgx does not guard against?");
  }
}

/// Runs the self-test once per device and translation unit (see above), before the
/// first kernel of a device<maxmin> call; not while `stream` is being captured into a
/// graph (it would then run at the first call outside a capture).
inline void self_test_once(cudaStream_t stream) {
  static std::mutex m;
  static std::vector<char> done;
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cgx::quant::device<maxmin> self-test: cudaGetDevice");
  {
    std::lock_guard<std::mutex> lock(m);
    if (static_cast<std::size_t>(dev) < done.size() && done[static_cast<std::size_t>(dev)]) return;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cgx::quant::device<maxmin> self-test: cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return;
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cgx self-test: cudaStreamCreate");
  struct destroyer {
    cudaStream_t s;
    ~destroyer() { (void)cudaStreamDestroy(s); }
  } guard{s};
  self_test_type<float>(s);
  self_test_type<double>(s);
  std::lock_guard<std::mutex> lock(m);
  if (done.size() <= static_cast<std::size_t>(dev)) done.resize(static_cast<std::size_t>(dev) + 1, 0);
  done[static_cast<std::size_t>(dev)] = 1;
}

}  // namespace

}  // namespace detail

/// Runs the device quantizer's self-test now on the current device (it otherwise runs
/// before the first device<maxmin> kernel of each translation unit and device): compresses
/// and decodes fixed buckets (normal, wide and subnormal ranges) on the device and
/// compares with the host's bytes and values.
/// \throws cgx::error (errc::cuda) when they differ, or when a CUDA call fails.
inline void device_self_test() { detail::self_test_once(nullptr); }

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
    detail::self_test_once(stream);
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
    detail::self_test_once(stream);
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

namespace cgx::comm {
inline cudaError_t cuda_runtime::increment_u32(std::uint32_t* p, cudaStream_t stream) {
  quant::detail::increment_u32_kernel<<<1, 1, 0, stream>>>(p);
  return cudaGetLastError();
}
}  // namespace cgx::comm
