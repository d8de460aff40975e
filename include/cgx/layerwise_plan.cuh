#pragma once
/// \file layerwise_plan.cuh
/// `cgx::layerwise_device_plan<T, X, Rounding>`: the layer-wise compressed allreduce of
/// layerwise_plan.hpp on a *device* buffer, stream-ordered on a caller's `cudaStream_t`,
/// over any device transport: comm::mpi (through comm::mpi_device), comm::cuda_ipc,
/// comm::nccl, or another host transport (staged through pinned memory by
/// comm::basic_host_device).
///
/// The schedule is schedule::sra_pattern over layerwise.hpp's cut, run by the device
/// executor that device_allreduce_plan's SRA uses (comm::device_sra_executor); the cut
/// into chunks, the per-piece quantizers (dispatched once per settings change, in
/// `with_quantizer`), the random-bit keys and the bytes on the wire are those of the
/// host plan, except that each piece starts at a 16-byte boundary of its message (the
/// device kernels of `none` need aligned input). The kernels are those of the
/// transport's runtime policy (comm/runtime.cuh: quant::device<Q> on the CUDA runtime).
///
/// A call is stream-ordered like device_allreduce_plan's: the result is ready in
/// `stream` order; the host blocks as the transport does (comm::mpi until its messages
/// are complete, cuda_ipc in its barriers). Error feedback is host-only for now
/// (layerwise_options::error_feedback throws here).
///
/// Workspace: 2 p slots of the largest chunk, owned by the transport. Its reserve() is
/// collective, and settings change locally (every rank makes the same change before its
/// next call): a change that needs more workspace reserves it at the plan's next call,
/// on every rank at once, after that call's argument check.

#include <cuda_runtime_api.h>

#if defined(__CUDACC__)
#include "quant/maxmin.cuh"  // cuda_runtime's kernels (a simulated runtime brings its own)
#endif

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/device_sra.cuh"
#include "comm/runtime.cuh"
#include "device_plan.cuh"
#include "error.hpp"
#include "layerwise.hpp"
#include "layerwise_plan.hpp"
#include "schedule/sra.hpp"

