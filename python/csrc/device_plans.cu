// The CUDA half of the extension, compiled by nvcc only where torch has CUDA and the
// toolkit is found (setup.py builds a CUDAExtension then): cgx::layerwise_device_plan on
// the caller's stream (the current torch stream, handed over by bindings.cpp), over
// comm::mpi (an mpi4py communicator; builds with MPI) or over comm::cuda_ipc set up
// through the job's Store (comm::store_bootstrap: torchrun, no MPI). No torch header
// here (see plans.hpp).
#include "plans.hpp"
#include "kv_ref.hpp"
#include "snapshot.hpp"

#include <cgx/cgx.cuh>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cgx_torch {

namespace {

cgx::layerwise_options to_device_options(const plan_config& c, std::int64_t timeout_ms) {
  cgx::layerwise_options o;
  if (timeout_ms >= 0) o.timeout_ms = static_cast<std::uint32_t>(timeout_ms);  // else CGX_TIMEOUT_MS's default
  o.defaults = cgx::layerwise_defaults{c.bits, c.bucket, c.min_compressed};
  o.error_feedback = false;  // host only (checked by the caller and by cgx)
  o.check = c.check_each_call ? cgx::checking::collective : cgx::checking::local;
  o.seed = c.seed;
  o.threads = 1;
  return o;
}

/// cgx::layerwise_device_plan<T, X, Rounding> over transport X: comm::mpi (through
/// comm::mpi_device: compressed bytes staged through pinned host memory unless MPI is
/// CUDA-aware) or comm::cuda_ipc (the ranks of one node read each other's workspace). The
/// plan is stream-ordered; run() synchronizes the stream so that the hook's result is in
/// the tensor when it returns. Optional adaptive bits, whose statistics need the reduced
/// buffer on the host: one copy per call.
template <class T, class X, class Rounding>
class device_plan final : public plan {
 public:
  device_plan(X x, std::size_t n, std::vector<cgx::layer> layers, const plan_config& c, std::int64_t timeout_ms)
      : plan_(std::move(x), n, layers, to_device_options(c, timeout_ms)), interval_(c.adaptive_interval) {
    if (interval_ > 0) {
      cgx::adaptive_options a;
      a.min_bits = c.min_bits;
      a.max_bits = c.max_bits;
      a.target_bits = c.target_bits;
      a.clusters = c.clusters;
      a.decay = c.decay;
      a.top_fraction = c.top_fraction;
      a.bucket = c.bucket;
      adapt_.emplace(layers, plan_.settings(), a);
      host_.resize(n);
    }
  }

  void run(void* data, std::size_t n, void* stream) override {
    T* buf = static_cast<T*>(data);
    auto s = static_cast<cudaStream_t>(stream);
    plan_(buf, n, s);
    if (!adapt_) {
      cgx::quant::detail::check_cuda(cudaStreamSynchronize(s), "cgx_torch: cudaStreamSynchronize");
      return;
    }
    cgx::quant::detail::check_cuda(cudaMemcpyAsync(host_.data(), buf, n * sizeof(T), cudaMemcpyDeviceToHost, s),
                                   "cgx_torch: cudaMemcpyAsync");
    cgx::quant::detail::check_cuda(cudaStreamSynchronize(s), "cgx_torch: cudaStreamSynchronize");
    adapt_->observe(host_.data());
    if (plan_.calls() % static_cast<std::uint32_t>(interval_) == 0) plan_.set_settings(adapt_->assign());
  }
  void reduce_scatter(void*, std::size_t) override {
    throw cgx::error(cgx::errc::invalid_argument, "cgx_torch: reduce_scatter runs on host plans (CPU tensors) only");
  }
  std::vector<std::pair<int, std::size_t>> settings() const override {
    std::vector<std::pair<int, std::size_t>> out;
    for (const auto& x : plan_.settings()) out.emplace_back(x.bits, x.bucket);
    return out;
  }
  double average_bits() const override { return plan_.average_bits(); }
  std::size_t bytes_sent() const override { return plan_.bytes_sent(); }
  std::size_t size() const override { return plan_.size(); }
  std::uint32_t calls() const override { return plan_.calls(); }
  int rank() const override { return plan_.transport().rank(); }
  int world() const override { return plan_.transport().size(); }
  bool on_device() const override { return true; }
  plan_snapshot snapshot() const override { return detail::take_snapshot(plan_, adapt_, std::span<const T>{}); }
  void restore(const plan_snapshot& s) override {
    detail::restore_snapshot<T>(plan_, adapt_, 0, s, [](std::span<const T>) {});
  }

 private:
  cgx::layerwise_device_plan<T, X, Rounding> plan_;
  std::optional<cgx::adaptive_bits> adapt_;
  std::vector<T> host_;
  int interval_;
};

template <class T, class X>
std::unique_ptr<plan> make_t(X x, std::size_t n, std::vector<cgx::layer> layers, const plan_config& c,
                             std::int64_t timeout_ms) {
  if (c.stochastic)
    return std::make_unique<device_plan<T, X, cgx::quant::stochastic>>(std::move(x), n, std::move(layers), c,
                                                                       timeout_ms);
  return std::make_unique<device_plan<T, X, cgx::quant::nearest>>(std::move(x), n, std::move(layers), c, timeout_ms);
}

}  // namespace

bool device_plans_compiled() { return true; }

std::string device_transports_compiled() {
#ifdef CGX_TORCH_WITH_MPI
  return "cuda_ipc (Store), mpi (mpi4py)";
#else
  return "cuda_ipc (Store)";
#endif
}

std::unique_ptr<plan> make_device_plan(int comm_f, dtype t, std::size_t n, std::vector<layer_desc> layers,
                                       const plan_config& c) {
#ifdef CGX_TORCH_WITH_MPI
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw cgx::error(cgx::errc::communicator, "MPI is not initialized (import mpi4py.MPI first)");
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(comm_f));
  if (t == dtype::f32) return make_t<float>(cgx::comm::mpi{comm}, n, detail::to_layers(layers), c, -1);
  return make_t<double>(cgx::comm::mpi{comm}, n, detail::to_layers(layers), c, -1);
#else
  (void)comm_f, (void)t, (void)n, (void)layers, (void)c;
  throw cgx::error(cgx::errc::invalid_argument,
                   "cgx_torch: this build has no MPI: device plans over an mpi4py communicator are not available "
                   "(a torch.distributed group's CUDA tensors use comm::cuda_ipc over its Store)");
#endif
}

std::unique_ptr<plan> make_store_device_plan(std::shared_ptr<kv> store, const std::string& prefix, int rank, int size,
                                             std::int64_t timeout_ms, device_transport x, dtype t, std::size_t n,
                                             std::vector<layer_desc> layers, const plan_config& c) {
  if (x != device_transport::cuda_ipc)
    throw cgx::error(cgx::errc::invalid_argument,
                     "cgx_torch: comm::nccl is not compiled into this build (cuda_ipc is: the ranks of one node)");
  kv_bootstrap boot(kv_ref{std::move(store)}, rank, size, prefix,
                    std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms));
  cgx::comm::cuda_ipc ipc{std::move(boot)};  // collective; errc::communicator when not on one node
  if (t == dtype::f32) return make_t<float>(std::move(ipc), n, detail::to_layers(layers), c, timeout_ms);
  return make_t<double>(std::move(ipc), n, detail::to_layers(layers), c, timeout_ms);
}

}  // namespace cgx_torch
