#pragma once
/// \file plans.hpp
/// The cgx plans behind libcgx_mpi (the PMPI interposer, cgx_mpi.cpp), behind one small
/// virtual interface so that the interposer's translation unit instantiates no
/// quantizer: the plans of each value type are compiled in their own file
/// (plans_f32.cpp, plans_f64.cpp), in parallel.

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace cgx_preload {

/// What one call of a plan sent, on this rank.
struct traffic {
  std::size_t sent = 0;  ///< bytes this rank sent (compressed payloads; for maxmin computed from the wire format)
  std::size_t raw = 0;   ///< bytes the same schedule sends uncompressed
  bool native = false;   ///< the plan handed the call to MPI_Allreduce (below its threshold)
};

/// A compressed allreduce (sum, in place) over one communicator, of up to capacity()
/// values. Collective, like the cgx plan it holds; throws cgx::error.
class plan {
 public:
  virtual ~plan() = default;
  /// Sums buf[0..n) over all ranks, in place; `bound`: the absolute bound of an
  /// error-bounded plan (ignored by a max-min plan).
  virtual traffic run(void* buf, std::size_t n, double bound) = 0;
  /// The largest n run() takes.
  [[nodiscard]] virtual std::size_t capacity() const noexcept = 0;
};

/// How a plan is made.
struct plan_request {
  MPI_Comm comm = MPI_COMM_NULL;  ///< the communicator the plan duplicates (the preload's control communicator)
  std::size_t capacity = 0;       ///< values
  int bits = 0;                   ///< 1..8: quant::maxmin<bits, 1024, stochastic>; 0: error-bounded
  std::size_t native_below = 0;   ///< plan_options::native_below_bytes (cgx::auto_threshold: the plan's pick)
  bool collective_check = false;  ///< plan_options::check = checking::collective (else local)
  std::uint32_t timeout_ms = 0;   ///< the wait limit of the construction and of every call (0: none)
};

/// A plan for float values (plans_f32.cpp). Collective over req.comm, bounded by
/// req.timeout_ms (the transport's duplications and barrier, cgx::comm::mpi); throws
/// cgx::error (errc::timeout when a rank did not join in time).
std::unique_ptr<plan> make_plan_f32(const plan_request& req);
/// A plan for double values (plans_f64.cpp). Collective over req.comm.
std::unique_ptr<plan> make_plan_f64(const plan_request& req);

}  // namespace cgx_preload
