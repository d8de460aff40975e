#pragma once
/// \file mpi.hpp
/// `cgx::comm::mpi`: the transport over an MPI communicator, host buffers.

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../timeout.hpp"
#include "header.hpp"

namespace cgx::comm {

/// How long a transport's waits may last before it gives up (plan_options::timeout_ms).
/// Zero: no limit.
using wait_limit = std::chrono::milliseconds;

namespace detail {
/// MPI cannot cancel a collective or a communicator duplication: a construction step that
/// timed out leaves its request with MPI, and with it the memory MPI may still write into
/// (the new communicator's handle, a reduction's buffer). Both are kept here for the life
/// of the process, never waited for or freed (a few bytes per timed-out step); a
/// communicator that such a request creates later is never used or freed either.
inline void abandon(std::span<MPI_Request> reqs, std::shared_ptr<void> keep) noexcept {
  struct kept_t {
    std::mutex lock;
    std::vector<MPI_Request> reqs;
    std::vector<std::shared_ptr<void>> memory;
  };
  static kept_t* const kept = new kept_t;  // never destroyed: MPI may write into it at exit
  const std::lock_guard<std::mutex> g(kept->lock);
  try {
    for (MPI_Request r : reqs)
      if (r != MPI_REQUEST_NULL) kept->reqs.push_back(r);
    if (keep) kept->memory.push_back(std::move(keep));
  } catch (...) {
    new std::shared_ptr<void>(std::move(keep));  // out of memory: leak it rather than free what MPI may write
  }
}

/// "not every rank of the communicator joined WHAT within L ms": a timed-out step of a
/// transport's construction, where MPI cannot say which rank is missing.
inline std::string construction_timeout(wait_limit limit, const std::string& what) {
  return "waited more than " + std::to_string(limit.count()) + " ms (plan_options::timeout_ms, CGX_TIMEOUT_MS) for " +
         what + ": not every rank of the communicator joined it (a rank is late, skipped the collective "
         "construction, or died; MPI's communicator duplication and collectives cannot say which)";
}

inline void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw cgx::error(errc::transport, std::string(what) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
  }
}

/// Waits for every request of `reqs` until `deadline` (polling: MPI cannot block with a
/// limit). Returns true when all completed, false when the deadline passed first (the rest
/// stay pending). Throws cgx::error(errc::transport) for an MPI error, naming `what`.
inline bool wait_until(std::span<MPI_Request> reqs, std::chrono::steady_clock::time_point deadline, const char* what) {
  for (unsigned spins = 0;; ++spins) {
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what);
    if (flag) return true;
    if ((spins & 63) == 63 && std::chrono::steady_clock::now() >= deadline) return false;
    if (spins > 64) std::this_thread::yield();  // ranks may outnumber cores
  }
}

/// wait_until for at most `limit` from now (zero: no limit; MPI_Waitall).
inline bool wait_bounded(std::span<MPI_Request> reqs, wait_limit limit, const char* what) {
  if (limit.count() == 0) {
    check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), what);
    return true;
  }
  return wait_until(reqs, std::chrono::steady_clock::now() + limit, what);
}

/// "waited more than L ms (plan_options::timeout_ms)": how every expired wait begins.
inline std::string waited_more_than(std::chrono::milliseconds limit) {
  return "waited more than " + std::to_string(limit.count()) + " ms (plan_options::timeout_ms)";
}

/// "waited more than L ms (plan_options::timeout_ms) for ranks 1, 3 and 4": the message
/// of a transport's expired wait; `peers` may hold repeats, in any order.
inline std::string waited_for(std::chrono::milliseconds limit, std::vector<int> peers) {
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  std::string s = waited_more_than(limit) + " for rank" + (peers.size() == 1 ? " " : "s ");
  for (std::size_t i = 0; i < peers.size(); ++i) {
    if (i > 0) s += (i + 1 == peers.size()) ? " and " : ", ";
    s += std::to_string(peers[i]);
  }
  return s;
}
/// What a peer's report of `code` becomes on the rank that hears it: timeouts and corrupt
/// messages keep their code (every rank then says what went wrong), anything else is
/// errc::peer_failed.
inline errc reported_code(errc code) noexcept {
  return code == errc::timeout || code == errc::corrupt ? code : errc::peer_failed;
}

/// "rank 2 timed out (its wait limit passed) waiting for rank 3": how a rank that hears a
/// failure report names it. `origin` is the rank that failed first (a report is relayed
/// unchanged), `waited_for` the lowest rank it waited for when its limit passed (-1: none
/// named).
inline std::string reported_failure(int origin, errc code, int waited_for) {
  std::string s = "rank " + std::to_string(origin) + " ";
  if (code == errc::timeout) {
    s += "timed out (its wait limit passed)";
    if (waited_for >= 0) s += " waiting for rank " + std::to_string(waited_for);
  } else if (code == errc::corrupt) {
    s += "received a corrupt message (plan_options::verify)";
  } else if (code == errc::mismatch) {
    s += "received a message of another count, plan or call (the ranks disagree)";
  } else if (code == errc::invalid_argument) {
    s += "refused the call (invalid arguments on that rank: a null buffer, a count above the plan's capacity or a "
         "bad option; it moved no data)";
  } else {
    s += "failed (it threw)";
  }
  return s;
}
}  // namespace detail

