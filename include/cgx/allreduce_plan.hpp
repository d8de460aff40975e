#pragma once
/// \file allreduce_plan.hpp
/// `cgx::allreduce_plan<T, Q, R, X>`: a compressed in-place sum over all ranks,
/// specialized at compile time for a value type, quantizer, reducer and transport.

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <thread>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "concepts.hpp"
#include "detail/path_choice.hpp"
#include "error.hpp"
#include "plan_common.hpp"
#include "quant/host_exec.hpp"
#include "quant/rounding.hpp"

namespace cgx {

/// Compressed allreduce (sum, in place) of up to `max_count` values of T.
///
/// \tparam T  float or double
/// \tparam Q  quantizer: quant::maxmin<...> or quant::none
/// \tparam R  reducer: comm::scatter_reduce_allgather, comm::ring or comm::tree
/// \tparam X  transport: comm::mpi
///
/// The workspace is sized and allocated once, at construction (or given by the caller),
/// and reused by every call. Construction and every call are collective: every rank
/// of the transport must make them, in the same order.
///
/// Like every host plan it also has its base plan_core's members: transport(),
/// max_count(), workspace_size(), calls() (compressed calls only: those that took the
/// native path are not counted) and options().
template <class T, class Q, class R, class X>
class allreduce_plan : public plan_core<X> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cgx::allreduce_plan: T must be float or double");
  static_assert(quantizer_for<Q, T>,
                "cgx::allreduce_plan: Q must be a quantizer (cgx::quant::maxmin<Bits, Bucket, Rounding> or "
                "cgx::quant::none)");
  static_assert(reducer<R>, "cgx::allreduce_plan: R must be a reducer (cgx::comm::scatter_reduce_allgather, cgx::comm::ring, "
                "cgx::comm::tree)");
  static_assert(transport<X>,
                "cgx::allreduce_plan: X must be a transport (e.g. cgx::comm::mpi): it needs rank(), size(), "
                "isend(), irecv(), wait_all() and max_all()");

  using schedule_type = typename R::template schedule<T, Q, X>;

 public:
  using value_type = T;          ///< the element type of the buffers
  using quantizer_type = Q;      ///< the quantizer (codec) on the wire
  using reducer_type = R;        ///< the reducer (schedule)
  using transport_type = X;      ///< the transport

