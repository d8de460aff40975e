#pragma once
/// \file cgx.cuh
/// The full umbrella header of cgx, for .cu files: the quantizers with their CUDA
/// kernels (<cgx/quant.cuh>, no MPI needed), the layer-wise device plan
/// (<cgx/layerwise_plan.cuh>) and, when <mpi.h> is on the include path, everything of
/// the host umbrella <cgx/cgx.hpp> (collectives, transports, plans) plus the
/// device-buffer plan (`cgx::device_allreduce_plan`) and the device transports
/// comm::mpi_device and comm::cuda_ipc. comm::nccl needs NCCL: include
/// <cgx/comm/nccl.cuh> and link cgx::nccl.
/// Code that must build without MPI includes <cgx/quant.cuh> directly.

#include "quant.cuh"
#include "layerwise_plan.cuh"  // needs no MPI: any transport on host memory

#if __has_include(<mpi.h>)
#include "cgx.hpp"
#include "comm/cuda_ipc.cuh"
#include "comm/mpi_device.cuh"
#include "device_plan.cuh"
#endif