/// Point-to-point transport over a caller-supplied communicator. The constructor
/// duplicates the communicator (collective: every rank of `comm` must call it), so
/// cgx's messages never match the caller's own; the duplicate is freed by the
/// destructor (also collective in MPI's sense: call it before MPI_Finalize).
/// Move-only. Host buffers only: Debian's Open MPI and MPICH are not CUDA-aware.
///
/// Headers: every payload carries a 40-byte header (detail::wire_header: call number,
/// plan signature, count, payload bytes; see comm::call_context), checked by the
/// receiver before it uses a byte of the payload: ranks that disagree on the count or
/// the plan, or are a call apart, get errc::mismatch at any checking level. A payload of
/// at most `inline_bytes` travels in one message with its header, through a staging
/// buffer on both sides (a second message would cost a small payload more than the
/// copies: 5-13 us per message over TCP); a larger one follows its header as a message
/// of its own, straight from and into the caller's memory (MPI's single-copy paths).
/// The receiver copies a staged payload into the caller's memory only once its header
/// (and, with verify, its checksum) passed.
///
/// Integrity (`set_verify`, from plan_options::verify): the sender puts the payload's
/// CRC-32C in the header and the receiver checks it when the payload has arrived; a
/// mismatch throws errc::corrupt there, and the peers, told as for any failure, throw
/// errc::corrupt too.
///
/// Failures: cgx's communicators return MPI's errors instead of aborting the job
/// (MPI_ERRORS_RETURN), and a wait turns them into cgx::error: a message longer or
/// shorter than the receive posted for it (ranks that disagree on a count) is
/// errc::mismatch, any other MPI error errc::transport. A rank whose call fails tells
/// its peers (`abort`), over a second duplicate of the communicator on which every
/// wait also listens; a peer that hears it stops waiting and throws errc::peer_failed
/// (errc::timeout or errc::corrupt if that was the failure), naming the rank. With a wait limit
/// (`set_wait_limit`, from plan_options::timeout_ms) a wait that lasts longer throws
/// errc::timeout naming the ranks it waited for, and tells the peers. After any of
/// these the transport is failed: every later wait throws at once. The transports made
/// from this one by split() and node() fail with it: when it fails, or hears a peer's
/// report, each of them is failed too and tells its own peers (a hierarchical plan's
/// ranks wait on those: see comm::hierarchical).
class mpi {
 public:
  /// Payloads of at most this many bytes travel in one message with their header (see
  /// the class comment).
  static constexpr std::size_t inline_bytes = std::size_t{16} << 10;

  /// A pending send or receive: the header and the payload in one message (payloads of
  /// at most inline_bytes), or the header message, then the payload (in two parts above
  /// 2 GiB).
  struct request {
    /// The MPI requests: header (with an inline payload), payload, and the payload's
    /// part above 2 GiB.
    MPI_Request r[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    std::size_t bytes[3] = {0, 0, 0};          ///< bytes of each (receives are checked)
    std::size_t payload = 0;                   ///< the payload's bytes
    detail::wire_header* header = nullptr;     ///< the header sent or received, at the start of its staging buffer
    void* data = nullptr;                      ///< the payload, in the caller's memory
    int peer = -1;                             ///< the other rank
    bool send = false;                         ///< a send (else a receive)
  };

  /// How ranks are grouped into nodes, for hierarchical reducers: by default the
  /// shared-memory domains MPI reports (MPI_Comm_split_type); a caller may instead give
  /// each rank a node number (to emulate several nodes on one machine, or to follow
  /// its own topology).
  struct nodes {
    int color = -1;  ///< this rank's node number; -1: ask MPI
  };

  /// Collective over `comm`. Throws cgx::error(errc::communicator) for MPI_COMM_NULL,
  /// an inter-communicator, or when MPI is not initialized.
  ///
  /// Bounded: the construction's collective steps (two MPI_Comm_idup of `comm`, then an
  /// MPI_Ibarrier on the duplicate) are polled against `limit` (default:
  /// default_timeout_ms(), i.e. CGX_TIMEOUT_MS or 10 minutes; zero: no limit), which also
  /// becomes the transport's wait limit until a plan sets its own (set_wait_limit). A rank
  /// whose construction passes the limit throws cgx::error(errc::timeout); a rank that
  /// arrives after its peers gave up fails too (its barrier is never joined), it never
  /// succeeds alone. What stays MPI's own: the steps cannot be cancelled, so a timed-out
  /// step is left with MPI for the life of the process (detail::abandon); and MPI cannot
  /// say which rank did not join a duplication.
  explicit mpi(MPI_Comm comm) : mpi(comm, nodes{-1}, wait_limit(default_timeout_ms())) {}

  /// As mpi(comm), with the construction bounded by `limit` (zero: no limit).
  mpi(MPI_Comm comm, wait_limit limit) : mpi(comm, nodes{-1}, limit) {}

  /// Collective over `comm`, with the caller's grouping of ranks into nodes.
  mpi(MPI_Comm comm, nodes grouping) : mpi(comm, grouping, wait_limit(default_timeout_ms())) {}

  /// Collective over `comm`, with the caller's grouping of ranks into nodes, the
  /// construction bounded by `limit` (see mpi(comm)).
  mpi(MPI_Comm comm, nodes grouping, wait_limit limit) : node_color_(grouping.color), limit_(limit) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw cgx::error(errc::communicator, "cgx::comm::mpi: MPI is not initialized");
    if (comm == MPI_COMM_NULL) throw cgx::error(errc::communicator, "cgx::comm::mpi: communicator is MPI_COMM_NULL");
    int inter = 0;
    detail::check_mpi(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter");
    if (inter) throw cgx::error(errc::communicator, "cgx::comm::mpi: inter-communicators are not supported");
    // The data communicator, then the failure channel's (a duplicate of the first: two
    // duplications of one communicator in flight at once gave ranks mismatched pairs under
    // Open MPI 4.1, a data message then matching the failure channel's receive), each
    // without blocking. MPI writes the new handles when a duplication completes, perhaps
    // after this constructor gave up: so they live on the heap, and are abandoned with the
    // requests on a timeout.
    struct duplicates {
      MPI_Comm out[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
      MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    };
    auto d = std::make_shared<duplicates>();
    int me = 0;
    MPI_Comm_rank(comm, &me);
    auto timed_out = [&](const char* what) {
      detail::abandon(d->req, d);
      return cgx::error(errc::timeout, "cgx::comm::mpi (rank " + std::to_string(me) + "): " +
                                           detail::construction_timeout(limit_, what));
    };
    detail::check_mpi(MPI_Comm_idup(comm, &d->out[0], &d->req[0]), "MPI_Comm_idup");
    if (!detail::wait_bounded(std::span<MPI_Request>(d->req, 1), limit_, "MPI_Comm_idup"))
      throw timed_out("the duplication of the communicator (MPI_Comm_idup)");
    const int rc = MPI_Comm_idup(d->out[0], &d->out[1], &d->req[1]);
    if (rc != MPI_SUCCESS) {
      detail::abandon(d->req, d);  // out[0] is kept: never freed after a failed construction
      detail::check_mpi(rc, "MPI_Comm_idup");
    }
    if (!detail::wait_bounded(std::span<MPI_Request>(d->req + 1, 1), limit_, "MPI_Comm_idup"))
      throw timed_out("the duplication of the failure channel's communicator (MPI_Comm_idup)");
    comm_ = d->out[0];
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // The failure channel: its own communicator, one receive always posted.
    fault_ = std::make_shared<fault_channel>();
    fault_->rank = rank_;
    fault_->size = size_;
    fault_->comm = d->out[1];
    MPI_Comm_set_errhandler(fault_->comm, MPI_ERRORS_RETURN);
    // Every rank's duplications completed, or a rank whose own did not gave up: a barrier on
    // the new communicator, bounded as well, makes a rank that completed its duplication
    // after its peers gave up fail too, instead of holding a transport no peer uses. Until
    // it passed, the communicators are not freed (messages of the abandoned barrier could
    // reach a communicator that reused their context id).
    try {
      barrier("the end of the transport's construction (MPI_Ibarrier)");
    } catch (...) {
      fault_->failed = true;  // release() keeps the communicators
      release();
      throw;
    }
    detail::check_mpi(MPI_Irecv(fault_->in, 4, MPI_INT, MPI_ANY_SOURCE, 0, fault_->comm, &fault_->listen), "MPI_Irecv");
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  /// Takes over o's communicator; o holds MPI_COMM_NULL after.
  mpi(mpi&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        rank_(o.rank_),
        size_(o.size_),
        node_color_(o.node_color_),
        limit_(o.limit_),
        stamp_(o.stamp_),
        fault_(std::move(o.fault_)) {}
  /// Frees this transport's communicator and takes over o's.
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      node_color_ = o.node_color_;
      limit_ = o.limit_;
      stamp_ = o.stamp_;
      fault_ = std::move(o.fault_);
    }
    return *this;
  }
  ~mpi() { release(); }

  /// This process's rank in the communicator.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The duplicated communicator cgx sends on.
  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_; }