namespace cgx {

namespace detail {
/// The device kernels of one setting.
template <class T>
struct device_codec {
  void (*compress)(const T*, std::size_t, std::byte*, const quant::rng_state&, cudaStream_t);
  void (*decompress)(const std::byte*, std::size_t, T*, cudaStream_t);
  void (*decompress_add)(const std::byte*, std::size_t, T*, cudaStream_t);
  bool lossless;
};

/// The kernels of setting s in runtime policy RT.
template <class T, class RT, class Rounding>
device_codec<T> make_device_codec(const layer_setting& s) {
  return with_device_quantizer<Rounding>(s, [](auto q) {
    using Q = typename decltype(q)::type;
    using D = typename RT::template kernels<Q>;
    return device_codec<T>{
        [](const T* in, std::size_t n, std::byte* out, const quant::rng_state& r, cudaStream_t st) {
          D::template compress<T>(in, n, out, r, st);
        },
        [](const std::byte* in, std::size_t n, T* out, cudaStream_t st) { D::template decompress<T>(in, n, out, st); },
        [](const std::byte* in, std::size_t n, T* out, cudaStream_t st) {
          D::template decompress_add<T>(in, n, out, st);
        },
        Q::lossless};
  });
}
}  // namespace detail

/// Layer-wise compressed allreduce (sum, in place) of a fused *device* buffer (see the
/// file comment and layerwise_plan.hpp, whose settings, checks and accounting it shares).
///
/// \tparam T         float or double
/// \tparam X         transport: comm::mpi, comm::mpi_device, comm::cuda_ipc, comm::nccl,
///                   or a host transport (staged)
/// \tparam Rounding  quant::stochastic or quant::nearest
template <class T, class X, class Rounding = quant::stochastic>
class layerwise_device_plan
    : private detail::graph_counter_holder<comm::runtime_of<comm::device_transport_t<X>>>,  // after the base's transport
      public detail::layerwise_base<layerwise_device_plan<T, X, Rounding>, T,
                                    comm::device_transport_t<X>, detail::device_codec<T>> {
  static_assert(quant::is_rounding_v<Rounding>,
                "cgx::layerwise_device_plan: Rounding must be cgx::quant::stochastic or cgx::quant::nearest");

 public:
  /// The device transport the plan drives (comm::mpi_device for X = comm::mpi).
  using device_transport_type = comm::device_transport_t<X>;

 private:
  using base = detail::layerwise_base<layerwise_device_plan<T, X, Rounding>, T, device_transport_type,
                                      detail::device_codec<T>>;
  friend base;
  using runtime = comm::runtime_of<device_transport_type>;

 public:
  /// Collective. As layerwise_plan's constructor; the transport reserves the device
  /// workspace. Throws cgx::error(errc::invalid_argument) for error feedback (host
  /// only) and errc::cuda when an allocation fails.
  layerwise_device_plan(X transport, std::size_t n, std::vector<layer> layers, layerwise_options opts = {})
      : base(device_transport_type(std::move(transport)), n, std::move(layers), opts) {
    if (this->opts_.error_feedback)
      throw error(errc::invalid_argument, "layerwise_device_plan: error feedback is implemented for host buffers only");
    this->init();
    grow();  // collective: every rank constructs at once
    std::optional<comm::detail::basic_device_guard<runtime>> on;
    if constexpr (requires { this->x_.device(); }) on.emplace(this->x_.device());
    this->counter_.emplace();
  }

  /// Sums d_buf[0..n) (device memory) over all ranks, in place, with kernels on
  /// `stream`; the result is ready in stream order. Collective, with the checks of
  /// layerwise_plan (a second thread's concurrent call throws errc::invalid_argument at
  /// once). While `stream` captures a CUDA graph the call is captured, as
  /// device_allreduce_plan's (device_plan.cuh, "CUDA graphs"; the settings in force at
  /// capture are the graph's), over a transport that can be (comm::nccl, comm::cuda_ipc); it is refused
  /// with errc::invalid_argument, before anything is enqueued, over the others, and when
  /// a settings change since the last call needs a larger workspace (allocation is not
  /// capturable: make one call outside the capture first).
  void operator()(T* d_buf, std::size_t n, cudaStream_t stream = nullptr) {
    const detail::call_guard claimed(this->busy_, "layerwise_device_plan");
    detail::raise_device_failure(this->x_);
    std::optional<comm::detail::basic_device_guard<runtime>> on;
    if constexpr (requires { this->x_.device(); }) on.emplace(this->x_.device());
    const bool capturing = comm::stream_capturing<runtime>(stream, "layerwise_device_plan");
    const char* refusal = detail::transport_capture_refusal<device_transport_type>(capturing);
    if (refusal == nullptr && capturing && need_ > ws_bytes_ && this->x_.size() >= 2)
      refusal = "the stream is capturing a CUDA graph, and the layer settings changed since the last call need a "
                "larger workspace, which cannot be allocated inside a capture; make one call outside the capture "
                "after changing them";
    this->check(d_buf, n, refusal);
    grow();  // every rank made the same settings change: collective here
    run(d_buf, this->counter_->apply(this->next_rng()), stream);
    if (capturing) this->counter_->advance(this->x_, stream);
  }

  /// Sets the call counter (layerwise_plan::set_calls). Throws cgx::error
  /// (errc::invalid_argument) once a call of the plan was captured into a CUDA graph: the
  /// launches of the graph advance the counter on the device, where the host cannot set
  /// it without waiting for them.
  void set_calls(std::uint32_t c) {
    if (this->counter_->captured() != 0)
      throw error(errc::invalid_argument,
                  "layerwise_device_plan::set_calls: a call of this plan was captured into a CUDA graph; the graph's "
                  "launches advance the counter on the device, so it can no longer be set");
    base::set_calls(c);
  }

  /// Calls captured into CUDA graphs so far (device_allreduce_plan::captured_calls).
  std::uint32_t captured_calls() const noexcept { return this->counter_->captured(); }

  /// Bytes of device workspace held (by the transport).
  std::size_t workspace_size() const noexcept { return ws_bytes_; }

 private:
  static constexpr std::size_t piece_align = 16;
  static constexpr std::uint64_t rounding_id = std::is_same_v<Rounding, quant::stochastic> ? 1 : 0;
  static detail::device_codec<T> make_codec(const layer_setting& s) {
    return detail::make_device_codec<T, runtime, Rounding>(s);
  }

  /// Local (settings change locally): records the slot size; grow() reserves.
  void reserve(std::size_t slot) {
    slot_ = comm::round_to_line(slot);
    need_ = base::pattern(this->x_.size(), slot_).slots_used() * slot_;
  }
  /// Collective: a larger workspace from the transport when the settings need one.
  void grow() {
    if (need_ <= ws_bytes_ || this->x_.size() < 2) return;
    ws_ = this->x_.reserve(need_);
    ws_bytes_ = need_;
  }

  /// The chunk codec of comm::device_sra_executor: chunk o is the layer-wise cut's
  /// chunk o, one kernel call per layer piece, keyed by the piece.
  struct codec {
    const layerwise_layout& lay;
    const std::vector<detail::device_codec<T>>& codecs;
    const schedule::sra_pattern& d;
    T* buf;
    const quant::rng_state& rng;
    cudaStream_t stream;
    int me;
    std::size_t bytes(int o) const { return lay.chunk_bytes(o); }
    void contribute(int o, std::byte* out) const {
      for (const auto& pc : lay.pieces(o))
        codecs[pc.layer].compress(buf + pc.begin, pc.count, out + pc.offset,
                                  schedule::keyed(rng, d.contribution_key(me, comm::chunk{pc.begin, pc.count})), stream);
    }
    void add(const std::byte* in) const {
      for (const auto& pc : lay.pieces(me))
        codecs[pc.layer].decompress_add(in + pc.offset, pc.count, buf + pc.begin, stream);
    }
    void finish(std::byte* out) const {
      for (const auto& pc : lay.pieces(me)) {
        const auto& c = codecs[pc.layer];
        c.compress(buf + pc.begin, pc.count, out + pc.offset,
                   schedule::keyed(rng, d.sum_key(me, comm::chunk{pc.begin, pc.count})), stream);
        if (!c.lossless) c.decompress(out + pc.offset, pc.count, buf + pc.begin, stream);
      }
    }
    void decode(int o, const std::byte* in) const {
      for (const auto& pc : lay.pieces(o))
        codecs[pc.layer].decompress(in + pc.offset, pc.count, buf + pc.begin, stream);
    }
  };

  void run(T* buf, const quant::rng_state& rng, cudaStream_t stream) {
    const int p = this->x_.size();
    if (p == 1 || this->layout_.size() == 0) return;
    // The host plan's pattern, in the transport's workspace.
    const schedule::sra_pattern d = base::pattern(p, slot_);
    exec_.run(this->x_, d, ws_, codec{this->layout_, this->codecs_, d, buf, rng, stream, this->x_.rank()}, stream);
  }

  comm::device_sra_executor exec_;
  std::byte* ws_ = nullptr;
  std::size_t ws_bytes_ = 0;
  std::size_t need_ = 0;
  std::size_t slot_ = 0;
};

}  // namespace cgx
