// cgx::layerwise_plan<double, comm::mpi, quant::nearest> for plans.cpp (see host_plan.inl);
// empty in a build without MPI.
#include "host_plan.inl"

namespace cgx_torch::detail {
#ifdef CGX_TORCH_WITH_MPI
CGX_TORCH_HOST_PLAN(, double, nearest)
#endif
}  // namespace cgx_torch::detail
