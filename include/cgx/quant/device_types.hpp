#pragma once
/// \file device_types.hpp
/// __half and __nv_bfloat16 as input types of the kernel bodies (kernel_bodies.hpp):
/// loads convert to float exactly, stores round to nearest once. Needs the CUDA
/// toolkit's cuda_fp16.h and cuda_bf16.h, whose conversions are host-callable too, so
/// a plain host compiler given the toolkit's include folder compiles this header (the
/// host tests of the kernel bodies do).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernel_bodies.hpp"

namespace cgx::quant::detail {

/// __half: float arithmetic and metadata.
template <>
struct value_conv<__half> {
  CGX_HOST_DEVICE CGX_FORCEINLINE static float to_meta(__half v) { return __half2float(v); }
  CGX_HOST_DEVICE CGX_FORCEINLINE static __half from_meta(float v) { return __float2half_rn(v); }
};

/// __nv_bfloat16: float arithmetic and metadata.
template <>
struct value_conv<__nv_bfloat16> {
  CGX_HOST_DEVICE CGX_FORCEINLINE static float to_meta(__nv_bfloat16 v) { return __bfloat162float(v); }
  CGX_HOST_DEVICE CGX_FORCEINLINE static __nv_bfloat16 from_meta(float v) { return __float2bfloat16_rn(v); }
};

}  // namespace cgx::quant::detail
