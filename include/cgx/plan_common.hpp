#pragma once
/// \file plan_common.hpp
/// What every plan shares: its options, a base holding the transport and workspace, and
/// the argument check every plan makes before it moves data (allreduce_plan,
/// reduce_scatter_plan, allgather_plan, broadcast_plan, error_bounded_plan): local
/// checks always, and with `checking::collective` one small exchange that makes every
/// rank throw when any rank's arguments are bad or differ from the others'.

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "concepts.hpp"
#include "detail/checked.hpp"
#include "error.hpp"
#include "timeout.hpp"
#include "comm/header.hpp"
#include "quant/rounding.hpp"

namespace cgx {

/// How much a plan checks before it moves data.
enum class checking {
  /// Only this rank's own arguments (null buffer, count above capacity). Free; a rank
  /// whose count or plan differs from the others' is caught in-band by the message
  /// headers of comm::mpi and comm::shm (errc::mismatch where a message shows it,
  /// errc::peer_failed on the others, the plan failed after, the buffers possibly
  /// partly written); over other transports it may go undetected.
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

/// `plan_options::native_below_bytes = auto_threshold` (the default): a host plan whose
/// transport has a native allreduce chooses, per size class of call (bytes rounded down
/// to a power of two), the faster of its compressed schedule and the native allreduce by
/// timing both on the caller's own calls and agreeing across ranks (the slowest rank's
/// times decide), and re-checks now and then, so the choice follows the link and the
/// load (detail::path_choice; docs/threshold.md). Calls under 4 KiB take the native
/// path. Plans without that measurement (the device plans) take static_threshold's pick.
inline constexpr std::size_t auto_threshold = std::numeric_limits<std::size_t>::max();

/// `plan_options::native_below_bytes = static_threshold`: the plan picks a fixed
/// threshold when it is constructed, from where its ranks are: default_native_below_bytes
/// when they span several nodes, default_native_below_bytes_one_node when the transport
/// says they all share one node (see `native_below_bytes`). (auto_threshold's meaning
/// before the measured choice.)
inline constexpr std::size_t static_threshold = std::numeric_limits<std::size_t>::max() - 2;

/// `plan_options::native_below_bytes = always_native`: every call goes through the
/// transport's native allreduce (uncompressed, exact) where it has one. (Any value above
/// the largest call's bytes does the same.)
inline constexpr std::size_t always_native = std::numeric_limits<std::size_t>::max() - 3;

/// The threshold a plan picks when its ranks span several nodes, or when its transport
/// cannot tell (it has no `single_node()`: the device transports): 64 KiB. Over TCP
/// (loopback, 4 ranks, 4-bit SRA) compression was at parity with MPI_Allreduce up to
/// 64 KiB (0.93x-1.16x) and won from 128 KiB (1.83x; 3.17x at 1 MiB): docs/threshold.md.
inline constexpr std::size_t default_native_below_bytes = std::size_t{64} << 10;

/// The threshold a plan picks when all its ranks share one node (shared memory): 16 MiB.
/// On one node (4 ranks, SRA, bucket 1024, threshold disabled: docs/results/
/// shm-mpi-compressed.txt and shm-shm-compressed.txt, tabulated in docs/threshold.md)
/// compression lost to MPI_Allreduce at 1 MiB over comm::shm (0.52x-0.87x) and at 1-2
/// MiB over comm::mpi (0.79x-1.04x), at 8 bits also at 8 MiB over comm::shm (0.96x); at
/// 16 MiB every width won over both transports (1.09x-1.74x). The run of the day before
/// had every width winning from 8 MiB: the crossover moves with the machine.
inline constexpr std::size_t default_native_below_bytes_one_node = std::size_t{16} << 20;

/// Run-time options of a plan.
struct plan_options {
  checking check = checking::automatic;  ///< argument checking level
  std::uint64_t seed = 0x63677821u;       ///< seed of stochastic rounding (any value; ranks may differ)
  int threads = 1;                        ///< host threads for (de)compression, per rank
  /// Messages of fewer bytes (uncompressed) go through the transport's own uncompressed
  /// allreduce (MPI_Allreduce for comm::mpi) when it has one: below this size that is
  /// faster (latency, not bandwidth, decides; on one node, shared memory moves the bytes
  /// faster than compression saves them). comm::shm's is MPI_Allreduce too.
  /// 0 disables the fallback (always compress; always_native forces the native path);
  /// any other value is used as given, and every rank must give the same.
  /// The default, auto_threshold, chooses per size class by measuring both paths on the
  /// plan's own calls (collectively, re-checked now and then; see auto_threshold and the
  /// plan's path_for()). static_threshold picks a fixed threshold at construction:
  /// default_native_below_bytes_one_node (16 MiB) when the transport reports that all
  /// ranks share one node (`single_node()`: comm::mpi asks MPI or your `mpi::nodes`
  /// grouping, comm::shm always does), default_native_below_bytes (64 KiB) otherwise.
  /// The plan's `native_below_bytes()` says what it uses. Measurements:
  /// docs/threshold.md.
  std::size_t native_below_bytes = auto_threshold;
  /// The longest one wait of a call may last for its peers, in milliseconds. Past it the
  /// waiting rank throws cgx::error(errc::timeout) naming the ranks it waited for, tells
  /// its peers (who throw errc::timeout too, naming it and the rank it waited for), and
  /// the plan is unusable from then on. The default, default_timeout_ms(), is 10 minutes
  /// (or CGX_TIMEOUT_MS from the environment): a stalled, deadlocked or lost peer becomes
  /// an error instead of a hang. 0: no limit, as in MPI. Transports: comm::mpi, comm::shm
  /// (and hierarchical over them).
  std::uint32_t timeout_ms = default_timeout_ms();
  /// Checksum every message (CRC-32C in its header, checked by the receiver): a message
  /// corrupted on the way throws cgx::error(errc::corrupt) on every rank instead of
  /// decoding into wrong values. Every rank must set the same value (else
  /// errc::mismatch). Costs a pass over each payload on either side (the SSE 4.2 crc32
  /// instruction where the CPU has it: several GB/s; cost: docs/results/README.md).
  /// Transports: comm::mpi, comm::shm; others refuse it (errc::invalid_argument).
  bool verify = false;
};

namespace detail {

/// A running FNV-1a hash, for plan signatures.
struct signature_hash {
  std::uint64_t h = 1469598103934665603ull;
  /// Mixes v in.
  void mix(std::uint64_t v) noexcept { h = (h ^ v) * 1099511628211ull; }
  /// Mixes the characters of s in.
  void mix(const char* s) noexcept {
    for (; *s != 0; ++s) mix(static_cast<unsigned char>(*s));
  }
  /// A non-negative int64 (so that -value fits).
  [[nodiscard]] std::int64_t value() const noexcept { return static_cast<std::int64_t>(h >> 1); }
};

/// The signature of a plan of kind `kind` (a plan or reducer name) for values T and
/// quantizer Q: differs between plans the ranks must not mix.
template <class T, class Q>
signature_hash plan_signature(const char* kind) noexcept {
  signature_hash h;
  h.mix(sizeof(T));
  if constexpr (requires { Q::bits; }) h.mix(static_cast<std::uint64_t>(Q::bits));
  h.mix(Q::bucket_size);
  if constexpr (requires { typename Q::rounding; })
    h.mix(std::is_same_v<typename Q::rounding, quant::stochastic> ? 1 : 0);
  if constexpr (requires { Q::variable_size; }) h.mix(Q::variable_size ? 0x7661 : 0);
  // A codec that transforms the values before an inner quantizer (quant::rotated) names
  // itself and its parameters here, so that it never mixes with the plain inner codec.
  if constexpr (requires { Q::signature_tag; }) h.mix(static_cast<std::uint64_t>(Q::signature_tag));
  h.mix(kind);
  return h;
}

/// A call refused on this rank by its own check (`why`): tells the peers where the
/// transport can (comm::mpi and comm::shm: refuse(), which fails the transport; they throw
/// errc::peer_failed naming this rank instead of waiting for it until their limit), then
/// throws errc::invalid_argument. No data has moved.
template <class X>
[[noreturn]] void refuse_call(X& x, const std::string& why) {
  const std::string msg = why + "; the call was refused on this rank before any data moved";
  if constexpr (requires { x.refuse(msg); })
    x.refuse(msg);
  else if constexpr (requires { x.abort(errc::invalid_argument, msg); })
    x.abort(errc::invalid_argument, msg);
  throw error(errc::invalid_argument, msg);
}

/// Checks the arguments of one call of a plan named `who` on this rank: a null buffer
/// with n > 0 (`bad_extra` adds a caller-defined local error, described by
/// `extra_message`), n above `max_count`; with collective checking also that every
/// rank passed the same n and the same `signature` (plan type and anything else the
/// ranks must agree on). Throws cgx::error, before any data moves, on every rank that
/// sees a violation (on every rank, with collective checking).
template <class X, class ExtraMessage>
void check_call(X& x, checking level, const char* who, bool null_buffer, std::size_t n, std::size_t max_count,
                std::int64_t signature, bool bad_extra, ExtraMessage extra_message) {
  enum : std::int64_t { null_bit = 1, too_many = 2, extra_bit = 4 };
  std::int64_t bad = 0;
  if (null_buffer && n > 0) bad |= null_bit;
  if (n > max_count) bad |= too_many;
  if (bad_extra) bad |= extra_bit;
  // Messages are built only on the way to a throw: no allocation on the hot path.
  auto where = [&] { return std::string(who) + " (rank " + std::to_string(x.rank()) + "): "; };
  auto local_message = [&]() -> std::string {
    if (bad & null_bit) return "null buffer with count " + std::to_string(n) + " > 0";
    if (bad & too_many) return "count " + std::to_string(n) + " exceeds the plan's max_count " + std::to_string(max_count);
    return extra_message();
  };
  if (resolve(level) == checking::local) {
    if (bad != 0) {
      // The peers do not know: without a word they would wait for this rank until their
      // limit. Where the transport has a failure channel (comm::mpi, comm::shm) they hear
      // of the refusal at once and throw errc::peer_failed naming this rank; no data has
      // moved here, and the plan is failed on every rank, as after any failed call.
      refuse_call(x, where() + local_message());
    }
    if constexpr (requires { x.throw_if_failed(); }) x.throw_if_failed();
    return;
  }
  if constexpr (requires { x.throw_if_failed(); }) x.throw_if_failed();  // before the collective step
  const auto sn = static_cast<std::int64_t>(n);
  std::array<std::int64_t, 5> v{sn, -sn, signature, -signature, bad};
  x.max_all(v);
  if (bad != 0) throw error(errc::invalid_argument, where() + local_message());
  if (v[4] != 0)
    throw error(errc::invalid_argument, where() + "another rank passed invalid arguments (null buffer, count above "
                                                  "max_count or a bad option); no data was moved");
  if (v[0] != -v[1])
    throw error(errc::mismatch, where() + "ranks passed different counts (between " + std::to_string(-v[1]) + " and " +
                                    std::to_string(v[0]) + "; this rank " + std::to_string(n) + "); no data was moved");
  if (v[2] != -v[3])
    throw error(errc::mismatch, where() + "ranks called plans of different value type, quantizer, reducer or "
                                          "options (threshold, root, bound); no data was moved");
}

/// check_call without a caller-defined error.
template <class X>
void check_call(X& x, checking level, const char* who, bool null_buffer, std::size_t n, std::size_t max_count,
                std::int64_t signature) {
  check_call(x, level, who, null_buffer, n, max_count, signature, false, [] { return std::string(); });
}

/// The native-allreduce threshold a plan over transport `x` uses when asked for
/// `requested` bytes (plan_options::native_below_bytes): `requested` itself unless it is
/// auto_threshold; then default_native_below_bytes_one_node if `x.single_node()` says
/// all ranks share one node, default_native_below_bytes if not or if X cannot tell.
/// Collective where X has single_node(): it is asked whatever `requested` is, so that
/// the ranks' sequence of collectives does not depend on an option they might disagree
/// on (a disagreement is then reported by the plan's signature check, not a hang).
template <class X>
std::size_t resolve_native_below(X& x, std::size_t requested, bool measured = false) {
  bool one_node = false;
  if constexpr (requires { { x.single_node() } -> std::convertible_to<bool>; }) one_node = x.single_node();
  if (requested == auto_threshold && measured) return auto_threshold;
  if (requested != auto_threshold && requested != static_threshold) return requested;
  return one_node ? default_native_below_bytes_one_node : default_native_below_bytes;
}

/// Throws cgx::error(errc::workspace) unless the caller's workspace `ws` holds `need`
/// bytes (for `max_count` values on `ranks` ranks, named in the message).
inline void require_workspace(std::span<std::byte> ws, std::size_t need, const char* who, std::size_t max_count,
                              int ranks) {
  if (ws.size() < need || (need > 0 && ws.data() == nullptr))
    throw error(errc::workspace, std::string(who) + ": workspace of " + std::to_string(ws.size()) +
                                     " bytes is too small: " + std::to_string(max_count) + " values on " +
                                     std::to_string(ranks) + " ranks need " + std::to_string(need));
}

/// Frees a plan's own workspace, unless its transport abandoned sends that MPI may still
/// read from it after a failed call (comm::mpi::abandoned): then it is kept for the life
/// of the process.
template <class X>
void release_workspace(const X& x, std::unique_ptr<std::byte[]>& ws) noexcept {
  if constexpr (requires { x.abandoned(); }) {
    if (x.abandoned() && ws) {
      static std::mutex lock;
      static std::vector<std::unique_ptr<std::byte[]>> kept;
      const std::lock_guard<std::mutex> g(lock);
      try {
        kept.push_back(std::move(ws));
      } catch (...) {
        (void)ws.release();
      }
      return;
    }
  }
  ws.reset();
}

/// Gives the transport a plan's wait limit (`timeout_ms`, plan_options::timeout_ms),
/// where it takes one, and its integrity option (`verify`, plan_options::verify). Throws
/// cgx::error(errc::invalid_argument) for verify over a transport that cannot checksum.
template <class X>
void configure_transport(X& x, std::uint32_t timeout_ms, bool verify) {
  if constexpr (requires { x.set_wait_limit(std::chrono::milliseconds(1)); })
    x.set_wait_limit(std::chrono::milliseconds(timeout_ms));
  if constexpr (requires { x.set_verify(true); })
    x.set_verify(verify);
  else if (verify)
    throw error(errc::invalid_argument,
                "plan_options::verify: this transport cannot checksum its messages (comm::mpi and comm::shm can)");
}


/// Claims a plan for one call, so that two threads never run one plan at once: the
/// constructor sets the plan's `busy` flag or, if another thread holds it, throws
/// cgx::error(errc::invalid_argument) at once, before any communication, leaving the
/// other thread's call and the caller's buffer untouched. The destructor releases the
/// flag and wakes `wait_idle`. Every call entry point of every plan makes one first.
///
/// Failure propagation: once a call's arguments are checked and its messages may start,
/// the plan calls `begin(transport)`. If the call then throws, the destructor tells the
/// peers through the transport's `abort` (where it has one: comm::mpi, comm::shm), so
/// that they stop waiting for this rank and throw errc::peer_failed; the transport is
/// failed from then on and every later call of the plan throws.
class call_guard {
 public:
  /// Claims `busy` for the call of `who` (a plan name, for the message).
  call_guard(std::atomic<bool>& busy, const char* who)
      : busy_(busy), who_(who), uncaught_(std::uncaught_exceptions()) {
    if (busy_.exchange(true, std::memory_order_acquire))
      throw error(errc::invalid_argument,
                  std::string(who) + ": called from two threads at once; a plan serves one call at a time (give "
                                     "each thread its own plan, over its own communicator); this call did nothing");
  }
  ~call_guard() {
    if (abort_ != nullptr && std::uncaught_exceptions() > uncaught_) abort_(transport_, who_);
    busy_.store(false, std::memory_order_release);
    busy_.notify_all();
  }

