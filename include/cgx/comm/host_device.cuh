#pragma once
/// \file host_device.cuh
/// `cgx::comm::basic_host_device<H, R>`: a device transport over a *host* transport H
/// (a cgx::transport: isend/irecv/wait_all/max_all on host pointers) and a CUDA runtime
/// policy R (comm/runtime.cuh). `comm::mpi_device` (comm/mpi_device.cuh) is this over
/// comm::mpi and the CUDA runtime; the tests also run it over thread-ranks and a
/// simulated runtime.
///
/// Two ways to move device bytes, chosen at construction:
///  - *direct*: H gets device pointers (a CUDA-aware MPI). The stream is synchronized
///    before the messages are posted.
///  - *staged*: the workspace is mirrored in pinned host memory. Each outgoing chunk is
///    copied down with its own event and sent as soon as its copy is done, so the copies
///    of later chunks overlap the transfer of earlier ones; each incoming chunk is
///    copied up (cudaMemcpyAsync on the stream) as soon as it has arrived, overlapping
///    the transfers still in flight, and its consumer (decompress_add) is enqueued right
///    behind the copy.
///
/// Either way an exchange blocks the host until its messages are complete (H needs the
/// host); what follows an arrival on the stream is not waited for.
///
/// Ordering across streams: the transport's workspace_fence (device_transport.cuh) is
/// recorded on the stream at the end of each exchange, behind the upward copies and the
/// consumers; prepare_send and exchange first make their stream wait for it. Without it
/// a call on stream s2 could let H (direct path: it synchronizes s2 only) or an upward
/// copy (staged) write a receive slot that the previous call's decompress_add on s1
/// still reads. Host waits on the GPU (a staged chunk's copy) poll with a growing sleep
/// (detail::poll_until) while driving H's progress (comm::progress), instead of
/// spinning on a core.

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "../concepts.hpp"
#include "../detail/tags.hpp"
#include "../error.hpp"
#include "device_transport.cuh"
#include "runtime.cuh"

namespace cgx::comm {

/// A device transport over host transport H and runtime R (see the file comment).
/// Collective construction and destruction where H's are. Move-only.
template <class H, class R = cuda_runtime>
class basic_host_device {
  static_assert(transport<H>, "cgx::comm::basic_host_device: H must be a host transport (cgx::transport)");

 public:
  /// The runtime policy its calls go through.
  using runtime_type = R;

  /// Takes over host transport `x`; `direct`: H gets device pointers (it must accept
  /// them), else the bytes are staged through pinned host memory.
  explicit basic_host_device(H x, bool direct = false) : x_(std::move(x)), direct_(direct) {
    device_ = detail::current_device<R>("cgx::comm::mpi_device");  // fails early without a device
    fence_ = basic_workspace_fence<R>("cgx::comm::mpi_device");
    h2d_done_ = basic_cuda_event<R>(cudaEventDisableTiming);
    native_done_ = basic_cuda_event<R>(cudaEventDisableTiming);
  }

  /// Movable (the plan takes the transport by value); not copyable.
  basic_host_device(basic_host_device&&) noexcept = default;
  /// Movable; not copyable.
  basic_host_device& operator=(basic_host_device&&) noexcept = default;
  basic_host_device(const basic_host_device&) = delete;
  basic_host_device& operator=(const basic_host_device&) = delete;
  /// Waits for the work that still uses the workspace or the pinned staging memory,
  /// then frees them.
  ~basic_host_device() {
    if (fence_.event() == nullptr) return;  // moved from
    guard on(device_, std::nothrow);
    fence_.synchronize();
    for (const basic_cuda_event<R>* e : {&h2d_done_, &native_done_})
      if (e->get() != nullptr && R::event_synchronize(e->get()) != cudaSuccess) (void)R::get_last_error();
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return x_.rank(); }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return x_.size(); }
  /// The CUDA device this rank uses (current at construction).
  [[nodiscard]] int device() const noexcept { return device_; }
  /// True when device pointers go to H directly; false when staged through the host.
  [[nodiscard]] bool direct() const noexcept { return direct_; }
  /// The host transport underneath.
  [[nodiscard]] H& host() noexcept { return x_; }

