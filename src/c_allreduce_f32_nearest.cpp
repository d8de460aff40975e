// cgx::allreduce_plan<float, maxmin<1..8, 128 | 1024, nearest>, SRA | ring, comm::mpi> for the C library.
#include "c_allreduce.inl"

CGX_C_ALLREDUCE(float, cgx::quant::nearest)
