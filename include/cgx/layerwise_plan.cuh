#pragma once
/// \file layerwise_plan.cuh
/// `cgx::layerwise_device_plan<T, X, Rounding>`: the layer-wise compressed allreduce of
/// layerwise_plan.hpp on a *device* buffer, with the CUDA kernels of
/// `cgx::quant::device<Q>` on a caller's `cudaStream_t`.
///
/// The schedule (schedule::sra_pattern over layerwise.hpp's cut, as the host plan runs
/// it), the cut into chunks, the per-piece quantizers (dispatched once per settings
/// change, in `with_quantizer`), the random-bit keys and the bytes on the wire are
/// those of the host plan, except that each piece starts at a 16-byte boundary of
/// its message (the device kernels of `none` need aligned input). The compressed bytes
/// are staged through pinned host memory for the transport (Debian's Open MPI is not
/// CUDA-aware): device compress -> copy to pinned -> send; receive into pinned -> copy
/// to device -> decompress(-add). Workspace: 2 p slots on the device and as many in
/// pinned host memory.
///
/// A call is blocking for the host: it returns when the result is in the device buffer
/// (it synchronizes `stream`). Error feedback is host-only for now
/// (layerwise_options::error_feedback throws here).

#include <cuda_runtime.h>

#include "quant/maxmin.cuh"

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "error.hpp"
#include "layerwise.hpp"
#include "layerwise_plan.hpp"
#include "schedule/sra.hpp"

