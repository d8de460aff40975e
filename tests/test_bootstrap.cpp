// comm::run_forked and comm::socket_bootstrap (include/cgx/comm/fork_group.hpp), the
// process group with no MPI that lets comm::cuda_ipc run where MPI is missing. One
// process, no MPI, no GPU: the test forks its ranks itself. For 1..4 ranks: allgather
// delivers every rank's blob to every rank in rank order (small, empty and 1 MiB blobs,
// through copies of the bootstrap), max_all and any_bootstrap work over it, no rank
// leaves a barrier before the last one entered it; a rank that exits early (rank 0, the
// hub, or another) makes every other rank throw errc::transport at once, one that hangs
// makes them throw within the timeout, unequal lengths make every rank throw; exit codes
// (returned, thrown, killed by the wait limit) reach the caller, the caller keeps no
// descriptor, and the ranks die with a supervisor that is killed. Rank bodies report through their exit code: a doctest check in a forked
// rank would be lost with the process.
#include <doctest/doctest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cgx/comm/bootstrap.hpp>
#include <cgx/comm/fork_group.hpp>
#include <cgx/error.hpp>

#include "bootstrap_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

using cgx::comm::fork_options;
using cgx::comm::run_forked;
using cgx::comm::socket_bootstrap;
using std::chrono::milliseconds;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using cgx_test::allgather_ok;
using cgx_test::pattern;

/// Open descriptors of this process.
int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d) != nullptr) ++n;
    ::closedir(d);
  }
  return n;
}

/// True when process `pid` is gone or a zombie.
bool dead(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;
  int id = 0;
  char state = '?';
  const int got = std::fscanf(f, "%d %*s %c", &id, &state);
  std::fclose(f);
  return got == 2 && (state == 'Z' || state == 'X');
}

/// Runs `fn(b)` in a rank: returns 0 when it threw cgx::error(errc::transport) within
/// `within`, 2 when it did not throw, 3 when it threw something else, 4 when too late.
template <class F>
int throws_transport(F&& fn, milliseconds within) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn();
  } catch (const cgx::error& e) {
    if (e.code() != cgx::errc::transport) return 3;
    return std::chrono::steady_clock::now() - t0 <= within ? 0 : 4;
  } catch (...) {
    return 3;
  }
  return 2;
}

}  // namespace

TEST_CASE("run_forked: allgather delivers every blob in rank order, at 1 to 4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    const int fds_before = open_fds();
    const auto res = run_forked(n, [](socket_bootstrap& b) {
      socket_bootstrap copy = b;  // copies share the channel
      int c = 0;
      for (std::size_t m : {std::size_t{13}, std::size_t{0}, std::size_t{1} << 20, std::size_t{1}, std::size_t{64}}) {
        if (!allgather_ok(c % 2 == 0 ? b : copy, m, c)) return 10 + c;
        ++c;
      }
      std::int64_t v[2] = {b.rank(), -b.rank()};
      cgx::comm::max_all(b, v);
      if (v[0] != b.size() - 1 || v[1] != 0) return 20;
      cgx::comm::any_bootstrap any(b);
      static_assert(cgx::comm::bootstrap<cgx::comm::any_bootstrap>);
      if (any.rank() != b.rank() || any.size() != b.size() || !any.same_node()) return 21;
      any.barrier();
      return 0;
    });
    REQUIRE(res.codes.size() == static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(res.codes[static_cast<std::size_t>(r)] == 0, "rank " << r);
    CHECK(res.code() == 0);
    CHECK(open_fds() == fds_before);
  }
}

TEST_CASE("run_forked: no rank leaves a barrier before the last one entered it") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const auto res = run_forked(n, [](socket_bootstrap& b) {
      for (int round = 0; round < 3; ++round) {
        // A different rank arrives last in each round.
        const int late = (b.size() - 1 + round) % b.size();
        if (b.rank() == late) std::this_thread::sleep_for(milliseconds(40));
        const std::int64_t in = now_ns();
        b.barrier();
        const std::int64_t out = now_ns();
        const auto p = static_cast<std::size_t>(b.size());
        std::vector<std::int64_t> ins(p), outs(p);
        b.allgather(std::as_bytes(std::span<const std::int64_t>(&in, 1)), std::as_writable_bytes(std::span(ins)));
        b.allgather(std::as_bytes(std::span<const std::int64_t>(&out, 1)), std::as_writable_bytes(std::span(outs)));
        std::int64_t last_in = ins[0], first_out = outs[0];
        for (std::size_t r = 0; r < p; ++r) {
          last_in = std::max(last_in, ins[r]);
          first_out = std::min(first_out, outs[r]);
        }
        if (first_out < last_in) return 30 + round;
      }
      return 0;
    });
    CHECK(res.code() == 0);
  }
}

TEST_CASE("run_forked: a rank that exits early makes the others throw errc::transport at once") {
  // The timeout is long: the others must notice the closed sockets, not time out.
  const fork_options opt{milliseconds(20000), milliseconds(0)};
  for (int n = 2; n <= 4; ++n)
    for (int quitter : {0, n - 1}) {
      CAPTURE(n);
      CAPTURE(quitter);
      const auto t0 = std::chrono::steady_clock::now();
      const auto res = run_forked(
          n,
          [quitter](socket_bootstrap& b) {
            b.barrier();  // everyone is up
            if (b.rank() == quitter) return 5;
            return throws_transport(
                [&] {
                  for (int i = 0; i < 100; ++i) b.barrier();
                },
                milliseconds(5000));
          },
          opt);
      for (int r = 0; r < n; ++r)
        CHECK_MESSAGE(res.codes[static_cast<std::size_t>(r)] == (r == quitter ? 5 : 0), "rank " << r);
      CHECK(res.code() == 5);
      CHECK(std::chrono::steady_clock::now() - t0 < milliseconds(10000));
    }
}

