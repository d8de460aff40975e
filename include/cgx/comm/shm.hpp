#pragma once
/// \file shm.hpp
/// `cgx::comm::shm`: a transport between the ranks of one node through POSIX shared
/// memory. MPI is used only to set it up (to agree on a segment name and to check
/// that all ranks share a node); every byte of a reduction then moves through the
/// segment.
///
/// Layout: one segment per transport holding, for every ordered pair (src, dst), a
/// single-producer single-consumer byte ring of `ring_bytes`. A send streams its bytes
/// into the ring to dst, a receive drains the ring from src; both advance inside
/// `wait_all` (and opportunistically when posted), so messages larger than a ring
/// flow through it in pieces. Messages between one pair are matched in the order they
/// were posted (tags are not used), which every cgx schedule allows for: it posts the
/// receives from a peer in the order that peer posts its sends (the transport contract
/// in concepts.hpp).
///
/// Lifetime: rank 0 creates the segment under a fresh unique name, reserves its memory
/// (posix_fallocate: a /dev/shm too small for it is an error at construction, naming
/// the bytes needed and free, never a SIGBUS at the first call), all ranks map it, and
/// rank 0 unlinks the name as soon as everyone has mapped it. Nothing is left in
/// /dev/shm after that point, even if the job is killed. A job killed *before* that
/// point (inside the constructor) leaves its segment's name behind; the name carries
/// the creator's pid namespace and pid ("cgx.<pid ns inode>.<pid>.<time>.<random>"),
/// and the next comm::shm constructed on the node in the same pid namespace unlinks
/// every such name whose creator no longer exists. A new job never meets an old job's
/// name (time and random bits, and creation uses O_EXCL).
///
/// Agreement: the ranks compare `ring_bytes` at construction; different values throw
/// cgx::error(errc::mismatch) on every rank.
///
/// Dead peers: a rank waiting for a peer (wait_all) checks, every 100 ms of waiting,
/// that the peers in its pid namespace are still alive, and throws
/// cgx::error(errc::transport, "... peer rank N (pid P) died ...") when one is gone,
/// instead of waiting forever. (An MPI launcher usually tears the job down first.)
///
/// Headers: every message is preceded in its ring by the 40-byte header of comm::mpi
/// (detail::wire_header: call number, plan signature, count, payload bytes); a receiver
/// checks it before it takes a byte of the payload, and a mismatch (ranks that passed
/// different counts or plans, a skipped call) throws errc::mismatch instead of reading
/// the stream out of step. With `set_verify` (plan_options::verify) the header also
/// carries the payload's CRC-32C, checked once the payload is in (errc::corrupt on
/// every rank, as for comm::mpi).
///
/// Failures: a rank whose call fails (a received header or checksum that does not match,
/// its wait limit, a throw of the plan) writes a report into the segment's failure word
/// (`abort`): the first failing rank, its errc and, for a timeout, the rank it waited
/// for. Every waiting rank reads that word as it spins, so it stops waiting at once and
/// throws errc::peer_failed (errc::timeout or errc::corrupt for a peer's timeout or
/// corrupt message, naming the ranks), whatever MPI's thread level: no MPI call is needed
/// to hear a peer. (The report also goes over comm::mpi's failure channel, for peers that
/// look there.) A received message that fails its check stops the transport at once: no
/// byte moves after it, and the first failure is the one reported. A wait limit
/// (`set_wait_limit`, plan_options::timeout_ms) bounds every wait (errc::timeout naming the
/// ranks waited for).

#include <dirent.h>
#include <fcntl.h>
#include <mpi.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <new>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "mpi.hpp"

namespace cgx::comm {

/// Shared-memory transport among ranks of one node (see the file comment).
/// Construction is collective over `comm`; throws cgx::error on every rank:
/// errc::communicator if the ranks are not all on one node, errc::invalid_argument for
/// a ring_bytes that is not a power of two >= 4096 on any rank, errc::mismatch if the
/// ranks pass different ring_bytes, errc::transport if the segment cannot be created,
/// reserved (too little room in /dev/shm) or mapped. Move-only.
class shm {
  struct ring_header {
    alignas(64) std::atomic<std::uint64_t> head;  // bytes written by the producer
    alignas(64) std::atomic<std::uint64_t> tail;  // bytes read by the consumer
  };
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "cgx::comm::shm needs lock-free 64-bit atomics");

