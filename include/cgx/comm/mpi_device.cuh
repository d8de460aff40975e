#pragma once
/// \file mpi_device.cuh
/// `cgx::comm::mpi_device`: the MPI transport for device buffers, the device transport
/// that `device_allreduce_plan<T, Q, R, comm::mpi>` uses.
///
/// Two ways to move device bytes, chosen at construction:
///  - *direct*, when the MPI library is CUDA-aware (asked at run time:
///    `MPIX_Query_cuda_support()` in Open MPI, `MPIX_GPU_query_support` in MPICH; the
///    environment variable `CGX_MPI_CUDA_AWARE=0|1` overrides): MPI_Isend/Irecv get
///    device pointers. The stream is synchronized before the messages are posted.
///  - *staged* otherwise (Debian's Open MPI and MPICH): the workspace is mirrored in
///    pinned host memory. Each outgoing chunk is copied down with its own event and
///    sent as soon as its copy is done, so the copies of later chunks overlap the
///    transfer of earlier ones; each incoming chunk is copied up (cudaMemcpyAsync on the
///    stream) as soon as it has arrived, overlapping the transfers still in flight, and
///    its consumer (decompress_add) is enqueued right behind the copy.
///
/// Either way an exchange blocks the host until its messages are complete (MPI needs
/// the host); what follows an arrival on the stream is not waited for.
///
/// Ordering across streams: the transport's workspace_fence (device_transport.cuh) is
/// recorded on the stream at the end of each exchange, behind the upward copies and the
/// consumers; prepare_send and exchange first make their stream wait for it. Without it
/// a call on stream s2 could let MPI (direct path: it synchronizes s2 only) or an upward
/// copy (staged) write a receive slot that the previous call's decompress_add on s1
/// still reads. Host waits on the GPU (a staged chunk's copy) poll with a growing sleep
/// (detail::poll_until) while driving MPI's progress, instead of spinning on a core.

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
#include "device_transport.cuh"
#include "mpi.hpp"
#include "../detail/tags.hpp"

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

/// MPI as a device transport (see the file comment). Collective construction and
/// destruction, like comm::mpi, whose communicator it owns. Move-only.
class mpi_device {
 public:
  /// How device bytes reach MPI.
  enum class path {
    automatic,  ///< direct when mpi_is_cuda_aware(), else staged
    staged,     ///< always through pinned host memory
    direct,     ///< always device pointers (only for a CUDA-aware MPI)
  };

  /// Takes over the (already duplicated) communicator of `x`. Collective.
  explicit mpi_device(mpi x, path how = path::automatic)
      : x_(std::move(x)), direct_(how == path::direct || (how == path::automatic && mpi_is_cuda_aware())) {
    device_ = detail::current_device("cgx::comm::mpi_device");  // fails early without a device
    fence_ = workspace_fence("cgx::comm::mpi_device");
    h2d_done_ = cuda_event(cudaEventDisableTiming);
    native_done_ = cuda_event(cudaEventDisableTiming);
  }
  /// Duplicates `comm` (see comm::mpi). Collective.
  explicit mpi_device(MPI_Comm comm, path how = path::automatic) : mpi_device(mpi(comm), how) {}

