// The smallest complete cgx program: a 4-bit compressed allreduce of a host buffer.
//   mpirun -np 4 ./quickstart
// [snippet:quickstart]
#include <cgx/cgx.hpp>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;  // bits, bucket, rounding
    using R = cgx::comm::scatter_reduce_allgather;                  // the schedule
    using X = cgx::comm::mpi;                                       // the transport
    const std::size_t n = 1 << 20;
    cgx::allreduce_plan<float, Q, R, X> plan{X{MPI_COMM_WORLD}, n};  // workspace allocated once

    std::vector<float> grad(n, 0.5f * static_cast<float>(plan.transport().rank() + 1));
    plan(grad.data(), grad.size());  // in place, blocking; every rank calls it

    if (plan.transport().rank() == 0) std::printf("grad[0] = %g on %d ranks\n", grad[0], plan.transport().size());
  }  // the plan (and its duplicated communicator) goes before MPI_Finalize
  MPI_Finalize();
}
// [snippet:quickstart]
