// comm::store_bootstrap over comm::file_store (include/cgx/comm/store_bootstrap.hpp): the
// set-up of the device transports in jobs without MPI (torchrun's Store; cgx_torch adapts
// c10d::Store to the same concept, tested under torchrun in python/tests). One process,
// no MPI: the ranks are forked by comm::run_forked and meet in a temporary directory,
// their socket_bootstrap used only to line them up. Rank bodies report through their exit
// code (a doctest check in a forked rank would be lost with the process).
//
// Checked: file_store's set / try_get / add (atomic across 4 processes); allgather in rank
// order at 1-4 ranks over several steps, barrier, same_node, behind any_bootstrap; a rank
// that never joins: errc::timeout on the others within the limit, naming it, and then on
// the late rank at once; a rank that skips one step; unequal lengths: errc::transport on
// every rank; the all-or-nothing outcome when the last rank arrives right at the limit
// (many trials: every rank succeeds or every rank fails, never a mix), and a give-up
// that reaches the store right after the last arrival (succeeds with it).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cgx/comm/bootstrap.hpp>
#include <cgx/comm/fork_group.hpp>
#include <cgx/comm/store_bootstrap.hpp>
#include <cgx/error.hpp>

#include "bootstrap_util.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using cgx::comm::file_store;
using cgx::comm::run_forked;
using cgx::comm::socket_bootstrap;
using cgx::comm::store_bootstrap;
using std::chrono::milliseconds;

static_assert(cgx::comm::kv_store<file_store>);
static_assert(cgx::comm::bootstrap<store_bootstrap<file_store>>);

/// A fresh directory, removed with its files at the end of the scope.
struct temp_dir {
  std::string path;
  temp_dir() {
    char t[] = "/tmp/cgx_store_XXXXXX";
    REQUIRE(::mkdtemp(t) != nullptr);
    path = t;
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

using cgx_test::allgather_ok;
using cgx_test::pattern;

/// 0 when fn threw cgx::error(code) within `within` and its message holds `says`; 2: no
/// throw, 3: another error, 4: too late, 5: the message lacks `says`.
template <class F>
int throws_code(F&& fn, cgx::errc code, milliseconds within, const std::string& says = "") {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn();
  } catch (const cgx::error& e) {
    if (e.code() != code) return 3;
    if (std::chrono::steady_clock::now() - t0 > within) return 4;
    return std::string(e.what()).find(says) == std::string::npos ? 5 : 0;
  } catch (...) {
    return 3;
  }
  return 2;
}

}  // namespace

TEST_CASE("file_store: set, try_get and add, with keys a file name cannot hold") {
  temp_dir d;
  file_store s(d.path);
  CHECK_FALSE(s.try_get("a/b c").has_value());
  const std::vector<std::byte> v = {std::byte{1}, std::byte{0}, std::byte{255}};
  s.set("a/b c", v);
  REQUIRE(s.try_get("a/b c").has_value());
  CHECK(*s.try_get("a/b c") == v);
  CHECK_FALSE(s.try_get("a_b c").has_value());  // '/' is not '_'
  s.set("a/b c", {});
  CHECK(s.try_get("a/b c")->empty());
  CHECK(s.add("n", 5) == 5);
  CHECK(s.add("n", -2) == 3);
  CHECK(s.add("n", 0) == 3);
  CHECK(s.add("other", 0) == 0);
  CHECK_THROWS_AS(file_store(""), cgx::error);
  CHECK(cgx::comm::file_store(d.path + "/sub").dir() == d.path + "/sub");  // created
  const std::string plain = d.path + "/plain";
  { std::FILE* f = std::fopen(plain.c_str(), "w"); REQUIRE(f != nullptr); std::fclose(f); }
  CHECK_THROWS_AS(file_store{plain}, cgx::error);
}

TEST_CASE("file_store: add is atomic across processes") {
  temp_dir d;
  const auto res = run_forked(4, [&](socket_bootstrap&) {
    file_store s(d.path);
    for (int i = 0; i < 500; ++i) (void)s.add("counter", 1);
    return 0;
  });
  CHECK(res.code() == 0);
  CHECK(file_store(d.path).add("counter", 0) == 2000);
}

