// cgx::layerwise_plan<double, comm::mpi, quant::nearest> for plans.cpp (see host_plan.inl).
#include "host_plan.inl"

namespace cgx_torch::detail {
CGX_TORCH_HOST_PLAN(, double, nearest)
}  // namespace cgx_torch::detail
