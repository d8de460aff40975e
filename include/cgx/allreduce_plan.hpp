#pragma once
/// \file allreduce_plan.hpp
/// `cgx::allreduce_plan<T, Q, R, X>`: a compressed in-place sum over all ranks,
/// specialized at compile time for a value type, quantizer, reducer and transport.

#include <array>
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
#include "error.hpp"
#include "quant/host_exec.hpp"
#include "quant/rounding.hpp"

namespace cgx {

/// How much a plan checks before it moves data.
enum class checking {
  /// Only this rank's own arguments (null buffer, count above capacity). Free, but a
  /// rank whose arguments differ from the others' is not detected and may hang.
  local,
  /// Also that every rank passed the same count and the same plan type: one small
  /// allreduce-like exchange per call (one network latency). A violation throws
  /// cgx::error on *every* rank before any data moves.
  collective,
  /// The default: `collective` in builds without NDEBUG (debug builds), `local` with
  /// NDEBUG, the convention of assert(). The choice must not depend on anything the
  /// ranks might disagree on (such as the count of a call), or a rank that skips the
  /// check would deadlock the ones that make it.
  automatic,
};

/// What `automatic` means in this translation unit.
constexpr checking resolve(checking c) noexcept {
#ifdef NDEBUG
  return c == checking::automatic ? checking::local : c;
#else
  return c == checking::automatic ? checking::collective : c;
#endif
}

/// Run-time options of a plan.
struct plan_options {
  checking check = checking::automatic;  ///< argument checking level
  std::uint64_t seed = 0x63677821u;       ///< seed of stochastic rounding (any value; ranks may differ)
  int threads = 1;                        ///< host threads for (de)compression, per rank
  /// Messages of fewer bytes (uncompressed) go through the transport's own uncompressed
  /// allreduce (MPI_Allreduce for comm::mpi) when it has one: below this size latency,
  /// not bandwidth, decides, and compression cannot win. 0 disables the fallback. The
  /// default comes from bench/allreduce_bench sweeps (see docs/threshold.md).
  std::size_t native_below_bytes = std::size_t{64} << 10;
};

/// The argument check of a plan call, shared by the plans. `bad` is this rank's own
/// verdict (non-zero: invalid), `sig` the plan's signature; `where()` prefixes and
/// `local_message()` describes this rank's problem (both built only on the way to a
/// throw: no allocation on the hot path). With collective checking, one max_all over X
/// makes every rank throw together, before any data moves.
namespace detail {
template <class X, class Where, class Local>
void check_call(X& x, checking level, std::size_t n, std::int64_t bad, std::int64_t sig, Where where,
                Local local_message, const char* other_invalid, const char* other_plan) {
  if (resolve(level) == checking::local) {
    if (bad != 0) throw error(errc::invalid_argument, where() + local_message());
    return;
  }
  const auto sn = static_cast<std::int64_t>(n);
  std::array<std::int64_t, 5> v{sn, -sn, sig, -sig, bad};
  x.max_all(v);
  if (bad != 0) throw error(errc::invalid_argument, where() + local_message());
  if (v[4] != 0) throw error(errc::invalid_argument, where() + other_invalid);
  if (v[0] != -v[1])
    throw error(errc::mismatch, where() + "ranks passed different counts (between " + std::to_string(-v[1]) + " and " +
                                    std::to_string(v[0]) + "; this rank " + std::to_string(n) + "); no data was moved");
  if (v[2] != -v[3]) throw error(errc::mismatch, where() + other_plan);
}
}  // namespace detail

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
template <class T, class Q, class R, class X>
class allreduce_plan {
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
  using value_type = T;
  using quantizer_type = Q;
  using reducer_type = R;
  using transport_type = X;

  /// Bytes of workspace a plan for `max_count` values on `ranks` ranks needs.
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return schedule_type::workspace_bytes(max_count, ranks);
  }

  /// Collective. Allocates workspace_bytes(max_count, transport.size()) bytes.
  allreduce_plan(X transport, std::size_t max_count, plan_options opts = {})
      : x_(std::move(transport)), max_count_(max_count), opts_(opts), sched_(x_) {
    validate_options();
    const std::size_t bytes = workspace_bytes(max_count_, x_.size());
    owned_ = std::make_unique_for_overwrite<std::byte[]>(bytes == 0 ? 1 : bytes);
    ws_ = std::span<std::byte>(owned_.get(), bytes);
  }

  /// Collective. Uses the caller's workspace, which must hold at least
  /// workspace_bytes(max_count, transport.size()) bytes and outlive the plan.
  /// Throws cgx::error(errc::workspace) if it is too small for this communicator.
  allreduce_plan(X transport, std::size_t max_count, std::span<std::byte> workspace, plan_options opts = {})
      : x_(std::move(transport)), max_count_(max_count), opts_(opts), sched_(x_), ws_(workspace) {
    validate_options();
    const std::size_t need = workspace_bytes(max_count_, x_.size());
    if (workspace.size() < need || (need > 0 && workspace.data() == nullptr))
      throw error(errc::workspace, "allreduce_plan: workspace of " + std::to_string(workspace.size()) +
                                       " bytes is too small: " + std::to_string(max_count_) + " values on " +
                                       std::to_string(x_.size()) + " ranks need " + std::to_string(need));
  }