TEST_CASE("store_bootstrap: allgather in rank order, barrier and same_node, at 1 to 4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    temp_dir d;
    const auto res = run_forked(n, [&](socket_bootstrap& sb) {
      store_bootstrap<file_store> b(file_store(d.path), sb.rank(), sb.size(), "job", milliseconds(20000));
      if (b.rank() != sb.rank() || b.size() != n) return 10;
      for (int c = 0; c < 4; ++c)
        if (!allgather_ok(b, static_cast<std::size_t>(1 + 50 * c), c)) return 11;
      if (!allgather_ok(b, 0, 9) || !allgather_ok(b, 128, 7)) return 12;  // empty; an NCCL id's size
      b.barrier();
      if (!b.same_node()) return 13;
      // behind any_bootstrap (what comm::nccl and comm::cuda_ipc hold), and max_all over it
      cgx::comm::any_bootstrap a(std::move(b));
      if (!allgather_ok(a, 64, 5)) return 14;
      std::int64_t v[2] = {sb.rank(), -sb.rank()};
      cgx::comm::max_all(a, std::span<std::int64_t>(v));
      return v[0] == n - 1 && v[1] == 0 ? 0 : 15;
    });
    CHECK(res.code() == 0);
  }
}

TEST_CASE("store_bootstrap: two bootstraps on one store with distinct prefixes do not mix") {
  temp_dir d;
  const auto res = run_forked(3, [&](socket_bootstrap& sb) {
    store_bootstrap<file_store> x(file_store(d.path), sb.rank(), sb.size(), "x", milliseconds(20000));
    store_bootstrap<file_store> y(file_store(d.path), sb.rank(), sb.size(), "y", milliseconds(20000));
    if (!allgather_ok(x, 16, 1) || !allgather_ok(y, 16, 2) || !allgather_ok(x, 8, 3)) return 1;
    return 0;
  });
  CHECK(res.code() == 0);
}

TEST_CASE("store_bootstrap: a rank late for the construction: errc::timeout on the others naming it, then on it") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    temp_dir d;
    const auto limit = milliseconds(400);
    const auto res = run_forked(n, [&](socket_bootstrap& sb) {
      const int last = sb.size() - 1;
      auto build = [&] { store_bootstrap<file_store> b(file_store(d.path), sb.rank(), sb.size(), "late", limit); };
      if (sb.rank() != last) {
        const int rc = throws_code(build, cgx::errc::timeout, milliseconds(5000),
                                   "rank(s) " + std::to_string(last) + " to join");
        sb.barrier();  // now the late rank comes
        return rc;
      }
      sb.barrier();
      // The others gave up: the late rank fails at once, never succeeds alone.
      return throws_code(build, cgx::errc::timeout, milliseconds(300), "before this rank arrived");
    });
    CHECK(res.code() == 0);
  }
}

TEST_CASE("store_bootstrap: a rank that skips a step, and unequal lengths, fail on every rank") {
  temp_dir d;
  const auto res = run_forked(3, [&](socket_bootstrap& sb) {
    store_bootstrap<file_store> b(file_store(d.path), sb.rank(), sb.size(), "skip", milliseconds(300));
    // Unequal lengths: every rank sees every blob, so every rank throws errc::transport.
    const std::size_t m = sb.rank() == 1 ? 8 : 4;
    std::vector<std::byte> mine(m), all(3 * m);
    const int rc = throws_code([&] { b.allgather(mine, all); }, cgx::errc::transport, milliseconds(5000),
                               "one length on every rank");
    if (rc != 0) return 20 + rc;
    // Rank 2 skips a barrier: the others time out, naming it.
    if (sb.rank() != 2) {
      const int r2 = throws_code([&] { b.barrier(); }, cgx::errc::timeout, milliseconds(5000), "rank(s) 2");
      if (r2 != 0) return 30 + r2;
    }
    sb.barrier();
    return 0;
  });
  CHECK(res.code() == 0);
}

