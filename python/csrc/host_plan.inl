// The host plan template of plans.cpp and pg_plans.cpp, instantiated once per (element
// type, rounding, transport) in its own translation unit (host_plan_*.cpp,
// pg_plan_*.cpp), so that they compile in parallel. The MPI ones only where the build
// has MPI (CGX_TORCH_WITH_MPI).
#pragma once
#include "plans.hpp"
#include "pg_transport.hpp"
#include "snapshot.hpp"

#include <cgx/adaptive.hpp>
#include <cgx/layerwise_plan.hpp>
#ifdef CGX_TORCH_WITH_MPI
#include <cgx/comm/mpi.hpp>
#endif

#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace cgx_torch::detail {

inline cgx::layerwise_options to_options(const plan_config& c) {
  cgx::layerwise_options o;
  o.defaults = cgx::layerwise_defaults{c.bits, c.bucket, c.min_compressed};
  o.error_feedback = c.error_feedback;
  o.error_feedback_decay = c.ef_decay;
  o.error_feedback_sum = c.ef_sum;
  o.check = c.check_each_call ? cgx::checking::collective : cgx::checking::local;
  o.seed = c.seed;
  o.threads = c.threads;
  return o;
}

inline cgx::adaptive_options to_adaptive(const plan_config& c) {
  cgx::adaptive_options a;
  a.min_bits = c.min_bits;
  a.max_bits = c.max_bits;
  a.target_bits = c.target_bits;
  a.clusters = c.clusters;
  a.decay = c.decay;
  a.top_fraction = c.top_fraction;
  a.bucket = c.bucket;
  return a;
}

/// cgx::layerwise_plan<T, X, Rounding> (X: comm::mpi or pg_transport) with, optionally, CGX's adaptive bits:
/// after each call the reduced buffer (the same bits on every rank) updates the
/// statistics, and every `adaptive_interval` calls the assignment replaces the settings
/// (the same on every rank, since it is computed from the same bits).
template <class T, class Rounding, class X>
class host_plan final : public plan {
 public:
  host_plan(X x, std::size_t n, std::vector<cgx::layer> layers, const plan_config& c)
      : plan_(std::move(x), n, layers, to_options(c)), interval_(c.adaptive_interval) {
    if (interval_ > 0) adapt_.emplace(layers, plan_.settings(), to_adaptive(c));
  }

  void run(void* data, std::size_t n, void*) override {
    T* buf = static_cast<T*>(data);
    plan_(buf, n);
    if (adapt_) {
      adapt_->observe(buf);
      if (plan_.calls() % static_cast<std::uint32_t>(interval_) == 0) plan_.set_settings(adapt_->assign());
    }
  }
  void reduce_scatter(void* data, std::size_t n) override { plan_.reduce_scatter(static_cast<T*>(data), n); }
  std::vector<std::pair<int, std::size_t>> settings() const override {
    std::vector<std::pair<int, std::size_t>> s;
    for (const auto& x : plan_.settings()) s.emplace_back(x.bits, x.bucket);
    return s;
  }
  double average_bits() const override { return plan_.average_bits(); }
  std::size_t bytes_sent() const override { return plan_.bytes_sent(); }
  std::size_t size() const override { return plan_.size(); }
  std::uint32_t calls() const override { return plan_.calls(); }
  int rank() const override { return plan_.transport().rank(); }
  int world() const override { return plan_.transport().size(); }
  bool on_device() const override { return false; }
  plan_snapshot snapshot() const override { return take_snapshot(plan_, adapt_, plan_.feedback().residual()); }
  void restore(const plan_snapshot& s) override {
    restore_snapshot<T>(plan_, adapt_, plan_.feedback().size(), s,
                        [this](std::span<const T> r) { plan_.set_feedback(r); });
  }

 private:
  cgx::layerwise_plan<T, X, Rounding> plan_;
  std::optional<cgx::adaptive_bits> adapt_;
  int interval_;
};

/// The plans for (T, Rounding); each instantiation is compiled in its own translation unit.
#ifdef CGX_TORCH_WITH_MPI
template <class T, class Rounding>
std::unique_ptr<plan> make_host(MPI_Comm comm, std::size_t n, std::vector<cgx::layer> layers, const plan_config& c) {
  return std::make_unique<host_plan<T, Rounding, cgx::comm::mpi>>(cgx::comm::mpi{comm}, n, std::move(layers), c);
}

#define CGX_TORCH_HOST_PLAN(EXTERN, T, R) \
  EXTERN template std::unique_ptr<plan> make_host<T, cgx::quant::R>(MPI_Comm, std::size_t, std::vector<cgx::layer>, const plan_config&);
CGX_TORCH_HOST_PLAN(extern, float, stochastic)
CGX_TORCH_HOST_PLAN(extern, float, nearest)
CGX_TORCH_HOST_PLAN(extern, double, stochastic)
CGX_TORCH_HOST_PLAN(extern, double, nearest)
#endif

template <class T, class Rounding>
std::unique_ptr<plan> make_pg_host(std::shared_ptr<channel> ch, std::size_t n, std::vector<cgx::layer> layers,
                                   const plan_config& c) {
  return std::make_unique<host_plan<T, Rounding, pg_transport>>(pg_transport{std::move(ch)}, n, std::move(layers), c);
}

#define CGX_TORCH_PG_PLAN(EXTERN, T, R)                                                                       \
  EXTERN template std::unique_ptr<plan> make_pg_host<T, cgx::quant::R>(std::shared_ptr<channel>, std::size_t, \
                                                                       std::vector<cgx::layer>, const plan_config&);
CGX_TORCH_PG_PLAN(extern, float, stochastic)
CGX_TORCH_PG_PLAN(extern, float, nearest)
CGX_TORCH_PG_PLAN(extern, double, stochastic)
CGX_TORCH_PG_PLAN(extern, double, nearest)

}  // namespace cgx_torch::detail