  struct op {
    std::byte* buf;
    std::size_t bytes;
    std::size_t done;
    bool send;
    int peer;
    std::uint64_t id;
    std::size_t header_for = no_header;  // a received header: the payload bytes it must announce
    const detail::wire_header* hdr = nullptr;  // a received payload: its header
  };
  static constexpr std::size_t no_header = ~std::size_t{0};     // a payload
  static constexpr std::size_t sent_header = ~std::size_t{1};   // a header this rank sends

 public:
  /// Handle of a posted send or receive.
  struct request {
    std::uint64_t id = 0;  ///< the transfer's number; 0: nothing to wait for
  };

  /// Default ring size per ordered pair of ranks.
  static constexpr std::size_t default_ring_bytes = std::size_t{1} << 20;

  /// Collective over `comm` (which must hold only ranks of one node). Every rank must
  /// pass the same `ring_bytes` (a power of two >= 4096). The segment holds
  /// size() * size() rings of ring_bytes + 128 bytes, and 128 bytes for failure reports,
  /// reserved in /dev/shm at once.
  explicit shm(MPI_Comm comm, std::size_t ring_bytes = default_ring_bytes) : ring_(ring_bytes) {
    base_comm_.emplace(comm);  // validates the communicator and duplicates it (setup, native allreduce)
    mpi& base = *base_comm_;
    rank_ = base.rank();
    size_ = base.size();
    blocked_send_.assign(static_cast<std::size_t>(size_), 0);
    blocked_recv_.assign(static_cast<std::size_t>(size_), 0);
    // Every collective step of the construction is bounded by the base transport's
    // construction limit (comm::mpi: CGX_TIMEOUT_MS or 10 minutes): MPI_Comm_split_type,
    // which has no non-blocking form, right after a bounded barrier.
    base.barrier("cgx::comm::shm's construction (MPI_Ibarrier before MPI_Comm_split_type)");
    MPI_Comm node;
    detail::check_mpi(MPI_Comm_split_type(base.comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type");
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    // One exchange: all on one node, ring_bytes valid everywhere and equal.
    const bool bad_ring = ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1)) != 0;
    const auto ring = static_cast<long long>(std::min<std::size_t>(ring_bytes, std::size_t{1} << 62));
    std::int64_t v[4] = {node_size == size_ ? 0 : 1, bad_ring ? 1 : 0, ring, -ring};
    base.reduce_max(v, "cgx::comm::shm's construction (its settings, MPI_Iallreduce)");
    if (v[0] != 0) throw cgx::error(errc::communicator, "cgx::comm::shm: the ranks of the communicator span several nodes");
    if (bad_ring)
      throw cgx::error(errc::invalid_argument, "cgx::comm::shm: ring_bytes must be a power of two >= 4096 (this rank "
                                               "passed " + std::to_string(ring_bytes) + ")");
    if (v[1] != 0)
      throw cgx::error(errc::invalid_argument, "cgx::comm::shm: another rank passed a ring_bytes that is not a power "
                                               "of two >= 4096");
    if (v[2] != -v[3])
      throw cgx::error(errc::mismatch, "cgx::comm::shm: ranks passed different ring_bytes (between " +
                                           std::to_string(-v[3]) + " and " + std::to_string(v[2]) + "; this rank " +
                                           std::to_string(ring_bytes) + "); every rank must pass the same");

    // Who the peers are, for the liveness checks of wait_all.
    const long long me[2] = {static_cast<long long>(pid_namespace()), static_cast<long long>(getpid())};
    std::vector<long long> ids(2 * static_cast<std::size_t>(size_));
    base.allgather(me, sizeof(me), ids.data(), "cgx::comm::shm's construction (the ranks' processes, MPI_Iallgather)");
    for (int r = 0; r < size_; ++r) {
      const auto ns = ids[2 * static_cast<std::size_t>(r)];
      // A pid means something here only in this rank's own pid namespace.
      peer_pid_.push_back(r != rank_ && ns != 0 && ns == me[0] ? static_cast<pid_t>(ids[2 * static_cast<std::size_t>(r) + 1]) : 0);
    }

    const std::size_t pairs = static_cast<std::size_t>(size_) * static_cast<std::size_t>(size_);
    if (ring_ > (std::size_t{1} << 62) / pairs)  // the same on every rank: they agree on ring_bytes
      throw cgx::error(errc::invalid_argument, "cgx::comm::shm: ring_bytes " + std::to_string(ring_) + " is too large");
    stride_ = sizeof(ring_header) + ring_;
    bytes_ = control_bytes + pairs * stride_;

    // Rank 0 creates the segment under a unique name; the others open it.
    char name[96] = {};
    long long created[2] = {0, 0};  // errno, and 1 if it was posix_fallocate's
    if (rank_ == 0) {
      reclaim_stale_segments();
      created[0] = create(name, sizeof(name), created[1]);
    }
    // From here a step that times out must not leave the segment behind: rank 0 unlinks its
    // name and every rank unmaps what it mapped.
    auto undo = [&] {
      if (rank_ == 0 && created[0] == 0) shm_unlink(name);
      release();
    };
    try {
      base.broadcast(created, sizeof(created), 0, "cgx::comm::shm's construction (the segment, MPI_Ibcast)");
    } catch (...) {
      undo();
      throw;
    }
    if (created[0] != 0) {
      const int e = static_cast<int>(created[0]);
      if (created[1] != 0)
        throw cgx::error(errc::transport, "cgx::comm::shm: cannot reserve " + std::to_string(bytes_) +
                                              " bytes in /dev/shm for the rings (" + std::to_string(size_) + " x " +
                                              std::to_string(size_) + " rings of ring_bytes " + std::to_string(ring_) +
                                              " + 128, and 128 bytes for failure reports): " + std::strerror(e) +
                                              "; /dev/shm has " + devshm_free() +
                                              ". Pass a smaller ring_bytes or enlarge /dev/shm (docker: --shm-size)");
      throw cgx::error(errc::transport, "cgx::comm::shm: cannot create a shared-memory segment of " +
                                            std::to_string(bytes_) + " bytes in /dev/shm: " + std::strerror(e));
    }
    std::int64_t any_err[1] = {0};
    try {
      base.broadcast(name, sizeof(name), 0, "cgx::comm::shm's construction (the segment's name, MPI_Ibcast)");
      if (rank_ != 0) any_err[0] = attach(name);
      base.reduce_max(any_err, "cgx::comm::shm's construction (mapping the segment, MPI_Iallreduce)");
    } catch (...) {
      undo();
      throw;
    }
    // Everyone has mapped it (or failed): the name is no longer needed.
    if (rank_ == 0) shm_unlink(name);
    if (any_err[0] != 0) {
      release();
      throw cgx::error(errc::transport, "cgx::comm::shm: a rank could not map the shared-memory segment");
    }
    // Make sure rank 0's initialization of the ring counters is visible before use.
    try {
      base.barrier("cgx::comm::shm's construction (MPI_Ibarrier)");
    } catch (...) {
      release();
      throw;
    }
  }

