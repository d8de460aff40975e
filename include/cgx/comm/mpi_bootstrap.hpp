#pragma once
/// \file mpi_bootstrap.hpp
/// `comm::mpi_bootstrap`: the `bootstrap` concept (comm/bootstrap.hpp) over a duplicated
/// MPI communicator (MPI_Allgather, MPI_Barrier, MPI_Comm_split_type). Including this
/// header also makes an MPI_Comm a `bootstrap_source`, so that `comm::cuda_ipc{comm}`
/// keeps working. Every collective step is polled against a wait limit (its non-blocking
/// form, or a bounded barrier right before MPI_Comm_split_type, which has none): a missing
/// rank becomes cgx::error(errc::timeout), not a hang.

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "bootstrap.hpp"
#include "mpi.hpp"

namespace cgx::comm {

/// A bootstrap over its own duplicate of an MPI communicator. Move-only; frees the
/// duplicate on destruction (unless MPI is already finalized).
class mpi_bootstrap {
 public:
  /// Collective over `comm`: duplicates it (errors on the duplicate return, as for
  /// comm::mpi). Every step of this bootstrap, this one included, waits at most `limit`
  /// (default: default_timeout_ms(), CGX_TIMEOUT_MS or 10 minutes; zero: no limit) and
  /// then throws cgx::error(errc::timeout); the timed-out MPI request is left with MPI
  /// (detail::abandon). \throws cgx::error(errc::communicator) for MPI_COMM_NULL,
  /// cgx::error(errc::transport) when MPI fails.
  explicit mpi_bootstrap(MPI_Comm comm) : mpi_bootstrap(comm, wait_limit(default_timeout_ms())) {}

