#pragma once
/// \file plans_impl.hpp
/// The plans of plans.hpp for one value type T; included by plans_f32.cpp and plans_f64.cpp.
/// Max-min: cgx::allreduce_plan<T, maxmin<B, 1024, stochastic>, SRA, comm::mpi>, B from
/// the request (cgx::dispatch_bits). Error-bounded: cgx::error_bounded_plan<T,
/// error_bounded<1024>, SRA, comm::mpi>.

#include <cgx/cgx.hpp>

#include <cstddef>
#include <memory>

#include "plans.hpp"

namespace cgx_preload::detail {

/// The plan's transport over req.comm, its construction bounded by the preload's wait limit.
inline cgx::comm::mpi transport_of(const plan_request& req) {
  return cgx::comm::mpi(req.comm, cgx::comm::wait_limit(req.timeout_ms));
}

inline cgx::plan_options options_of(const plan_request& req) {
  cgx::plan_options o;
  o.native_below_bytes = req.native_below;
  o.check = req.collective_check ? cgx::checking::collective : cgx::checking::local;
  o.timeout_ms = req.timeout_ms;
  return o;
}

/// Bytes one rank sends in SRA's two phases for n values whose compressed form takes
/// `bytes(n)` bytes: (p - 1) / p of it in each phase.
template <class Bytes>
std::size_t sra_bytes(std::size_t n, int p, Bytes bytes) {
  if (p < 2) return 0;
  const auto whole = static_cast<double>(bytes(n));
  return static_cast<std::size_t>(2.0 * (p - 1) / p * whole);
}

template <class T, int Bits>
class maxmin_plan final : public plan {
  using Q = cgx::quant::maxmin<Bits, 1024, cgx::quant::stochastic>;
  using P = cgx::allreduce_plan<T, Q, cgx::comm::scatter_reduce_allgather, cgx::comm::mpi>;

 public:
  explicit maxmin_plan(const plan_request& req) : p_(transport_of(req), req.capacity, options_of(req)) {}
  traffic run(void* buf, std::size_t n, double) override {
    p_(static_cast<T*>(buf), n);
    traffic t;
    if (p_.last_native()) {  // the plan's measured choice, or the user's threshold
      t.native = true;
      return t;
    }
    const int p = p_.transport().size();
    t.sent = sra_bytes(n, p, [](std::size_t m) { return Q::template compressed_bytes<T>(m); });
    t.raw = sra_bytes(n, p, [](std::size_t m) { return m * sizeof(T); });
    return t;
  }
  [[nodiscard]] std::size_t capacity() const noexcept override { return p_.max_count(); }

 private:
  P p_;
};

template <class T>
class bound_plan final : public plan {
  using P = cgx::error_bounded_plan<T, cgx::quant::error_bounded<1024>, cgx::comm::scatter_reduce_allgather,
                                    cgx::comm::mpi>;

 public:
  explicit bound_plan(const plan_request& req) : p_(transport_of(req), req.capacity, options_of(req)) {}
  traffic run(void* buf, std::size_t n, double bound) override {
    p_(static_cast<T*>(buf), n, bound);
    const auto& s = p_.last_stats();
    return traffic{s.bytes_sent, s.raw_bytes, s.native};
  }
  [[nodiscard]] std::size_t capacity() const noexcept override { return p_.max_count(); }

 private:
  P p_;
};

template <class T>
std::unique_ptr<plan> make(const plan_request& req) {
  if (req.bits == 0) return std::make_unique<bound_plan<T>>(req);
  return cgx::dispatch_bits(req.bits, [&](auto b) -> std::unique_ptr<plan> {
    return std::make_unique<maxmin_plan<T, decltype(b)::value>>(req);
  });
}

}  // namespace cgx_preload::detail
