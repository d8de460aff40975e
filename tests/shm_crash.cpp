// Helper of the shm_killed_job test (run it with 3 ranks).
//
//   shm_crash                          a real allreduce over comm::shm, checked
//   shm_crash --crash FILE             rank 0 writes its pid to FILE and is killed
//                                      (SIGKILL, no cleanup) while every rank holds a
//                                      mapped segment whose name is already unlinked
//   shm_crash --crash-in-constructor FILE
//                                      rank 0 is killed inside comm::shm's constructor,
//                                      after it created the segment and before it could
//                                      unlink the name: rank 1 kills it at the moment it
//                                      would open the segment (this program's shm_open
//                                      stands in for the C library's), and writes the
//                                      segment's name to FILE first
//   shm_crash --peer-dies FILE         rank 2 is killed just before an allreduce over
//                                      shm; ranks 0 and 1, waiting for it inside the
//                                      transport, must throw cgx::error(errc::transport)
//                                      naming it: each writes what it caught to FILE.<rank>
//                                      and exits 0 without MPI_Finalize (run it with a
//                                      launcher that lets survivors run: Open MPI's
//                                      --enable-recovery; MPICH's -disable-auto-cleanup
//                                      with each rank started through
//                                      hydra_keep_survivors.sh)
//   shm_crash --peer-dies-late FILE    the same, but rank 1 makes its call 500 ms late:
//                                      rank 0 has found rank 2 dead and reported it by
//                                      then, so rank 1 hears of the death before it can
//                                      see it, and must throw the same error (the order
//                                      that a loaded machine produces now and then)
//
// In the crash modes the launcher tears the job down; the script then checks what was
// left in /dev/shm. Plans run their schedule at every size (no native fallback), so the
// bytes go through the shared-memory rings.
#include <cgx/cgx.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {
bool kill_in_constructor = false;  // armed on rank 1 just before comm::shm is made
int rank0_pid = 0;
const char* out_file = nullptr;

void write_file(const std::string& s) {
  if (FILE* f = std::fopen(out_file, "w")) {
    std::fputs(s.c_str(), f);
    std::fclose(f);
  }
}
}  // namespace

// Every shm_open of this process, cgx's included, comes here first.
extern "C" int shm_open(const char* name, int oflag, mode_t mode) {
  using real_fn = int (*)(const char*, int, mode_t);
  static const auto real = reinterpret_cast<real_fn>(dlsym(RTLD_NEXT, "shm_open"));
  if (kill_in_constructor && (oflag & O_CREAT) == 0) {
    // Rank 0 created `name` and waits in the constructor for the others to map it; it
    // has not unlinked the name (it does so only once every rank has mapped it).
    write_file(name[0] == '/' ? name + 1 : name);
    kill(rank0_pid, SIGKILL);
    for (;;) pause();  // the launcher tears the job down
  }
  return real(name, oflag, mode);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const bool crash = argc > 2 && std::strcmp(argv[1], "--crash") == 0;
  const bool crash_in_ctor = argc > 2 && std::strcmp(argv[1], "--crash-in-constructor") == 0;
  const bool late = argc > 2 && std::strcmp(argv[1], "--peer-dies-late") == 0;
  const bool peer_dies = argc > 2 && (std::strcmp(argv[1], "--peer-dies") == 0 || late);
  if (crash || crash_in_ctor || peer_dies) out_file = argv[2];
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  rank0_pid = static_cast<int>(getpid());
  MPI_Bcast(&rank0_pid, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (crash_in_ctor && rank == 1) kill_in_constructor = true;
  int bad = 0;
  {
    using Q = cgx::quant::maxmin<8, 1024, cgx::quant::nearest>;
    cgx::plan_options opts;
    opts.native_below_bytes = 0;
    opts.check = cgx::checking::local;
    cgx::allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, cgx::comm::shm> plan{
        cgx::comm::shm{MPI_COMM_WORLD}, 10000, opts};
    if (crash_in_ctor) {
      if (rank == 0) std::fprintf(stderr, "shm_crash: rank 0 survived its constructor: the hook did not run\n");
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    if (crash) {
      if (rank == 0) write_file(std::to_string(getpid()));
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 0) std::raise(SIGKILL);
      MPI_Barrier(MPI_COMM_WORLD);  // never completes: the launcher tears the job down
    }
    std::vector<float> v(10000, 1.0f + static_cast<float>(rank));
    if (peer_dies) {
      std::signal(SIGUSR1, SIG_IGN);  // MPICH's launcher tells survivors of a failure with SIGUSR1
      MPI_Barrier(MPI_COMM_WORLD);
      if (rank == 2) std::raise(SIGKILL);
      if (late && rank == 1) usleep(500000);
      std::string caught = "nothing";
      try {
        plan(v.data(), v.size());
      } catch (const cgx::error& e) {
        caught = std::string(e.code() == cgx::errc::transport ? "transport: " : "other: ") + e.what();
      }
      out_file = nullptr;
      const std::string mine = std::string(argv[2]) + "." + std::to_string(rank);
      out_file = mine.c_str();
      write_file(caught + "\n");
      // Exit only when the other survivor has caught too: it may still wait for this rank.
      const std::string other = std::string(argv[2]) + "." + std::to_string(1 - rank);
      for (int i = 0; i < 1000 && access(other.c_str(), F_OK) != 0; ++i) usleep(10000);
      std::fflush(nullptr);
      _exit(0);
    }
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
