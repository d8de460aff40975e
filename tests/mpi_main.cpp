// The main of every MPI test: doctest runs on every rank; rank 0 prints its report,
// then the report of every other rank that had failures; the exit code is non-zero
// if any rank failed (MPI_MAX over ranks).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  // SERIALIZED: plans' start()/wait() run MPI on a background thread. (The main of
  // tests whose threads call MPI at once is built with CGX_TEST_THREAD_MULTIPLE.)
  int provided = 0;
#ifdef CGX_TEST_THREAD_MULTIPLE
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
#else
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
#endif
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  std::ostringstream out;
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  ctx.setOption("no-colors", true);
  ctx.setCout(&out);
  int failed = ctx.run();
  if (ctx.shouldExit()) {
    if (rank == 0) std::fputs(out.str().c_str(), stdout);
    MPI_Finalize();
    return failed;
  }
  int my_fail = failed != 0 ? 1 : 0;
  int any_fail = 0;
  MPI_Allreduce(&my_fail, &any_fail, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);

  // Collect the reports of failing ranks on rank 0, in rank order.
  std::string mine = out.str();
  if (rank == 0) {
    std::printf("[rank 0 of %d]\n%s", size, mine.c_str());
    for (int r = 1; r < size; ++r) {
      int len = 0;
      MPI_Recv(&len, 1, MPI_INT, r, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (len > 0) {
        std::vector<char> buf(static_cast<std::size_t>(len));
        MPI_Recv(buf.data(), len, MPI_CHAR, r, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        std::printf("[rank %d of %d: failures]\n%.*s", r, size, len, buf.data());
      }
    }
    std::printf("ranks with failures: %s\n", any_fail ? "yes" : "none");
    std::fflush(stdout);
  } else {
    int len = my_fail ? static_cast<int>(mine.size()) : 0;
    MPI_Send(&len, 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
    if (len > 0) MPI_Send(mine.data(), len, MPI_CHAR, 0, 2, MPI_COMM_WORLD);
  }
  MPI_Finalize();
  return any_fail;
}
