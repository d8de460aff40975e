#pragma once
/// \file mpi_device.cuh
/// `cgx::comm::mpi_device`: the MPI transport for device buffers, the device transport
/// that `device_allreduce_plan<T, Q, R, comm::mpi>` uses.
///
/// It is comm::basic_host_device (comm/host_device.cuh) over comm::mpi and the CUDA
/// runtime: the *direct* path (MPI_Isend/Irecv get device pointers) when the MPI library
/// is CUDA-aware (asked at run time: `MPIX_Query_cuda_support()` in Open MPI,
/// `MPIX_GPU_query_support` in MPICH; the environment variable `CGX_MPI_CUDA_AWARE=0|1`
/// overrides), else the *staged* path through pinned host memory (Debian's Open MPI and
/// MPICH). host_device.cuh describes both, and the ordering across streams.

#include <mpi.h>
#if defined(OPEN_MPI) && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "../error.hpp"
#include "host_device.cuh"
#include "mpi.hpp"

namespace cgx::comm {

/// True when the MPI library says it can take device pointers (checked at run time).
/// `CGX_MPI_CUDA_AWARE=1` or `=0` in the environment overrides the answer.
inline bool mpi_is_cuda_aware() {
  if (const char* e = std::getenv("CGX_MPI_CUDA_AWARE"); e != nullptr && (e[0] == '0' || e[0] == '1'))
    return e[0] == '1';
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  // Open MPI: the macro says what the library was built with (0 for Debian's); the
  // function what the library loaded at run time supports.
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPIX_GPU_SUPPORT_CUDA)
  int supported = 0;
  if (MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &supported) != MPI_SUCCESS) return false;
  return supported != 0;
#else
  return false;
#endif
}

/// MPI as a device transport (see the file comment): basic_host_device over comm::mpi
/// and the CUDA runtime, with the choice of path. Collective construction and
/// destruction, like comm::mpi, whose communicator it owns. Move-only.
class mpi_device : public basic_host_device<mpi, cuda_runtime> {
  using base = basic_host_device<mpi, cuda_runtime>;

 public:
  /// How device bytes reach MPI.
  enum class path {
    automatic,  ///< direct when mpi_is_cuda_aware(), else staged
    staged,     ///< always through pinned host memory
    direct,     ///< always device pointers (only for a CUDA-aware MPI)
  };

  /// Takes over the (already duplicated) communicator of `x`. Collective.
  explicit mpi_device(mpi x, path how = path::automatic)
      : base(std::move(x), how == path::direct || (how == path::automatic && mpi_is_cuda_aware())) {}
  /// Duplicates `comm` (see comm::mpi). Collective.
  explicit mpi_device(MPI_Comm comm, path how = path::automatic) : mpi_device(mpi(comm), how) {}
};

}  // namespace cgx::comm
