// What bench/profile runs under perf: only cgx's 4-bit SRA allreduce (stochastic,
// bucket 1024) on 64 MiB of fp32 per rank, ITERS times, over comm::mpi or comm::shm,
// with no baseline in between, so that a whole-machine profile shows cgx alone.
//   mpirun -np 4 profile_driver [ITERS] [mpi|shm]
#include <cgx/cgx.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  {
    const std::size_t n = (std::size_t{64} << 20) / sizeof(float);
    const int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    const bool use_shm = argc > 2 && std::string(argv[2]) == "shm";
    using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
    using R = cgx::comm::scatter_reduce_allgather;
    cgx::plan_options o;
    o.native_below_bytes = 0;
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 2654435761u + static_cast<unsigned>(rank)) % 1000) * 1e-3f;
    auto go = [&](auto& plan) {
      const double t0 = MPI_Wtime();
      for (int it = 0; it < iters; ++it) plan(g.data(), n);
      if (rank == 0) std::printf("%d x 64 MiB: %.1f ms each\n", iters, (MPI_Wtime() - t0) / iters * 1e3);
    };
    if (use_shm) {
      cgx::allreduce_plan<float, Q, R, cgx::comm::shm> p{cgx::comm::shm{MPI_COMM_WORLD}, n, o};
      go(p);
    } else {
      cgx::allreduce_plan<float, Q, R, cgx::comm::mpi> p{cgx::comm::mpi{MPI_COMM_WORLD}, n, o};
      go(p);
    }
  }
  MPI_Finalize();
}
