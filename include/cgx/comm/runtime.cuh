#pragma once
/// \file runtime.cuh
/// The CUDA runtime as a policy: every runtime call that the device transports
/// (comm::cuda_ipc, their owning memory, events and fences) and the device schedules
/// (comm::device_sra, comm::device_ring) make goes through a type R with these static
/// members, and the kernels they launch are `R::kernels<Q>`.
///
/// `cuda_runtime` forwards each call to the CUDA runtime of the same name and launches
/// quant::device<Q>'s kernels: that is what every user gets. The policy exists so that
/// the same transports and schedules can run, unchanged, over a *simulated* runtime on
/// a machine without a GPU (tests/sim_runtime.hpp: queued streams, counter events,
/// randomized interleaving, a happens-before checker of every device byte): the
/// stream ordering, slot reuse across streams and calls, and teardown order of the
/// device code are then tested on every CI run.
///
/// A runtime policy R provides, with the CUDA runtime's signatures and error codes:
/// malloc, free, host_alloc, free_host, pointer_attributes, event_create (with flags),
/// event_destroy, event_record, event_record_with_flags, event_query, event_synchronize,
/// stream_wait_event, stream_wait_event_with_flags, stream_synchronize,
/// stream_is_capturing, memcpy_async, increment_u32 (a one-thread kernel: *p += 1 in
/// stream order), ipc_post and ipc_wait (comm::cuda_ipc's device synchronization), get_device, set_device, get_last_error,
/// error_name, error_string, ipc_get_mem_handle, ipc_open_mem_handle,
/// ipc_close_mem_handle, ipc_get_event_handle, ipc_open_event_handle; and the alias
/// template `kernels<Q>` (compressed_bytes, compress, decompress, decompress_add, as
/// quant::device<Q>). Handles (cudaStream_t, cudaEvent_t) are opaque to the code that
/// uses them, so a simulated runtime hands out its own objects behind the same types.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

namespace cgx::quant {
template <class Q>
struct device;  // CUDA kernels of quantizer Q (quant/maxmin.cuh)
}  // namespace cgx::quant

namespace cgx::comm {

/// The CUDA runtime itself (see the file comment). Stateless.
struct cuda_runtime {
  /// The CUDA kernels of quantizer Q (defined in quant/maxmin.cuh, compiled by nvcc).
  template <class Q>
  using kernels = quant::device<Q>;

