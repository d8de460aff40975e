/// \file plans_f32.cpp
/// The float plans of libcgx_mpi (plans.hpp).
#include "plans_impl.hpp"

std::unique_ptr<cgx_preload::plan> cgx_preload::make_plan_f32(const plan_request& req) { return detail::make<float>(req); }