  /// Sums buf[0..n) over all ranks, in place, blocking. Collective: every rank calls it
  /// with the same n. Throws cgx::error, leaving buf untouched, for a null buf with
  /// n > 0, n > max_count(), or (collective checking, see `checking`) counts or plan
  /// types that differ between ranks, on every rank.
  void operator()(T* buf, std::size_t n) {
    if (in_flight_) throw error(errc::invalid_argument, "allreduce_plan: a started reduction is still in flight; call wait() first");
    check(buf, n);
    reduce(buf, n);
  }

  /// Starts summing buf[0..n) over all ranks, in place, and returns at once; the
  /// reduction runs on a background thread until wait(). The caller must not touch
  /// buf in between. Arguments are checked (collectively) before start() returns, so
  /// bad input throws here, with buf untouched. Collective, like operator().
  /// With comm::mpi, MPI must be initialized with at least MPI_THREAD_SERIALIZED (then
  /// the caller makes no MPI call until wait()); MPI_THREAD_MULTIPLE lifts that.
  void start(T* buf, std::size_t n) {
    if (in_flight_) throw error(errc::invalid_argument, "allreduce_plan: start() while a reduction is in flight");
    if constexpr (requires { x_.require_thread_level(); }) x_.require_thread_level();
    check(buf, n);
    in_flight_ = true;
    failure_ = nullptr;
    worker_ = std::thread([this, buf, n] {
      try {
        reduce(buf, n);
      } catch (...) {
        failure_ = std::current_exception();
      }
    });
  }

  /// Completes the reduction begun by start(); rethrows what it threw. No-op if none.
  void wait() {
    if (!in_flight_) return;
    worker_.join();
    in_flight_ = false;
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

  /// True between start() and wait().
  bool in_flight() const noexcept { return in_flight_; }

  allreduce_plan(const allreduce_plan&) = delete;
  allreduce_plan& operator=(const allreduce_plan&) = delete;
  /// Waits for a reduction still in flight (errors are dropped: call wait() to see them).
  ~allreduce_plan() {
    if (in_flight_) worker_.join();
  }

  /// The transport (e.g. to read rank() and size()).
  X& transport() noexcept { return x_; }
  const X& transport() const noexcept { return x_; }
  /// Largest count a call may pass.
  std::size_t max_count() const noexcept { return max_count_; }
  /// Bytes of workspace in use.
  std::size_t workspace_size() const noexcept { return ws_.size(); }
  /// Number of completed or started calls (the stochastic-rounding call counter).
  std::uint32_t calls() const noexcept { return calls_; }
  /// The options the plan was made with.
  const plan_options& options() const noexcept { return opts_; }

 private:
  void reduce(T* buf, std::size_t n) {
    if constexpr (requires { x_.native_allreduce(buf, n); }) {
      if (n * sizeof(T) < opts_.native_below_bytes) {
        x_.native_allreduce(buf, n);
        return;
      }
    }
    quant::rng_state rng;
    rng.seed = opts_.seed;
    rng.counter = calls_++;
    sched_.run(buf, n, x_, ws_.data(), rng, quant::host_exec{opts_.threads});
  }

  void validate_options() const {
    if (opts_.threads < 1) throw error(errc::invalid_argument, "allreduce_plan: plan_options::threads must be >= 1");
  }

  /// A number that differs between plans of different T, Q or R.
  static std::int64_t signature() {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(sizeof(T));
    mix(static_cast<std::uint64_t>(Q::bits));
    mix(Q::bucket_size);
    mix(std::is_same_v<typename Q::rounding, quant::stochastic> ? 1 : 0);
    for (const char* c = R::name; *c != 0; ++c) mix(static_cast<unsigned char>(*c));
    return static_cast<std::int64_t>(h >> 1);
  }

  void check(const T* buf, std::size_t n) {
    enum : std::int64_t { null_buffer = 1, too_many = 2 };
    std::int64_t bad = 0;
    if (buf == nullptr && n > 0) bad |= null_buffer;
    if (n > max_count_) bad |= too_many;
    // Messages are built only on the way to a throw: no allocation on the hot path.
    auto where = [this] { return "allreduce_plan (rank " + std::to_string(x_.rank()) + "): "; };
    auto local_message = [&]() -> std::string {
      if (bad & null_buffer) return "null buffer with count " + std::to_string(n) + " > 0";
      return "count " + std::to_string(n) + " exceeds the plan's max_count " + std::to_string(max_count_);
    };
    detail::check_call(x_, opts_.check, n, bad, sig_, where, local_message,
                       "another rank passed invalid arguments (null buffer or count above max_count); no data was moved",
                       "ranks called plans of different value type, quantizer, reducer or native_below_bytes; no data "
                       "was moved");
  }

  X x_;
  std::size_t max_count_;
  plan_options opts_;
  // Ranks must also agree on the native-allreduce threshold, or some would take the
  // native path while others run the schedule.
  std::int64_t sig_ = signature() ^ static_cast<std::int64_t>(opts_.native_below_bytes * 0x9E3779B97F4A7C15ull >> 2);
  schedule_type sched_;
  std::unique_ptr<std::byte[]> owned_;
  std::span<std::byte> ws_;
  std::uint32_t calls_ = 0;
  std::thread worker_;
  bool in_flight_ = false;
  std::exception_ptr failure_;
};

}  // namespace cgx
