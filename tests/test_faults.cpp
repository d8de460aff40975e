// Issue 18, items 1 and 2: a failure inside a collective call reaches every rank as a
// cgx::error, nothing hangs, and the plan is unusable afterwards; the in-band headers
// catch ranks that disagree (count, plan) whatever the checking level. Runs under Open MPI
// and MPICH (scripts/test stages 1 and 4).
#include <doctest/doctest.h>

#include <cgx/cgx.hpp>

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_util.hpp"

namespace {
using SRA = cgx::comm::scatter_reduce_allgather;
using Ring = cgx::comm::ring;
using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;

// -1 for "no error", else the errc as an int; gathered so every rank sees every code.
std::vector<int> gather_codes(const std::optional<cgx::errc>& c) {
  const int mine = c ? static_cast<int>(*c) : -1;
  std::vector<int> all(static_cast<std::size_t>(cgx_test::world_size()));
  MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  return all;
}

cgx::plan_options local_checks(std::uint32_t timeout_ms = 0) {
  cgx::plan_options o = cgx_test::schedule_always();
  o.check = cgx::checking::local;  // the release default: no collective comparison
  o.timeout_ms = timeout_ms;
  return o;
}

// One rank passes a smaller count with local checking. The ranks that receive a message
// of the wrong length throw errc::mismatch, the others hear of it (errc::peer_failed) or
// finished before it; no rank hangs, and every rank's next call throws.
// Over comm::shm under MPI_THREAD_SERIALIZED (this test's level) a waiting rank cannot
// listen for reports (see shm.hpp), so a rank waiting for one that gave up is ended by the
// wait limit: errc::timeout is then an expected outcome too.
// The last rank passes `short_n` instead of n.
template <class R, class X>
void mismatched_counts(X x, std::uint32_t timeout_ms = 0, std::size_t n = 50000, std::size_t short_n = 49000) {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  cgx::allreduce_plan<float, Q4, R, X> plan{std::move(x), n, local_checks(timeout_ms)};
  auto v = cgx_test::inputs<float>(r, n);
  const auto code = cgx_test::error_code_of([&] { plan(v.data(), r == p - 1 ? short_n : n); });
  const auto codes = gather_codes(code);
  int mismatches = 0;
  for (int c : codes) {
    CHECK((c == -1 || c == static_cast<int>(cgx::errc::mismatch) || c == static_cast<int>(cgx::errc::peer_failed) ||
           (timeout_ms > 0 && c == static_cast<int>(cgx::errc::timeout))));
    if (c == static_cast<int>(cgx::errc::mismatch)) ++mismatches;
  }
  CHECK(mismatches >= 1);
  // The plan is failed on every rank: the next call throws (at once, or when it hears the
  // report it has not heard yet), and does not hang.
  const auto next = cgx_test::error_code_of([&] { plan(v.data(), n); });
  CHECK(next.has_value());
  MPI_Barrier(MPI_COMM_WORLD);
}

// The last rank never calls: every other rank throws errc::timeout within the limit (the
// first to give up names the rank it waited for and tells the others).
template <class X>
void absent_rank(X x) {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  const std::size_t n = 20000;
  cgx::allreduce_plan<float, Q4, SRA, X> plan{std::move(x), n, local_checks(1500)};
  auto v = cgx_test::inputs<float>(r, n);
  std::optional<cgx::errc> code;
  std::string what;
  const double t0 = MPI_Wtime();
  if (r != p - 1) {
    try {
      plan(v.data(), n);
    } catch (const cgx::error& e) {
      code = e.code();
      what = e.what();
    }
  }
  const double waited = MPI_Wtime() - t0;
  const auto codes = gather_codes(code);
  for (int q = 0; q + 1 < p; ++q) CHECK(codes[static_cast<std::size_t>(q)] == static_cast<int>(cgx::errc::timeout));
  if (r != p - 1) {
    CHECK(waited < 30.0);
    INFO(what);
    CHECK(what.find("rank") != std::string::npos);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
}  // namespace

TEST_CASE("mismatched counts under local checking (comm::mpi, SRA): an error on every rank, no abort, no hang") {
  if (cgx_test::world_size() < 2) return;
  const std::size_t p = static_cast<std::size_t>(cgx_test::world_size());
  // comm::mpi sends a payload of at most inline_bytes in one message with its header,
  // a larger one as a message of its own after the header: chunks of both kinds, and
  // ranks that disagree on the kind.
  static_assert(cgx::comm::mpi::inline_bytes == 16384, "the counts below assume 16 KiB");
  SUBCASE("inline messages (50000 values)") { mismatched_counts<SRA>(cgx::comm::mpi{MPI_COMM_WORLD}); }
  SUBCASE("header, then payload (400000 values per rank)") {
    mismatched_counts<SRA>(cgx::comm::mpi{MPI_COMM_WORLD}, 0, 400000 * p, 400000 * p - 1000);
  }
  SUBCASE("one rank inline, the others not") {
    mismatched_counts<SRA>(cgx::comm::mpi{MPI_COMM_WORLD}, 0, 50000 * p, 50000 * p / 3);
  }
}

TEST_CASE("mismatched counts under local checking (comm::mpi, ring): an error on every rank, no hang") {
  if (cgx_test::world_size() < 2) return;
  mismatched_counts<Ring>(cgx::comm::mpi{MPI_COMM_WORLD});
}

TEST_CASE("mismatched counts under local checking (comm::shm): errc::mismatch from the headers, no garbage, no hang") {
  if (cgx_test::world_size() < 2) return;
  mismatched_counts<SRA>(cgx::comm::shm{MPI_COMM_WORLD}, 3000);
}

// Ranks whose plans differ (quantizer width) with the same count and local checking: the
// payloads may even have equal lengths; the headers' signatures differ.
template <class X>
void mismatched_plans(X x, std::uint32_t timeout_ms = 0) {
  const int r = cgx_test::world_rank();
  const std::size_t n = 40000;
  auto v = cgx_test::inputs<float>(r, n);
  const auto before = v;
  std::optional<cgx::errc> code;
  if (r == 0) {
    cgx::allreduce_plan<float, cgx::quant::maxmin<8, 1024, cgx::quant::stochastic>, SRA, X> plan{std::move(x), n,
                                                                                               local_checks(timeout_ms)};
    code = cgx_test::error_code_of([&] { plan(v.data(), n); });
  } else {
    cgx::allreduce_plan<float, Q4, SRA, X> plan{std::move(x), n, local_checks(timeout_ms)};
    code = cgx_test::error_code_of([&] { plan(v.data(), n); });
  }
  const auto codes = gather_codes(code);
  int mismatches = 0;
  for (int c : codes) {
    CHECK((c == static_cast<int>(cgx::errc::mismatch) || c == static_cast<int>(cgx::errc::peer_failed) ||
           (timeout_ms > 0 && c == static_cast<int>(cgx::errc::timeout))));
    if (c == static_cast<int>(cgx::errc::mismatch)) ++mismatches;
  }
  CHECK(mismatches >= 1);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("plans of different quantizers under local checking: errc::mismatch, not wrong values") {
  if (cgx_test::world_size() < 2) return;
  SUBCASE("comm::mpi") { mismatched_plans(cgx::comm::mpi{MPI_COMM_WORLD}); }
  SUBCASE("comm::shm") { mismatched_plans(cgx::comm::shm{MPI_COMM_WORLD}, 3000); }
}

TEST_CASE("a rank that never calls (comm::mpi): the others throw errc::timeout") {
  if (cgx_test::world_size() < 2) return;
  absent_rank(cgx::comm::mpi{MPI_COMM_WORLD});
}

TEST_CASE("a rank that never calls (comm::shm): the others throw errc::timeout") {
  if (cgx_test::world_size() < 2) return;
  absent_rank(cgx::comm::shm{MPI_COMM_WORLD});
}

TEST_CASE("a failed plan reports the failure at every later call; a new plan works") {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  if (p < 2) return;
  const std::size_t n = 30000;
  auto v = cgx_test::inputs<float>(r, n);
  {
    cgx::allreduce_plan<float, Q4, SRA, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD}, n, local_checks()};
    (void)cgx_test::error_code_of([&] { plan(v.data(), r == 0 ? n / 2 : n); });
    MPI_Barrier(MPI_COMM_WORLD);  // every report has been sent
    for (int k = 0; k < 2; ++k) CHECK(cgx_test::error_code_of([&] { plan(v.data(), n); }).has_value());
    MPI_Barrier(MPI_COMM_WORLD);
  }
  // A new plan over the same MPI communicator is unaffected by the old one's reports.
  cgx::allreduce_plan<double, cgx::quant::none, SRA, cgx::comm::mpi> fresh{cgx::comm::mpi{MPI_COMM_WORLD}, n,
                                                                          local_checks()};
  auto w = cgx_test::integer_inputs<double>(r, n);
  const auto want = cgx_test::mpi_sum(w);
  fresh(w.data(), n);
  CHECK(w == want);
}

// ---- Item 4: the optional wire integrity check (plan_options::verify) --------------

namespace {
std::atomic<int> flips_left{0};
std::atomic<int> payloads_to_skip{0};

// What a faulty link or memory does: one bit of one received payload flips (after
// payloads_to_skip intact ones).
void flip_one_bit(int /*peer*/, void* data, std::size_t bytes) {
  if (bytes == 0 || payloads_to_skip.fetch_sub(1) > 0) return;
  if (flips_left.fetch_sub(1) <= 0) return;
  static_cast<unsigned char*>(data)[bytes / 2] ^= 0x10;
  // Late, as a slow rank would be: its peers may finish their part of the call first.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
}

cgx::plan_options verified(std::uint32_t timeout_ms = 0) {
  cgx::plan_options o = local_checks(timeout_ms);
  o.verify = true;
  return o;
}

// Rank 0's first received payload has a flipped bit: it throws errc::corrupt, and so does
// every other rank (each waits for rank 0's part of the allgather and hears its report),
// instead of decoding wrong values. Over comm::shm under MPI_THREAD_SERIALIZED a waiting
// rank hears reports only through its wait limit (see shm.hpp): errc::timeout there.
template <class R, class X>
void corrupt_wire(X x, bool listens, std::size_t n = 60000) {
  const int r = cgx_test::world_rank();
  cgx::allreduce_plan<float, Q4, R, X> plan{std::move(x), n, verified(listens ? 0 : 3000)};
  auto v = cgx_test::inputs<float>(r, n);
  if (r == 0) {
    flips_left = 1;
    payloads_to_skip = 0;
    cgx::comm::detail::received_payload_hook = &flip_one_bit;
  }
  std::string what;
  std::optional<cgx::errc> code;
  try {
    plan(v.data(), n);
  } catch (const cgx::error& e) {
    code = e.code();
    what = e.what();
  }
  cgx::comm::detail::received_payload_hook = nullptr;
  const auto codes = gather_codes(code);
  CHECK(codes[0] == static_cast<int>(cgx::errc::corrupt));
  if (r == 0) {
    INFO(what);
    CHECK(what.find("CRC-32C") != std::string::npos);
  }
  for (std::size_t q = 1; q < codes.size(); ++q)
    CHECK((codes[q] == static_cast<int>(cgx::errc::corrupt) ||
           (!listens && codes[q] == static_cast<int>(cgx::errc::timeout))));
  MPI_Barrier(MPI_COMM_WORLD);
}

// verify changes nothing but the headers: the same bits as without it.
template <class R, class X, class MakeX>
void verified_same_bits(MakeX make) {
  const int r = cgx_test::world_rank();
  const std::size_t n = 70001;
  std::vector<float> plain = cgx_test::inputs<float>(r, n), checked = plain;
  cgx::allreduce_plan<float, Q4, R, X> a{make(), n, local_checks()};
  cgx::allreduce_plan<float, Q4, R, X> b{make(), n, verified()};
  for (int call = 0; call < 2; ++call) {
    a(plain.data(), n);
    b(checked.data(), n);
  }
  CHECK(std::memcmp(plain.data(), checked.data(), n * sizeof(float)) == 0);
}
}  // namespace

TEST_CASE("verify: a bit flipped on the wire throws errc::corrupt on every rank (comm::mpi, SRA and ring)") {
  if (cgx_test::world_size() < 2) return;
  SUBCASE("SRA") { corrupt_wire<SRA>(cgx::comm::mpi{MPI_COMM_WORLD}, true); }
  SUBCASE("ring") { corrupt_wire<Ring>(cgx::comm::mpi{MPI_COMM_WORLD}, true); }
  SUBCASE("SRA, payloads above inline_bytes (a message after their header)") {
    corrupt_wire<SRA>(cgx::comm::mpi{MPI_COMM_WORLD}, true, 400000 * static_cast<std::size_t>(cgx_test::world_size()));
  }
}

TEST_CASE("verify: a bit flipped in the ring throws errc::corrupt (comm::shm)") {
  if (cgx_test::world_size() < 2) return;
  corrupt_wire<SRA>(cgx::comm::shm{MPI_COMM_WORLD}, false);
}

TEST_CASE("verify: the same bits as without it (comm::mpi, comm::shm, hierarchical)") {
  SUBCASE("comm::mpi, SRA") { verified_same_bits<SRA, cgx::comm::mpi>([] { return cgx::comm::mpi{MPI_COMM_WORLD}; }); }
  SUBCASE("comm::shm, ring") { verified_same_bits<Ring, cgx::comm::shm>([] { return cgx::comm::shm{MPI_COMM_WORLD}; }); }
  SUBCASE("comm::mpi, hierarchical over 2 emulated nodes") {
    using H = cgx::comm::hierarchical<cgx::comm::uncompressed, SRA>;
    verified_same_bits<H, cgx::comm::mpi>(
        [] { return cgx::comm::mpi{MPI_COMM_WORLD, cgx::comm::mpi::nodes{cgx_test::world_rank() % 2}}; });
  }
}

TEST_CASE("verify set on some ranks only: errc::mismatch, not a silent unchecked call") {
  const int r = cgx_test::world_rank();
  if (cgx_test::world_size() < 2) return;
  const std::size_t n = 30000;
  auto v = cgx_test::inputs<float>(r, n);
  cgx::allreduce_plan<float, Q4, SRA, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD}, n,
                                                           r == 0 ? verified() : local_checks()};
  const auto codes = gather_codes(cgx_test::error_code_of([&] { plan(v.data(), n); }));
  int mismatches = 0;
  for (int c : codes) {
    CHECK((c == static_cast<int>(cgx::errc::mismatch) || c == static_cast<int>(cgx::errc::peer_failed)));
    mismatches += c == static_cast<int>(cgx::errc::mismatch);
  }
  CHECK(mismatches >= 1);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Rank 0's *last* message of a call is corrupt: it throws, while its peers may already
