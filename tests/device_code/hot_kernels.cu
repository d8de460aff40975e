// The translation unit of the device-code check (check_device_code.py, CMakeLists.txt):
// compiled to PTX and a cubin only, never linked or run. It instantiates the hot kernels of
// cgx::quant::device<maxmin> (maxmin.cuh) and of device<none> (add_kernel) and small probe
// kernels, each of which holds one function of the per-bucket arithmetic (wire_format.hpp)
// and nothing else, so that the check can hold that arithmetic to the strictest rule
// without the surrounding code.
//
// Built with -DCGX_DC_MUTANT (check_device_code.py --mutant-build), against a copy of the
// headers whose exact arithmetic is removed, it holds a few of them and a kernel with a
// local array: the mutant on which every SASS rule is shown to fail.
#include <cstddef>
#include <cstdint>

#include <cgx/quant/maxmin.cuh>

namespace cgx::quant::detail {

#if !defined(CGX_DC_MUTANT)
// ---- the hot kernels ------------------------------------------------------------------
// Compress: float and __half, nearest and stochastic, 1, 2, 4 and 8 bits, buckets of 128
// (a logical warp per bucket), 1024 (a block) and 16384 (a block, 8 positions per lane);
// double and __nv_bfloat16 once each; every width 1..8 (the GPU tests' check_config runs
// them all) at least once, with __nv_bfloat16 for both roundings. (The first-use
// self-test adds compress and decode of maxmin<5, 64> for float and double.)
#define CGX_DC_COMPRESS(BITS, B, R, T)                                                              \
  template __global__ void maxmin_compress_kernel<BITS, B, R, T>(const T* __restrict__, std::size_t, \
                                                                  std::byte* __restrict__, rng_state, bool, std::uint32_t*);
CGX_DC_COMPRESS(4, 1024, stochastic, float)
CGX_DC_COMPRESS(4, 1024, nearest, float)
CGX_DC_COMPRESS(4, 1024, stochastic, __half)
CGX_DC_COMPRESS(4, 1024, nearest, __half)
CGX_DC_COMPRESS(1, 128, stochastic, float)
CGX_DC_COMPRESS(2, 128, nearest, __half)
CGX_DC_COMPRESS(8, 16384, stochastic, float)
CGX_DC_COMPRESS(8, 16384, nearest, __half)
CGX_DC_COMPRESS(2, 16384, stochastic, __half)
CGX_DC_COMPRESS(1, 1024, nearest, float)
CGX_DC_COMPRESS(4, 1024, stochastic, double)
CGX_DC_COMPRESS(4, 1024, stochastic, __nv_bfloat16)
CGX_DC_COMPRESS(3, 1024, nearest, __nv_bfloat16)
CGX_DC_COMPRESS(6, 1024, stochastic, float)
CGX_DC_COMPRESS(7, 1024, nearest, __half)
// Issue 19 defect 5: a bucket of 2^20 (512 positions per lane). CGX_UNROLL once unrolled
// its per-lane loop fully: about 4 minutes of nvcc and a 1.2 MB cubin for this kernel
// alone. Bounded, it is 5.6 k lines of PTX; check_device_code.py caps every kernel's
// instructions (MAX_INSTRUCTIONS).
CGX_DC_COMPRESS(4, 1048576, stochastic, float)
#undef CGX_DC_COMPRESS

// Decompress and decompress-add (the owner's add before it re-quantizes its sum: SRA's
// add-requantize is decompress-add then compress, two of these kernels).
#define CGX_DC_DECODE(BITS, B, ADD, T)                                                                     \
  template __global__ void maxmin_decode_kernel<BITS, B, ADD, T>(const std::byte* __restrict__, std::size_t, \
                                                                  T* __restrict__, bool);
CGX_DC_DECODE(4, 1024, false, float)
CGX_DC_DECODE(4, 1024, true, float)
CGX_DC_DECODE(4, 1024, true, __half)
CGX_DC_DECODE(1, 128, true, float)
CGX_DC_DECODE(8, 16384, true, __half)
CGX_DC_DECODE(2, 16384, false, float)
CGX_DC_DECODE(4, 1024, true, double)
CGX_DC_DECODE(4, 1024, true, __nv_bfloat16)
CGX_DC_DECODE(3, 1024, false, __nv_bfloat16)
CGX_DC_DECODE(6, 1024, true, float)
CGX_DC_DECODE(7, 1024, false, __half)
#undef CGX_DC_DECODE

// The elementwise add of device<none>::decompress_add.
template __global__ void add_kernel<float>(const float* __restrict__, std::size_t, float* __restrict__);
template __global__ void add_kernel<__half>(const __half* __restrict__, std::size_t, __half* __restrict__);
template __global__ void add_kernel<__nv_bfloat16>(const __nv_bfloat16* __restrict__, std::size_t,
                                                   __nv_bfloat16* __restrict__);
#endif  // !CGX_DC_MUTANT

// ---- probes: one function of wire_format.hpp each --------------------------------------
// Operands come from memory, so nothing is folded at compile time.

template <int Bits, class M>
__global__ void probe_bucket_params(const M* lo, const M* hi, bucket_params<M>* out) {
  out[threadIdx.x] = make_bucket_params<Bits, M>(lo[threadIdx.x], hi[threadIdx.x], true);
}
// The rounding offset is the kernels' own (rounding_offsets): 1/2, or h 2^-16 with h a
// 16-bit integer, whose flushing or widening is exact.
template <int Bits, bool Scaled, class R, class M>
__global__ void probe_encode(const M* x, const M* q, rng_state rng, std::uint32_t* out) {
  const rounding_offsets<R> off(rng, 0, threadIdx.x);
  out[threadIdx.x] = encode_value<Bits, Scaled, M>(x[threadIdx.x], q[0], q[1], off.template get<M>(threadIdx.x & 7));
}
template <int Bits, class R, class M>
__global__ void probe_encode_wide(const M* x, const M* q, rng_state rng, std::uint32_t* out) {
  const rounding_offsets<R> off(rng, 0, threadIdx.x);
  out[threadIdx.x] = encode_value_wide<Bits, M>(x[threadIdx.x], q[0], q[1], off.template get<M>(threadIdx.x & 7));
}
template <class M>
__global__ void probe_decode(const std::uint32_t* c, const M* q, M* out) {
  out[threadIdx.x] = decode_value<M>(c[threadIdx.x], q[0], q[1]);
}
template <class M>
__global__ void probe_decode_wide(const std::uint32_t* c, const M* q, M* out) {
  out[threadIdx.x] = decode_value_wide<M>(c[threadIdx.x], q[0], q[1]);
}
template <int Bits, class M>
__global__ void probe_is_wide(const M* q, bool* out) {
  out[threadIdx.x] = is_wide<Bits, M>(q[2 * threadIdx.x], q[2 * threadIdx.x + 1]);
}

#if !defined(CGX_DC_MUTANT)
template __global__ void probe_bucket_params<4, float>(const float*, const float*, bucket_params<float>*);
template __global__ void probe_bucket_params<1, float>(const float*, const float*, bucket_params<float>*);
template __global__ void probe_bucket_params<4, double>(const double*, const double*, bucket_params<double>*);
template __global__ void probe_encode<4, false, stochastic, float>(const float*, const float*, rng_state, std::uint32_t*);
template __global__ void probe_encode<4, false, nearest, float>(const float*, const float*, rng_state, std::uint32_t*);
template __global__ void probe_encode<4, true, stochastic, float>(const float*, const float*, rng_state, std::uint32_t*);
template __global__ void probe_encode<4, false, stochastic, double>(const double*, const double*, rng_state, std::uint32_t*);
template __global__ void probe_encode_wide<4, stochastic, float>(const float*, const float*, rng_state, std::uint32_t*);
template __global__ void probe_encode_wide<4, nearest, float>(const float*, const float*, rng_state, std::uint32_t*);
template __global__ void probe_encode_wide<4, stochastic, double>(const double*, const double*, rng_state, std::uint32_t*);
template __global__ void probe_decode<float>(const std::uint32_t*, const float*, float*);
template __global__ void probe_decode<double>(const std::uint32_t*, const double*, double*);
template __global__ void probe_decode_wide<float>(const std::uint32_t*, const float*, float*);
template __global__ void probe_decode_wide<double>(const std::uint32_t*, const double*, double*);
template __global__ void probe_is_wide<4, float>(const float*, bool*);
#else
// ---- the mutant: a few kernels over the mutated headers, and a local array ------------
template __global__ void maxmin_compress_kernel<4, 1024, stochastic, float>(const float* __restrict__, std::size_t,
                                                                           std::byte* __restrict__, rng_state, bool,
                                                                           std::uint32_t*);
template __global__ void maxmin_decode_kernel<4, 1024, true, float>(const std::byte* __restrict__, std::size_t,
                                                                    float* __restrict__, bool);
template __global__ void probe_bucket_params<4, float>(const float*, const float*, bucket_params<float>*);
template __global__ void probe_encode<4, false, stochastic, float>(const float*, const float*, rng_state, std::uint32_t*);
template __global__ void probe_decode<float>(const std::uint32_t*, const float*, float*);
// An array too large for registers, indexed at run time: it lives in local memory (STL/LDL).
__global__ void probe_mutant_local(const int* idx, int n, float* out) {
  float a[256];
  for (int i = 0; i < n; ++i) a[idx[i] & 255] = out[i];
  out[threadIdx.x] = a[idx[threadIdx.x] & 255];
}
#endif  // CGX_DC_MUTANT

}  // namespace cgx::quant::detail
