#pragma once
/// \file quant.cuh
/// The quantizers of cgx for CUDA code without MPI: the host quantizers of cgx.hpp
/// (maxmin, none, the wire format, the random bits) plus their CUDA kernels,
/// `cgx::quant::device<Q>` (maxmin.cuh). Include from .cu files. <cgx/cgx.cuh> adds
/// the collectives when MPI is available.

// maxmin.cuh first: it includes the shared wire-format headers with nvcc's warning
// about std::numeric_limits in __host__ __device__ code silenced (see there).
#include "quant/maxmin.cuh"
#include "quant/rotated.cuh"

#include "config.hpp"
#include "error.hpp"
#include "concepts.hpp"
#include "quant/rounding.hpp"
#include "quant/philox.hpp"
#include "quant/wire_format.hpp"
#include "quant/host_exec.hpp"
#include "quant/none.hpp"
#include "quant/maxmin.hpp"
#include "quant/rotated.hpp"
