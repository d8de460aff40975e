// cgx::allreduce_plan<double, maxmin<1..8, 128 | 1024, stochastic>, SRA | ring, comm::mpi> for the C library.
#include "c_allreduce.inl"

CGX_C_ALLREDUCE(double, cgx::quant::stochastic)
