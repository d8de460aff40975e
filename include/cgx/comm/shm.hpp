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
/// were posted (tags are not used), which is what every cgx reducer does.
///
/// Lifetime: rank 0 creates the segment under a fresh unique name, all ranks map it,
/// and rank 0 unlinks the name as soon as everyone has mapped it. Nothing is left in
/// /dev/shm after that point, even if the job is killed, and a new job never meets an
/// old job's name (names carry the pid, the time and random bits, and creation uses
/// O_EXCL).

#include <fcntl.h>
#include <mpi.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
/// Construction is collective over `comm`; throws cgx::error(errc::communicator) if
/// the ranks are not all on one node. Move-only.
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
  };

 public:
  /// Handle of a posted send or receive.
  struct request {
    std::uint64_t id = 0;  ///< the transfer's number; 0: nothing to wait for
  };

  /// Default ring size per ordered pair of ranks.
  static constexpr std::size_t default_ring_bytes = std::size_t{1} << 20;

  /// Collective over `comm` (which must hold only ranks of one node).
  explicit shm(MPI_Comm comm, std::size_t ring_bytes = default_ring_bytes) : ring_(ring_bytes) {
    if (ring_bytes < 4096 || (ring_bytes & (ring_bytes - 1)) != 0)
      throw cgx::error(errc::invalid_argument, "cgx::comm::shm: ring_bytes must be a power of two >= 4096");
    base_comm_.emplace(comm);  // validates the communicator and duplicates it (setup, native allreduce)
    mpi& base = *base_comm_;
    rank_ = base.rank();
    size_ = base.size();
    blocked_send_.assign(static_cast<std::size_t>(size_), 0);
    blocked_recv_.assign(static_cast<std::size_t>(size_), 0);
    MPI_Comm node;
    detail::check_mpi(MPI_Comm_split_type(base.comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                      "MPI_Comm_split_type");
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    int all_local = node_size == size_ ? 1 : 0, ok = 0;
    MPI_Allreduce(&all_local, &ok, 1, MPI_INT, MPI_MIN, base.comm());
    if (!ok) throw cgx::error(errc::communicator, "cgx::comm::shm: the ranks of the communicator span several nodes");

    const std::size_t pairs = static_cast<std::size_t>(size_) * static_cast<std::size_t>(size_);
    stride_ = sizeof(ring_header) + ring_;
    bytes_ = pairs * stride_;

    // Rank 0 creates the segment under a unique name; the others open it.
    char name[64] = {};
    int err = 0;
    if (rank_ == 0) err = create(name, sizeof(name));
    MPI_Bcast(&err, 1, MPI_INT, 0, base.comm());
    if (err != 0) throw cgx::error(errc::transport, "cgx::comm::shm: cannot create a shared-memory segment: " + std::string(std::strerror(err)));
    MPI_Bcast(name, sizeof(name), MPI_CHAR, 0, base.comm());
    int my_err = 0;
    if (rank_ != 0) my_err = attach(name);
    int any_err = 0;
    MPI_Allreduce(&my_err, &any_err, 1, MPI_INT, MPI_MAX, base.comm());
    // Everyone has mapped it (or failed): the name is no longer needed.
    if (rank_ == 0) shm_unlink(name);
    if (any_err != 0) {
      release();
      throw cgx::error(errc::transport, "cgx::comm::shm: a rank could not map the shared-memory segment");
    }
    // Make sure rank 0's initialization of the ring counters is visible before use.
    MPI_Barrier(base.comm());
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

  /// Progresses every pending operation until those in `reqs` are complete.
  void wait_all(std::span<request> reqs) {
    auto done = [&] {
      for (const auto& r : reqs)
        if (r.id != 0 && !is_complete(r.id)) return false;
      return true;
    };
    int idle = 0;
    while (!done()) {
      if (progress()) {
        idle = 0;
      } else if (++idle > 64) {
        std::this_thread::yield();  // ranks may outnumber cores
      }
    }
    for (auto& r : reqs) {
      forget(r.id);
      r.id = 0;
    }
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
  ring_header* header(int src, int dst) const {
    return reinterpret_cast<ring_header*>(static_cast<std::byte*>(base_) +
                                          (static_cast<std::size_t>(src) * static_cast<std::size_t>(size_) +
                                           static_cast<std::size_t>(dst)) * stride_);
  }
  std::byte* data(int src, int dst) const { return reinterpret_cast<std::byte*>(header(src, dst) + 1); }

  int create(char* name, std::size_t cap) {
    std::random_device rd;
    for (int attempt = 0; attempt < 16; ++attempt) {
      const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
      std::snprintf(name, cap, "/cgx.%d.%llx.%08x", static_cast<int>(getpid()),
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
      void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p == MAP_FAILED) {
        const int e = errno;
        shm_unlink(name);
        return e;
      }
      base_ = p;
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
    const std::uint64_t id = ++next_id_;
    if (bytes == 0) {
      completed_.push_back(id);
      return {id};
    }
    pending_.push_back(op{buf, bytes, 0, send, peer, id});
    progress();
    return {id};
  }

  /// Moves bytes for every pending operation that can move; true if anything moved.
  /// Only the oldest unfinished operation per (direction, peer) may move (FIFO order).
  bool progress() {
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
        completed_.push_back(o.id);
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
};

}  // namespace cgx::comm