  shm(const shm&) = delete;
  shm& operator=(const shm&) = delete;
  /// Takes over o's segment and queues; o holds none after.
  shm(shm&& o) noexcept { *this = std::move(o); }
  /// Releases this transport's segment and takes over o's.
  shm& operator=(shm&& o) noexcept {
    if (this != &o) {
      release();
      base_ = std::exchange(o.base_, nullptr);
      base_comm_ = std::move(o.base_comm_);
      o.base_comm_.reset();
      bytes_ = o.bytes_;
      stride_ = o.stride_;
      ring_ = o.ring_;
      rank_ = o.rank_;
      size_ = o.size_;
      next_id_ = o.next_id_;
      pending_ = std::move(o.pending_);
      completed_ = std::move(o.completed_);
      blocked_send_ = std::move(o.blocked_send_);
      blocked_recv_ = std::move(o.blocked_recv_);
      peer_pid_ = std::move(o.peer_pid_);
      limit_ = o.limit_;
      stamp_ = o.stamp_;
      headers_ = std::move(o.headers_);
      bad_ = std::move(o.bad_);
      bad_code_ = o.bad_code_;
      failed_ = o.failed_;
      code_ = o.code_;
      what_ = std::move(o.what_);
    }
    return *this;
  }
  ~shm() { release(); }

  /// This process's rank in the communicator given at construction.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// True: all ranks share one node (the constructor refuses any other communicator).
  /// Moves no data; plans ask it, as they ask comm::mpi's, to pick their threshold.
  [[nodiscard]] constexpr bool single_node() const noexcept { return true; }

  /// MPI_Allreduce (sum, in place) over the communicator the transport was made from:
  /// what a plan uses below its native_below_bytes() threshold. On one node, MPI's own
  /// shared-memory allreduce beats compressing small and mid-sized messages
  /// (docs/threshold.md), so plans over comm::shm fall back to it as they do over comm::mpi.
  template <class T>
  void native_allreduce(T* buf, std::size_t n) {
    base_comm_->native_allreduce(buf, n);
  }