TEST_CASE("store_bootstrap: arriving right at the limit, every rank succeeds or every rank fails") {
  // The last rank arrives near the others' limit (before, at, or after it): whatever the
  // timing, the step's outcome is one for all. Each trial reports 1 for success, 2 for
  // errc::timeout; the exit code is 1 or 2 on every rank, or 9 for anything else.
  temp_dir d;
  int successes = 0, failures = 0;
  for (int trial = 0; trial < 24; ++trial) {
    CAPTURE(trial);
    const auto limit = milliseconds(60);
    const auto delay = std::chrono::microseconds(45000 + 1250 * trial);  // 45 .. 74 ms
    const std::string prefix = "race" + std::to_string(trial);
    const auto res = run_forked(3, [&](socket_bootstrap& sb) {
      sb.barrier();
      if (sb.rank() == 2) std::this_thread::sleep_for(delay);
      try {
        store_bootstrap<file_store> b(file_store(d.path), sb.rank(), sb.size(), prefix, limit);
        return 1;
      } catch (const cgx::error& e) {
        return e.code() == cgx::errc::timeout ? 2 : 9;
      } catch (...) {
        return 9;
      }
    });
    REQUIRE(res.codes.size() == 3);
    CHECK(res.codes[0] == res.codes[1]);
    CHECK(res.codes[1] == res.codes[2]);
    CHECK(res.codes[0] != 9);
    (res.codes[0] == 1 ? successes : failures) += 1;
  }
  MESSAGE("arrivals near the limit: " << successes << " trials succeeded on every rank, " << failures
                                      << " failed on every rank");
}

namespace {
/// A file_store whose add(key, d) with a large d (a rank giving up) first runs a hook:
/// it lets a test put another rank's arrival right before a give-up.
struct hooked_store {
  file_store s;
  std::shared_ptr<std::function<void()>> before_give_up;
  void set(const std::string& k, std::span<const std::byte> v) { s.set(k, v); }
  std::optional<std::vector<std::byte>> try_get(const std::string& k) { return s.try_get(k); }
  std::int64_t add(const std::string& k, std::int64_t d) {
    if (d > 1 && *before_give_up) std::exchange(*before_give_up, nullptr)();
    return s.add(k, d);
  }
};
}  // namespace

TEST_CASE("store_bootstrap: a give-up right after the last arrival succeeds with it (the last arrival decides)") {
  // Rank 0 waits 50 ms for rank 1 and gives up; just before its give-up reaches the
  // store, rank 1 arrives (in a thread), sees every rank there and no give-up, and
  // succeeds. Rank 0 must then succeed too, not fail alone.
  temp_dir d;
  std::optional<std::string> rank1_error;
  auto hook = std::make_shared<std::function<void()>>([&] {
    std::thread t([&] {
      try {
        store_bootstrap<file_store> b1(file_store(d.path), 1, 2, "edge", milliseconds(5000));
      } catch (const std::exception& e) {
        rank1_error = e.what();
      }
    });
    t.join();
  });
  std::optional<std::string> rank0_error;
  try {
    store_bootstrap<hooked_store> b0(hooked_store{file_store(d.path), hook}, 0, 2, "edge", milliseconds(50));
  } catch (const std::exception& e) {
    rank0_error = e.what();
  }
  CHECK_FALSE(*hook);  // the hook ran: rank 0 did give up
  CHECK_FALSE(rank1_error.has_value());
  CHECK_FALSE(rank0_error.has_value());
  if (rank0_error) MESSAGE(*rank0_error);
}

TEST_CASE("store_bootstrap: bad arguments are errc::invalid_argument") {
  temp_dir d;
  auto code = [&](int rank, int size, std::string prefix) {
    try {
      store_bootstrap<file_store> b(file_store(d.path), rank, size, std::move(prefix), milliseconds(100));
    } catch (const cgx::error& e) {
      return static_cast<int>(e.code());
    }
    return -1;
  };
  CHECK(code(1, 1, "p") == static_cast<int>(cgx::errc::invalid_argument));
  CHECK(code(-1, 2, "p") == static_cast<int>(cgx::errc::invalid_argument));
  CHECK(code(0, 0, "p") == static_cast<int>(cgx::errc::invalid_argument));
  CHECK(code(0, 1, "") == static_cast<int>(cgx::errc::invalid_argument));
  store_bootstrap<file_store> one(file_store(d.path), 0, 1, "one", milliseconds(100));
  std::vector<std::byte> mine(4), wrong(3);
  CHECK_THROWS_AS(one.allgather(mine, wrong), cgx::error);
  std::vector<std::byte> all(4);
  one.allgather(mine, all);  // a single rank: its own blob
  CHECK(all == mine);
}