  /// Collective: the transport over the ranks with the same `color`, ordered by `key`.
  /// It fails with this one (see the class comment).
  /// Bounded: a barrier polled against the wait limit (errc::timeout) precedes
  /// MPI_Comm_split, which has no non-blocking form; so only a rank that dies between the
  /// two can make it wait for ever (MPI's own).
  mpi split(int color, int key) const {
    barrier("MPI_Comm_split (MPI_Ibarrier before it)");
    MPI_Comm sub;
    detail::check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return linked(sub);
  }

  /// Collective: the transport over the ranks of this rank's node (see `nodes`). It
  /// fails with this one (see the class comment).
  mpi node() const {
    if (node_color_ >= 0) return split(node_color_, rank_);
    barrier("MPI_Comm_split_type (MPI_Ibarrier before it)");
    MPI_Comm sub;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub),
                      "MPI_Comm_split_type");
    return linked(sub);
  }

  /// Collective: whether all ranks of the communicator are on one node, by the same
  /// grouping as node(): with a caller's `nodes{color}`, whether every rank gave the same
  /// color; otherwise whether MPI's shared-memory domain (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED) holds the whole communicator. Every rank gets the same answer.
  /// A plan asks it once, at construction, to pick its native-allreduce threshold.
  /// Bounded by the wait limit like split(): a reduction and a barrier polled against it
  /// (errc::timeout), then MPI_Comm_split_type.
  [[nodiscard]] bool single_node() const {
    std::int64_t v[2] = {node_color_, -static_cast<std::int64_t>(node_color_)};  // max color, -min color
    reduce_max(v, "the plan's construction (which ranks share a node, MPI_Iallreduce)");
    // A rank that arrives after its peers gave up completes the reduction they left with
    // MPI; it must not go on alone (and not into MPI_Comm_split_type, which would wait for
    // ever): this barrier, which they never posted, makes it fail too.
    barrier("the plan's construction (MPI_Ibarrier)");
    if (v[0] >= 0) return v[0] == -v[1];  // a grouping was given (ranks without one count as color -1)
    MPI_Comm sub;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub),
                      "MPI_Comm_split_type");
    int sub_size = 0;
    MPI_Comm_size(sub, &sub_size);
    MPI_Comm_free(&sub);
    return sub_size == size_;
  }

  /// Collective, bounded by the wait limit: MPI_Ibarrier on this transport's
  /// communicator, polled. Throws cgx::error(errc::timeout) naming `what` when the limit
  /// passes (the barrier is left with MPI: detail::abandon). For construction steps (of
  /// this transport and of those built over it, such as comm::shm).
  void barrier(const char* what) const {
    MPI_Request r = MPI_REQUEST_NULL;
    detail::check_mpi(MPI_Ibarrier(comm_, &r), "MPI_Ibarrier");
    finish(std::span<MPI_Request>(&r, 1), nullptr, what);
  }

  /// Collective, bounded like barrier(): element-wise maximum over all ranks of `v`, in
  /// place (MPI_Iallreduce). Unlike max_all() it does not listen for failure reports: a
  /// construction step.
  void reduce_max(std::span<std::int64_t> v, const char* what) const {
    auto buf = std::make_shared<std::vector<std::int64_t>>(v.begin(), v.end());
    MPI_Request r = MPI_REQUEST_NULL;
    detail::check_mpi(
        MPI_Iallreduce(MPI_IN_PLACE, buf->data(), static_cast<int>(buf->size()), MPI_INT64_T, MPI_MAX, comm_, &r),
        "MPI_Iallreduce");
    finish(std::span<MPI_Request>(&r, 1), buf, what);
    std::copy(buf->begin(), buf->end(), v.begin());
  }

  /// Collective, bounded like barrier(): every rank's `bytes` bytes at `mine` into `all`
  /// (size() * bytes, in rank order; MPI_Iallgather).
  void allgather(const void* mine, std::size_t bytes, void* all, const char* what) const {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw cgx::error(errc::invalid_argument, "cgx::comm::mpi::allgather: " + std::to_string(bytes) + " bytes per rank");
    auto buf = std::make_shared<std::vector<std::byte>>(bytes * (static_cast<std::size_t>(size_) + 1));
    if (bytes != 0) std::memcpy(buf->data(), mine, bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    const int b = static_cast<int>(bytes);
    detail::check_mpi(MPI_Iallgather(buf->data(), b, MPI_BYTE, buf->data() + bytes, b, MPI_BYTE, comm_, &r),
                      "MPI_Iallgather");
    finish(std::span<MPI_Request>(&r, 1), buf, what);
    if (bytes != 0) std::memcpy(all, buf->data() + bytes, bytes * static_cast<std::size_t>(size_));
  }

  /// Collective, bounded like barrier(): rank `root`'s `bytes` bytes at `buf` to every
  /// rank (MPI_Ibcast).
  void broadcast(void* buf, std::size_t bytes, int root, const char* what) const {
    if (bytes > static_cast<std::size_t>(INT_MAX))
      throw cgx::error(errc::invalid_argument, "cgx::comm::mpi::broadcast: " + std::to_string(bytes) + " bytes");
    auto copy = std::make_shared<std::vector<std::byte>>(bytes);
    if (bytes != 0) std::memcpy(copy->data(), buf, bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    detail::check_mpi(MPI_Ibcast(copy->data(), static_cast<int>(bytes), MPI_BYTE, root, comm_, &r), "MPI_Ibcast");
    finish(std::span<MPI_Request>(&r, 1), copy, what);
    if (bytes != 0) std::memcpy(buf, copy->data(), bytes);
  }

  /// MPI's own uncompressed allreduce (sum, in place): what a plan uses below its
  /// `native_below_bytes` threshold.
  template <class T>
  void native_allreduce(T* buf, std::size_t n) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "native_allreduce takes float or double");
    const MPI_Datatype t = std::is_same_v<T, float> ? MPI_FLOAT : MPI_DOUBLE;
    for (std::size_t done = 0; done < n;) {
      const std::size_t part = std::min<std::size_t>(n - done, std::size_t{1} << 30);
      detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf + done, static_cast<int>(part), t, MPI_SUM, comm_),
                        "MPI_Allreduce");
      done += part;
    }
  }

  /// Throws cgx::error(errc::transport) unless MPI was initialized with at least
  /// MPI_THREAD_SERIALIZED, which a plan's start()/wait() needs (MPI runs on a
  /// background thread).
  void require_thread_level() const {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_SERIALIZED)
      throw cgx::error(errc::transport,
                       "allreduce_plan::start: MPI was initialized without thread support; use "
                       "MPI_Init_thread with MPI_THREAD_SERIALIZED (or MPI_THREAD_MULTIPLE to keep calling MPI "
                       "while a reduction is in flight)");
  }

  /// Starts sending `bytes` bytes at `buf` to `peer`.
  request isend(const void* buf, std::size_t bytes, int peer, int tag) {
    request q;
    post(q, const_cast<void*>(buf), bytes, peer, tag, true);
    return q;
  }

  /// Starts receiving exactly `bytes` bytes from `peer` into `buf`.
  request irecv(void* buf, std::size_t bytes, int peer, int tag) {
    request q;
    post(q, buf, bytes, peer, tag, false);
    return q;
  }

  /// Starts a call of a plan: later messages carry `c` and the next call number in their
  /// header, and received headers must match (see call_context).
  void begin_call(const call_context& c) noexcept {
    stamp_.begin(c);
  }
  /// The context of the current call (the last begin_call's).
  [[nodiscard]] call_context context() const noexcept { return stamp_.ctx; }

  /// Bounds every later wait (zero: no bound). See the class comment.
  void set_wait_limit(wait_limit limit) noexcept { limit_ = limit; }
  /// The bound on waits; zero when there is none.
  [[nodiscard]] wait_limit wait_limit_value() const noexcept { return limit_; }

  /// Checksums every later message (see the class comment); every rank must agree (a
  /// receiver whose setting differs from its sender's throws errc::mismatch).
  void set_verify(bool on) noexcept { stamp_.verify = on; }
  /// Whether messages are checksummed.
  [[nodiscard]] bool verify() const noexcept { return stamp_.verify; }

  /// Completes every request in `reqs`. Throws cgx::error: errc::mismatch for a message
  /// whose length or header differs from its receive's, errc::corrupt for one that fails
  /// its checksum (set_verify), errc::peer_failed (or the peer's errc::timeout or
  /// errc::corrupt) when a peer reported a failure, errc::timeout when the wait limit
  /// passed, errc::transport for other MPI errors; and at once if this transport failed
  /// before.
  void wait_all(std::span<request> reqs) {
    if (fault_->failed) throw cgx::error(fault_->code, fault_->what);
    auto& live = fault_->live;
    auto& which = fault_->which;
    live.clear();
    which.clear();
    for (std::size_t i = 0; i < reqs.size(); ++i)
      for (int k = 0; k < 3; ++k)
        if (reqs[i].r[k] != MPI_REQUEST_NULL) {
          live.push_back(reqs[i].r[k]);
          which.push_back(static_cast<int>(3 * i + static_cast<std::size_t>(k)));
        }
    std::size_t left = live.size();
    if (left == 0) {
      settle();
      return;
    }
    const bool listening = fault_->listen != MPI_REQUEST_NULL;
    if (listening) live.push_back(fault_->listen);  // last: a peer's failure report
    const auto t0 = std::chrono::steady_clock::now();
    int idle = 0;
    while (left > 0) {
      int idx = MPI_UNDEFINED;
      int flag = 0;
      MPI_Status st;
      int rc;
      if (limit_.count() == 0) {
        rc = MPI_Waitany(static_cast<int>(live.size()), live.data(), &idx, &st);
        flag = 1;
      } else {
        rc = MPI_Testany(static_cast<int>(live.size()), live.data(), &idx, &flag, &st);
      }
      const bool heard = listening && fault_->listen != MPI_REQUEST_NULL && idx + 1 == static_cast<int>(live.size());
      if (rc != MPI_SUCCESS && (idx == MPI_UNDEFINED || heard))
        fail_wait(reqs, errc::transport, rc, "MPI_Waitany");
      if (!flag || idx == MPI_UNDEFINED) {
        if (std::chrono::steady_clock::now() - t0 > limit_) timed_out(reqs);
        if (++idle > 64) std::this_thread::yield();  // ranks may outnumber cores
        continue;
      }
      idle = 0;
      if (heard) {
        // A report about a later call (a peer that finished this one and refused or failed
        // the next): this call can still complete; the next one throws it.
        if (defer_report(stamp_.call)) {
          live.pop_back();
          continue;
        }
        peer_reported(reqs);
      }
      const int slot = which[static_cast<std::size_t>(idx)];
      request& q = reqs[static_cast<std::size_t>(slot / 3)];
      const int part = slot % 3;
      q.r[part] = MPI_REQUEST_NULL;
      --left;
      --fault_->outstanding;
      if (rc != MPI_SUCCESS) {
        const int err = rc;
        int cls = 0;
        MPI_Error_class(err, &cls);
        if (cls == MPI_ERR_TRUNCATE)
          fail_wait(reqs, errc::mismatch, err,
                    "a message from rank " + std::to_string(q.peer) + " is longer than the " +
                        std::to_string(q.bytes[part]) + " bytes this rank expects (the ranks disagree on the count "
                        "or the plan)");
        fail_wait(reqs, errc::transport, err, q.send ? "MPI_Isend" : "MPI_Irecv");
      }
      if (!q.send) {
        MPI_Count got = 0;
        MPI_Get_elements_x(&st, MPI_BYTE, &got);
        if (got != static_cast<MPI_Count>(q.bytes[part])) {
          std::string why;
          if (part == 0 && got >= static_cast<MPI_Count>(sizeof(detail::wire_header)))
            why = detail::header_mismatch(*q.header, stamp_.expected(q.payload), q.peer);  // a first message of another length
          if (why.empty())
            why = "a message from rank " + std::to_string(q.peer) + " holds " + std::to_string(got) + " bytes where this rank "
                  "expects " + std::to_string(q.bytes[part]) + " (the ranks disagree on the count or the plan)";
          fail_wait(reqs, errc::mismatch, MPI_SUCCESS, why);
        }
        if (part == 0) {
          const std::string why = detail::header_mismatch(*q.header, stamp_.expected(q.payload), q.peer);
          if (!why.empty()) fail_wait(reqs, errc::mismatch, MPI_SUCCESS, why);
        }
        // Header and payload both in (the header was checked): the checksum, with verify;
        // then an inline payload moves to the caller's memory.
        if (q.r[0] == MPI_REQUEST_NULL && q.r[1] == MPI_REQUEST_NULL && q.r[2] == MPI_REQUEST_NULL) {
          const bool inl = q.payload <= inline_bytes;  // the sender's choice too: it depends on the length only
          void* const payload = inl ? static_cast<void*>(q.header + 1) : q.data;
          if (stamp_.verify) {
            const std::string why = detail::payload_corrupt(*q.header, payload, q.payload, q.peer);
            if (!why.empty()) fail_wait(reqs, errc::corrupt, MPI_SUCCESS, why);
          }
          if (inl && q.payload != 0) std::memcpy(q.data, payload, q.payload);
        }
      }
    }
    settle();
  }

  /// Tells every peer that this rank's call failed with `code` (they throw
  /// errc::peer_failed, or the same code for errc::timeout and errc::corrupt, at their
  /// next wait), and fails
  /// this transport. Called by a plan when a call throws after its messages began;
  /// idempotent; never throws.
  /// `waited_for`: for a timeout, the rank this one waited for (named in the peers'
  /// errors), else -1.
  void abort(errc code, const std::string& why, int waited_for = -1) noexcept {
    abort_at(code, why, waited_for, static_cast<int>(stamp_.call));
  }

  /// Tells every peer that this rank refuses the call it was about to begin (a local
  /// argument check failed: no message of it was sent), and fails this transport: the
  /// peers throw errc::peer_failed naming this rank. The report carries that call's number,
  /// so a peer still finishing the previous call finishes it and throws at the refused one.
  void refuse(const std::string& why) noexcept {
    abort_at(errc::invalid_argument, why, -1, static_cast<int>(stamp_.call + 1));
  }

  /// True once a wait failed, a peer reported a failure, or abort() was called.
  [[nodiscard]] bool failed() const noexcept { return fault_ && fault_->failed; }
  /// True if a failed call left a send pending that MPI could not cancel: MPI may still
  /// read its buffer, so the plan keeps its workspace for the life of the process.
  [[nodiscard]] bool abandoned() const noexcept { return fault_ && fault_->abandoned; }

  /// Throws the failure of an earlier call (cgx::error with its code), or a peer's report
  /// that has arrived since (errc::peer_failed, errc::timeout or errc::corrupt); returns if there is
  /// none. What a plan calls before a call's first collective step. With `poll` false it
  /// makes no MPI call (only this transport's own record).
  void throw_if_failed(bool poll = true) {
    if (!fault_->failed && fault_->deferred) {
      record_report(" inside a collective call");
    } else if (poll && !fault_->failed && fault_->listen != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(&fault_->listen, &flag, MPI_STATUS_IGNORE);
      if (flag) record_report(" inside a collective call");
    }
    if (fault_->failed)
      throw cgx::error(fault_->code, fault_->what + "; the plan cannot be used after that (build a new one)");
  }

  /// The end of a call whose own work is done (detail::call_guard::finish): throws a peer's
  /// failure report about this call or an earlier one (errc::peer_failed, or the peer's
  /// errc::timeout / errc::corrupt), or this transport's own failure. A report about a
  /// later call (a peer that finished this one and then refused or failed the next) is
  /// kept for the next call's throw_if_failed().
  void end_call_check() {
    if (!fault_->failed && !fault_->deferred && fault_->listen != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Test(&fault_->listen, &flag, MPI_STATUS_IGNORE);
      if (flag && !defer_report(stamp_.call)) record_report(" inside a collective call");
    }
    if (fault_->failed)
      throw cgx::error(fault_->code, fault_->what + "; the plan cannot be used after that (build a new one)");
  }

  /// Lets MPI move the messages in flight: a rendezvous send waits for the receiver's
  /// answer, and its data leaves only from inside MPI calls, so a rank that computes
  /// between its sends calls this now and then (MPI_Iprobe runs MPI's progress engine).
  void progress() {
    int flag = 0;
    detail::check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
  }

  /// Collective: element-wise maximum over all ranks, in place (a plan's collective
  /// argument check). Waits like wait_all: a peer's failure report ends it
  /// (errc::peer_failed, or the peer's errc::timeout / errc::corrupt), and so does the
  /// wait limit (errc::timeout); so a rank whose previous call finished while a peer's
  /// failed does not wait forever for that peer, which never joins again. Before the
  /// transport's first call (begin_call), while a plan is built, a report does not end
  /// it: it completes, and the report fails the transport for its first call. Throws at
  /// once if this transport failed before.
  void max_all(std::span<std::int64_t> v) {
    if (fault_->failed && stamp_.call != 0) throw cgx::error(fault_->code, fault_->what);
    auto& buf = fault_->collective;  // MPI's buffer: it outlives an abandoned reduction
    buf.assign(v.begin(), v.end());
    MPI_Request both[2] = {MPI_REQUEST_NULL, fault_->listen};
    detail::check_mpi(
        MPI_Iallreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_INT64_T, MPI_MAX, comm_, &both[0]),
        "MPI_Iallreduce");
    const auto t0 = std::chrono::steady_clock::now();
    for (int idle = 0;;) {
      int idx = MPI_UNDEFINED;
      int flag = 0;
      const int n = both[1] == MPI_REQUEST_NULL ? 1 : 2;
      const int rc = limit_.count() == 0 ? (flag = 1, MPI_Waitany(n, both, &idx, MPI_STATUS_IGNORE))
                                         : MPI_Testany(n, both, &idx, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) fail_wait({}, errc::transport, rc, "MPI_Iallreduce");
      if (flag && idx == 0) {
        std::copy(buf.begin(), buf.end(), v.begin());
        return;
      }
      if (flag && idx == 1) {
        both[1] = MPI_REQUEST_NULL;
        if (defer_report(stamp_.call + 1)) continue;  // about a call after the one checked here
        if (stamp_.call == 0) {
          // Before the first call (a plan's construction): every rank takes part, and a
          // peer that reports a failure has passed this reduction, so it completes here
          // too. The report fails the transport (the first call throws it); the plan is
          // built on every rank, and every rank's error comes from the same call.
          record_report(" inside a collective call");
          continue;
        }
        // A peer's report. The reduction cannot be cancelled: it stays with MPI, on a
        // communicator and a buffer that a failed transport never frees (release()).
        fault_->listen = MPI_REQUEST_NULL;
        fault_->abandoned = true;
        peer_reported({});
      }
      if (std::chrono::steady_clock::now() - t0 > limit_) {
        fault_->abandoned = true;
        fail_wait({}, errc::timeout, MPI_SUCCESS,
                  detail::waited_more_than(limit_) + " in the collective argument check: a rank did not make the call");
      }
      if (++idle > 64) std::this_thread::yield();
    }
  }

 private:
  static constexpr std::size_t block = std::size_t{1} << 30;

  /// The state of the failure channel, on the heap: MPI writes into `in` while the
  /// transport object may move.
  struct fault_channel;
  /// A transport made from this one (split(), node()), which fails with it; `ranks`: the
  /// rank there of each rank here (MPI_UNDEFINED if not in it).
  struct child {
    std::weak_ptr<fault_channel> channel;
    std::vector<int> ranks;
  };
  struct fault_channel {
    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0;  // this rank, of `size`, in comm
    int size = 1;
    std::vector<child> children;  // fail with this channel (tell())
    MPI_Request listen = MPI_REQUEST_NULL;  // always posted: a peer's report
    // A report: failed rank, errc, rank it waited for, and the call it is about (the
    // number of calls begun there; 0: now, whatever the call).
    int in[4] = {0, 0, -1, 0};
    int out[4] = {0, 0, -1, 0};             // this rank's report (or a peer's, passed on)
    bool deferred = false;                  // `in` holds a report about a later call than this rank's
    std::vector<MPI_Request> sent;          // this rank's reports in flight
    bool failed = false;                    // every later wait throws
    bool told = false;                      // this rank told its peers
    bool abandoned = false;                 // a send of a failed call was left pending
    errc code = errc::transport;
    std::string what;
    std::vector<MPI_Request> live;  // scratch of wait_all
    std::vector<int> which;
    std::deque<std::vector<std::byte>> staging;  // every message's header (and inline payload); reused once nothing is in flight
    std::size_t staging_used = 0;                // of them, in use by the requests in flight
    std::vector<std::int64_t> collective;     // max_all's buffer
    std::size_t outstanding = 0;              // MPI requests posted and not yet completed
  };

  /// abort() with the number of the call the failure is about.
  void abort_at(errc code, const std::string& why, int waited_for, int call) noexcept {
    if (!fault_ || fault_->told) return;
    if (!fault_->failed) {
      fault_->failed = true;
      fault_->code = code;
      fault_->what = why;
    }
    tell(rank_, code, waited_for, call);
  }

  /// A peer's report has arrived (`in`): whether it is about a later call than the one this
  /// rank is in (`current`), for which it is kept (deferred: the report's receive is not
  /// posted again, and the next call's throw_if_failed() throws it).
  bool defer_report(std::uint32_t current) noexcept {
    if (fault_->in[3] <= 0 || static_cast<std::uint32_t>(fault_->in[3]) <= current) return false;
    fault_->deferred = true;
    fault_->listen = MPI_REQUEST_NULL;
    return true;
  }

  /// Frees the staging buffers (and so the headers) for reuse, once no request is in flight.
  void settle() noexcept {
    if (fault_->outstanding != 0) return;
    fault_->staging_used = 0;
  }

  /// Records the failure, cancels the requests of `reqs` still pending, tells the peers
  /// and throws.
  [[noreturn]] void fail_wait(std::span<request> reqs, errc code, int rc, const std::string& what, int waited_for = -1) {
    std::string msg = "cgx::comm::mpi (rank " + std::to_string(rank_) + "): " + what;
    if (rc != MPI_SUCCESS && code == errc::transport) {
      char text[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, text, &len);
      msg += " failed: " + std::string(text, static_cast<std::size_t>(len));
    }
    cancel(reqs);
    abort(code, msg, waited_for);
    throw cgx::error(code, msg);
  }

  /// A peer's report arrived (its receive completed): the transport is failed, with the
  /// report's message and `where` after it, and the report passed on.
  void record_report(const char* where) noexcept {
    fault_->listen = MPI_REQUEST_NULL;
    const auto code = static_cast<errc>(fault_->in[1]);
    fault_->failed = true;
    fault_->code = detail::reported_code(code);
    try {
      fault_->what = "cgx::comm::mpi (rank " + std::to_string(rank_) + "): " +
                     detail::reported_failure(fault_->in[0], code, fault_->in[2]) + where;
    } catch (...) {  // no memory for the message: the code says it
    }
    // Passed on, as a waiting rank passes it on: a peer that waits for this rank
    // alone hears of the failure only from here.
    tell(fault_->in[0], code, fault_->in[2], fault_->in[3]);
  }

  /// Waits for a construction step's request up to the wait limit; on a timeout leaves it
  /// with MPI (with `keep`, the memory it writes) and throws errc::timeout naming `what`.
  void finish(std::span<MPI_Request> reqs, std::shared_ptr<void> keep, const char* what) const {
    if (detail::wait_bounded(reqs, limit_, what)) return;
    detail::abandon(reqs, std::move(keep));
    std::string msg = "cgx::comm::mpi (rank " + std::to_string(rank_) + "): " + detail::construction_timeout(limit_, what);
    // The abandoned step still uses this transport's communicator: the transport is failed,
    // so that release() keeps it (MPI would otherwise progress a collective on a freed one).
    if (fault_ && !fault_->failed) {
      fault_->failed = true;
      fault_->code = errc::timeout;
      fault_->what = msg;
    }
    throw cgx::error(errc::timeout, msg);
  }

  /// The transport over `sub` (freed here), failing with this one (child).
  mpi linked(MPI_Comm& sub) const {
    mpi out(sub, nodes{-1}, limit_);
    MPI_Comm_free(&sub);
    child c{out.fault_, std::vector<int>(static_cast<std::size_t>(size_), MPI_UNDEFINED)};
    MPI_Group mine = MPI_GROUP_NULL, theirs = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(out.comm_, &theirs);
    std::vector<int> all(static_cast<std::size_t>(size_));
    for (int r = 0; r < size_; ++r) all[static_cast<std::size_t>(r)] = r;
    MPI_Group_translate_ranks(mine, size_, all.data(), theirs, c.ranks.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&theirs);
    if (fault_->failed) inherit_failure(*out.fault_, *fault_);  // split from a failed transport (its peers know)
    fault_->children.push_back(std::move(c));
    return out;
  }

  /// A peer's report arrived: fail with its code, naming it.
  [[noreturn]] void peer_reported(std::span<request> reqs) {
    record_report(" inside this collective call; this call stopped waiting");  // (completed by MPI_Waitany)
    cancel(reqs);
    throw cgx::error(fault_->code, fault_->what);
  }

  /// Fails channel `to` as `from` failed (its code and message), unless it failed before.
  static void inherit_failure(fault_channel& to, const fault_channel& from) noexcept {
    if (to.failed) return;
    to.failed = true;
    to.code = from.code;
    try {
      to.what = from.what;
    } catch (...) {  // no memory for the message: the code says it
    }
  }

  /// Sends the report (origin, code, waited_for) to every peer, once per transport: this
  /// rank's own failure, or a peer's passed on unchanged (so every rank names the rank
  /// that failed first, and the rank a timed-out one waited for). Never throws.
  void tell(int origin, errc code, int waited_for, int call) noexcept {
    if (fault_) tell(*fault_, origin, code, waited_for, call);
  }

  /// tell() on channel f; then each transport split from it fails too and tells its own
  /// peers (the same code; the origin and the rank waited for by their rank there, or
  /// this rank and none when they are not in it).
  static void tell(fault_channel& f, int origin, errc code, int waited_for, int call) noexcept {
    if (f.told) return;
    f.told = true;
    f.out[0] = origin;
    f.out[1] = static_cast<int>(code);
    f.out[2] = waited_for;
    f.out[3] = call;
    for (int r = 0; r < f.size; ++r) {
      if (r == f.rank || r == origin) continue;
      MPI_Request q = MPI_REQUEST_NULL;
      // Three ints: MPI sends them eagerly; the buffer lives as long as the transport.
      if (MPI_Isend(f.out, 4, MPI_INT, r, 0, f.comm, &q) == MPI_SUCCESS) {
        try {
          f.sent.push_back(q);
        } catch (...) {
          MPI_Request_free(&q);  // sent all the same
        }
      }
    }
    auto in_child = [](const child& c, int r) {
      return r >= 0 && static_cast<std::size_t>(r) < c.ranks.size() ? c.ranks[static_cast<std::size_t>(r)] : MPI_UNDEFINED;
    };
    for (const child& c : f.children) {
      const std::shared_ptr<fault_channel> ch = c.channel.lock();
      if (!ch || ch->told) continue;
      inherit_failure(*ch, f);
      const int o = in_child(c, origin);
      const int w = in_child(c, waited_for);
      tell(*ch, o == MPI_UNDEFINED ? ch->rank : o, code, w == MPI_UNDEFINED ? -1 : w, 0);  // (their own call numbers)
    }
  }

  /// The wait limit passed: fail, naming the ranks still waited for.
  [[noreturn]] void timed_out(std::span<request> reqs) {
    std::vector<int> peers;
    for (const auto& q : reqs)
      if (q.r[0] != MPI_REQUEST_NULL || q.r[1] != MPI_REQUEST_NULL || q.r[2] != MPI_REQUEST_NULL)
        peers.push_back(q.peer);
    const int first = peers.empty() ? -1 : *std::min_element(peers.begin(), peers.end());
    fail_wait(reqs, errc::timeout, MPI_SUCCESS, detail::waited_for(limit_, std::move(peers)), first);
  }

  /// How long a failed call gives its cancelled requests to complete. A send that MPI
  /// cannot cancel (Open MPI cancels no send) may still read its buffer; it completes
  /// only if its receiver was already draining it, which takes milliseconds on shared
  /// memory and TCP for a chunk of a few MiB; a receiver that failed too cancelled its
  /// receive, and then the send never completes and the whole grace is spent. So it is
  /// short: a failed call costs at most this much more. A send still pending after it
  /// only keeps its plan's workspace alive (abandoned()).
  static constexpr std::chrono::milliseconds cancel_grace{250};

  /// Cancels what is pending in `reqs` and gives it up to cancel_grace to complete (a send
  /// that MPI cannot cancel may still read its buffer; its receiver is usually draining
  /// it; a receive may have matched a message of the wrong length and completed with an
  /// error). A request still pending then, or any request of the call that was not part
  /// of this wait, is left with MPI, and `abandoned()` tells the plan to keep its
  /// workspace alive (detail::release_workspace).
  /// MPICH (4.0) raises the error of a request completed in MPI_Wait or MPI_Testany on
  /// MPI_COMM_WORLD instead of the request's communicator, which aborts the job under
  /// the default handler; so for these few calls MPI_COMM_WORLD returns errors too, and
  /// its own handler is put back after.
  void cancel(std::span<request> reqs) noexcept {
    MPI_Errhandler world_handler = MPI_ERRHANDLER_NULL;
    const bool swap = MPI_Comm_get_errhandler(MPI_COMM_WORLD, &world_handler) == MPI_SUCCESS;
    if (swap) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    cancel_pending(reqs);
    if (swap) {
      MPI_Comm_set_errhandler(MPI_COMM_WORLD, world_handler);
      MPI_Errhandler_free(&world_handler);
    }
  }

  void cancel_pending(std::span<request> reqs) noexcept {
    std::vector<MPI_Request> left;
    for (auto& q : reqs)
      for (auto& r : q.r) {
        if (r == MPI_REQUEST_NULL) continue;
        --fault_->outstanding;
        MPI_Cancel(&r);
        left.push_back(r);
        r = MPI_REQUEST_NULL;
      }
    // Requests the schedule posted but was not waiting for here stay with MPI: the
    // workspace they use must outlive them.
    if (fault_->outstanding > 0) fault_->abandoned = true;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t pending = left.size(); pending > 0;) {
      int idx = MPI_UNDEFINED;
      int flag = 0;
      MPI_Testany(static_cast<int>(left.size()), left.data(), &idx, &flag, MPI_STATUS_IGNORE);
      if (idx != MPI_UNDEFINED) {
        left[static_cast<std::size_t>(idx)] = MPI_REQUEST_NULL;  // completed (an error is of no interest now)
        --pending;
        continue;
      }
      if (flag) break;  // no active request left
      if (std::chrono::steady_clock::now() - t0 > cancel_grace) break;
      std::this_thread::yield();
    }
    for (auto& r : left)
      if (r != MPI_REQUEST_NULL) {
        fault_->abandoned = true;
        MPI_Request_free(&r);
      }
  }

  void post(request& q, void* buf, std::size_t bytes, int peer, int tag, bool send) {
    if (fault_->failed) throw cgx::error(fault_->code, fault_->what);
    q.peer = peer;
    q.send = send;
    auto start = [&](void* p, int count, MPI_Datatype t, MPI_Request* r) {
      if (send)
        detail::check_mpi(MPI_Isend(p, count, t, peer, tag, comm_, r), "MPI_Isend");
      else
        detail::check_mpi(MPI_Irecv(p, count, t, peer, tag, comm_, r), "MPI_Irecv");
      ++fault_->outstanding;
    };
    q.data = buf;
    q.payload = bytes;
    // Every message's header sits at the start of a staging buffer from the pool. A
    // payload of at most inline_bytes follows it in the same message. A receive's buffer
    // holds any inline message, whatever the length expected: so a sender whose message
    // is longer than expected is reported from its header, never as MPI's truncation
    // error (which MPICH raises on MPI_COMM_WORLD's handler from MPI_Waitany, aborting
    // the job). A larger payload travels after its header message (same peer and tag:
    // MPI keeps the order), from and into the caller's memory.
    const bool inl = bytes <= inline_bytes;
    auto& pool = fault_->staging;
    if (fault_->staging_used == pool.size()) pool.emplace_back();
    std::vector<std::byte>& st = pool[fault_->staging_used++];
    const std::size_t len = sizeof(detail::wire_header) + (inl ? bytes : 0);  // the message expected
    const std::size_t cap = send ? len : sizeof(detail::wire_header) + inline_bytes;
    if (st.size() < cap) st.resize(cap);
    static_assert(alignof(detail::wire_header) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);  // the vector's buffer is aligned for it
    q.header = ::new (static_cast<void*>(st.data())) detail::wire_header{};
    if (send) {
      *q.header = stamp_.outgoing(buf, bytes);
      if (inl && bytes != 0) std::memcpy(q.header + 1, buf, bytes);
    }
    q.bytes[0] = len;
    start(st.data(), static_cast<int>(cap), MPI_BYTE, &q.r[0]);
    if (inl) return;
    if (bytes <= static_cast<std::size_t>(INT_MAX)) {
      q.bytes[1] = bytes;
      start(buf, static_cast<int>(bytes), MPI_BYTE, &q.r[1]);
      return;
    }
    // Over INT_MAX bytes: whole 1 GiB blocks as one derived-type message, then the rest.
    // Freeing the type right away is allowed: MPI keeps it alive for pending operations.
    MPI_Datatype big;
    detail::check_mpi(MPI_Type_contiguous(static_cast<int>(block), MPI_BYTE, &big), "MPI_Type_contiguous");
    MPI_Type_commit(&big);
    const std::size_t nblocks = bytes / block;
    q.bytes[1] = nblocks * block;
    q.bytes[2] = bytes - nblocks * block;
    start(buf, static_cast<int>(nblocks), big, &q.r[1]);
    MPI_Type_free(&big);
    start(static_cast<char*>(buf) + nblocks * block, static_cast<int>(bytes - nblocks * block), MPI_BYTE, &q.r[2]);
  }

  void release() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (fault_ && fault_->failed) {
      // After a failure, messages of the abandoned call may still be in flight to or from
      // this rank; freeing the communicators would let MPI give their context ids to new
      // communicators, which those messages could then reach. They are left allocated
      // (a few KiB per failed transport, until MPI_Finalize), and the channel MPI may still
      // write into is kept for the life of the process.
      static std::mutex lock;
      static std::vector<std::shared_ptr<fault_channel>> failed_channels;
      const std::lock_guard<std::mutex> g(lock);
      try {
        failed_channels.push_back(std::move(fault_));
      } catch (...) {
        new std::shared_ptr<fault_channel>(std::move(fault_));  // out of memory: leak it rather than free what MPI may write
      }
      comm_ = MPI_COMM_NULL;
      return;
    }
    if (fault_ && !finalized) {
      if (fault_->listen != MPI_REQUEST_NULL) {
        MPI_Cancel(&fault_->listen);
        MPI_Wait(&fault_->listen, MPI_STATUS_IGNORE);
      }
      for (auto& q : fault_->sent) MPI_Request_free(&q);
      if (fault_->comm != MPI_COMM_NULL) MPI_Comm_free(&fault_->comm);
    }
    fault_.reset();
    if (comm_ != MPI_COMM_NULL) {
      if (!finalized) MPI_Comm_free(&comm_);
      comm_ = MPI_COMM_NULL;
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int node_color_ = -1;
  wait_limit limit_{0};
  detail::call_stamp stamp_;
  std::shared_ptr<fault_channel> fault_;
};

}  // namespace cgx::comm