  /// Bytes of workspace a plan for `max_count` values on `ranks` ranks needs.
  /// Throws cgx::error(errc::invalid_argument) if that size overflows std::size_t.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return detail::sized("allreduce_plan", max_count, ranks, [&] { return schedule_type::workspace_bytes(max_count, ranks); });
  }

  /// Collective. Allocates workspace_bytes(max_count, transport.size()) bytes, and picks
  /// the native-allreduce threshold (see native_below_bytes()).
  allreduce_plan(X transport, std::size_t max_count, plan_options opts = {})
      : plan_core<X>(std::move(transport), max_count, opts, "allreduce_plan", detail::defer_setup), sched_(this->x_) {
    this->setup();
    this->own_workspace(workspace_bytes(max_count, this->x_.size()));
  }

  /// Collective. Uses the caller's workspace, which must hold at least
  /// workspace_bytes(max_count, transport.size()) bytes and outlive the plan.
  /// Throws cgx::error(errc::workspace) if it is too small for this communicator.
  allreduce_plan(X transport, std::size_t max_count, std::span<std::byte> workspace, plan_options opts = {})
      : plan_core<X>(std::move(transport), max_count, opts, "allreduce_plan", detail::defer_setup), sched_(this->x_) {
    this->setup();
    this->use_workspace(workspace, workspace_bytes(max_count, this->x_.size()));
  }

  /// Sums buf[0..n) over all ranks, in place, blocking. Collective: every rank calls it
  /// with the same n. Throws cgx::error, leaving buf untouched, for a null buf with
  /// n > 0, n > max_count(), or (collective checking, see `checking`) counts or plan
  /// types that differ between ranks, on every rank. Throws errc::invalid_argument at
  /// once, before any communication, when another thread is in a call of this plan
  /// (operator(), start() or wait()) or a start()ed reduction is still in flight.
  void operator()(T* buf, std::size_t n) {
    const auto claimed = this->claim();
    if (in_flight_.load(std::memory_order_relaxed))
      throw error(errc::invalid_argument, "allreduce_plan: a started reduction is still in flight; call wait() first");
    this->begin_call(claimed, buf == nullptr, n, sig_);
    reduce(buf, n);
    claimed.finish();
  }

  /// Starts summing buf[0..n) over all ranks, in place, and returns at once; the
  /// reduction runs on a background thread until wait(). The caller must not touch
  /// buf in between. Arguments are checked (collectively) before start() returns, so
  /// bad input throws here, with buf untouched. Collective, like operator().
  /// With comm::mpi, MPI must be initialized with at least MPI_THREAD_SERIALIZED (then
  /// the caller makes no MPI call until wait()); MPI_THREAD_MULTIPLE lifts that.
  /// Throws errc::invalid_argument while a reduction is in flight, and at once when
  /// another thread is in a call of this plan.
  void start(T* buf, std::size_t n) {
    const detail::call_guard g(this->busy_, "allreduce_plan::start");
    if (in_flight_.load(std::memory_order_relaxed))
      throw error(errc::invalid_argument, "allreduce_plan: start() while a reduction is in flight");
    X& x = this->x_;
    if constexpr (requires { x.require_thread_level(); }) x.require_thread_level();
    detail::check_call(x, this->opts_.check, "allreduce_plan", buf == nullptr, n, this->max_count_, sig_);
    if constexpr (requires { x.begin_call(comm::call_context{}); }) x.begin_call(comm::call_context{sig_, n});
    failure_ = nullptr;
    worker_ = std::thread([this, buf, n] {
      X& xw = this->x_;  // (nvcc's front end rejects this-> inside the requires below)
      try {
        reduce(buf, n);
        // A peer's failure report for this call (see detail::call_guard::finish).
        if constexpr (requires { xw.end_call_check(); })
          xw.end_call_check();
        else if constexpr (requires { xw.throw_if_failed(); })
          xw.throw_if_failed();
      } catch (...) {
        failure_ = std::current_exception();
        // Tell the peers, as a blocking call's guard would (see detail::call_guard).
        if constexpr (requires { xw.abort(errc::transport, std::string()); })
          xw.abort(errc::transport, "allreduce_plan: a rank threw during the call");
      }
    });
    in_flight_.store(true, std::memory_order_release);
  }

  /// Completes the reduction begun by start(); rethrows what it threw. No-op if none.
  /// Throws errc::invalid_argument at once when another thread is in a call of this plan.
  void wait() {
    const detail::call_guard g(this->busy_, "allreduce_plan::wait");
    if (!in_flight_.load(std::memory_order_relaxed)) return;
    worker_.join();
    in_flight_.store(false, std::memory_order_release);
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  /// True between start() and wait().
  bool in_flight() const noexcept { return in_flight_.load(std::memory_order_acquire); }

  allreduce_plan(const allreduce_plan&) = delete;
  allreduce_plan& operator=(const allreduce_plan&) = delete;
  /// Lets a call running on another thread return, then waits for a reduction still in
  /// flight (errors are dropped: call wait() to see them); its base then frees the
  /// plan's own workspace. The reduction needs every peer's matching call: if a peer
  /// never makes it, the destructor never returns (as wait() would not). Destroying the
  /// plan while another thread may still *start* a call of it is a use after free, as
  /// for any object.
  ~allreduce_plan() {
    detail::call_guard::wait_idle(this->busy_);
    if (in_flight_.load(std::memory_order_acquire)) worker_.join();
  }

  /// The native-allreduce threshold in use: calls of fewer bytes (n * sizeof(T)) go
  /// through the transport's own uncompressed allreduce, where it has one. The value of
  /// plan_options::native_below_bytes; for static_threshold the plan's pick, made at
  /// construction (default_native_below_bytes_one_node when the transport's
  /// single_node() is true, default_native_below_bytes otherwise); 0: every call is
  /// compressed. For auto_threshold (the default, over a transport with a native
  /// allreduce) it returns auto_threshold: the path is chosen per size class by
  /// measurement (see path_for()).
  std::size_t native_below_bytes() const noexcept { return native_below_; }

  /// What the measured choice (auto_threshold) knows of calls of `bytes` bytes: whether
  /// it has decided, its pick, and the agreed times of both paths at its last decision.
  /// With a fixed threshold: measured, and the pick the threshold makes.
  path_pick path_for(std::size_t bytes) const noexcept {
    if (native_below_ == auto_threshold) return choice_.pick_for(bytes);
    path_pick p;
    p.measured = true;
    p.compressed = !(has_native && bytes < native_below_);
    return p;
  }

  /// True if the last call (completed, or in flight) took the transport's native allreduce.
  bool last_native() const noexcept { return last_native_; }

 private:
  static constexpr bool has_native = requires(X& x, T* b, std::size_t n) { x.native_allreduce(b, n); };

  void reduce(T* buf, std::size_t n) {
    X& x = this->x_;
    auto compressed = [&] { sched_.run(buf, n, x, this->ws_.data(), this->next_rng(), quant::host_exec{this->opts_.threads}); };
    if constexpr (has_native) {
      auto native = [&] { x.native_allreduce(buf, n); };
      const std::size_t bytes = n * sizeof(T);
      if (native_below_ == auto_threshold) {
        last_native_ = !detail::run_chosen(choice_, x, bytes, native, compressed);
        return;
      }
      if (bytes < native_below_) {
        last_native_ = true;
        native();
        return;
      }
    }
    last_native_ = false;
    compressed();
  }

  /// A number that differs between plans of different T, Q or R.
  static std::int64_t signature() { return detail::plan_signature<T, Q>(R::name).value(); }

  // Collective (before the schedule's own setup, in the same order on every rank).
  std::size_t native_below_ = detail::resolve_native_below(this->x_, this->opts_.native_below_bytes, has_native);
  // Ranks must also agree on the native-allreduce threshold, or some would take the
  // native path while others run the schedule.
  std::int64_t sig_ = signature() ^ static_cast<std::int64_t>(native_below_ * 0x9E3779B97F4A7C15ull >> 2);
  schedule_type sched_;
  detail::path_choice choice_;  // auto_threshold: the measured pick per size class
  bool last_native_ = false;
  std::thread worker_;
  std::atomic<bool> in_flight_{false};  // between start() and wait(); written under busy_
  std::exception_ptr failure_;
};

}  // namespace cgx
