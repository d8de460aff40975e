#pragma once
/// \file mpi_bootstrap.hpp
/// `comm::mpi_bootstrap`: the `bootstrap` concept (comm/bootstrap.hpp) over a duplicated
/// MPI communicator (MPI_Allgather, MPI_Barrier, MPI_Comm_split_type). Including this
/// header also makes an MPI_Comm a `bootstrap_source`, so that `comm::cuda_ipc{comm}`
/// keeps working. MPI's collectives have no timeout: a dead peer is MPI's to report.

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "../error.hpp"
#include "bootstrap.hpp"
#include "mpi.hpp"

namespace cgx::comm {

/// A bootstrap over its own duplicate of an MPI communicator. Move-only; frees the
/// duplicate on destruction (unless MPI is already finalized).
class mpi_bootstrap {
 public:
  /// Collective over `comm`: duplicates it (errors on the duplicate return, as for
  /// comm::mpi). \throws cgx::error(errc::communicator) for
  /// MPI_COMM_NULL, cgx::error(errc::transport) when MPI fails.
  explicit mpi_bootstrap(MPI_Comm comm) {
    if (comm == MPI_COMM_NULL) throw cgx::error(errc::communicator, "cgx::comm::mpi_bootstrap: MPI_COMM_NULL");
    detail::check_mpi(MPI_Comm_dup(comm, &comm_), "cgx::comm::mpi_bootstrap: MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // errors become cgx::error, not an abort
    detail::check_mpi(MPI_Comm_rank(comm_, &rank_), "cgx::comm::mpi_bootstrap: MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(comm_, &size_), "cgx::comm::mpi_bootstrap: MPI_Comm_size");
  }
  /// Takes over o's communicator; o holds none after.
  mpi_bootstrap(mpi_bootstrap&& o) noexcept
      : comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), size_(o.size_) {}
  mpi_bootstrap(const mpi_bootstrap&) = delete;
  mpi_bootstrap& operator=(const mpi_bootstrap&) = delete;
  mpi_bootstrap& operator=(mpi_bootstrap&&) = delete;
  ~mpi_bootstrap() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) (void)MPI_Comm_free(&comm_);
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
    detail::check_mpi(MPI_Allgather(mine.data(), m, MPI_BYTE, all.data(), m, MPI_BYTE, comm_),
                      "cgx::comm::mpi_bootstrap: MPI_Allgather");
  }

  /// Collective: MPI_Barrier. \throws cgx::error(errc::transport) after MPI_Finalize.
  void barrier() {
    usable("barrier");
    detail::check_mpi(MPI_Barrier(comm_), "cgx::comm::mpi_bootstrap: MPI_Barrier");
  }

  /// Collective: true on every rank when every rank is on one node (MPI_Comm_split_type
  /// with MPI_COMM_TYPE_SHARED gives one communicator of all ranks).
  [[nodiscard]] bool same_node() {
    usable("same_node");
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

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

/// An MPI_Comm is a bootstrap source: `make(comm)` is mpi_bootstrap(comm).
template <>
struct bootstrap_from<MPI_Comm> {
  /// Collective over `comm` (duplicates it).
  static mpi_bootstrap make(MPI_Comm comm) { return mpi_bootstrap(comm); }
};

}  // namespace cgx::comm