  /// From here on, a throw out of the call is reported to the peers over `x` (see
  /// above); and the transport stamps the call's messages with `signature` and `count`
  /// (comm::call_context; where it has begin_call: comm::mpi, comm::shm).
  template <class X>
  void begin(X& x, std::int64_t signature, std::uint64_t count) const noexcept {
    if constexpr (requires { x.begin_call(comm::call_context{}); }) x.begin_call(comm::call_context{signature, count});
    if constexpr (requires { x.abort(errc::transport, std::string()); }) {
      transport_ = &x;
      abort_ = [](void* t, const char* who) noexcept {
        try {
          static_cast<X*>(t)->abort(errc::transport, std::string(who) + ": a rank threw during the call");
        } catch (...) {  // a message that cannot be built: the peers' wait limit is left
        }
      };
    }
    if constexpr (requires { x.end_call_check(); }) {
      transport_ = &x;
      finish_ = [](void* t) { static_cast<X*>(t)->end_call_check(); };
    } else if constexpr (requires { x.throw_if_failed(); }) {
      transport_ = &x;
      finish_ = [](void* t) { static_cast<X*>(t)->throw_if_failed(); };
    }
  }

  /// Ends a call whose work is done: throws if a peer's failure report for it has
  /// arrived (the transport's throw_if_failed), so that a rank whose own part of a
  /// failed call completed (its data arrived before a peer gave up, or while it was
  /// stopped) throws too instead of returning as if the call had succeeded. One look at
  /// the failure channel (comm::mpi: an MPI_Test; comm::shm: a word of the segment).
  void finish() const {
    if (finish_ != nullptr) finish_(transport_);
  }
  call_guard(const call_guard&) = delete;
  call_guard& operator=(const call_guard&) = delete;

