// The max-min allreduce plans of the C library (see c_plans.hpp): make_allreduce<T,
// Rounding>, included by one translation unit per (T, Rounding), which instantiates it.
#pragma once
#include "c_plans.hpp"

#include <cgx/allreduce_plan.hpp>
#include <cgx/comm/mpi.hpp>
#include <cgx/comm/ring.hpp>
#include <cgx/comm/scatter_reduce_allgather.hpp>
#include <cgx/dispatch.hpp>
#include <cgx/quant/maxmin.hpp>

#include <memory>
#include <string>
#include <type_traits>

namespace cgx::c_api {

template <class T, class Q, class R>
class allreduce_impl final : public allreduce_iface {
 public:
  allreduce_impl(MPI_Comm comm, std::size_t max_count, const plan_options& o) : plan_(make_transport(comm, o), max_count, o) {}
  void run(void* buf, std::size_t n) override { plan_(static_cast<T*>(buf), n); }
  void start(void* buf, std::size_t n) override { plan_.start(static_cast<T*>(buf), n); }
  void wait() override { plan_.wait(); }
  bool in_flight() const override { return plan_.in_flight(); }
  std::size_t native_below_bytes() const override { return plan_.native_below_bytes(); }
  path_pick path_for(std::size_t bytes) const override { return plan_.path_for(bytes); }
  bool last_native() const override { return plan_.last_native(); }
  std::uint32_t calls() const override { return plan_.calls(); }
  std::size_t compressed_bytes(std::size_t n) const override { return Q::template compressed_bytes<T>(n); }

 private:
  allreduce_plan<T, Q, R, comm::mpi> plan_;
};

template <class T, class Rounding>
std::unique_ptr<allreduce_iface> make_allreduce(MPI_Comm comm, const allreduce_spec& s, const plan_options& o) {
  // cgx::dispatch turns each run-time value into a type (it throws for one outside the
  // compiled set; c_api.cpp has already refused those with a clearer message).
  return dispatch_bits(s.bits, [&](auto b) {
    return dispatch<128, 1024>(static_cast<int>(s.bucket), [&](auto k) -> std::unique_ptr<allreduce_iface> {
      using Q = quant::maxmin<decltype(b)::value, static_cast<std::size_t>(decltype(k)::value), Rounding>;
      if (s.schedule == CGX_RING) return std::make_unique<allreduce_impl<T, Q, comm::ring>>(comm, s.max_count, o);
      return std::make_unique<allreduce_impl<T, Q, comm::scatter_reduce_allgather>>(comm, s.max_count, o);
    });
  });
}

}  // namespace cgx::c_api

#define CGX_C_ALLREDUCE(T, Rounding) \
  template std::unique_ptr<cgx::c_api::allreduce_iface> cgx::c_api::make_allreduce<T, Rounding>( \
      MPI_Comm, const cgx::c_api::allreduce_spec&, const cgx::plan_options&);
