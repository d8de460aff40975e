// Internal to the C library (cgx_c): the type-erased plans behind include/cgx/c.h.
// c_api.cpp holds the C functions (argument checks, error codes, no exception across
// the boundary); c_allreduce_*.cpp instantiate the compiled set of max-min allreduce
// plans, one translation unit per (value type, rounding), so that they build in
// parallel and the two schedules of one unit share its quantizer kernels;
// c_error_bounded.cpp the error-bounded ones.
#pragma once

#include <cgx/c.h>

#include <cgx/comm/mpi.hpp>
#include <cgx/error_bounded_plan.hpp>
#include <cgx/plan_common.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

namespace cgx::c_api {

/// Buckets compiled into the library (cgx_bucket_supported, the header's list).
inline constexpr std::size_t compiled_buckets[] = {128, 1024};

/// A cgx::allreduce_plan<T, maxmin<Bits, Bucket, Rounding>, R, comm::mpi>, type-erased.
class allreduce_iface {
 public:
  virtual ~allreduce_iface() = default;
  virtual void run(void* buf, std::size_t n) = 0;
  virtual void start(void* buf, std::size_t n) = 0;
  virtual void wait() = 0;
  [[nodiscard]] virtual bool in_flight() const = 0;
  [[nodiscard]] virtual std::size_t native_below_bytes() const = 0;
  [[nodiscard]] virtual path_pick path_for(std::size_t bytes) const = 0;
  [[nodiscard]] virtual bool last_native() const = 0;
  [[nodiscard]] virtual std::uint32_t calls() const = 0;
  [[nodiscard]] virtual std::size_t compressed_bytes(std::size_t n) const = 0;
};

/// A cgx::error_bounded_plan<T, quant::error_bounded<1024>, R, comm::mpi>, type-erased.
class error_bounded_iface {
 public:
  virtual ~error_bounded_iface() = default;
  virtual void run(void* buf, std::size_t n, double bound) = 0;
  [[nodiscard]] virtual cgx::error_bounded_stats stats() const = 0;
  [[nodiscard]] virtual path_pick path_for(std::size_t bytes) const = 0;
};

/// The transport of a plan over `comm` with options `o` (resolved by c_api.cpp): where
/// comm::mpi's construction takes a wait limit, the plan's own, so that neither the
/// construction nor anything else reads CGX_TIMEOUT_MS again (a C caller who set
/// timeout_ms is not refused for a malformed variable it does not use).
template <class X = comm::mpi>
X make_transport(MPI_Comm comm, const plan_options& o) {
  if constexpr (std::is_constructible_v<X, MPI_Comm, comm::wait_limit>)
    return X(comm, comm::wait_limit(o.timeout_ms));
  else
    return X(comm);
}

/// What a max-min plan is made of, checked by c_api.cpp before it gets here.
struct allreduce_spec {
  int bits;
  std::size_t bucket;
  cgx_schedule schedule;
  std::size_t max_count;
};

/// The plan for value type T and rounding Rounding (quant::stochastic or
/// quant::nearest), its bits and bucket picked at run time by cgx::dispatch.
/// Collective. Throws cgx::error (errc::invalid_argument for a spec outside the
/// compiled set). Defined in c_allreduce.inl, instantiated in c_allreduce_*.cpp.
template <class T, class Rounding>
std::unique_ptr<allreduce_iface> make_allreduce(MPI_Comm comm, const allreduce_spec& s, const plan_options& o);

/// The error-bounded plan of value type `type` and schedule `schedule`. Collective.
std::unique_ptr<error_bounded_iface> make_error_bounded(MPI_Comm comm, cgx_datatype type, cgx_schedule schedule,
                                                        std::size_t max_count, const plan_options& o);

}  // namespace cgx::c_api