  /// Blocks until no call holds `busy`, then claims it for good: what allreduce_plan's
  /// destructor does, so that a start() or call still running on another thread
  /// returns before the plan's members go (it never returns if that call never does).
  static void wait_idle(std::atomic<bool>& busy) noexcept {
    while (busy.exchange(true, std::memory_order_acquire)) busy.wait(true, std::memory_order_relaxed);
  }

 private:
  std::atomic<bool>& busy_;
  const char* who_;
  int uncaught_;
  mutable void* transport_ = nullptr;
  mutable void (*abort_)(void*, const char*) noexcept = nullptr;
  mutable void (*finish_)(void*) = nullptr;
};

/// An empty vector with room for n elements (a plan's request list, sized once).
template <class R>
std::vector<R> reserved(std::size_t n) {
  std::vector<R> v;
  v.reserve(n);
  return v;
}

/// Selects plan_core's constructor that only stores its arguments (see plan_core::setup()).
struct defer_setup_t {};
/// The tag of that constructor.
inline constexpr defer_setup_t defer_setup{};

}  // namespace detail

/// The core every host plan is a front end of (allreduce_plan, reduce_scatter_plan,
/// allgather_plan, broadcast_plan, error_bounded_plan): the transport, the capacity
/// (max_count), the options, the workspace (owned or the caller's), the call counter that
/// keys stochastic rounding, and the flag a call holds, so that a second concurrent call
/// of one plan throws instead of corrupting the first. Its public members are every
/// plan's; a plan is not made from it directly (its constructors are protected).
///
/// For the plan that derives from it: one that sizes its workspace from its own
/// arguments and transport passes its static workspace_bytes to the constructors that
/// take a workspace_fn; allreduce_plan, whose own collective setup must come first, uses
/// detail::defer_setup and calls setup() and own_workspace() / use_workspace() itself.
/// Each call claims the plan (claim()), checks its arguments (begin_call(): check_call
/// under the plan's name, checking level and max_count) and draws its random state
/// (next_rng()).
template <class X>
class plan_core {
 public:
  /// The transport (e.g. to read rank() and size()).
  X& transport() noexcept { return x_; }
  /// The transport, read-only.
  const X& transport() const noexcept { return x_; }
  /// Largest count a call may pass.
  std::size_t max_count() const noexcept { return max_count_; }
  /// Bytes of workspace in use.
  std::size_t workspace_size() const noexcept { return ws_.size(); }
  /// Number of calls so far that drew a random state (the stochastic-rounding call
  /// counter); allreduce_plan's calls that take the native path are not counted.
  std::uint32_t calls() const noexcept { return calls_; }
  /// The options the plan was made with (native_below_bytes as given: possibly
  /// auto_threshold).
  const plan_options& options() const noexcept { return opts_; }

