#pragma once
/// \file mpi.hpp
/// `cgx::comm::mpi`: the transport over an MPI communicator, host buffers.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "../error.hpp"

namespace cgx::comm {

namespace detail {
inline void check_mpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw cgx::error(errc::transport, std::string(what) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
  }
}
}  // namespace detail

/// Point-to-point transport over a caller-supplied communicator. The constructor
/// duplicates the communicator (collective: every rank of `comm` must call it), so
/// cgx's messages never match the caller's own; the duplicate is freed by the
/// destructor (also collective in MPI's sense: call it before MPI_Finalize).
/// Move-only. Host buffers only: Debian's Open MPI and MPICH are not CUDA-aware.
class mpi {
 public:
  /// A pending send or receive; messages over 2 GiB travel in two parts.
  struct request {
    MPI_Request r[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  ///< the MPI requests (the second for the part above 2 GiB)
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
  explicit mpi(MPI_Comm comm) : mpi(comm, nodes{-1}) {}

  /// Collective over `comm`, with the caller's grouping of ranks into nodes.
  mpi(MPI_Comm comm, nodes grouping) : node_color_(grouping.color) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw cgx::error(errc::communicator, "cgx::comm::mpi: MPI is not initialized");
    if (comm == MPI_COMM_NULL) throw cgx::error(errc::communicator, "cgx::comm::mpi: communicator is MPI_COMM_NULL");
    int inter = 0;
    detail::check_mpi(MPI_Comm_test_inter(comm, &inter), "MPI_Comm_test_inter");
    if (inter) throw cgx::error(errc::communicator, "cgx::comm::mpi: inter-communicators are not supported");
    detail::check_mpi(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  mpi(const mpi&) = delete;
  mpi& operator=(const mpi&) = delete;
  /// Takes over o's communicator; o holds MPI_COMM_NULL after.
  mpi(mpi&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_), node_color_(o.node_color_) {}
  /// Frees this transport's communicator and takes over o's.
  mpi& operator=(mpi&& o) noexcept {
    if (this != &o) {
      release();
      comm_ = std::exchange(o.comm_, MPI_COMM_NULL);
      rank_ = o.rank_;
      size_ = o.size_;
      node_color_ = o.node_color_;
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
  mpi split(int color, int key) const {
    MPI_Comm sub;
    detail::check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    mpi out(sub);
    MPI_Comm_free(&sub);
    return out;
  }

  /// Collective: the transport over the ranks of this rank's node (see `nodes`).
  mpi node() const {
    if (node_color_ >= 0) return split(node_color_, rank_);
    MPI_Comm sub;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub),
                      "MPI_Comm_split_type");
    mpi out(sub);
    MPI_Comm_free(&sub);
    return out;
  }

  /// Collective: whether all ranks of the communicator are on one node, by the same
  /// grouping as node(): with a caller's `nodes{color}`, whether every rank gave the same
  /// color; otherwise whether MPI's shared-memory domain (MPI_Comm_split_type with
  /// MPI_COMM_TYPE_SHARED) holds the whole communicator. Every rank gets the same answer.
  /// A plan asks it once, at construction, to pick its native-allreduce threshold.
  [[nodiscard]] bool single_node() const {
    std::int64_t v[2] = {node_color_, -static_cast<std::int64_t>(node_color_)};  // max color, -min color
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce");
    if (v[0] >= 0) return v[0] == -v[1];  // a grouping was given (ranks without one count as color -1)
    MPI_Comm sub;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &sub),
                      "MPI_Comm_split_type");
    int sub_size = 0;
    MPI_Comm_size(sub, &sub_size);
    MPI_Comm_free(&sub);
    return sub_size == size_;
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

  /// Completes every request in `reqs`.
  void wait_all(std::span<request> reqs) {
    for (auto& q : reqs) detail::check_mpi(MPI_Waitall(2, q.r, MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  /// Lets MPI move the messages in flight: a rendezvous send waits for the receiver's
  /// answer, and its data leaves only from inside MPI calls, so a rank that computes
  /// between its sends calls this now and then (MPI_Iprobe runs MPI's progress engine).
  void progress() {
    int flag = 0;
    detail::check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
  }

  /// Collective: element-wise maximum over all ranks, in place.
  void max_all(std::span<std::int64_t> v) {
    detail::check_mpi(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT64_T, MPI_MAX, comm_),
                      "MPI_Allreduce");
  }

 private:
  static constexpr std::size_t block = std::size_t{1} << 30;

  void post(request& q, void* buf, std::size_t bytes, int peer, int tag, bool send) {
    auto start = [&](void* p, int count, MPI_Datatype t, MPI_Request* r) {
      if (send)
        detail::check_mpi(MPI_Isend(p, count, t, peer, tag, comm_, r), "MPI_Isend");
      else
        detail::check_mpi(MPI_Irecv(p, count, t, peer, tag, comm_, r), "MPI_Irecv");
    };
    if (bytes <= static_cast<std::size_t>(INT_MAX)) {
      start(buf, static_cast<int>(bytes), MPI_BYTE, &q.r[0]);
      return;
    }
    // Over INT_MAX bytes: whole 1 GiB blocks as one derived-type message, then the rest.
    // Freeing the type right away is allowed: MPI keeps it alive for pending operations.
    MPI_Datatype big;
    detail::check_mpi(MPI_Type_contiguous(static_cast<int>(block), MPI_BYTE, &big), "MPI_Type_contiguous");
    MPI_Type_commit(&big);
    const std::size_t nblocks = bytes / block;
    start(buf, static_cast<int>(nblocks), big, &q.r[0]);
    MPI_Type_free(&big);
    start(static_cast<char*>(buf) + nblocks * block, static_cast<int>(bytes - nblocks * block), MPI_BYTE, &q.r[1]);
  }

  void release() noexcept {
    if (comm_ != MPI_COMM_NULL) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Comm_free(&comm_);
      comm_ = MPI_COMM_NULL;
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int node_color_ = -1;
};

}  // namespace cgx::comm