  /// As mpi_bootstrap(comm), every step bounded by `limit`.
  mpi_bootstrap(MPI_Comm comm, wait_limit limit) : limit_(limit) {
    if (comm == MPI_COMM_NULL) throw cgx::error(errc::communicator, "cgx::comm::mpi_bootstrap: MPI_COMM_NULL");
    struct duplicate {
      MPI_Comm out = MPI_COMM_NULL;
      MPI_Request req = MPI_REQUEST_NULL;
    };
    auto d = std::make_shared<duplicate>();
    detail::check_mpi(MPI_Comm_idup(comm, &d->out, &d->req), "cgx::comm::mpi_bootstrap: MPI_Comm_idup");
    finish(d->req, d, "the duplication of the communicator (MPI_Comm_idup)");
    comm_ = d->out;
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // errors become cgx::error, not an abort
    detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "cgx::comm::mpi_bootstrap: MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(comm_, &size_), "cgx::comm::mpi_bootstrap: MPI_Comm_size");
    // A rank that completes the duplication its peers gave up on must fail too: they never
    // post this barrier. (The communicator is then kept, not freed: abandoned_.)
    barrier();
  }
  /// Takes over o's communicator; o holds none after.
  mpi_bootstrap(mpi_bootstrap&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)),
        rank_(o.rank_),
        size_(o.size_),
        limit_(o.limit_),
        abandoned_(o.abandoned_) {}
  mpi_bootstrap(const mpi_bootstrap&) = delete;
  mpi_bootstrap& operator=(const mpi_bootstrap&) = delete;
  mpi_bootstrap& operator=(mpi_bootstrap&&) = delete;
  ~mpi_bootstrap() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A step that timed out is still MPI's, on this communicator: it is kept (freeing it
    // would let MPI progress a collective on a freed communicator).
    if (comm_ != MPI_COMM_NULL && !finalized && !abandoned_) (void)MPI_Comm_free(&comm_);
  }

  /// This process's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// Number of ranks.
  [[nodiscard]] int size() const noexcept { return size_; }

  /// Collective: MPI_Allgather of `mine` (one length on every rank) into `all`.
  void allgather(std::span<const std::byte> mine, std::span<std::byte> all) {
    usable("allgather");
    if (all.size() != mine.size() * static_cast<std::size_t>(size_) || mine.size() > static_cast<std::size_t>(INT_MAX))
      throw cgx::error(errc::invalid_argument, "cgx::comm::mpi_bootstrap: allgather of " +
                                                   std::to_string(mine.size()) + " bytes into " +
                                                   std::to_string(all.size()));
    const int m = static_cast<int>(mine.size());
    // MPI's buffers on the heap: a timed-out gather is left with MPI, which may write later.
    auto buf = std::make_shared<std::vector<std::byte>>(mine.size() + all.size());
    std::copy(mine.begin(), mine.end(), buf->begin());
    MPI_Request r = MPI_REQUEST_NULL;
    detail::check_mpi(MPI_Iallgather(buf->data(), m, MPI_BYTE, buf->data() + mine.size(), m, MPI_BYTE, comm_, &r),
                      "cgx::comm::mpi_bootstrap: MPI_Iallgather");
    finish(r, buf, "an allgather (MPI_Iallgather)");
    std::copy(buf->begin() + static_cast<std::ptrdiff_t>(mine.size()), buf->end(), all.begin());
  }

  /// Collective: a barrier (MPI_Ibarrier, bounded). \throws cgx::error(errc::transport)
  /// after MPI_Finalize, errc::timeout when the limit passes.
  void barrier() {
    usable("barrier");
    MPI_Request r = MPI_REQUEST_NULL;
    detail::check_mpi(MPI_Ibarrier(comm_, &r), "cgx::comm::mpi_bootstrap: MPI_Ibarrier");
    finish(r, nullptr, "a barrier (MPI_Ibarrier)");
  }

  /// Collective: true on every rank when every rank is on one node (MPI_Comm_split_type
  /// with MPI_COMM_TYPE_SHARED gives one communicator of all ranks).
  [[nodiscard]] bool same_node() {
    usable("same_node");
    barrier();  // bounded: MPI_Comm_split_type has no non-blocking form
    MPI_Comm node = MPI_COMM_NULL;
    detail::check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                      "cgx::comm::mpi_bootstrap: MPI_Comm_split_type");
    int node_size = 0;
    const int size_rc = MPI_Comm_size(node, &node_size);
    const int free_rc = MPI_Comm_free(&node);
    detail::check_mpi(size_rc, "cgx::comm::mpi_bootstrap: MPI_Comm_size (node communicator)");
    detail::check_mpi(free_rc, "cgx::comm::mpi_bootstrap: MPI_Comm_free (node communicator)");
    std::int64_t off_node[1] = {node_size == size_ ? 0 : 1};
    max_all(*this, off_node);
    return off_node[0] == 0;
  }

  /// The duplicated communicator (MPI_COMM_NULL when moved from).
  [[nodiscard]] MPI_Comm comm() const noexcept { return comm_; }

 private:
  void usable(const char* what) const {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ == MPI_COMM_NULL || finalized)
      throw cgx::error(errc::transport, std::string("cgx::comm::mpi_bootstrap: ") + what +
                                            (finalized ? " after MPI_Finalize" : " on a moved-from bootstrap"));
  }

  /// Waits for `r` up to the limit; on a timeout leaves it (and `keep`) with MPI and throws.
  void finish(MPI_Request& r, std::shared_ptr<void> keep, const char* what) const {
    if (detail::wait_bounded(std::span<MPI_Request>(&r, 1), limit_, what)) return;
    detail::abandon(std::span<MPI_Request>(&r, 1), std::move(keep));
    abandoned_ = true;
    throw cgx::error(errc::timeout, "cgx::comm::mpi_bootstrap: " + detail::construction_timeout(limit_, what));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  wait_limit limit_{0};
  mutable bool abandoned_ = false;  // a step timed out: the communicator is never freed
};

/// An MPI_Comm is a bootstrap source: `make(comm)` is mpi_bootstrap(comm).
template <>
struct bootstrap_from<MPI_Comm> {
  /// Collective over `comm` (duplicates it).
  static mpi_bootstrap make(MPI_Comm comm) { return mpi_bootstrap(comm); }
};

}  // namespace cgx::comm