  plan_core(const plan_core&) = delete;
  plan_core& operator=(const plan_core&) = delete;

 protected:
  /// A plan's workspace size for `max_count` values on `ranks` ranks (its static workspace_bytes).
  using workspace_fn = std::size_t (*)(std::size_t max_count, int ranks);
  /// Stores the arguments; the plan calls setup() before its first message.
  plan_core(X transport, std::size_t max_count, plan_options opts, const char* who, detail::defer_setup_t)
      : x_(std::move(transport)), max_count_(max_count), opts_(opts), who_(who) {}
  /// Stores the arguments and calls setup().
  plan_core(X transport, std::size_t max_count, plan_options opts, const char* who)
      : plan_core(std::move(transport), max_count, opts, who, detail::defer_setup) {
    setup();
  }
  /// As above, then allocates size(max_count, transport.size()) bytes of workspace.
  plan_core(X transport, std::size_t max_count, plan_options opts, const char* who, workspace_fn size)
      : plan_core(std::move(transport), max_count, opts, who) {
    own_workspace(size(max_count_, x_.size()));
  }
  /// As above, but uses the caller's workspace: throws cgx::error(errc::workspace) if it
  /// holds fewer than size(max_count, transport.size()) bytes.
  plan_core(X transport, std::size_t max_count, std::span<std::byte> workspace, plan_options opts, const char* who,
            workspace_fn size)
      : plan_core(std::move(transport), max_count, opts, who) {
    use_workspace(workspace, size(max_count_, x_.size()));
  }
  ~plan_core() { detail::release_workspace(x_, owned_); }