// have finished the call. With collective checking their next call starts with the
// argument check, a collective that rank 0 (failed) never joins: it must end with the
// report rank 0 sent (errc::corrupt), not wait forever.
TEST_CASE("a rank fails after its peers finished: their next call's collective check throws, not hangs") {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  if (p < 2) return;
  const std::size_t n = 4096;  // small messages: MPI sends them eagerly, so peers finish first
  cgx::plan_options o = verified();
  o.check = cgx::checking::collective;
  cgx::allreduce_plan<float, Q4, SRA, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD}, n, o};
  auto v = cgx_test::inputs<float>(r, n);
  if (r == 0) {
    flips_left = 1;
    payloads_to_skip = 2 * (p - 1) - 1;  // SRA: p - 1 pieces to reduce, then p - 1 sums
    cgx::comm::detail::received_payload_hook = &flip_one_bit;
  }
  const auto first = cgx_test::error_code_of([&] { plan(v.data(), n); });
  cgx::comm::detail::received_payload_hook = nullptr;
  if (r == 0) CHECK(first == cgx::errc::corrupt);
  const auto second = cgx_test::error_code_of([&] { plan(v.data(), n); });
  CHECK(second.has_value());
  if (second) CHECK(*second == cgx::errc::corrupt);
  MPI_Barrier(MPI_COMM_WORLD);
}