  /// Movable (the plan takes the transport by value); not copyable.
  mpi_device(mpi_device&&) noexcept = default;
  /// Movable; not copyable.
  mpi_device& operator=(mpi_device&&) noexcept = default;
  mpi_device(const mpi_device&) = delete;
  mpi_device& operator=(const mpi_device&) = delete;
  /// Waits for the work that still uses the workspace or the pinned staging memory,
  /// then frees them.
  ~mpi_device() {
    if (fence_.event() == nullptr) return;  // moved from
    detail::device_guard on(device_, std::nothrow);
    fence_.synchronize();
    for (const cuda_event* e : {&h2d_done_, &native_done_})
      if (e->get() != nullptr && cudaEventSynchronize(e->get()) != cudaSuccess) (void)cudaGetLastError();
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return x_.rank(); }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return x_.size(); }
  /// The CUDA device this rank uses (current at construction).
  [[nodiscard]] int device() const noexcept { return device_; }
  /// True when device pointers go to MPI directly; false when staged through the host.
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  /// The host transport underneath.
  [[nodiscard]] mpi& host() noexcept { return x_; }

  /// Collective (in the sense that every rank's plan calls it). A device workspace of
  /// `bytes` bytes, mirrored in pinned host memory when staged.
  std::byte* reserve(std::size_t bytes) {
    detail::device_guard on(device_);
    fence_.wait();
    sync_staging();
    dev_ = device_memory(bytes);
    if (!direct_) host_ = pinned_memory(bytes);
    return dev_.get();
  }

  /// Orders the caller's coming writes to the workspace after the previous exchange's
  /// work on any stream (the fence); no host wait.
  void prepare_send(cudaStream_t stream) {
    detail::device_guard on(device_);
    fence_.order(stream);
  }

  /// Collective: one exchange (see device_transport.cuh). Blocks until every message is
  /// complete; enqueues the upward copies and `arrived`'s work on `stream`.
  template <class F>
  void exchange(std::span<const device_message> sends, std::span<const device_message> recvs, cudaStream_t stream,
                F&& arrived) {
    detail::device_guard on(device_);
    const int tag = tag_base + static_cast<int>(seq_++ & 1u);
    reqs_.clear();
    fence_.order(stream);
    if (direct_) {
      // The sends' bytes are ready, and last exchange's consumers (on whatever stream:
      // the fence) are done with the receive region, once the stream has drained.
      detail::cuda_check(cudaStreamSynchronize(stream), "cgx::comm::mpi_device: cudaStreamSynchronize");
      for (const auto& m : recvs) reqs_.push_back(x_.irecv(dev_.get() + m.offset, m.bytes, m.peer, tag));
      for (const auto& m : sends) reqs_.push_back(x_.isend(dev_.get() + m.offset, m.bytes, m.peer, tag));
      for (std::size_t i = 0; i < recvs.size(); ++i) {
        x_.wait_all(std::span(reqs_.data() + i, 1));
        arrived(i, static_cast<const std::byte*>(dev_.get() + recvs[i].offset));
      }
      fence_.record(stream);
      x_.wait_all(std::span(reqs_.data() + recvs.size(), sends.size()));
      return;
    }
    // Staged. The pinned receive region is free once last exchange's upward copies are done.
    detail::cuda_check(cudaEventSynchronize(h2d_done_.get()), "cgx::comm::mpi_device: cudaEventSynchronize (staging)");
    for (const auto& m : recvs) reqs_.push_back(x_.irecv(host_.get() + m.offset, m.bytes, m.peer, tag));
    while (events_.size() < sends.size()) events_.emplace_back(cudaEventDisableTiming);
    // One copy per distinct source (an allgather sends one slot to every peer: copying it
    // again would rewrite bytes that a posted MPI_Isend is reading).
    copy_of_.resize(sends.size());
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const auto& m = sends[i];
      if (i > 0 && m.offset == sends[i - 1].offset && m.bytes == sends[i - 1].bytes) {
        copy_of_[i] = copy_of_[i - 1];
        continue;
      }
      copy_of_[i] = i;
      detail::cuda_check(cudaMemcpyAsync(host_.get() + m.offset, dev_.get() + m.offset, m.bytes,
                                         cudaMemcpyDeviceToHost, stream),
                         "cgx::comm::mpi_device: cudaMemcpyAsync (device to pinned host)");
      detail::cuda_check(cudaEventRecord(events_[i].get(), stream), "cgx::comm::mpi_device: cudaEventRecord");
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      if (copy_of_[i] == i) wait_event(events_[i].get(), recvs.size());
      const auto& m = sends[i];
      reqs_.push_back(x_.isend(host_.get() + m.offset, m.bytes, m.peer, tag));
    }
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const auto& m = recvs[i];
      x_.wait_all(std::span(reqs_.data() + i, 1));
      detail::cuda_check(cudaMemcpyAsync(dev_.get() + m.offset, host_.get() + m.offset, m.bytes,
                                         cudaMemcpyHostToDevice, stream),
                         "cgx::comm::mpi_device: cudaMemcpyAsync (pinned host to device)");
      arrived(i, static_cast<const std::byte*>(dev_.get() + m.offset));
    }
    detail::cuda_check(cudaEventRecord(h2d_done_.get(), stream), "cgx::comm::mpi_device: cudaEventRecord");
    fence_.record(stream);
    x_.wait_all(std::span(reqs_.data() + recvs.size(), sends.size()));
  }

  /// Collective: element-wise maximum over all ranks (host values).
  void max_all(std::span<std::int64_t> v) { x_.max_all(v); }

  /// MPI_Allreduce (sum, in place) of d_buf[0..n) on the device: direct, or through
  /// pinned host memory (grown on first use to the largest n seen). Synchronizes
  /// `stream` before MPI runs; the result is ready in stream order. float and double.
  template <class T>
    requires(std::is_same_v<T, float> || std::is_same_v<T, double>)
  void native_allreduce(T* d_buf, std::size_t n, cudaStream_t stream) {
    if (n == 0) return;
    detail::device_guard on(device_);
    const std::size_t bytes = n * sizeof(T);
    if (direct_) {
      detail::cuda_check(cudaStreamSynchronize(stream), "cgx::comm::mpi_device: cudaStreamSynchronize");
      x_.native_allreduce(d_buf, n);
      return;
    }
    detail::cuda_check(cudaEventSynchronize(native_done_.get()), "cgx::comm::mpi_device: cudaEventSynchronize");
    if (native_.size() < bytes) native_ = pinned_memory(bytes);
    T* h = reinterpret_cast<T*>(native_.get());
    detail::cuda_check(cudaMemcpyAsync(h, d_buf, bytes, cudaMemcpyDeviceToHost, stream),
                       "cgx::comm::mpi_device: cudaMemcpyAsync (native allreduce, down)");
    detail::cuda_check(cudaStreamSynchronize(stream), "cgx::comm::mpi_device: cudaStreamSynchronize");
    x_.native_allreduce(h, n);
    detail::cuda_check(cudaMemcpyAsync(d_buf, h, bytes, cudaMemcpyHostToDevice, stream),
                       "cgx::comm::mpi_device: cudaMemcpyAsync (native allreduce, up)");
    detail::cuda_check(cudaEventRecord(native_done_.get(), stream), "cgx::comm::mpi_device: cudaEventRecord");
  }

 private:
  static constexpr int tag_base = cgx::detail::tag_value(cgx::detail::tag::device_even);  // + 1: odd exchanges

  /// Waits for `ev` on the host while driving MPI's progress on the receives posted
  /// (MPI_Testall on the first one's requests), polling with a growing sleep.
  void wait_event(cudaEvent_t ev, std::size_t nrecv) {
    detail::poll_until([&] {
      const cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) detail::cuda_check(e, "cgx::comm::mpi_device: cudaEventQuery");
      if (nrecv != 0) {
        int done = 0;
        detail::check_mpi(MPI_Testall(2, reqs_[0].r, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      }
      return false;
    });
  }

  void sync_staging() {
    if (h2d_done_.get() != nullptr)
      detail::cuda_check(cudaEventSynchronize(h2d_done_.get()), "cgx::comm::mpi_device: cudaEventSynchronize");
  }

  mpi x_;
  bool direct_ = false;
  int device_ = 0;
  workspace_fence fence_;
  std::uint32_t seq_ = 0;
  device_memory dev_;
  pinned_memory host_;
  pinned_memory native_;
  cuda_event h2d_done_;
  cuda_event native_done_;
  std::vector<cuda_event> events_;
  std::vector<std::size_t> copy_of_;
  std::vector<mpi::request> reqs_;
};

}  // namespace cgx::comm
