#pragma once
/// \file device_schedule.cuh
/// What the device schedules (device_sra.cuh, device_ring.cuh, device_tree.cuh) are
/// made of: the device transport contract and its messages, the runtime policy whose
/// kernels they enqueue, the chunking, and their common base.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <cuda_runtime.h>

#if defined(__CUDACC__)
#include "../quant/maxmin.cuh"  // cuda_runtime's kernels (a simulated runtime brings its own)
#endif
#include "../quant/rounding.hpp"
#include "chunking.hpp"
#include "device_transport.cuh"
#include "runtime.cuh"

namespace cgx::comm {

/// The kernels a device schedule for quantizer Q enqueues over transport X: those of X's
/// runtime policy (comm/runtime.cuh: `quant::device<Q>` on the CUDA runtime).
template <class Q, class X>
using device_kernels = typename runtime_of<X>::template kernels<Q>;

}  // namespace cgx::comm