  /// cudaMalloc.
  static cudaError_t malloc(void** p, std::size_t bytes) { return cudaMalloc(p, bytes); }
  /// cudaFree.
  static cudaError_t free(void* p) { return cudaFree(p); }
  /// cudaHostAlloc (cudaHostAllocDefault).
  static cudaError_t host_alloc(void** p, std::size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocDefault); }
  /// cudaFreeHost.
  static cudaError_t free_host(void* p) { return cudaFreeHost(p); }
  /// cudaPointerGetAttributes.
  static cudaError_t pointer_attributes(cudaPointerAttributes* a, const void* p) {
    return cudaPointerGetAttributes(a, p);
  }
  /// cudaEventCreateWithFlags.
  static cudaError_t event_create(cudaEvent_t* e, unsigned flags) { return cudaEventCreateWithFlags(e, flags); }
  /// cudaEventDestroy.
  static cudaError_t event_destroy(cudaEvent_t e) { return cudaEventDestroy(e); }
  /// cudaEventRecord.
  static cudaError_t event_record(cudaEvent_t e, cudaStream_t s) { return cudaEventRecord(e, s); }
  /// cudaEventRecordWithFlags (cudaEventRecordExternal: a node of a graph being captured).
  static cudaError_t event_record_with_flags(cudaEvent_t e, cudaStream_t s, unsigned flags) {
    return cudaEventRecordWithFlags(e, s, flags);
  }
  /// cudaEventQuery.
  static cudaError_t event_query(cudaEvent_t e) { return cudaEventQuery(e); }
  /// cudaEventSynchronize.
  static cudaError_t event_synchronize(cudaEvent_t e) { return cudaEventSynchronize(e); }
  /// cudaStreamWaitEvent (flags 0).
  static cudaError_t stream_wait_event(cudaStream_t s, cudaEvent_t e) { return cudaStreamWaitEvent(s, e, 0); }
  /// cudaStreamWaitEvent with `flags` (cudaEventWaitExternal: a node of a graph being captured).
  static cudaError_t stream_wait_event_with_flags(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    return cudaStreamWaitEvent(s, e, flags);
  }
  /// cudaStreamSynchronize.
  static cudaError_t stream_synchronize(cudaStream_t s) { return cudaStreamSynchronize(s); }
  /// cudaStreamIsCapturing.
  static cudaError_t stream_is_capturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
    return cudaStreamIsCapturing(s, status);
  }
  /// `*p += 1` on the device, in `stream` order (one thread; a graph node when `stream`
  /// captures). Defined with the kernels, in quant/maxmin.cuh (nvcc only).
  static cudaError_t increment_u32(std::uint32_t* p, cudaStream_t stream);
  /// comm::cuda_ipc's post: word `slot` of synchronization block `sync` written behind the
  /// work on `stream` (a one-thread kernel). Defined in comm/cuda_ipc.cuh.
  static cudaError_t ipc_post(std::uint32_t* sync, unsigned slot, cudaStream_t stream);
  /// comm::cuda_ipc's wait: `stream` waits until word `slot` of each of the `p` blocks in
  /// the device array `peers` reaches word 0 (the epoch) of `mine`, at most `limit_ns`
  /// (0: no limit; past it the first such wait claims word 3 of `mine`, reports in
  /// `fault`, pinned host memory, and every one traps).
  /// A one-block kernel. Defined in comm/cuda_ipc.cuh.
  static cudaError_t ipc_wait(const std::uint32_t* const* peers, int p, std::uint32_t* mine, unsigned slot,
                              std::uint64_t limit_ns, void* fault, cudaStream_t stream);
  /// cudaMemcpyAsync.
  static cudaError_t memcpy_async(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                  cudaStream_t s) {
    return cudaMemcpyAsync(dst, src, bytes, kind, s);
  }
  /// cudaGetDevice.
  static cudaError_t get_device(int* d) { return cudaGetDevice(d); }
  /// cudaSetDevice.
  static cudaError_t set_device(int d) { return cudaSetDevice(d); }
  /// cudaGetLastError.
  static cudaError_t get_last_error() { return cudaGetLastError(); }
  /// cudaGetErrorName.
  static const char* error_name(cudaError_t e) { return cudaGetErrorName(e); }
  /// cudaGetErrorString.
  static const char* error_string(cudaError_t e) { return cudaGetErrorString(e); }
  /// cudaIpcGetMemHandle.
  static cudaError_t ipc_get_mem_handle(cudaIpcMemHandle_t* h, void* p) { return cudaIpcGetMemHandle(h, p); }
  /// cudaIpcOpenMemHandle.
  static cudaError_t ipc_open_mem_handle(void** p, cudaIpcMemHandle_t h, unsigned flags) {
    return cudaIpcOpenMemHandle(p, h, flags);
  }
  /// cudaIpcCloseMemHandle.
  static cudaError_t ipc_close_mem_handle(void* p) { return cudaIpcCloseMemHandle(p); }
  /// cudaIpcGetEventHandle.
  static cudaError_t ipc_get_event_handle(cudaIpcEventHandle_t* h, cudaEvent_t e) {
    return cudaIpcGetEventHandle(h, e);
  }
  /// cudaIpcOpenEventHandle.
  static cudaError_t ipc_open_event_handle(cudaEvent_t* e, cudaIpcEventHandle_t h) {
    return cudaIpcOpenEventHandle(e, h);
  }
};

namespace detail {
template <class X>
struct runtime_of_impl {
  using type = cuda_runtime;
};
template <class X>
  requires requires { typename X::runtime_type; }
struct runtime_of_impl<X> {
  using type = typename X::runtime_type;
};
}  // namespace detail

/// The runtime policy of device transport X: X::runtime_type where X names one (the
/// transports that are templates over it), else cuda_runtime.
template <class X>
using runtime_of = typename detail::runtime_of_impl<X>::type;

}  // namespace cgx::comm
