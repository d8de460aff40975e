// cgx::layerwise_plan<float, comm::mpi, quant::stochastic> for plans.cpp (see host_plan.inl).
#include "host_plan.inl"

namespace cgx_torch::detail {
CGX_TORCH_HOST_PLAN(, float, stochastic)
}  // namespace cgx_torch::detail
