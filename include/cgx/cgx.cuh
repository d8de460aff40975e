#pragma once
/// \file cgx.cuh
/// The full umbrella header of cgx, for .cu files: the quantizers with their CUDA
/// kernels (<cgx/quant.cuh>, no MPI needed), the layer-wise device plan
/// (<cgx/layerwise_plan.cuh>), the device-buffer plans (`cgx::device_allreduce_plan`,
/// `cgx::device_reduce_scatter_plan`, `cgx::device_allgather_plan`)
/// with the device transport comm::cuda_ipc and its MPI-free process group
/// (comm::run_forked, comm::socket_bootstrap) and, when <mpi.h> is on the include path,
/// everything of the host umbrella <cgx/cgx.hpp> (collectives, transports, plans) plus
/// comm::mpi_device and comm::mpi_bootstrap. comm::nccl needs NCCL: include
/// <cgx/comm/nccl.cuh> and link cgx::nccl.

#include "quant.cuh"
#include "layerwise_plan.cuh"  // needs no MPI: any transport on host memory
#include "comm/bootstrap.hpp"
#include "comm/fork_group.hpp"
#include "comm/cuda_ipc.cuh"
#include "device_plan.cuh"
#include "device_collectives.cuh"

#if __has_include(<mpi.h>)
#include "cgx.hpp"
#include "comm/mpi_bootstrap.hpp"
#include "comm/mpi_device.cuh"
#endif
