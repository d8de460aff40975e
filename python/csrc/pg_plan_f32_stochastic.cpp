// cgx::layerwise_plan<float, pg_transport, quant::stochastic> for pg_plans.cpp (see host_plan.inl).
#include "host_plan.inl"

namespace cgx_torch::detail {
CGX_TORCH_PG_PLAN(, float, stochastic)
}  // namespace cgx_torch::detail