  /// Posts a send of `bytes` bytes to `peer` (tag ignored; FIFO per pair).
  request isend(const void* buf, std::size_t bytes, int peer, int /*tag*/) {
    return post(const_cast<std::byte*>(static_cast<const std::byte*>(buf)), bytes, peer, true);
  }
  /// Posts a receive of exactly `bytes` bytes from `peer` (tag ignored; FIFO per pair).
  request irecv(void* buf, std::size_t bytes, int peer, int /*tag*/) {
    return post(static_cast<std::byte*>(buf), bytes, peer, false);
  }

  /// Progresses every pending operation until those in `reqs` are complete. Throws
  /// cgx::error(errc::transport) if a peer that this rank waits for has died (checked
  /// every 100 ms of waiting; see the file comment).
  void wait_all(std::span<request> reqs) {
    throw_if_stopped();
    auto done = [&] {
      for (const auto& r : reqs)
        if (r.id != 0 && !is_complete(r.id)) return false;
      return true;
    };
    int idle = 0;
    const auto t0 = std::chrono::steady_clock::now();
    auto last_check = std::chrono::steady_clock::time_point{};
    while (!done()) {
      if (progress()) {
        idle = 0;
        throw_if_stopped();
      } else if (++idle > 64) {
        throw_if_stopped();  // a peer's report in the segment: one load of a shared word
        std::this_thread::yield();  // ranks may outnumber cores
        const auto now = std::chrono::steady_clock::now();
        if (idle == 65) {
          last_check = now;
        } else if (now - last_check > std::chrono::milliseconds(100)) {
          last_check = now;
          check_peers_alive();
          if (may_call_mpi()) base_comm_->throw_if_failed();
        }
        if (limit_.count() > 0 && now - t0 > limit_) timed_out(reqs);
      }
    }
    throw_if_stopped();
    for (auto& r : reqs) {
      forget(r.id);
      r.id = 0;
    }
    if (pending_.empty()) headers_.clear();
  }

  /// Bounds every later wait (zero: no bound). See the file comment.
  void set_wait_limit(wait_limit limit) noexcept { limit_ = limit; }

  /// Checksums every later message (see the file comment); every rank must agree.
  void set_verify(bool on) noexcept { stamp_.verify = on; }
  /// Whether messages are checksummed.
  [[nodiscard]] bool verify() const noexcept { return stamp_.verify; }

  /// Starts a call of a plan (see comm::call_context): later headers carry `c` and the
  /// next call number, and received ones must match.
  void begin_call(const call_context& c) noexcept {
    stamp_.begin(c);
  }
  /// The context of the current call (the last begin_call's).
  [[nodiscard]] call_context context() const noexcept { return stamp_.ctx; }
  /// The bound on waits; zero when there is none.
  [[nodiscard]] wait_limit wait_limit_value() const noexcept { return limit_; }

  /// Tells every peer that this rank's call failed (the segment's failure word, and
  /// comm::mpi::abort); `waited_for`: for a timeout, the rank waited for; for a dead peer,
  /// that peer (heard() names it); else -1. Never
  /// throws.
  void abort(errc code, const std::string& why, int waited_for = -1) noexcept {
    if (!failed_) {
      failed_ = true;
      code_ = code;
      what_ = why;
    }
    report(rank_, code, waited_for);
    if (base_comm_) base_comm_->abort(code, why, waited_for);
  }
  /// Tells the peers, through the segment alone, that this rank refuses the call it was
  /// about to begin (a local argument check failed; nothing was sent), and fails this
  /// transport. The report carries that call's number: a peer still finishing the previous
  /// call completes it, and throws errc::peer_failed naming this rank in the refused one.
  void refuse(const std::string& why) noexcept {
    if (!failed_) {
      failed_ = true;
      code_ = errc::invalid_argument;
      what_ = why;
    }
    report(rank_, errc::invalid_argument, -1, stamp_.call + 1 == 0 ? 1 : stamp_.call + 1);
  }
  /// False: comm::shm's transfers copy through the segment and never outlive a wait.
  [[nodiscard]] static constexpr bool abandoned() noexcept { return false; }
  /// True once a wait failed, a peer's failure was heard, or abort() was called.
  [[nodiscard]] bool failed() const noexcept { return failed_ || (base_comm_ && base_comm_->failed()); }
  /// Throws an earlier failure, or a peer's report that has arrived: the segment's failure
  /// word (always read), then comm::mpi's channel (only where this thread may call MPI,
  /// see the file comment).
  void throw_if_failed() {
    heard();
    if (failed_) throw cgx::error(code_, what_ + "; the plan cannot be used after that (build a new one)");
    if (base_comm_) base_comm_->throw_if_failed(may_call_mpi());
  }

