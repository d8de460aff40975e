// cgx::layerwise_plan<float, pg_transport, quant::nearest> for pg_plans.cpp (see host_plan.inl).
#include "host_plan.inl"

namespace cgx_torch::detail {
CGX_TORCH_PG_PLAN(, float, nearest)
}  // namespace cgx_torch::detail
