// cgx::layerwise_plan<double, comm::mpi, quant::stochastic> for plans.cpp (see host_plan.inl).
#include "host_plan.inl"

namespace cgx_torch::detail {
CGX_TORCH_HOST_PLAN(, double, stochastic)
}  // namespace cgx_torch::detail
