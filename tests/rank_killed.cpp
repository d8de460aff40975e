// Issue 18: a rank killed in the middle of a collective call. The survivors must each throw
// a cgx::error naming what they waited for, within the wait limit plus slack, instead of
// waiting forever. Run with 3 or more ranks under a launcher that lets the survivors live
// on; the ctest rank_killed does so with Open MPI (mpirun --enable-recovery) and with
// MPICH (mpiexec.mpich -disable-auto-cleanup, each rank started through
// tests/hydra_keep_survivors.sh, which says why), and wants both survivors' PASS.
//
// Rank 1 is killed (SIGKILL, no cleanup, as by the OOM killer) at the moment its first
// message of the call has arrived, through the receive hook of plan_options::verify. With
// the argument `construction` (issue 47) it is killed before the plan is built instead: the
// survivors' construction (comm::mpi's MPI_Comm_idup, bounded) must throw errc::timeout.
// Prints "PASS rank R" per survivor, or "FAIL rank R: why"; exits 0 / 1.
#include <cgx/cgx.hpp>

#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {
void kill_self(int, void*, std::size_t) { std::raise(SIGKILL); }
}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int r = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  if (p < 3) {
    if (r == 0) std::printf("FAIL rank 0: run with 3 or more ranks\n");
    MPI_Finalize();
    return 1;
  }
  cgx::plan_options o;
  o.verify = true;          // for the hook that kills rank 1
  o.timeout_ms = 3000;      // the survivors' bound
  o.check = cgx::checking::local;
  o.native_below_bytes = 0;
  const std::size_t n = std::size_t{1} << 20;
  using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
  using P = cgx::allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, cgx::comm::mpi>;
  const bool at_construction = argc > 1 && std::string(argv[1]) == "construction";
  std::unique_ptr<P> plan;
  if (!at_construction) plan = std::make_unique<P>(cgx::comm::mpi{MPI_COMM_WORLD}, n, o);
  std::vector<float> v(n, 1.0f);
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 1) {
    if (at_construction) std::raise(SIGKILL);
    cgx::comm::detail::received_payload_hook = &kill_self;
  }
  const double t0 = MPI_Wtime();
  std::string fail;
  try {
    if (at_construction) {
      P built(cgx::comm::mpi(MPI_COMM_WORLD, cgx::comm::wait_limit(o.timeout_ms)), n, o);
      fail = "the plan was built although rank 1 died before its construction";
    } else {
      (*plan)(v.data(), n);
      fail = "the call returned although rank 1 died inside it";
    }
  } catch (const cgx::error& e) {
    const double waited = MPI_Wtime() - t0;
    const std::string what = e.what();
    std::printf("rank %d: after %.2f s: %s\n", r, waited, e.what());
    if (e.code() != cgx::errc::timeout && e.code() != cgx::errc::peer_failed && e.code() != cgx::errc::transport)
      fail = "unexpected error code " + std::to_string(static_cast<int>(e.code()));
    else if (waited > 20.0)
      fail = "gave up only after " + std::to_string(waited) + " s";
    else if (e.code() == cgx::errc::timeout && what.find("rank") == std::string::npos)
      fail = "the timeout does not name the ranks waited for";
  }
  if (fail.empty())
    std::printf("PASS rank %d\n", r);
  else
    std::printf("FAIL rank %d: %s\n", r, fail.c_str());
  std::fflush(stdout);
  // MPI_Finalize would wait for the dead rank; the plan (its failed transport) is left.
  std::_Exit(fail.empty() ? 0 : 1);
}