TEST_CASE("run_forked: a rank that hangs makes the others throw errc::transport within the timeout") {
  const fork_options opt{milliseconds(300), milliseconds(0)};
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const auto res = run_forked(
        n,
        [](socket_bootstrap& b) {
          b.barrier();
          if (b.rank() == 1) {  // silent, alive, past the others' timeout
            std::this_thread::sleep_for(milliseconds(1500));
            return 0;
          }
          const auto t0 = std::chrono::steady_clock::now();
          const int rc = throws_transport([&] { b.barrier(); }, milliseconds(1200));
          // Rank 0 waits out its timeout; the others learn from rank 0 right after.
          if (rc == 0 && std::chrono::steady_clock::now() - t0 < milliseconds(250)) return 6;
          return rc;
        },
        opt);
    CHECK(res.code() == 0);
  }
}

TEST_CASE("run_forked: unequal allgather lengths make every rank throw errc::transport") {
  const fork_options opt{milliseconds(20000), milliseconds(0)};
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    const auto res = run_forked(
        n,
        [](socket_bootstrap& b) {
          const std::size_t m = b.rank() == b.size() - 1 ? 8 : 4;
          std::vector<std::byte> mine(m), all(m * static_cast<std::size_t>(b.size()));
          const int rc = throws_transport([&] { b.allgather(mine, all); }, milliseconds(5000));
          if (rc != 0) return rc;
          // Later calls fail too.
          return throws_transport([&] { b.barrier(); }, milliseconds(100)) == 0 ? 0 : 7;
        },
        opt);
    CHECK(res.code() == 0);
  }
}

TEST_CASE("run_forked: exit codes reach the caller") {
  auto res = run_forked(4, [](socket_bootstrap& b) { return 10 + b.rank(); });
  CHECK(res.codes == std::vector<int>{10, 11, 12, 13});
  CHECK(res.code() == 10);

  res = run_forked(3, [](socket_bootstrap& b) -> int {
    if (b.rank() == 2) throw std::runtime_error("rank 2 fails on purpose (expected in this test)");
    return 0;
  });
  CHECK(res.codes == std::vector<int>{0, 0, 1});
  CHECK(res.code() == 1);

  res = run_forked(2, [](socket_bootstrap&) { return 77; });
  CHECK(res.code() == 77);
  res = run_forked(2, [](socket_bootstrap& b) { return b.rank() == 0 ? 77 : 0; });
  CHECK(res.code() == 77);
  res = run_forked(2, [](socket_bootstrap& b) { return b.rank() == 0 ? 77 : 3; });
  CHECK(res.code() == 3);

  // The wait limit kills a rank that runs too long: 128 + SIGKILL.
  const auto t0 = std::chrono::steady_clock::now();
  res = run_forked(
      2,
      [](socket_bootstrap& b) {
        if (b.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
        return 0;
      },
      fork_options{milliseconds(1000), milliseconds(300)});
  CHECK(res.codes == std::vector<int>{0, 128 + 9});
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));

  bool threw = false;
  try {
    (void)run_forked(0, [](socket_bootstrap&) { return 0; });
  } catch (const cgx::error& e) {
    threw = e.code() == cgx::errc::invalid_argument;
  }
  CHECK(threw);
}

#if defined(__linux__)
TEST_CASE("run_forked: the ranks die when the supervisor is killed") {
  int fds[2] = {-1, -1};
  REQUIRE(::pipe(fds) == 0);
  const pid_t supervisor = ::fork();
  REQUIRE(supervisor >= 0);
  if (supervisor == 0) {  // the supervisor: its ranks report their pids, then sleep
    (void)::close(fds[0]);
    const int out = fds[1];
    (void)run_forked(2, [out](socket_bootstrap&) {
      const pid_t me = ::getpid();
      if (::write(out, &me, sizeof me) != static_cast<ssize_t>(sizeof me)) return 1;
      std::this_thread::sleep_for(std::chrono::seconds(30));
      return 0;
    });
    ::_exit(0);
  }
  (void)::close(fds[1]);
  pid_t ranks[2] = {0, 0};
  std::size_t got = 0;
  while (got < sizeof ranks) {
    const ssize_t k = ::read(fds[0], reinterpret_cast<char*>(ranks) + got, sizeof ranks - got);
    if (k <= 0) break;
    got += static_cast<std::size_t>(k);
  }
  (void)::close(fds[0]);
  REQUIRE(got == sizeof ranks);
  (void)::kill(supervisor, SIGKILL);
  int st = 0;
  (void)::waitpid(supervisor, &st, 0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!(dead(ranks[0]) && dead(ranks[1])) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(10));
  CHECK(dead(ranks[0]));
  CHECK(dead(ranks[1]));
  // Whatever happened, leave nothing running.
  for (pid_t r : ranks)
    if (!dead(r)) (void)::kill(r, SIGKILL);
}
#endif