  /// Collective element-wise maximum over all ranks, through the segment. Uses the
  /// rings like a message exchange with rank 0 (gather, then broadcast).
  void max_all(std::span<std::int64_t> v) {
    const std::size_t bytes = v.size_bytes();
    if (size_ == 1 || bytes == 0) return;
    if (rank_ == 0) {
      std::vector<std::int64_t> tmp(v.size());
      for (int r = 1; r < size_; ++r) {
        request q = irecv(tmp.data(), bytes, r, 0);
        wait_all(std::span(&q, 1));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::max(v[i], tmp[i]);
      }
      std::vector<request> qs;
      for (int r = 1; r < size_; ++r) qs.push_back(isend(v.data(), bytes, r, 0));
      wait_all(qs);
    } else {
      request q = isend(v.data(), bytes, 0, 0);
      wait_all(std::span(&q, 1));
      q = irecv(v.data(), bytes, 0, 0);
      wait_all(std::span(&q, 1));
    }
  }

 private:
  /// The segment's first cache lines: the failure word (0: no failure; else the first
  /// failing rank + 1, its errc and the rank it waited for + 1, 16 bits each).
  static constexpr std::size_t control_bytes = 128;
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
  std::atomic<std::uint64_t>* failure_word() const {
    return reinterpret_cast<std::atomic<std::uint64_t>*>(base_);
  }

  /// Writes the report (origin, code, waited_for) into the failure word unless one is
  /// there (the first failure wins: every rank then names the same one).
  /// `call`: the number of the call the report is about (a refusal: the call the rank did
  /// not begin), 0 for "now"; kept modulo 2^15 in bits 48-62, bit 63 set when present.
  void report(int origin, errc code, int waited_for, std::uint32_t call = 0) noexcept {
    if (base_ == nullptr) return;
    const std::uint64_t w = (static_cast<std::uint64_t>(origin + 1) & 0xffff) |
                            ((static_cast<std::uint64_t>(code) & 0xffff) << 16) |
                            ((static_cast<std::uint64_t>(waited_for + 1) & 0xffff) << 32) |
                            (call != 0 ? (std::uint64_t{1} << 63) | ((static_cast<std::uint64_t>(call) & 0x7fff) << 48) : 0);
    std::uint64_t none = 0;
    failure_word()->compare_exchange_strong(none, w, std::memory_order_acq_rel);
  }

  /// Reads the failure word; a peer's report fails this transport (errc::peer_failed,
  /// or the peer's errc::timeout / errc::corrupt; a dead peer's errc::transport), naming
  /// the ranks.
  void heard() {
    if (failed_ || base_ == nullptr) return;
    const std::uint64_t w = failure_word()->load(std::memory_order_acquire);
    if (w == 0) return;
    const int origin = static_cast<int>(w & 0xffff) - 1;
    const auto code = static_cast<errc>((w >> 16) & 0xffff);
    const int waited_for = static_cast<int>((w >> 32) & 0xffff) - 1;
    const bool about_call = (w >> 63) != 0;
    if (about_call) {
      // A refusal of a later call than this rank's (a peer that finished this one and
      // refused the next): this call completes; the next one's waits throw it.
      const std::uint64_t ahead = (((w >> 48) & 0x7fff) - (stamp_.call & 0x7fff)) & 0x7fff;
      if (ahead != 0 && ahead < 0x4000) return;
    }
    failed_ = true;
    if (code == errc::transport && waited_for >= 0 && waited_for < size_) {
      // A peer died (check_peers_alive named it): a fact about the job, not about the
      // rank that saw it first, and this rank's transfers with it cannot complete either.
      // The same error as that rank's, whichever of them looks first.
      code_ = errc::transport;
      what_ = "cgx::comm::shm (rank " + std::to_string(rank_) + "): peer rank " + std::to_string(waited_for) + " (pid " +
              std::to_string(peer_pid_[static_cast<std::size_t>(waited_for)]) + ") died (rank " + std::to_string(origin) +
              " found it gone) inside a collective call; this call stopped waiting";
    } else {
      code_ = detail::reported_code(code);
      what_ = "cgx::comm::shm (rank " + std::to_string(rank_) + "): " + detail::reported_failure(origin, code, waited_for) +
              " inside a collective call; this call stopped waiting";
    }
    // The MPI transport underneath is failed too: peers' reports may still arrive on its
    // communicators, which it must then never free (see comm::mpi::release). It passes
    // the report on over MPI too (as a failing rank of its own does). Not a refusal: its
    // rank wrote the segment alone (refuse()), which every peer reads.
    if (base_comm_ && !about_call) base_comm_->abort(code_, what_, waited_for);
  }