  /// Checks plan_options::threads and gives the transport its wait limit and integrity
  /// option (configure_transport).
  void setup() {
    if (opts_.threads < 1) throw error(errc::invalid_argument, std::string(who_) + ": plan_options::threads must be >= 1");
    detail::configure_transport(x_, opts_.timeout_ms, opts_.verify);
  }

  /// Claims the plan for one call (throws if another thread is in a call of it).
  [[nodiscard]] detail::call_guard claim() { return detail::call_guard(busy_, who_); }

  /// Checks the arguments of a call of n values that the caller has `claimed`
  /// (check_call under the plan's name, checking level and max_count; `extra`: a
  /// caller-defined error and its message), then begins it (call_guard::begin).
  template <class... Extra>
  void begin_call(const detail::call_guard& claimed, bool null_buffer, std::size_t n, std::int64_t signature,
                  const Extra&... extra) {
    detail::check_call(x_, opts_.check, who_, null_buffer, n, max_count_, signature, extra...);
    claimed.begin(x_, signature, n);
  }

  /// Allocates `bytes` of workspace; throws cgx::error(errc::workspace) if that fails.
  void own_workspace(std::size_t bytes) {
    owned_ = detail::allocate_workspace(bytes, who_, max_count_, x_.size());
    ws_ = std::span<std::byte>(owned_.get(), bytes);
  }