  /// Collective (in the sense that every rank's plan calls it). A device workspace of
  /// `bytes` bytes, mirrored in pinned host memory when staged.
  std::byte* reserve(std::size_t bytes) {
    guard on(device_);
    fence_.wait();
    sync_staging();
    dev_ = basic_device_memory<R>(bytes);
    if (!direct_) host_ = basic_pinned_memory<R>(bytes);
    return dev_.get();
  }

  /// Orders the caller's coming writes to the workspace after the previous exchange's
  /// work on any stream (the fence); no host wait.
  void prepare_send(cudaStream_t stream) {
    guard on(device_);
    fence_.order(stream);
  }

  /// Records the workspace fence behind the work enqueued on `stream` so far; no host wait.
  void fence(cudaStream_t stream) {
    guard on(device_);
    fence_.record(stream);
  }

  /// Collective: one exchange (see device_transport.cuh). Blocks until every message is
  /// complete; enqueues the upward copies and `arrived`'s work on `stream`.
  template <class F>
  void exchange(std::span<const device_message> sends, std::span<const device_message> recvs, cudaStream_t stream,
                F&& arrived) {
    guard on(device_);
    const int tag = tag_base + static_cast<int>(seq_++ & 1u);
    reqs_.clear();
    fence_.order(stream);
    if (direct_) {
      // The sends' bytes are ready, and last exchange's consumers (on whatever stream:
      // the fence) are done with the receive region, once the stream has drained.
      detail::cuda_check<R>(R::stream_synchronize(stream), "cgx::comm::mpi_device: cudaStreamSynchronize");
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
    detail::cuda_check<R>(R::event_synchronize(h2d_done_.get()),
                          "cgx::comm::mpi_device: cudaEventSynchronize (staging)");
    for (const auto& m : recvs) reqs_.push_back(x_.irecv(host_.get() + m.offset, m.bytes, m.peer, tag));
    while (events_.size() < sends.size()) events_.emplace_back(cudaEventDisableTiming);
    // One copy per distinct source (an allgather sends one slot to every peer: copying it
    // again would rewrite bytes that a posted send is reading).
    copy_of_.resize(sends.size());
    for (std::size_t i = 0; i < sends.size(); ++i) {
      const auto& m = sends[i];
      if (i > 0 && m.offset == sends[i - 1].offset && m.bytes == sends[i - 1].bytes) {
        copy_of_[i] = copy_of_[i - 1];
        continue;
      }
      copy_of_[i] = i;
      detail::cuda_check<R>(
          R::memcpy_async(host_.get() + m.offset, dev_.get() + m.offset, m.bytes, cudaMemcpyDeviceToHost, stream),
          "cgx::comm::mpi_device: cudaMemcpyAsync (device to pinned host)");
      detail::cuda_check<R>(R::event_record(events_[i].get(), stream), "cgx::comm::mpi_device: cudaEventRecord");
    }
    for (std::size_t i = 0; i < sends.size(); ++i) {
      if (copy_of_[i] == i) wait_event(events_[i].get());
      const auto& m = sends[i];
      reqs_.push_back(x_.isend(host_.get() + m.offset, m.bytes, m.peer, tag));
    }
    for (std::size_t i = 0; i < recvs.size(); ++i) {
      const auto& m = recvs[i];
      x_.wait_all(std::span(reqs_.data() + i, 1));
      detail::cuda_check<R>(
          R::memcpy_async(dev_.get() + m.offset, host_.get() + m.offset, m.bytes, cudaMemcpyHostToDevice, stream),
          "cgx::comm::mpi_device: cudaMemcpyAsync (pinned host to device)");
      arrived(i, static_cast<const std::byte*>(dev_.get() + m.offset));
    }
    detail::cuda_check<R>(R::event_record(h2d_done_.get(), stream), "cgx::comm::mpi_device: cudaEventRecord");
    fence_.record(stream);
    x_.wait_all(std::span(reqs_.data() + recvs.size(), sends.size()));
  }

  /// Collective: element-wise maximum over all ranks (host values).
  void max_all(std::span<std::int64_t> v) { x_.max_all(v); }

  /// H's own uncompressed sum (MPI_Allreduce, in place) of d_buf[0..n) on the device:
  /// direct, or through pinned host memory (grown on first use to the largest n seen).
  /// Synchronizes `stream` before H runs; the result is ready in stream order. float and
  /// double, where H has native_allreduce.
  template <class T>
    requires((std::is_same_v<T, float> || std::is_same_v<T, double>) &&
             requires(H& h, T* p, std::size_t n) { h.native_allreduce(p, n); })
  void native_allreduce(T* d_buf, std::size_t n, cudaStream_t stream) {
    if (n == 0) return;
    guard on(device_);
    const std::size_t bytes = n * sizeof(T);
    if (direct_) {
      detail::cuda_check<R>(R::stream_synchronize(stream), "cgx::comm::mpi_device: cudaStreamSynchronize");
      x_.native_allreduce(d_buf, n);
      return;
    }
    detail::cuda_check<R>(R::event_synchronize(native_done_.get()), "cgx::comm::mpi_device: cudaEventSynchronize");
    if (native_.size() < bytes) native_ = basic_pinned_memory<R>(bytes);
    T* h = reinterpret_cast<T*>(native_.get());
    detail::cuda_check<R>(R::memcpy_async(h, d_buf, bytes, cudaMemcpyDeviceToHost, stream),
                          "cgx::comm::mpi_device: cudaMemcpyAsync (native allreduce, down)");
    detail::cuda_check<R>(R::stream_synchronize(stream), "cgx::comm::mpi_device: cudaStreamSynchronize");
    x_.native_allreduce(h, n);
    detail::cuda_check<R>(R::memcpy_async(d_buf, h, bytes, cudaMemcpyHostToDevice, stream),
                          "cgx::comm::mpi_device: cudaMemcpyAsync (native allreduce, up)");
    detail::cuda_check<R>(R::event_record(native_done_.get(), stream), "cgx::comm::mpi_device: cudaEventRecord");
  }

 private:
  using guard = detail::basic_device_guard<R>;
  static constexpr int tag_base = cgx::detail::tag_value(cgx::detail::tag::device_even);  // + 1: odd exchanges

  /// Waits for `ev` on the host while driving H's progress on the messages posted,
  /// polling with a growing sleep.
  void wait_event(cudaEvent_t ev) {
    detail::poll_until([&] {
      const cudaError_t e = R::event_query(ev);
      if (e == cudaSuccess) return true;
      if (e != cudaErrorNotReady) detail::cuda_check<R>(e, "cgx::comm::mpi_device: cudaEventQuery");
      comm::progress(x_);
      return false;
    });
  }

  void sync_staging() {
    if (h2d_done_.get() != nullptr)
      detail::cuda_check<R>(R::event_synchronize(h2d_done_.get()), "cgx::comm::mpi_device: cudaEventSynchronize");
  }

  H x_;
  bool direct_ = false;
  int device_ = 0;
  basic_workspace_fence<R> fence_;
  std::uint32_t seq_ = 0;
  basic_device_memory<R> dev_;
  basic_pinned_memory<R> host_;
  basic_pinned_memory<R> native_;
  basic_cuda_event<R> h2d_done_;
  basic_cuda_event<R> native_done_;
  std::vector<basic_cuda_event<R>> events_;
  std::vector<std::size_t> copy_of_;
  std::vector<typename H::request> reqs_;
};

}  // namespace cgx::comm
