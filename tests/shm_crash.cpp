// Helper of the shm_killed_job test: with --crash, rank 0 is killed (SIGKILL, no
// cleanup) while every rank holds a mapped cgx::comm::shm segment; without it, the
// ranks run a real allreduce over shm and check it.
#include <cgx/cgx.hpp>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool crash = argc > 1 && std::strcmp(argv[1], "--crash") == 0;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int bad = 0;
  {
    using Q = cgx::quant::maxmin<8, 1024, cgx::quant::nearest>;
    cgx::allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, cgx::comm::shm> plan{
        cgx::comm::shm{MPI_COMM_WORLD}, 10000};
    if (crash) {
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) std::raise(SIGKILL);
      MPI_Barrier(MPI_COMM_WORLD);  // never completes: the launcher tears the job down
    }
    std::vector<float> v(10000, 1.0f + static_cast<float>(rank));
    plan(v.data(), v.size());
    const float want = static_cast<float>(size * (size + 1) / 2);
    for (float f : v) bad += f == want ? 0 : 1;
  }
  int all = 0;
  MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("shm allreduce after the killed job: %s\n", all == 0 ? "correct" : "WRONG");
  MPI_Finalize();
  return all == 0 ? 0 : 1;
}