  /// Uses the caller's workspace; throws cgx::error(errc::workspace) if it is under `need` bytes.
  void use_workspace(std::span<std::byte> ws, std::size_t need) {
    detail::require_workspace(ws, need, who_, max_count_, x_.size());
    ws_ = ws;
  }

  /// The random state of the next call (advances the call counter).
  quant::rng_state next_rng() noexcept {
    quant::rng_state rng;
    rng.seed = opts_.seed;
    rng.counter = calls_++;
    return rng;
  }

  X x_;                                  ///< the transport
  std::size_t max_count_;                ///< largest count a call may pass
  plan_options opts_;                    ///< the options, as given
  const char* who_;                      ///< the plan's name, for error messages
  std::unique_ptr<std::byte[]> owned_;   ///< the workspace the plan allocated (else empty)
  std::span<std::byte> ws_;              ///< the workspace in use (owned_ or the caller's)
  std::uint32_t calls_ = 0;              ///< the call counter (next_rng())
  std::atomic<bool> busy_{false};        ///< held by a call in progress (claim())
};

/// The core of the fixed-size host collectives (reduce_scatter_plan, allgather_plan,
/// broadcast_plan): plan_core, with their requirements on T, Q and X checked once, their
/// member types, and their two constructors, which the plans inherit.
///
/// \tparam Plan  the plan deriving from it: names itself (`Plan::name`) and sizes its
///               workspace (`Plan::workspace_bytes(max_count, ranks)`)
/// \tparam T  float or double
/// \tparam Q  a fixed-size quantizer: quant::maxmin<...> or quant::none
/// \tparam X  transport: comm::mpi or comm::shm
///
/// Construction and every call are collective: every rank of the transport must make
/// them, in the same order.
template <class Plan, class T, class Q, class X>
class collective_plan : public plan_core<X> {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "cgx::allgather_plan, cgx::broadcast_plan and cgx::reduce_scatter_plan: T must be float or double");
  static_assert(quantizer_for<Q, T>, "cgx::allgather_plan, cgx::broadcast_plan and cgx::reduce_scatter_plan: Q must be a "
                                     "fixed-size quantizer (cgx::quant::maxmin<Bits, Bucket, Rounding> or cgx::quant::none)");
  static_assert(transport<X>, "cgx::allgather_plan, cgx::broadcast_plan and cgx::reduce_scatter_plan: X must be a transport "
                              "(cgx::comm::mpi or cgx::comm::shm)");

 public:
  using value_type = T;      ///< the element type of the buffers
  using quantizer_type = Q;  ///< the quantizer (codec) on the wire
  using transport_type = X;  ///< the transport

  /// Collective. Allocates Plan::workspace_bytes(max_count, transport.size()) bytes;
  /// throws cgx::error(errc::workspace) if that fails.
  collective_plan(X transport, std::size_t max_count, plan_options opts = {})
      : plan_core<X>(std::move(transport), max_count, opts, Plan::name, &Plan::workspace_bytes) {}

  /// Collective. Uses the caller's workspace (at least Plan::workspace_bytes(max_count,
  /// transport.size()) bytes, outliving the plan); throws cgx::error(errc::workspace) if
  /// it is smaller.
  collective_plan(X transport, std::size_t max_count, std::span<std::byte> workspace, plan_options opts = {})
      : plan_core<X>(std::move(transport), max_count, workspace, opts, Plan::name, &Plan::workspace_bytes) {}
};

}  // namespace cgx
