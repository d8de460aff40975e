// cgx::error_bounded_plan<float | double, quant::error_bounded<1024>, SRA | ring, comm::mpi>
// for the C library (see c_plans.hpp).
#include "c_plans.hpp"

#include <cgx/comm/error_bounded_schedules.hpp>
#include <cgx/comm/mpi.hpp>
#include <cgx/comm/ring.hpp>
#include <cgx/comm/scatter_reduce_allgather.hpp>
#include <cgx/error_bounded_plan.hpp>
#include <cgx/quant/error_bounded.hpp>

#include <memory>

namespace cgx::c_api {
namespace {

template <class T, class R>
class error_bounded_impl final : public error_bounded_iface {
 public:
  error_bounded_impl(MPI_Comm comm, std::size_t max_count, const plan_options& o) : plan_(make_transport(comm, o), max_count, o) {}
  void run(void* buf, std::size_t n, double bound) override { plan_(static_cast<T*>(buf), n, bound); }
  cgx::error_bounded_stats stats() const override { return plan_.last_stats(); }
  path_pick path_for(std::size_t bytes) const override { return plan_.path_for(bytes); }

 private:
  error_bounded_plan<T, quant::error_bounded<1024>, R, comm::mpi> plan_;
};

template <class T>
std::unique_ptr<error_bounded_iface> make(MPI_Comm comm, cgx_schedule schedule, std::size_t max_count,
                                          const plan_options& o) {
  if (schedule == CGX_RING) return std::make_unique<error_bounded_impl<T, comm::ring>>(comm, max_count, o);
  return std::make_unique<error_bounded_impl<T, comm::scatter_reduce_allgather>>(comm, max_count, o);
}

}  // namespace

std::unique_ptr<error_bounded_iface> make_error_bounded(MPI_Comm comm, cgx_datatype type, cgx_schedule schedule,
                                                        std::size_t max_count, const plan_options& o) {
  if (type == CGX_FLOAT) return make<float>(comm, schedule, max_count, o);
  return make<double>(comm, schedule, max_count, o);
}

}  // namespace cgx::c_api