namespace cgx {

namespace detail {
/// The device kernels of one setting.
template <class T>
struct device_codec {
  void (*compress)(const T*, std::size_t, std::byte*, const quant::rng_state&, cudaStream_t, quant::device_status*);
  void (*decompress)(const std::byte*, std::size_t, T*, cudaStream_t);
  void (*decompress_add)(const std::byte*, std::size_t, T*, cudaStream_t);
  bool lossless;
};

template <class T, class Rounding>
device_codec<T> make_device_codec(const layer_setting& s) {
  return with_quantizer<Rounding>(s, [](auto q) {
    using Q = typename decltype(q)::type;
    using D = quant::device<Q>;
    return device_codec<T>{&D::template compress<T>, &D::template decompress<T>, &D::template decompress_add<T>,
                           Q::lossless};
  });
}
}  // namespace detail

/// Layer-wise compressed allreduce (sum, in place) of a fused *device* buffer (see the
/// file comment and layerwise_plan.hpp, whose settings, checks and accounting it shares).
///
/// \tparam T         float or double
/// \tparam X         transport on host memory, e.g. comm::mpi
/// \tparam Rounding  quant::stochastic or quant::nearest
template <class T, class X, class Rounding = quant::stochastic>
class layerwise_device_plan
    : public detail::layerwise_base<layerwise_device_plan<T, X, Rounding>, T, X, detail::device_codec<T>> {
  static_assert(quant::is_rounding_v<Rounding>,
                "cgx::layerwise_device_plan: Rounding must be cgx::quant::stochastic or cgx::quant::nearest");
  using base = detail::layerwise_base<layerwise_device_plan<T, X, Rounding>, T, X, detail::device_codec<T>>;
  friend base;

 public:
  /// Collective. As layerwise_plan's constructor; allocates device and pinned host
  /// workspace. Throws cgx::error(errc::invalid_argument) for error feedback (host
  /// only) and errc::cuda when an allocation fails.
  layerwise_device_plan(X transport, std::size_t n, std::vector<layer> layers, layerwise_options opts = {})
      : base(std::move(transport), n, std::move(layers), opts) {
    if (this->opts_.error_feedback)
      throw error(errc::invalid_argument, "layerwise_device_plan: error feedback is implemented for host buffers only");
    this->init();
  }
  ~layerwise_device_plan() { release(); }

  /// Sums d_buf[0..n) (device memory) over all ranks, in place, with kernels on
  /// `stream`; returns when done. Collective, with the checks of layerwise_plan (a second
  /// thread's concurrent call throws errc::invalid_argument at once).
  void operator()(T* d_buf, std::size_t n, cudaStream_t stream = nullptr) {
    const detail::call_guard claimed(this->busy_, "layerwise_device_plan");
    this->check(d_buf, n);
    run(d_buf, this->next_rng(), stream);
  }

  /// Bytes of workspace held on the device (as much again in pinned host memory).
  std::size_t workspace_size() const noexcept { return ws_bytes_; }

 private:
  static constexpr std::size_t piece_align = 16;
  static constexpr std::uint64_t rounding_id = std::is_same_v<Rounding, quant::stochastic> ? 1 : 0;
  static detail::device_codec<T> make_codec(const layer_setting& s) {
    return detail::make_device_codec<T, Rounding>(s);
  }

  static void ok(cudaError_t e, const char* what) { quant::detail::check_cuda(e, what); }

  void release() noexcept {
    if (d_ws_ != nullptr) cudaFree(d_ws_);
    if (h_ws_ != nullptr) cudaFreeHost(h_ws_);
    d_ws_ = nullptr;
    h_ws_ = nullptr;
    ws_bytes_ = 0;
  }

  void reserve(std::size_t slot) {
    const std::size_t need = base::pattern(this->x_.size(), slot).slots_used() * slot;
    if (need > ws_bytes_) {
      release();
      ok(cudaMalloc(&d_ws_, need), "layerwise_device_plan: cudaMalloc");
      ok(cudaMallocHost(&h_ws_, need), "layerwise_device_plan: cudaMallocHost");
      ws_bytes_ = need;
    }
    slot_ = slot;
  }

  void run(T* buf, const quant::rng_state& rng, cudaStream_t stream) {
    const int p = this->x_.size(), me = this->x_.rank();
    if (p == 1 || this->layout_.size() == 0) return;
    // The host plan's pattern; the device and the pinned workspace share its slots.
    const schedule::sra_pattern d = base::pattern(p, slot_);
    auto dsend = [&](int o) { return d_ws_ + d.send_slot(o); };
    auto drecv = [&](int r) { return d_ws_ + d.recv_slot(r); };
    auto dgather = [&](int o) { return d_ws_ + d.gather_slot(o); };
    auto hsend = [&](int o) { return h_ws_ + d.send_slot(o); };
    auto hrecv = [&](int r) { return h_ws_ + d.recv_slot(r); };
    auto hgather = [&](int o) { return h_ws_ + d.gather_slot(o); };
    auto to_host = [&](std::byte* h, const std::byte* d, std::size_t b) {
      ok(cudaMemcpyAsync(h, d, b, cudaMemcpyDeviceToHost, stream), "layerwise_device_plan: cudaMemcpyAsync D2H");
    };
    auto to_device = [&](std::byte* d, const std::byte* h, std::size_t b) {
      ok(cudaMemcpyAsync(d, h, b, cudaMemcpyHostToDevice, stream), "layerwise_device_plan: cudaMemcpyAsync H2D");
    };
    auto sync = [&] { ok(cudaStreamSynchronize(stream), "layerwise_device_plan: cudaStreamSynchronize"); };
    auto& reqs = this->reqs_;
    const auto& lay = this->layout_;
    const std::size_t mine_bytes = lay.chunk_bytes(me);

    // Phase 1: every part compressed on the device and staged, then sent.
    reqs.clear();
    if (mine_bytes != 0)
      for (int r = 0; r < p; ++r)
        if (r != me) reqs.push_back(this->x_.irecv(hrecv(r), mine_bytes, r, base::tag_scatter));
    const std::size_t nrecv = reqs.size();  // rank r's part is reqs[r - (r > me)]
    for (int step = 1; step < p; ++step) {
      const int o = d.to(me, step);
      for (const auto& pc : lay.pieces(o)) {
        const quant::rng_state s = schedule::keyed(rng, d.contribution_key(me, comm::chunk{pc.begin, pc.count}));
        this->codecs_[pc.layer].compress(buf + pc.begin, pc.count, dsend(o) + pc.offset, s, stream, nullptr);
      }
      if (lay.chunk_bytes(o) != 0) to_host(hsend(o), dsend(o), lay.chunk_bytes(o));
    }
    sync();
    for (int step = 1; step < p; ++step) {
      const int o = d.to(me, step);
      if (lay.chunk_bytes(o) != 0) reqs.push_back(this->x_.isend(hsend(o), lay.chunk_bytes(o), o, base::tag_scatter));
    }
    if (mine_bytes != 0) {
      for (int i = 0; i + 1 < p; ++i) {  // in the pattern's order, each part once it has arrived
        const int r = d.addend(me, i);
        this->x_.wait_all(std::span(reqs.data() + (r - (r > me ? 1 : 0)), 1));
        to_device(drecv(r), hrecv(r), mine_bytes);
        for (const auto& pc : lay.pieces(me))
          this->codecs_[pc.layer].decompress_add(drecv(r) + pc.offset, pc.count, buf + pc.begin, stream);
      }
      for (const auto& pc : lay.pieces(me)) {
        const auto& c = this->codecs_[pc.layer];
        const quant::rng_state s = schedule::keyed(rng, d.sum_key(me, comm::chunk{pc.begin, pc.count}));
        c.compress(buf + pc.begin, pc.count, dsend(me) + pc.offset, s, stream, nullptr);
        if (!c.lossless) c.decompress(dsend(me) + pc.offset, pc.count, buf + pc.begin, stream);
      }
      to_host(hsend(me), dsend(me), mine_bytes);
      sync();  // also: the receive buffers' copies to the device are done before phase 2 reuses them
    }

    // Phase 2: allgather of the compressed sums, received into the receive slots.
    for (int r = 0; r < p; ++r)
      if (r != me && lay.chunk_bytes(r) != 0)
        reqs.push_back(this->x_.irecv(hgather(r), lay.chunk_bytes(r), r, base::tag_gather));
    if (mine_bytes != 0)
      for (int step = 1; step < p; ++step)
        reqs.push_back(this->x_.isend(hsend(me), mine_bytes, d.to(me, step), base::tag_gather));
    this->x_.wait_all(std::span(reqs.data() + nrecv, reqs.size() - nrecv));
    for (int step = 1; step < p; ++step) {
      const int o = d.from(me, step);
      if (lay.chunk_bytes(o) == 0) continue;
      to_device(dgather(o), hgather(o), lay.chunk_bytes(o));
      for (const auto& pc : lay.pieces(o))
        this->codecs_[pc.layer].decompress(dgather(o) + pc.offset, pc.count, buf + pc.begin, stream);
    }
    sync();
  }

  std::byte* d_ws_ = nullptr;
  std::byte* h_ws_ = nullptr;
  std::size_t ws_bytes_ = 0;
  std::size_t slot_ = 0;
};

}  // namespace cgx