// A transport split from another fails with it: a rank whose parent transport fails (its
// own abort, or a peer's report it hears there) tells its peers on the split one too, so
// a peer that waits only there hears it instead of waiting out its limit. The split
// reverses the ranks, so the report's origin must be translated to be named right.
TEST_CASE("comm::mpi: a transport from split() fails with its parent and tells its own peers") {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  if (p < 2) return;
  cgx::comm::mpi x{MPI_COMM_WORLD};
  cgx::comm::mpi child = x.split(0, p - 1 - r);
  REQUIRE(child.rank() == p - 1 - r);
  child.set_wait_limit(std::chrono::milliseconds(8000));
  std::optional<cgx::errc> code;
  std::string what;
  if (r == 0) {
    x.abort(cgx::errc::transport, "test: rank 0 gave up");
    CHECK(child.failed());
  } else {
    // Waits on the split transport only, for world rank 0 (rank p - 1 there).
    std::vector<std::byte> buf(64);
    std::vector<cgx::comm::mpi::request> q{child.irecv(buf.data(), buf.size(), p - 1, 77)};
    const auto t0 = std::chrono::steady_clock::now();
    try {
      child.wait_all(q);
    } catch (const cgx::error& e) {
      code = e.code();
      what = e.what();
    }
    INFO(what);
    CHECK(code == cgx::errc::peer_failed);
    CHECK(what.find("rank " + std::to_string(p - 1) + " failed") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(6000));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// Before a transport's first call (while a plan is built) a peer's report does not end
// max_all: every rank takes part in the construction, so the reduction completes, and
// the report fails the transport for its first call. Here rank 0 reports before it
// joins; before, the others threw from max_all while rank 0 had not even joined (and
// a rank still in a plan's constructor threw while its peers' first call failed).
TEST_CASE("comm::mpi: before the first call, max_all completes through a peer's report; the first call throws it") {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  if (p < 2) return;
  cgx::comm::mpi x{MPI_COMM_WORLD};
  x.set_wait_limit(std::chrono::milliseconds(8000));
  if (r == 0) {
    x.abort(cgx::errc::transport, "test: rank 0 gave up");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the report arrives first
  }
  std::int64_t v[1] = {r};
  const auto code = cgx_test::error_code_of([&] { x.max_all(v); });
  CHECK(!code.has_value());
  CHECK(v[0] == p - 1);
  CHECK(x.failed());
  const auto next = cgx_test::error_code_of([&] { x.throw_if_failed(); });
  CHECK(next == (r == 0 ? cgx::errc::transport : cgx::errc::peer_failed));
  MPI_Barrier(MPI_COMM_WORLD);
}

// A hierarchical plan (emulated nodes of two ranks) whose plan transport hears of a
// failure at the start of a call, before the schedule runs: rank 0 calls late, after
// node 1's ranks (which disagree on the count) failed and reported; it throws from the
// call's first look at the failure channel. Rank 1 waits meanwhile on the node transport,
// for rank 0 only: it must hear the failure there (the node transport fails with the
// plan's), not wait out its limit. Before, it threw errc::timeout after 8 s (MPICH: in
// most runs of test_mismatch_family).
TEST_CASE("hierarchical over comm::mpi: a failure heard before the schedule runs reaches the node's ranks") {
  const int r = cgx_test::world_rank();
  const int p = cgx_test::world_size();
  if (p != 4) return;
  using Hier = cgx::comm::hierarchical<cgx::comm::uncompressed, SRA>;
  const std::size_t n = 60000;
  cgx::allreduce_plan<float, Q4, Hier, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD, cgx::comm::mpi::nodes{r / 2}},
                                                             n, local_checks(8000)};
  auto v = cgx_test::inputs<float>(r, n);
  if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const auto t0 = std::chrono::steady_clock::now();
  const auto code = cgx_test::error_code_of([&] { plan(v.data(), r == 3 ? n - 1000 : n); });
  const auto waited = std::chrono::steady_clock::now() - t0;
  const auto codes = gather_codes(code);
  for (int q = 0; q < p; ++q) {
    INFO("rank " << q << " threw code " << codes[static_cast<std::size_t>(q)]);
    CHECK((codes[static_cast<std::size_t>(q)] == static_cast<int>(cgx::errc::mismatch) ||
           codes[static_cast<std::size_t>(q)] == static_cast<int>(cgx::errc::peer_failed)));
  }
  CHECK(waited < std::chrono::milliseconds(6000));
  const auto next = cgx_test::error_code_of([&] { plan(v.data(), n); });
  CHECK(next.has_value());
  MPI_Barrier(MPI_COMM_WORLD);
}