  /// Throws if this transport has stopped: a received message failed its check (the
  /// first such failure; reported to the peers), a peer's report is in the segment, or
  /// an earlier failure.
  void throw_if_stopped() {
    if (!bad_.empty()) fail(bad_code_, std::exchange(bad_, std::string()));
    heard();
    if (failed_) throw cgx::error(code_, what_);
  }

  ring_header* header(int src, int dst) const {
    return reinterpret_cast<ring_header*>(static_cast<std::byte*>(base_) + control_bytes +
                                          (static_cast<std::size_t>(src) * static_cast<std::size_t>(size_) +
                                           static_cast<std::size_t>(dst)) * stride_);
  }
  std::byte* data(int src, int dst) const { return reinterpret_cast<std::byte*>(header(src, dst) + 1); }

  /// The inode of this process's pid namespace, 0 if it cannot be told.
  static unsigned long long pid_namespace() noexcept {
    struct stat st {};
    if (stat("/proc/self/ns/pid", &st) != 0) return 0;
    return static_cast<unsigned long long>(st.st_ino);
  }

  /// True if no process `pid` runs (it does not exist, or is a zombie).
  static bool process_gone(pid_t pid) noexcept {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) return false;
    char buf[512] = {};
    const std::size_t got = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[got] = 0;
    const char* paren = std::strrchr(buf, ')');  // the state follows the command name
    return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
  }

  /// Unlinks the names that comm::shm constructors of this pid namespace left in
  /// /dev/shm when their process was killed before unlinking them (see the file comment).
  static void reclaim_stale_segments() noexcept {
    const unsigned long long ns = pid_namespace();
    if (ns == 0) return;
    DIR* d = opendir("/dev/shm");
    if (d == nullptr) return;
    std::vector<std::string> stale;
    while (const dirent* e = readdir(d)) {
      unsigned long long their_ns = 0;
      int pid = 0, used = 0;
      if (std::sscanf(e->d_name, "cgx.%llu.%d.%n", &their_ns, &pid, &used) == 2 && used > 0 && their_ns == ns &&
          pid > 0 && pid != static_cast<int>(getpid()) && process_gone(static_cast<pid_t>(pid)))
        stale.emplace_back(std::string("/") + e->d_name);
    }
    closedir(d);
    for (const auto& n : stale) shm_unlink(n.c_str());
  }

  /// "F bytes free of S" for /dev/shm, for error messages.
  static std::string devshm_free() {
    struct statvfs v {};
    if (statvfs("/dev/shm", &v) != 0) return "an unknown amount free";
    const auto unit = static_cast<unsigned long long>(v.f_frsize);
    return std::to_string(static_cast<unsigned long long>(v.f_bavail) * unit) + " bytes free of " +
           std::to_string(static_cast<unsigned long long>(v.f_blocks) * unit);
  }

  /// Whether this thread may call MPI now (to hear a peer's failure report): always under
  /// MPI_THREAD_MULTIPLE; on MPI's main thread under SINGLE and FUNNELED (no other thread
  /// calls MPI there); never under SERIALIZED, where another thread (a start()ed plan over
  /// comm::mpi) may be inside MPI at the same time.
  static bool may_call_mpi() noexcept {
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level == MPI_THREAD_MULTIPLE) return true;
    if (level == MPI_THREAD_SERIALIZED) return false;
    int main = 0;
    MPI_Is_thread_main(&main);
    return main != 0;
  }

  /// The wait limit passed: tell the peers and throw, naming the ranks waited for.
  [[noreturn]] void timed_out(std::span<request> reqs) {
    std::vector<int> peers;
    for (const auto& o : pending_)
      if (std::any_of(reqs.begin(), reqs.end(), [&](const request& r) { return r.id == o.id; })) peers.push_back(o.peer);
    const int first = peers.empty() ? -1 : *std::min_element(peers.begin(), peers.end());
    fail(errc::timeout, detail::waited_for(limit_, std::move(peers)), first);
  }

  /// Tells the peers and throws.
  [[noreturn]] void fail(errc code, const std::string& what, int waited_for = -1) {
    const std::string msg = "cgx::comm::shm (rank " + std::to_string(rank_) + "): " + what;
    abort(code, msg, waited_for);
    throw cgx::error(code, msg);
  }

  /// Throws if a transfer this rank waits for can no longer complete because its peer
  /// died. (A peer may exit once its sends are in the rings: only a transfer that is
  /// still pending after the dead peer's last bytes are drained is an error.)
  void check_peers_alive() {
    auto pending_with = [&](int r) {
      return std::any_of(pending_.begin(), pending_.end(), [r](const op& o) { return o.peer == r; });
    };
    for (int r = 0; r < size_; ++r) {
      const pid_t pid = peer_pid_[static_cast<std::size_t>(r)];
      if (pid == 0 || !pending_with(r) || !process_gone(pid)) continue;
      while (progress()) {
      }
      if (pending_with(r))  // reported naming r: a rank that hears it throws the same (heard())
        fail(errc::transport, "peer rank " + std::to_string(r) + " (pid " + std::to_string(pid) +
                                  ") died while this rank waited for a transfer with it", r);
    }
  }

  /// Creates, sizes, reserves and maps the segment (rank 0); 0 or an errno value, with
  /// `reserving` set to 1 when posix_fallocate failed (no room in /dev/shm).
  int create(char* name, std::size_t cap, long long& reserving) {
    std::random_device rd;
    for (int attempt = 0; attempt < 16; ++attempt) {
      const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
      std::snprintf(name, cap, "/cgx.%llu.%d.%llx.%08x", pid_namespace(), static_cast<int>(getpid()),
                    static_cast<unsigned long long>(now), static_cast<unsigned>(rd()));
      const int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        if (errno == EEXIST) continue;
        return errno;
      }
      if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
        const int e = errno;
        close(fd);
        shm_unlink(name);
        return e;
      }
      // Reserve the pages now: on a full tmpfs a store into the mapping is a SIGBUS.
      if (const int e = posix_fallocate(fd, 0, static_cast<off_t>(bytes_)); e != 0) {
        close(fd);
        shm_unlink(name);
        reserving = 1;
        return e;
      }
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) {
        const int e = errno;
        shm_unlink(name);
        return e;
      }
      base_ = p;
      new (base_) std::atomic<std::uint64_t>(0);
      for (int s = 0; s < size_; ++s)
        for (int d = 0; d < size_; ++d) {
          ring_header* h = header(s, d);
          new (h) ring_header;
          h->head.store(0, std::memory_order_relaxed);
          h->tail.store(0, std::memory_order_relaxed);
        }
      std::atomic_thread_fence(std::memory_order_release);
      return 0;
    }
    return EEXIST;
  }

  int attach(const char* name) {
    const int fd = shm_open(name, O_RDWR, 0600);
    if (fd < 0) return errno;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (p == MAP_FAILED) return e;
    base_ = p;
    return 0;
  }

  void release() noexcept {
    if (base_ != nullptr) {
      munmap(base_, bytes_);
      base_ = nullptr;
    }
  }

  request post(std::byte* buf, std::size_t bytes, int peer, bool send) {
    if (peer < 0 || peer >= size_) throw cgx::error(errc::invalid_argument, "cgx::comm::shm: peer out of range");
    throw_if_stopped();
    if (failed()) throw_if_failed();
    // The header, then the payload, in the same ring (FIFO per pair keeps them together).
    detail::wire_header& h = headers_.emplace_back();
    if (send) h = stamp_.outgoing(buf, bytes);
    const std::uint64_t hid = ++next_id_;
    pending_.push_back(op{reinterpret_cast<std::byte*>(&h), sizeof(h), 0, send, peer, hid, send ? sent_header : bytes});
    const std::uint64_t id = ++next_id_;
    if (bytes == 0) {
      completed_.push_back(id);
    } else {
      pending_.push_back(op{buf, bytes, 0, send, peer, id, no_header, send ? nullptr : &h});
    }
    progress();
    throw_if_stopped();  // a header that arrived just now and does not match
    return {id};
  }


  /// Moves bytes for every pending operation that can move; true if anything moved.
  /// Only the oldest unfinished operation per (direction, peer) may move (FIFO order).
  bool progress() {
    // Once a received message failed its check the streams are out of step: nothing
    // more moves (the first failure is what the call reports).
    if (!bad_.empty()) return false;
    bool moved = false;
    std::fill(blocked_send_.begin(), blocked_send_.end(), 0);
    std::fill(blocked_recv_.begin(), blocked_recv_.end(), 0);
    for (auto it = pending_.begin(); it != pending_.end();) {
      op& o = *it;
      auto& blocked = o.send ? blocked_send_ : blocked_recv_;
      const auto peer = static_cast<std::size_t>(o.peer);
      if (!blocked[peer]) {
        moved |= o.send ? push(o) : pull(o);
        if (o.done != o.bytes) blocked[peer] = 1;
      }
      if (o.done == o.bytes) {
        if (o.header_for == no_header) {
          if (o.hdr != nullptr && stamp_.verify) {  // a checksummed payload (its header was checked)
            std::string why = detail::payload_corrupt(*o.hdr, o.buf, o.bytes, o.peer);
            if (!why.empty()) {
              bad_ = std::move(why);
              bad_code_ = errc::corrupt;
              pending_.erase(it);
              return true;
            }
          }
          completed_.push_back(o.id);
        } else if (o.header_for != sent_header) {
          // A received header: checked before any byte of its payload moves.
          std::string why = detail::header_mismatch(*reinterpret_cast<const detail::wire_header*>(o.buf),
                                                    stamp_.expected(o.header_for), o.peer);
          if (!why.empty()) {
            bad_ = std::move(why);
            bad_code_ = errc::mismatch;
            pending_.erase(it);
            return true;
          }
        }
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    return moved;
  }

  bool push(op& o) {
    ring_header* h = header(rank_, o.peer);
    const std::uint64_t head = h->head.load(std::memory_order_relaxed);
    const std::uint64_t tail = h->tail.load(std::memory_order_acquire);
    const std::size_t space = ring_ - static_cast<std::size_t>(head - tail);
    std::size_t n = std::min(space, o.bytes - o.done);
    if (n == 0) return false;
    std::byte* d = data(rank_, o.peer);
    const std::size_t at = static_cast<std::size_t>(head & (ring_ - 1));
    const std::size_t first = std::min(n, ring_ - at);
    std::memcpy(d + at, o.buf + o.done, first);
    std::memcpy(d, o.buf + o.done + first, n - first);
    o.done += n;
    h->head.store(head + n, std::memory_order_release);
    return true;
  }

  bool pull(op& o) {
    ring_header* h = header(o.peer, rank_);
    const std::uint64_t tail = h->tail.load(std::memory_order_relaxed);
    const std::uint64_t head = h->head.load(std::memory_order_acquire);
    std::size_t n = std::min(static_cast<std::size_t>(head - tail), o.bytes - o.done);
    if (n == 0) return false;
    const std::byte* d = data(o.peer, rank_);
    const std::size_t at = static_cast<std::size_t>(tail & (ring_ - 1));
    const std::size_t first = std::min(n, ring_ - at);
    std::memcpy(o.buf + o.done, d + at, first);
    std::memcpy(o.buf + o.done + first, d, n - first);
    o.done += n;
    h->tail.store(tail + n, std::memory_order_release);
    return true;
  }

  bool is_complete(std::uint64_t id) const {
    return std::find(completed_.begin(), completed_.end(), id) != completed_.end();
  }
  void forget(std::uint64_t id) {
    auto it = std::find(completed_.begin(), completed_.end(), id);
    if (it != completed_.end()) completed_.erase(it);
  }

  void* base_ = nullptr;
  std::optional<mpi> base_comm_;  // the caller's communicator, duplicated
  std::size_t bytes_ = 0;
  std::size_t stride_ = 0;
  std::size_t ring_ = default_ring_bytes;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t next_id_ = 0;
  std::deque<op> pending_;
  std::vector<std::uint64_t> completed_;
  std::vector<char> blocked_send_, blocked_recv_;  // per peer, scratch of progress()
  wait_limit limit_{0};
  detail::call_stamp stamp_;
  std::deque<detail::wire_header> headers_;  // of the transfers in flight (stable addresses)
  std::string bad_;                          // a received message that failed its check, and
  errc bad_code_ = errc::mismatch;           // how (mismatch: its header; corrupt: its checksum)
  bool failed_ = false;                      // a failure of this rank's or a peer's (the segment's word)
  errc code_ = errc::transport;              // with failed_: the code every later call throws
  std::string what_;                         // and its message
  std::vector<pid_t> peer_pid_;  // per rank: its pid if it shares this rank's pid namespace, else 0 (and 0 for self)
};

}  // namespace cgx::comm
