/// \file plans_f64.cpp
/// The double plans of libcgx_mpi (plans.hpp).
#include "plans_impl.hpp"

std::unique_ptr<cgx_preload::plan> cgx_preload::make_plan_f64(const plan_request& req) { return detail::make<double>(req); }
