// The device transports and schedules on a simulated CUDA runtime (issue 19): no GPU.
// comm::basic_cuda_ipc<sim::runtime>, comm::device_sra / device_ring / device_tree over it and
// device_allreduce_plan, device_reduce_scatter_plan and device_allgather_plan run
// unchanged, with the CUDA kernels' bodies on the host, over
// thread-ranks; sim_runtime.hpp's checker reports every pair of device accesses that
// the streams, events and barriers leave unordered, and every teardown step out of
// CUDA IPC's order. Each scenario runs under several executor seeds (interleavings).
#include <doctest/doctest.h>

#include "sim_runtime.hpp"

#include <cgx/allgather_plan.hpp>
#include <cgx/allreduce_plan.hpp>
#include <cgx/comm/cuda_ipc.cuh>
#include <cgx/comm/device_ring.cuh>
#include <cgx/comm/device_sra.cuh>
#include <cgx/comm/device_tree.cuh>
#include <cgx/comm/host_device.cuh>
#if CGX_SIM_NCCL
#include <cgx/comm/nccl.cuh>
#endif
#include <cgx/device_collectives.cuh>
#include <cgx/device_plan.cuh>
#include <cgx/layerwise_plan.cuh>
#include <cgx/layerwise_plan.hpp>
#include <cgx/reduce_scatter_plan.hpp>

#include "gpu/thread_transport.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using sim_ipc = cgx::comm::basic_cuda_ipc<sim::runtime>;
using Q = cgx::quant::maxmin<4, 256, cgx::quant::stochastic>;

/// The thread transport, with its reads and writes of simulated memory (a CUDA-aware
/// MPI's on device memory, or any MPI's on pinned staging memory) shown to the checker.
class sim_host_transport {
 public:
  using request = gpu_test::thread_transport::request;
  sim_host_transport(std::shared_ptr<gpu_test::thread_group> g, int rank) : x_(std::move(g), rank) {}
  int rank() const { return x_.rank(); }
  int size() const { return x_.size(); }
  request isend(const void* p, std::size_t bytes, int peer, int tag) {
    sim::w().host_access(p, bytes, false, "a host transport's send");
    return x_.isend(p, bytes, peer, tag);
  }
  request irecv(void* p, std::size_t bytes, int peer, int tag) { return x_.irecv(p, bytes, peer, tag); }
  void wait_all(std::span<request> reqs) {
    std::vector<request> recvs;
    for (const auto& q : reqs)
      if (q.dst != nullptr) recvs.push_back(q);
    x_.wait_all(reqs);
    for (const auto& q : recvs) sim::w().host_access(q.dst, q.bytes, true, "a host transport's receive");
  }
  void max_all(std::span<std::int64_t> v) { x_.max_all(v); }

 private:
  gpu_test::thread_transport x_;
};
using sim_host_device = cgx::comm::basic_host_device<sim_host_transport, sim::runtime>;

#if CGX_SIM_NCCL
using sim_nccl = cgx::comm::basic_nccl<sim::runtime, sim::nccl>;
#endif

/// How a scenario makes rank r's device transport.
struct over_ipc {
  using type = sim_ipc;
  std::shared_ptr<sim::group> g;
  explicit over_ipc(int p) : g(std::make_shared<sim::group>(p)) {}
  type make(int r) const { return type{sim::thread_bootstrap(g, r)}; }
};
#if CGX_SIM_NCCL
struct over_nccl {
  using type = sim_nccl;
  std::shared_ptr<sim::group> g;
  explicit over_nccl(int p) : g(std::make_shared<sim::group>(p)) {}
  type make(int r) const { return type{sim::thread_bootstrap(g, r)}; }
};
#endif
struct over_host {
  using type = sim_host_device;
  std::shared_ptr<gpu_test::thread_group> g;
  bool direct;
  over_host(int p, bool d) : g(std::make_shared<gpu_test::thread_group>(p)), direct(d) {}
  type make(int r) const { return type{sim_host_transport(g, r), direct}; }
};

/// Runs body(rank) on p threads, each attached to the world as that rank; rethrows the
/// first exception.
void on_ranks(sim::world& w, int p, const std::function<void(int)>& body) {
  std::vector<std::thread> t;
  std::vector<std::exception_ptr> err(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      w.attach(r);
      try {
        body(r);
      } catch (...) {
        err[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& x : t) x.join();
  for (auto& e : err)
    if (e) std::rethrow_exception(e);
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size() && i < 12; ++i) s += "  " + v[i] + "\n";
  if (v.size() > 12) s += "  ... " + std::to_string(v.size() - 12) + " more\n";
  return s;
}

std::vector<float> input(int rank, std::size_t n, int call) {
  std::mt19937 g(static_cast<unsigned>(1000 * rank + 17 * call + 5));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g) + 0.25f * static_cast<float>(rank);
  return v;
}

/// The counts of the calls of a scenario: full, cut mid-bucket, tiny, full again.
std::vector<std::size_t> counts(std::size_t max_n) { return {max_n, max_n / 2 + 37, 5, max_n}; }

/// What the host plan (R over the thread transport) returns for the same calls: the
/// bits the device schedule must reproduce.
template <class R>
std::vector<std::vector<std::vector<float>>> host_results(int p, std::size_t max_n) {
  auto g = std::make_shared<gpu_test::thread_group>(p);
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(p));
  std::vector<std::thread> t;
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      cgx::plan_options o;
      o.native_below_bytes = 0;
      cgx::allreduce_plan<float, Q, R, gpu_test::thread_transport> plan{gpu_test::thread_transport(g, r), max_n, o};
      int call = 0;
      for (const std::size_t n : counts(max_n)) {
        auto v = input(r, n, call++);
        plan(v.data(), n);
        out[static_cast<std::size_t>(r)].push_back(std::move(v));
      }
    });
  for (auto& x : t) x.join();
  return out;
}

/// One rank's calls of device_allreduce_plan<float, Q, R, sim_ipc>, alternating between
/// two streams, each with its own device buffer, and no host wait between calls: call k
/// on one stream may run while call k - 1's work on the other is still queued, and only
/// the transport's ordering keeps them from sharing workspace bytes unordered.
template <class R, class Make>
std::vector<std::vector<float>> device_calls(const Make& make, int r, std::size_t max_n) {
  using X = typename Make::type;
  cgx::plan_options o;
  o.native_below_bytes = 0;
  cgx::device_allreduce_plan<float, Q, R, X> plan{make.make(r), max_n, o};
  cudaStream_t s[2] = {sim::w().create_stream(), sim::w().create_stream()};
  float* d[2] = {};
  for (auto& x : d) {
    void* mem = nullptr;
    REQUIRE(sim::runtime::malloc(&mem, max_n * sizeof(float)) == cudaSuccess);
    x = static_cast<float*>(mem);
  }
  std::vector<std::vector<float>> out;
  out.reserve(counts(max_n).size());
  int call = 0;
  for (const std::size_t n : counts(max_n)) {
    const int k = call % 2;
    out.push_back(input(r, n, call++));
    auto& v = out.back();
    sim::runtime::memcpy_async(d[k], v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s[k]);
    plan(d[k], n, s[k]);
    sim::runtime::memcpy_async(v.data(), d[k], n * sizeof(float), cudaMemcpyDeviceToHost, s[k]);
  }
  for (cudaStream_t x : s) sim::runtime::stream_synchronize(x);
  for (float* x : d) REQUIRE(sim::runtime::free(x) == cudaSuccess);
  return out;
}

template <class R, class Make>
void check_schedule(const Make& make, int p, std::size_t max_n, std::uint64_t seed) {
  CAPTURE(p);
  CAPTURE(max_n);
  CAPTURE(seed);
  const auto want = host_results<R>(p, max_n);
  sim::world w(seed);
  sim::scope use(w);
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p));
  on_ranks(w, p, [&](int r) { got[static_cast<std::size_t>(r)] = device_calls<R>(make, r, max_n); });
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
  CHECK(w.executed() > 0);
  for (int r = 0; r < p; ++r)
    for (std::size_t c = 0; c < want[0].size(); ++c) {
      const auto& a = got[static_cast<std::size_t>(r)][c];
      const auto& b = want[static_cast<std::size_t>(r)][c];
      REQUIRE(a.size() == b.size());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++bad;
      CAPTURE(r);
      CAPTURE(c);
      CHECK_MESSAGE(bad == 0, bad << " of " << a.size() << " values differ from the host plan's");
    }
}

}  // namespace

TEST_CASE("sim checker: unordered accesses of two streams are violations; an event wait orders them") {
  for (const bool ordered : {false, true}) {
    sim::world w(7);
    sim::scope use(w);
    w.attach(0);
    cudaStream_t s1 = w.create_stream(), s2 = w.create_stream();
    void* p = nullptr;
    REQUIRE(sim::runtime::malloc(&p, 1024) == cudaSuccess);
    std::vector<std::byte> host(1024, std::byte{1});
    sim::runtime::memcpy_async(p, host.data(), 1024, cudaMemcpyHostToDevice, s1);
    cudaEvent_t e{};
    REQUIRE(sim::runtime::event_create(&e, cudaEventDisableTiming) == cudaSuccess);
    sim::runtime::event_record(e, s1);
    if (ordered) sim::runtime::stream_wait_event(s2, e);
    sim::runtime::memcpy_async(host.data(), static_cast<std::byte*>(p) + 512, 256, cudaMemcpyDeviceToHost, s2);
    sim::runtime::stream_synchronize(s1);
    sim::runtime::stream_synchronize(s2);
    sim::runtime::event_destroy(e);
    sim::runtime::free(p);
    CAPTURE(ordered);
    CHECK(w.violations().empty() == ordered);
  }
}

TEST_CASE("sim checker: an exported allocation freed before the importer closes it is a violation") {
  for (const bool close_first : {false, true}) {
    sim::world w(9);
    sim::scope use(w);
    auto g = std::make_shared<sim::group>(2);
    on_ranks(w, 2, [&](int r) {
      sim::thread_bootstrap b(g, r);
      void* mine = nullptr;
      REQUIRE(sim::runtime::malloc(&mine, 256) == cudaSuccess);
      cudaIpcMemHandle_t h{};
      REQUIRE(sim::runtime::ipc_get_mem_handle(&h, mine) == cudaSuccess);
      std::vector<cudaIpcMemHandle_t> all(2);
      b.allgather(std::as_bytes(std::span(&h, 1)), std::as_writable_bytes(std::span(all)));
      void* peer = nullptr;
      REQUIRE(sim::runtime::ipc_open_mem_handle(&peer, all[static_cast<std::size_t>(1 - r)], 0) == cudaSuccess);
      if (close_first) sim::runtime::ipc_close_mem_handle(peer);
      b.barrier();
      sim::runtime::free(mine);
      if (!close_first) sim::runtime::ipc_close_mem_handle(peer);
    });
    CAPTURE(close_first);
    CHECK(w.violations().empty() == close_first);
  }
}

TEST_CASE("device SRA over CUDA IPC on the simulated runtime: the host plan's bits, no unordered access") {
  for (const int p : {2, 3, 4})
    for (const std::uint64_t seed : {1u, 2u})
      check_schedule<cgx::comm::scatter_reduce_allgather>(over_ipc(p), p, p == 3 ? 3000 : 2048 + 100, seed);
}

TEST_CASE("device ring over CUDA IPC on the simulated runtime: the host plan's bits, no unordered access") {
  for (const int p : {2, 3, 4})
    for (const std::uint64_t seed : {3u, 4u})
      check_schedule<cgx::comm::ring>(over_ipc(p), p, p == 3 ? 3000 : 2048 + 100, seed);
}

TEST_CASE("device tree over CUDA IPC on the simulated runtime: the host plan's bits, no unordered access") {
  // 3, 5 and 6 ranks fold and unfold; 4 does not; 2 is one halving and one doubling step.
  for (const int p : {2, 3, 4, 5, 6})
    for (const std::uint64_t seed : {5u, 6u})
      check_schedule<cgx::comm::tree>(over_ipc(p), p, p % 2 == 1 ? 3000 : 2048 + 100, seed);
}

TEST_CASE("device SRA and ring over a host transport (mpi_device's code), staged and direct, on the simulated runtime") {
  for (const bool direct : {false, true})
    for (const int p : {2, 3, 4}) {
      CAPTURE(direct);
      check_schedule<cgx::comm::scatter_reduce_allgather>(over_host(p, direct), p, 2048 + 100, 10u + p);
      check_schedule<cgx::comm::ring>(over_host(p, direct), p, 3000, 20u + p);
    }
}

TEST_CASE("device tree over a host transport (mpi_device's code), staged and direct, on the simulated runtime") {
  for (const bool direct : {false, true})
    for (const int p : {3, 4, 6}) {
      CAPTURE(direct);
      check_schedule<cgx::comm::tree>(over_host(p, direct), p, 3000, 30u + p);
    }
}

#if CGX_SIM_NCCL
TEST_CASE("device SRA and ring over NCCL (simulated): the host plan's bits, no unordered access") {
  for (const int p : {2, 3, 4}) {
    check_schedule<cgx::comm::scatter_reduce_allgather>(over_nccl(p), p, 2048 + 100, 60u + p);
    check_schedule<cgx::comm::ring>(over_nccl(p), p, 3000, 70u + p);
  }
}

TEST_CASE("device tree over NCCL (simulated): the host plan's bits, no unordered access") {
  for (const int p : {3, 4, 5}) check_schedule<cgx::comm::tree>(over_nccl(p), p, 3000, 80u + p);
}

namespace {
/// One plan call of every rank over simulated NCCL, then `fault(r, plan)`; returns what
/// each rank's later calls threw (empty: nothing), with the plan destroyed at the end
/// of each rank's scope. No rank may hang: a finalize that waits for peers longer than
/// 1 s is reported by the world.
template <class Fault, class After = void (*)(int)>
std::vector<std::string> nccl_fault(sim::world& w, int p, Fault fault, After after = [](int) {}) {
  auto g = std::make_shared<sim::group>(p);
  std::vector<std::string> caught(static_cast<std::size_t>(p));
  w.set_finalize_limit(std::chrono::milliseconds(1000));
  on_ranks(w, p, [&](int r) {
    const std::size_t n = 3000;
    cudaStream_t s = sim::w().create_stream();
    void* mem = nullptr;
    REQUIRE(sim::runtime::malloc(&mem, n * sizeof(float)) == cudaSuccess);
    auto* d = static_cast<float*>(mem);
    auto v = input(r, n, 0);
    sim::runtime::memcpy_async(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
    try {
      cgx::plan_options o;
      o.native_below_bytes = 0;
      o.check = cgx::checking::local;  // the scenarios call on some ranks only (collective checks would wait)
      cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, sim_nccl> plan{
          sim_nccl{sim::thread_bootstrap(g, r)}, n, o};
      plan(d, n, s);
      fault(r, plan, d, n, s);
    } catch (const cgx::error& e) {
      caught[static_cast<std::size_t>(r)] = e.what();
    } catch (const std::runtime_error& e) {
      caught[static_cast<std::size_t>(r)] = std::string("application: ") + e.what();
    }
    after(r);  // the plan is gone
    sim::runtime::stream_synchronize(s);  // aborted communicators drop their pending work
    sim::runtime::free(mem);
  });
  return caught;
}
}  // namespace

TEST_CASE("nccl (simulated): a call that fails inside the send/receive group closes the group; the transport refuses "
          "later calls; no rank hangs") {
  sim::world w(81);
  sim::scope use(w);
  const int p = 3;
  std::vector<int> depth_after(p, -1);
  std::vector<std::string> later(p);
  std::atomic<bool> rank1_done{false};
  const auto caught = nccl_fault(w, p, [&](int r, auto& plan, float* d, std::size_t n, cudaStream_t s) {
    if (r != 1) {
      // The peers call once rank 1 has failed (so that no peer's abort reaches rank 1
      // first), enqueue work that waits for rank 1 forever, and give up.
      while (!rank1_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      plan(d, n, s);
      throw std::runtime_error("rank " + std::to_string(r) + " gives up after its peer's failure");
    }
    sim::w().nccl_fail_next_call(1);
    try {
      plan(d, n, s);
    } catch (const cgx::error&) {
      depth_after[1] = sim::world::nccl_group_depth();
      try {
        plan(d, n, s);  // must throw too: the transport failed
      } catch (const cgx::error& e) {
        later[1] = e.what();
      }
      rank1_done = true;
      throw;
    }
    rank1_done = true;
  });
  INFO("violations:\n" << joined(w.violations()));
  CHECK(w.violations().empty());
  CHECK(depth_after[1] == 0);
  CHECK(caught[1].find("ncclRecv") != std::string::npos);
  CHECK(later[1].find("failed before") != std::string::npos);
  CHECK(w.nccl_aborts() == p);  // every rank aborted: none finalized alone
}

TEST_CASE("nccl (simulated): an asynchronous error aborts the communicator and throws; the peers see theirs") {
  sim::world w(82);
  sim::scope use(w);
  const int p = 3;
  const auto caught = nccl_fault(w, p, [&](int r, auto& plan, float* d, std::size_t n, cudaStream_t s) {
    if (r == 2) sim::w().nccl_set_async_error(2, ncclSystemError);
    plan(d, n, s);  // rank 2 throws at once; the others wait for rank 2 until it aborts
    plan(d, n, s);
  });
  INFO("violations:\n" << joined(w.violations()));
  CHECK(w.violations().empty());
  CHECK(caught[2].find("asynchronous error") != std::string::npos);
  CHECK(w.nccl_aborts() == p);
}

TEST_CASE("nccl (simulated): a rank unwinding alone aborts instead of a collective finalize that would wait for its "
          "peers") {
  sim::world w(83);
  sim::scope use(w);
  const int p = 3;
  std::atomic<bool> rank0_done{false};
  const auto caught = nccl_fault(w, p, [&](int r, auto&, float*, std::size_t, cudaStream_t) {
    if (r == 0) throw std::runtime_error("rank 0 fails alone");
    // The peers stay in their scope until rank 0's plan is gone (old code: rank 0 waited
    // in ncclCommFinalize for them), then give up too.
    while (!rank0_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    throw std::runtime_error("rank " + std::to_string(r) + " gives up");
  }, [&](int r) {
    if (r == 0) rank0_done = true;
  });
  (void)caught;
  INFO("violations:\n" << joined(w.violations()));
  CHECK(w.violations().empty());
}

#endif  // CGX_SIM_NCCL

TEST_CASE("device plans on a second device: each call makes the transport's device current and restores the caller's") {
  // Issue 19 defect 7: a process driving several GPUs. Each rank builds its plan on device
  // 1 and calls it with device 0 current.
  sim::world w(91, 2);
  sim::scope use(w);
  const int p = 2;
  auto g = std::make_shared<sim::group>(p);
  std::vector<int> after(p, -1);
  on_ranks(w, p, [&](int r) {
    REQUIRE(sim::runtime::set_device(1) == cudaSuccess);
    cudaStream_t s = sim::w().create_stream();
    const std::size_t n = 3000;
    void* mem = nullptr;
    REQUIRE(sim::runtime::malloc(&mem, n * sizeof(float)) == cudaSuccess);
    auto* d = static_cast<float*>(mem);
    auto v = input(r, n, 0);
    sim::runtime::memcpy_async(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
    {
      cgx::plan_options o;
      o.native_below_bytes = 0;
      cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, sim_ipc> plan{
          sim_ipc{sim::thread_bootstrap(g, r)}, n, o};
      REQUIRE(sim::runtime::set_device(0) == cudaSuccess);
      plan(d, n, s);
      sim::runtime::get_device(&after[static_cast<std::size_t>(r)]);
      REQUIRE(sim::runtime::set_device(1) == cudaSuccess);
      sim::runtime::stream_synchronize(s);
    }
    sim::runtime::free(mem);
  });
  INFO("violations:\n" << joined(w.violations()));
  CHECK(w.violations().empty());
  CHECK(after == std::vector<int>{0, 0});
}

TEST_CASE("cuda_ipc (simulated): a peer that stops calling makes the device wait time out; the next call throws "
          "errc::timeout naming it") {
  sim::world w(31);
  sim::scope use(w);
  constexpr int p = 2;
  constexpr std::size_t n = 3000;
  const over_ipc make(p);
  std::vector<std::string> caught(p);
  on_ranks(w, p, [&](int r) {
    cudaStream_t s = sim::w().create_stream();
    void* mem = nullptr;
    REQUIRE(sim::runtime::malloc(&mem, n * sizeof(float)) == cudaSuccess);
    auto* d = static_cast<float*>(mem);
    {
      cgx::plan_options o;
      o.native_below_bytes = 0;
      o.check = cgx::checking::local;  // rank 1 skips a call: collective checks would wait on the host
      o.timeout_ms = 200;
      cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, sim_ipc> plan{make.make(r), n, o};
      const auto v = input(r, n, 0);
      sim::runtime::memcpy_async(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
      plan(d, n, s);  // every rank
      if (r == 0) {
        try {
          // Rank 1 never makes this call: the device waits for it run out of time, and
          // a later exchange of this call or the next call throws.
          plan(d, n, s);
          REQUIRE(sim::runtime::stream_synchronize(s) == cudaSuccess);
          plan(d, n, s);
        } catch (const cgx::error& e) {
          CHECK(e.code() == cgx::errc::timeout);
          caught[static_cast<std::size_t>(r)] = e.what();
        }
      }
      REQUIRE(sim::runtime::stream_synchronize(s) == cudaSuccess);
    }
    REQUIRE(sim::runtime::free(mem) == cudaSuccess);
  });
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
  CAPTURE(caught[0]);
  CHECK(caught[0].find("for rank 1 to post 'ready' of exchange 3") != std::string::npos);
  CHECK(caught[0].find("200 ms") != std::string::npos);
}

TEST_CASE("cuda_ipc on the simulated runtime: a workspace replaced by reserve() and the teardown follow CUDA IPC's order") {
  for (const std::uint64_t seed : {5u, 6u, 7u}) {
    sim::world w(seed);
    sim::scope use(w);
    const int p = 3;
    auto g = std::make_shared<sim::group>(p);
    on_ranks(w, p, [&](int r) {
      sim_ipc x{sim::thread_bootstrap(g, r)};
      cgx::comm::device_sra<float, Q, sim_ipc> sra;
      cudaStream_t s = sim::w().create_stream();
      void* mem = nullptr;
      const std::size_t n = 4096;
      REQUIRE(sim::runtime::malloc(&mem, n * sizeof(float)) == cudaSuccess);
      auto* d = static_cast<float*>(mem);
      auto v = input(r, n, 0);
      sim::runtime::memcpy_async(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
      const cgx::quant::rng_state rng{};
      std::byte* ws = x.reserve(sra.workspace_bytes(n / 2, p));
      sra.run(d, n / 2, n / 2, x, ws, rng, s);
      ws = x.reserve(sra.workspace_bytes(n, p));  // the old one is released while in use by peers
      sra.run(d, n, n, x, ws, rng, s);
      sim::runtime::stream_synchronize(s);
      sim::runtime::free(mem);
    });
    const auto v = w.violations();
    INFO("violations:\n" << joined(v));
    CHECK(v.empty());
  }
}

namespace {

std::vector<cgx::layer> model_layers() {
  return {{0, 5000, false},    {5000, 100, true}, {5100, 700, false},  {9000, 3001, false},
          {5800, 3000, false}, {12001, 1, true},  {12100, 2500, false}};
}
constexpr std::size_t model_n = 14600;

/// The settings of call k: mixed widths and buckets, then another width for layer 0,
/// then every layer raw (the largest workspace).
std::vector<cgx::layer_setting> settings_of(const std::vector<cgx::layer>& ls, int call) {
  auto s = cgx::default_settings(ls);
  s[0] = {call == 0 ? 2 : 3, 128};
  s[3] = {8, 512};
  s[4] = {4, 1024};
  s[6] = {1, 512};
  if (call == 2)
    for (auto& x : s) x.bits = 0;
  return s;
}
constexpr int layerwise_calls = 4;

using LR = cgx::quant::stochastic;

std::vector<std::vector<std::vector<float>>> layerwise_host(int p) {
  auto g = std::make_shared<gpu_test::thread_group>(p);
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(p));
  std::vector<std::thread> t;
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      const auto ls = model_layers();
      cgx::layerwise_plan<float, gpu_test::thread_transport, LR> plan{gpu_test::thread_transport(g, r), model_n, ls};
      for (int call = 0; call < layerwise_calls; ++call) {
        plan.set_settings(settings_of(ls, call % 3));
        auto v = input(r, model_n, call);
        plan(v.data(), model_n);
        out[static_cast<std::size_t>(r)].push_back(std::move(v));
      }
    });
  for (auto& x : t) x.join();
  return out;
}

template <class Make>
void check_layerwise(const Make& make, int p, std::uint64_t seed) {
  CAPTURE(p);
  CAPTURE(seed);
  const auto want = layerwise_host(p);
  sim::world w(seed);
  sim::scope use(w);
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p));
  on_ranks(w, p, [&](int r) {
    const auto ls = model_layers();
    cgx::layerwise_options o;
    o.check = cgx::checking::collective;
    cgx::layerwise_device_plan<float, typename Make::type, LR> plan{make.make(r), model_n, ls, o};
    cudaStream_t s[2] = {sim::w().create_stream(), sim::w().create_stream()};
    float* d[2] = {};
    for (auto& x : d) {
      void* mem = nullptr;
      REQUIRE(sim::runtime::malloc(&mem, model_n * sizeof(float)) == cudaSuccess);
      x = static_cast<float*>(mem);
    }
    auto& out = got[static_cast<std::size_t>(r)];
    out.reserve(layerwise_calls);
    for (int call = 0; call < layerwise_calls; ++call) {
      const int k = call % 2;
      plan.set_settings(settings_of(ls, call % 3));  // local, between calls still in flight
      out.push_back(input(r, model_n, call));
      auto& v = out.back();
      sim::runtime::memcpy_async(d[k], v.data(), model_n * sizeof(float), cudaMemcpyHostToDevice, s[k]);
      plan(d[k], model_n, s[k]);
      sim::runtime::memcpy_async(v.data(), d[k], model_n * sizeof(float), cudaMemcpyDeviceToHost, s[k]);
    }
    for (cudaStream_t x : s) sim::runtime::stream_synchronize(x);
    for (float* x : d) REQUIRE(sim::runtime::free(x) == cudaSuccess);
  });
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
  for (int r = 0; r < p; ++r)
    for (int c = 0; c < layerwise_calls; ++c) {
      const auto& a = got[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)];
      const auto& b = want[static_cast<std::size_t>(r)][static_cast<std::size_t>(c)];
      std::size_t bad = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++bad;
      CAPTURE(r);
      CAPTURE(c);
      CHECK_MESSAGE(bad == 0, bad << " of " << a.size() << " values differ from the host layer-wise plan's");
    }
}

#if CGX_SIM_NCCL
void check_layerwise_nccl(int p) { check_layerwise(over_nccl(p), p, 90u + static_cast<unsigned>(p)); }
#endif

}  // namespace

TEST_CASE("layerwise_device_plan over CUDA IPC and over a host transport on the simulated runtime: the host plan's bits") {
  for (const int p : {2, 3, 4}) {
    check_layerwise(over_ipc(p), p, 30u + p);
    check_layerwise(over_host(p, false), p, 40u + p);
    check_layerwise(over_host(p, true), p, 50u + p);
  }
}

#if CGX_SIM_NCCL
TEST_CASE("layerwise_device_plan over NCCL (simulated): the host plan's bits") {
  for (const int p : {2, 4}) check_layerwise_nccl(p);
}
#endif

// ---- device reduce-scatter and allgather (issue 36, item 4) -----------------------------

namespace {

template <class T>
T to_value(float v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16(v);
  else
    return static_cast<T>(v);
}
template <class T>
float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return static_cast<float>(v);
}
template <class T>
std::vector<T> input_of(int rank, std::size_t n, int call) {
  const auto f = input(rank, n, call);
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = to_value<T>(f[i]);
  return v;
}
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

enum class op { reduce_scatter, allgather, allreduce };

/// One rank's calls of the device plan `o` over Make's transport: the counts of
/// counts(max_n), on three streams in turn with no host wait between calls: calls 0
/// and 2 use the same workspace half from different streams, so only the transport's
/// fence orders call 2 after call 0's last work. Returns each call's output buffer
/// (allgather: p blocks).
template <op O, class T, class Make>
std::vector<std::vector<T>> device_collective_calls(const Make& make, int r, int p, std::size_t max_n) {
  using X = typename Make::type;
  cgx::plan_options opts;
  opts.native_below_bytes = 0;
  auto plan = [&] {
    if constexpr (O == op::reduce_scatter)
      return std::make_unique<cgx::device_reduce_scatter_plan<T, Q, X>>(make.make(r), max_n, opts);
    else if constexpr (O == op::allgather)
      return std::make_unique<cgx::device_allgather_plan<T, Q, X>>(make.make(r), max_n, opts);
    else
      return std::make_unique<cgx::device_allreduce_plan<T, Q, cgx::comm::scatter_reduce_allgather, X>>(make.make(r),
                                                                                                          max_n, opts);
  }();
  const std::size_t out_n = O == op::allgather ? max_n * static_cast<std::size_t>(p) : max_n;
  cudaStream_t s[3] = {sim::w().create_stream(), sim::w().create_stream(), sim::w().create_stream()};
  T* in[3] = {};
  T* out[3] = {};
  for (int k = 0; k < 3; ++k) {
    void* a = nullptr;
    void* b = nullptr;
    REQUIRE(sim::runtime::malloc(&a, max_n * sizeof(T)) == cudaSuccess);
    REQUIRE(sim::runtime::malloc(&b, out_n * sizeof(T)) == cudaSuccess);
    in[k] = static_cast<T*>(a);
    out[k] = static_cast<T*>(b);
  }
  std::vector<std::vector<T>> res;
  std::vector<std::vector<T>> inputs;  // alive until the streams have run their copies
  int call = 0;
  for (const std::size_t n : counts(max_n)) {
    const int k = call % 3;
    auto v = input_of<T>(r, n, call++);
    if constexpr (O == op::allgather) {
      res.emplace_back(n * static_cast<std::size_t>(p));
      inputs.push_back(std::move(v));
      sim::runtime::memcpy_async(in[k], inputs.back().data(), n * sizeof(T), cudaMemcpyHostToDevice, s[k]);
      (*plan)(in[k], n, out[k], s[k]);
      sim::runtime::memcpy_async(res.back().data(), out[k], n * static_cast<std::size_t>(p) * sizeof(T),
                                 cudaMemcpyDeviceToHost, s[k]);
    } else {
      res.push_back(std::move(v));
      sim::runtime::memcpy_async(in[k], res.back().data(), n * sizeof(T), cudaMemcpyHostToDevice, s[k]);
      (*plan)(in[k], n, s[k]);
      sim::runtime::memcpy_async(res.back().data(), in[k], n * sizeof(T), cudaMemcpyDeviceToHost, s[k]);
    }
  }
  for (cudaStream_t x : s) sim::runtime::stream_synchronize(x);
  for (int k = 0; k < 3; ++k) {
    REQUIRE(sim::runtime::free(in[k]) == cudaSuccess);
    REQUIRE(sim::runtime::free(out[k]) == cudaSuccess);
  }
  CHECK(plan->calls() == counts(max_n).size());
  return res;
}

/// Runs the device collective O on every rank of a fresh simulated world; checks that
/// no access was unordered and returns every rank's outputs.
template <op O, class T, class Make>
std::vector<std::vector<std::vector<T>>> run_device(const Make& make, int p, std::size_t max_n, std::uint64_t seed) {
  sim::world w(seed);
  sim::scope use(w);
  std::vector<std::vector<std::vector<T>>> got(static_cast<std::size_t>(p));
  on_ranks(w, p, [&](int r) { got[static_cast<std::size_t>(r)] = device_collective_calls<O, T>(make, r, p, max_n); });
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
  CHECK(w.executed() > 0);
  return got;
}

/// The host reduce_scatter_plan / allgather_plan over the thread transport, same calls.
template <op O>
std::vector<std::vector<std::vector<float>>> host_collective(int p, std::size_t max_n) {
  auto g = std::make_shared<gpu_test::thread_group>(p);
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(p));
  std::vector<std::thread> t;
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      using TT = gpu_test::thread_transport;
      int call = 0;
      auto& mine = out[static_cast<std::size_t>(r)];
      if constexpr (O == op::reduce_scatter) {
        cgx::reduce_scatter_plan<float, Q, TT> plan{TT(g, r), max_n};
        for (const std::size_t n : counts(max_n)) {
          mine.push_back(input(r, n, call++));
          plan(mine.back().data(), n);
        }
      } else {
        cgx::allgather_plan<float, Q, TT> plan{TT(g, r), max_n};
        for (const std::size_t n : counts(max_n)) {
          const auto v = input(r, n, call++);
          mine.emplace_back(n * static_cast<std::size_t>(p));
          plan(v.data(), n, mine.back().data());
        }
      }
    });
  for (auto& x : t) x.join();
  return out;
}

/// Values of `got` that differ in their bits from `want` in [begin, end).
template <class T>
std::size_t differing(const std::vector<T>& got, const std::vector<T>& want, std::size_t begin, std::size_t end) {
  std::size_t bad = 0;
  for (std::size_t i = begin; i < end; ++i)
    if (!same_bits(got[i], want[i])) ++bad;
  return bad;
}

/// fp32: the host plans' bits. Reduce-scatter: this rank's chunk is the host plan's,
/// the rest of the buffer is the input, untouched. Allgather: every block, every rank.
template <class Make>
void check_float_collectives(const Make& make, int p, std::size_t max_n, std::uint64_t seed) {
  CAPTURE(p);
  CAPTURE(max_n);
  CAPTURE(seed);
  const auto rs_want = host_collective<op::reduce_scatter>(p, max_n);
  const auto rs_got = run_device<op::reduce_scatter, float>(make, p, max_n, seed);
  const auto ag_want = host_collective<op::allgather>(p, max_n);
  const auto ag_got = run_device<op::allgather, float>(make, p, max_n, seed + 1000);
  const auto ns = counts(max_n);
  for (int r = 0; r < p; ++r)
    for (std::size_t c = 0; c < ns.size(); ++c) {
      CAPTURE(r);
      CAPTURE(c);
      const auto& got = rs_got[static_cast<std::size_t>(r)][c];
      const auto& want = rs_want[static_cast<std::size_t>(r)][c];
      REQUIRE(got.size() == want.size());
      const auto mine = cgx::reduce_scatter_plan<float, Q, gpu_test::thread_transport>::chunk_of(ns[c], p, r);
      CHECK(cgx::device_reduce_scatter_plan<float, Q, sim_ipc>::chunk_of(ns[c], p, r).begin == mine.begin);
      CHECK(cgx::device_reduce_scatter_plan<float, Q, sim_ipc>::chunk_of(ns[c], p, r).count == mine.count);
      CHECK_MESSAGE(differing(got, want, 0, got.size()) == 0, "reduce-scatter: values differ from the host plan's");
      const auto in = input(r, ns[c], static_cast<int>(c));
      CHECK_MESSAGE(differing(got, in, 0, mine.begin) + differing(got, in, mine.begin + mine.count, got.size()) == 0,
                    "reduce-scatter: values outside the rank's chunk changed");
      CHECK_MESSAGE(differing(ag_got[static_cast<std::size_t>(r)][c], ag_want[static_cast<std::size_t>(r)][c], 0,
                              ag_want[static_cast<std::size_t>(r)][c].size()) == 0,
                    "allgather: values differ from the host plan's");
    }
}

/// fp16 and bf16 (no host plan): the reduce-scatter chunk is device_allreduce_plan's
/// (SRA) chunk, bit for bit; the allgather gives every rank the same bits, each value
/// within one quantization step of its block's bucket (maxmin: (max - min) / (2^b - 1),
/// of the values as T holds them; stochastic rounding stays below one step, and the
/// decoded value is then rounded to T once more, half a unit of T's last place).
template <class T, class Make>
void check_half_collectives(const Make& make, int p, std::size_t max_n, std::uint64_t seed) {
  CAPTURE(p);
  CAPTURE(seed);
  const auto ar = run_device<op::allreduce, T>(make, p, max_n, seed);
  const auto rs = run_device<op::reduce_scatter, T>(make, p, max_n, seed + 1);
  const auto ag = run_device<op::allgather, T>(make, p, max_n, seed + 2);
  const auto ns = counts(max_n);
  constexpr std::size_t B = Q::bucket_size;
  const double ulp = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;  // relative, last place
  for (int r = 0; r < p; ++r)
    for (std::size_t c = 0; c < ns.size(); ++c) {
      CAPTURE(r);
      CAPTURE(c);
      const auto mine = cgx::device_reduce_scatter_plan<T, Q, sim_ipc>::chunk_of(ns[c], p, r);
      const auto& a = ar[static_cast<std::size_t>(r)][c];
      const auto& b = rs[static_cast<std::size_t>(r)][c];
      CHECK_MESSAGE(differing(b, a, mine.begin, mine.begin + mine.count) == 0,
                    "reduce-scatter: the chunk differs from the allreduce's");
      const auto in = input_of<T>(r, ns[c], static_cast<int>(c));
      CHECK(differing(b, in, 0, mine.begin) + differing(b, in, mine.begin + mine.count, b.size()) == 0);
      CHECK_MESSAGE(differing(ag[static_cast<std::size_t>(r)][c], ag[0][c], 0, ag[0][c].size()) == 0,
                    "allgather: ranks hold different bits");
    }
  for (std::size_t c = 0; c < ns.size(); ++c) {
    const std::size_t n = ns[c];
    std::size_t far = 0;
    for (int q = 0; q < p; ++q) {
      const auto in = input_of<T>(q, n, static_cast<int>(c));
      for (std::size_t b0 = 0; b0 < n; b0 += B) {
        const std::size_t e = std::min(n, b0 + B);
        float lo = to_float(in[b0]), hi = lo;
        for (std::size_t i = b0; i < e; ++i) lo = std::min(lo, to_float(in[i])), hi = std::max(hi, to_float(in[i]));
        const double step = (static_cast<double>(hi) - lo) / ((1u << Q::bits) - 1);
        for (std::size_t i = b0; i < e; ++i) {
          const double x = to_float(in[i]);
          const double y = to_float(ag[0][c][static_cast<std::size_t>(q) * n + i]);
          if (!(std::fabs(y - x) <= step + ulp * std::max(std::fabs(x), std::fabs(y)))) ++far;
        }
      }
    }
    CAPTURE(c);
    CHECK_MESSAGE(far == 0, far << " gathered values are more than one step from their input");
  }
}

}  // namespace

TEST_CASE("device reduce-scatter and allgather over CUDA IPC (simulated), 2-6 ranks, odd counts: the host plans' bits") {
  for (const int p : {2, 3, 4, 5, 6}) check_float_collectives(over_ipc(p), p, 3001, 100u + p);
}

TEST_CASE("device reduce-scatter and allgather over a host transport (simulated), staged and direct: the host plans' bits") {
  for (const bool direct : {false, true})
    for (const int p : {2, 3, 5}) {
      CAPTURE(direct);
      check_float_collectives(over_host(p, direct), p, 2049, 110u + p);
    }
}

#if CGX_SIM_NCCL
TEST_CASE("device reduce-scatter and allgather over NCCL (simulated): the host plans' bits") {
  for (const int p : {2, 3, 4, 6}) check_float_collectives(over_nccl(p), p, 3001, 120u + p);
}
#endif

TEST_CASE("device reduce-scatter and allgather of fp16 and bf16 (simulated): the allreduce's chunk, one step, same bits") {
  for (const int p : {2, 3, 4}) {
    check_half_collectives<__half>(over_ipc(p), p, 3001, 130u + p);
    check_half_collectives<__nv_bfloat16>(over_host(p, false), p, 2049, 140u + p);
#if CGX_SIM_NCCL
    check_half_collectives<__nv_bfloat16>(over_nccl(p), p, 2049, 150u + p);
#endif
  }
}

TEST_CASE("device reduce-scatter and allgather refuse host buffers and counts above max_count, buffers untouched") {
  sim::world w(161);
  sim::scope use(w);
  const int p = 2;
  auto g = std::make_shared<sim::group>(p);
  std::vector<std::string> what(4 * p);
  on_ranks(w, p, [&](int r) {
    cgx::plan_options o;
    o.check = cgx::checking::local;
    const std::size_t n = 1000;
    cgx::device_reduce_scatter_plan<float, Q, sim_ipc> rs{sim_ipc{sim::thread_bootstrap(g, r)}, n, o};
    cgx::device_allgather_plan<float, Q, sim_ipc> ag{sim_ipc{sim::thread_bootstrap(g, r)}, n, o};
    std::vector<float> host = input(r, n, 0);
    const auto before = host;
    std::vector<float> host_out(n * p, 7.0f);
    void* mem = nullptr;
    REQUIRE(sim::runtime::malloc(&mem, 2 * n * p * sizeof(float)) == cudaSuccess);
    auto* d = static_cast<float*>(mem);
    auto code = [&](auto&& f, int slot) {
      try {
        f();
      } catch (const cgx::error& e) {
        what[static_cast<std::size_t>(4 * r + slot)] = e.what();
        return static_cast<int>(e.code());
      }
      return -1;
    };
    const int inv = static_cast<int>(cgx::errc::invalid_argument);
    CHECK(code([&] { rs(host.data(), n); }, 0) == inv);
    CHECK(code([&] { rs(d, n + 1); }, 1) == inv);
    CHECK(code([&] { ag(d, n, host_out.data()); }, 2) == inv);
    CHECK(code([&] { ag(d, n + 1, d + n); }, 3) == inv);
    CHECK(host == before);
    CHECK(std::all_of(host_out.begin(), host_out.end(), [](float v) { return v == 7.0f; }));
    CHECK(rs.calls() == 0);
    CHECK(ag.calls() == 0);
    sim::runtime::free(mem);
  });
  for (const auto& s : what) CHECK_MESSAGE(!s.empty(), "a refused call without a message");
  CHECK(what[0].find("not device") != std::string::npos);
  CHECK(what[1].find("max_count") != std::string::npos);
}

// ---- CUDA graph capture (issue 36, item 3) ----------------------------------------------

namespace {

/// How the graph scenario calls a plan: `call(d_buf, stream)` is one call; `before(k)`
/// runs before call k (a layer-wise plan's settings).
struct plan_calls {
  std::function<void(float*, cudaStream_t)> call;
  std::function<void(int)> before = [](int) {};
};

constexpr int graph_launches = 3;
constexpr int graph_scenario_calls = 3 + graph_launches;

/// One rank's calls of the graph scenario: call 0 eager on stream s2 (buffer d2), call 1
/// eager on s (buffer d), then one call captured on s into a graph that is launched
/// graph_launches times on s (calls 2, 3, 4; the input copied into d before each
/// launch), then call 5 eager on s2 again: the launches are ordered after eager work on
/// another stream and before it, by the transport's fence alone. Returns each call's
/// result; `nodes`: the graph's size.
std::vector<std::vector<float>> graph_scenario(int r, std::size_t n, const plan_calls& plan, std::size_t* nodes) {
  cudaStream_t s = sim::w().create_stream(), s2 = sim::w().create_stream();
  void* mem[2] = {};
  for (auto& m : mem) REQUIRE(sim::runtime::malloc(&m, n * sizeof(float)) == cudaSuccess);
  float* d = static_cast<float*>(mem[0]);
  float* d2 = static_cast<float*>(mem[1]);
  std::vector<std::vector<float>> out;
  out.reserve(graph_scenario_calls);
  // On the way out, also when a check throws: no copy into `out` may still be queued.
  struct drain {
    cudaStream_t a, b;
    ~drain() {
      cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
      cudaGraph_t g = nullptr;
      if (sim::runtime::stream_is_capturing(a, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone)
        (void)sim::w().end_capture(a, &g);
      (void)sim::runtime::stream_synchronize(a);
      (void)sim::runtime::stream_synchronize(b);
    }
  } drained{s, s2};
  auto in = [&](int k, float* buf, cudaStream_t st) {
    out.push_back(input(r, n, k));
    sim::runtime::memcpy_async(buf, out.back().data(), n * sizeof(float), cudaMemcpyHostToDevice, st);
  };
  auto back = [&](float* buf, cudaStream_t st) {
    sim::runtime::memcpy_async(out.back().data(), buf, n * sizeof(float), cudaMemcpyDeviceToHost, st);
  };
  auto eager = [&](int k, float* buf, cudaStream_t st) {
    plan.before(k);
    in(k, buf, st);
    plan.call(buf, st);
    back(buf, st);
  };
  eager(0, d2, s2);
  eager(1, d, s);
  plan.before(2);
  REQUIRE(sim::w().begin_capture(s) == cudaSuccess);
  plan.call(d, s);
  cudaGraph_t g = nullptr;
  REQUIRE(sim::w().end_capture(s, &g) == cudaSuccess);
  *nodes = sim::w().graph_nodes(g);
  cudaGraphExec_t x = nullptr;
  REQUIRE(sim::w().instantiate(&x, g) == cudaSuccess);
  for (int k = 2; k < 2 + graph_launches; ++k) {
    in(k, d, s);
    REQUIRE(sim::w().graph_launch(x, s) == cudaSuccess);
    back(d, s);
  }
  eager(2 + graph_launches, d2, s2);
  for (cudaStream_t x2 : {s, s2}) REQUIRE(sim::runtime::stream_synchronize(x2) == cudaSuccess);
  for (void* m : mem) REQUIRE(sim::runtime::free(m) == cudaSuccess);
  return out;
}

/// Every rank's results of the graph scenario equal the host plan's eager calls bit for
/// bit; no unordered access; the graph is not empty.
void check_graph_results(const sim::world& w, const std::vector<std::vector<std::vector<float>>>& got,
                         const std::vector<std::vector<std::vector<float>>>& want,
                         const std::vector<std::size_t>& nodes) {
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
  for (std::size_t r = 0; r < got.size(); ++r) {
    CHECK(nodes[r] > 0);
    REQUIRE(got[r].size() == want[r].size());
    for (std::size_t c = 0; c < want[r].size(); ++c) {
      const auto& a = got[r][c];
      const auto& b = want[r][c];
      REQUIRE(a.size() == b.size());
      std::size_t bad = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++bad;
      CAPTURE(r);
      CAPTURE(c);
      CHECK_MESSAGE(bad == 0, bad << " of " << a.size() << " values differ from the host plan's eager call");
    }
  }
}

/// The host plan's results for graph_scenario_calls eager calls (inputs input(r, n, k)).
template <class HostPlan, class Make>
std::vector<std::vector<std::vector<float>>> host_eager(int p, std::size_t n, const Make& make_plan,
                                                        const std::function<void(HostPlan&, int)>& before) {
  auto g = std::make_shared<gpu_test::thread_group>(p);
  std::vector<std::vector<std::vector<float>>> out(static_cast<std::size_t>(p));
  std::vector<std::thread> t;
  for (int r = 0; r < p; ++r)
    t.emplace_back([&, r] {
      auto plan = make_plan(gpu_test::thread_transport(g, r));
      for (int k = 0; k < graph_scenario_calls; ++k) {
        before(*plan, k);
        auto v = input(r, n, k);
        (*plan)(v.data(), n);
        out[static_cast<std::size_t>(r)].push_back(std::move(v));
      }
    });
  for (auto& x : t) x.join();
  return out;
}

/// A call on a capturing stream that must be refused: throws cgx::error
/// (invalid_argument) naming the capture, enqueues nothing (the capture ends with an
/// empty graph), and leaves the buffer as it was.
template <class Call>
void check_capture_refused(std::size_t n, int r, Call&& call, const char* what) {
  CAPTURE(what);
  cudaStream_t s = sim::w().create_stream();
  void* mem = nullptr;
  REQUIRE(sim::runtime::malloc(&mem, n * sizeof(float)) == cudaSuccess);
  auto* d = static_cast<float*>(mem);
  const auto v = input(r, n, 0);
  auto got = v;
  sim::runtime::memcpy_async(d, v.data(), n * sizeof(float), cudaMemcpyHostToDevice, s);
  REQUIRE(sim::w().begin_capture(s) == cudaSuccess);
  bool threw = false;
  try {
    call(d, s);
  } catch (const cgx::error& e) {
    threw = true;
    CHECK(e.code() == cgx::errc::invalid_argument);
    CHECK(std::string(e.what()).find("capturing a CUDA graph") != std::string::npos);
  }
  CHECK(threw);
  cudaGraph_t g = nullptr;
  REQUIRE(sim::w().end_capture(s, &g) == cudaSuccess);
  CHECK(sim::w().graph_nodes(g) == 0);
  std::fill(got.begin(), got.end(), 0.0f);
  sim::runtime::memcpy_async(got.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost, s);
  REQUIRE(sim::runtime::stream_synchronize(s) == cudaSuccess);
  CHECK(std::memcmp(got.data(), v.data(), n * sizeof(float)) == 0);
  REQUIRE(sim::runtime::free(d) == cudaSuccess);
}

template <class Make>
void check_allreduce_refused(const Make& make, int p, std::uint64_t seed) {
  CAPTURE(p);
  sim::world w(seed);
  sim::scope use(w);
  constexpr std::size_t n = 3000;
  on_ranks(w, p, [&](int r) {
    cgx::plan_options o;
    o.native_below_bytes = 0;
    o.check = cgx::checking::collective;
    cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, typename Make::type> plan{make.make(r),
                                                                                                       n, o};
    check_capture_refused(n, r, [&](float* d, cudaStream_t s) { plan(d, n, s); }, "device_allreduce_plan");
    cgx::layerwise_options lo;
    lo.check = cgx::checking::collective;
    cgx::layerwise_device_plan<float, typename Make::type, LR> lw{make.make(r), model_n, model_layers(), lo};
    check_capture_refused(model_n, r, [&](float* d, cudaStream_t s) { lw(d, model_n, s); }, "layerwise_device_plan");
  });
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
}

}  // namespace

/// device_allreduce_plan over the transport Make makes, in the graph scenario at 2-4 ranks:
/// each launch gives the bits of one more eager call of the host plan.
template <class Make>
void check_allreduce_graph(unsigned world_seed) {
  for (const int p : {2, 3, 4})
    for (const std::uint64_t seed : {1u, 2u}) {
      CAPTURE(p);
      CAPTURE(seed);
      constexpr std::size_t n = 4099;
      using SRA = cgx::comm::scatter_reduce_allgather;
      cgx::plan_options o;
      o.native_below_bytes = 0;
      using HP = cgx::allreduce_plan<float, Q, SRA, gpu_test::thread_transport>;
      const auto want = host_eager<HP>(
          p, n, [&](gpu_test::thread_transport x) { return std::make_unique<HP>(std::move(x), n, o); },
          [](HP&, int) {});
      sim::world w(world_seed + seed);
      sim::scope use(w);
      const Make make(p);
      std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p));
      std::vector<std::size_t> nodes(static_cast<std::size_t>(p));
      on_ranks(w, p, [&](int r) {
        cgx::plan_options oc = o;
        oc.check = cgx::checking::collective;
        cgx::device_allreduce_plan<float, Q, SRA, typename Make::type> plan{make.make(r), n, oc};
        got[static_cast<std::size_t>(r)] = graph_scenario(
            r, n, plan_calls{[&](float* d, cudaStream_t s) { plan(d, n, s); }}, &nodes[static_cast<std::size_t>(r)]);
        CHECK(plan.calls() == 4);  // calls made on the host: the captured one once
        CHECK(plan.captured_calls() == 1);
      });
      check_graph_results(w, got, want, nodes);
    }
}

#if CGX_SIM_NCCL
TEST_CASE("device_allreduce_plan over NCCL (simulated) in a CUDA graph: each launch gives the bits of one more eager "
          "call") {
  check_allreduce_graph<over_nccl>(700);
}
#endif

TEST_CASE("device_allreduce_plan over CUDA IPC (simulated) in a CUDA graph: each launch gives the bits of one more "
          "eager call; the device waits advance their epochs on every launch") {
  check_allreduce_graph<over_ipc>(710);
}

#if CGX_SIM_NCCL
TEST_CASE("device_allreduce_plan's native path (ncclAllReduce, simulated) in a CUDA graph: the sums of each launch") {
  constexpr int p = 3;
  constexpr std::size_t n = 300;  // below the threshold: ncclAllReduce
  sim::world w(77);
  sim::scope use(w);
  const over_nccl make(p);
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p));
  std::vector<std::size_t> nodes(static_cast<std::size_t>(p));
  on_ranks(w, p, [&](int r) {
    cgx::plan_options o;
    o.native_below_bytes = 1 << 20;
    cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, sim_nccl> plan{make.make(r), n, o};
    got[static_cast<std::size_t>(r)] = graph_scenario(
        r, n, plan_calls{[&](float* d, cudaStream_t s) { plan(d, n, s); }}, &nodes[static_cast<std::size_t>(r)]);
    CHECK(plan.calls() == 0);  // native calls draw no random bits
  });
  // The simulated ncclAllReduce sums in rank order.
  std::vector<std::vector<std::vector<float>>> want(static_cast<std::size_t>(p));
  for (int k = 0; k < graph_scenario_calls; ++k) {
    std::vector<float> sum(n, 0.0f);
    for (int r = 0; r < p; ++r) {
      const auto v = input(r, n, k);
      for (std::size_t i = 0; i < n; ++i) sum[i] += v[i];
    }
    for (auto& x : want) x.push_back(sum);
  }
  check_graph_results(w, got, want, nodes);
}

#endif  // CGX_SIM_NCCL

/// layerwise_device_plan over the transport Make makes, in the graph scenario: each
/// launch gives the bits of one more eager call of the host plan, with the settings of the
/// capture.
template <class Make>
void check_layerwise_graph(unsigned world_seed) {
  for (const int p : {2, 4}) {
    CAPTURE(p);
    // Settings A for calls 0 and 5, B for 1 to 4 (the graph holds B).
    auto settings = [](int k) { return settings_of(model_layers(), k == 0 || k == 5 ? 0 : 1); };
    using HP = cgx::layerwise_plan<float, gpu_test::thread_transport, LR>;
    const auto want = host_eager<HP>(
        p, model_n,
        [&](gpu_test::thread_transport x) { return std::make_unique<HP>(std::move(x), model_n, model_layers()); },
        [&](HP& plan, int k) { plan.set_settings(settings(k)); });
    sim::world w(world_seed + static_cast<unsigned>(p));
    sim::scope use(w);
    const Make make(p);
    std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p));
    std::vector<std::size_t> nodes(static_cast<std::size_t>(p));
    on_ranks(w, p, [&](int r) {
      cgx::layerwise_options o;
      o.check = cgx::checking::collective;
      cgx::layerwise_device_plan<float, typename Make::type, LR> plan{make.make(r), model_n, model_layers(), o};
      got[static_cast<std::size_t>(r)] =
          graph_scenario(r, model_n,
                         plan_calls{[&](float* d, cudaStream_t s) { plan(d, model_n, s); },
                                    [&](int k) { plan.set_settings(settings(k)); }},
                         &nodes[static_cast<std::size_t>(r)]);
      CHECK(plan.captured_calls() == 1);
      // The device advances the counter now: the host cannot set it.
      CHECK_THROWS_AS(plan.set_calls(0), cgx::error);
    });
    check_graph_results(w, got, want, nodes);
  }
}

#if CGX_SIM_NCCL
TEST_CASE("layerwise_device_plan over NCCL (simulated) in a CUDA graph: each launch gives the bits of one more eager "
          "call, with the settings of the capture") {
  check_layerwise_graph<over_nccl>(800);
}
#endif

TEST_CASE("layerwise_device_plan over CUDA IPC (simulated) in a CUDA graph: each launch gives the bits of one more "
          "eager call, with the settings of the capture") {
  check_layerwise_graph<over_ipc>(820);
}

#if CGX_SIM_NCCL
TEST_CASE("device reduce-scatter and allgather over NCCL (simulated) refuse a capturing stream, buffers untouched") {
  constexpr int p = 2;
  constexpr std::size_t n = 2000;
  sim::world w(91);
  sim::scope use(w);
  const over_nccl make(p);
  on_ranks(w, p, [&](int r) {
    cgx::device_reduce_scatter_plan<float, Q, sim_nccl> rs{make.make(r), n};
    check_capture_refused(n, r, [&](float* d, cudaStream_t s) { rs(d, n, s); }, "device_reduce_scatter_plan");
    cgx::device_allgather_plan<float, Q, sim_nccl> ag{make.make(r), n / p};
    check_capture_refused(n, r, [&](float* d, cudaStream_t s) { ag(d + static_cast<std::size_t>(r) * (n / p), n / p, d, s); },
                          "device_allgather_plan");
  });
  const auto v = w.violations();
  INFO("violations:\n" << joined(v));
  CHECK(v.empty());
}
#endif  // CGX_SIM_NCCL

TEST_CASE("device plans over a host transport (mpi_device's code) refuse a capturing stream with cgx::error, buffer "
          "untouched, on every rank") {
  for (const int p : {1, 2, 3}) {
    check_allreduce_refused(over_host(p, false), p, 63u + static_cast<unsigned>(p));
    check_allreduce_refused(over_host(p, true), p, 66u + static_cast<unsigned>(p));
  }
}

TEST_CASE("a rank that captures alone is refused, and its peer, not capturing, gets an error instead of a hang") {
  sim::world w(5);
  sim::scope use(w);
  constexpr int p = 2;
  constexpr std::size_t n = 3000;
  const over_host make(p, false);
  on_ranks(w, p, [&](int r) {
    cgx::plan_options o;
    o.native_below_bytes = 0;
    o.check = cgx::checking::collective;
    cgx::device_allreduce_plan<float, Q, cgx::comm::scatter_reduce_allgather, sim_host_device> plan{make.make(r), n,
                                                                                                   o};
    if (r == 0) {
      check_capture_refused(n, r, [&](float* d, cudaStream_t s) { plan(d, n, s); }, "capturing rank");
    } else {
      cudaStream_t s = sim::w().create_stream();
      void* mem = nullptr;
      REQUIRE(sim::runtime::malloc(&mem, n * sizeof(float)) == cudaSuccess);
      try {
        plan(static_cast<float*>(mem), n, s);
        FAIL("the peer of a refused rank went on");
      } catch (const cgx::error& e) {
        CHECK(e.code() == cgx::errc::invalid_argument);
        CHECK(std::string(e.what()).find("another rank") != std::string::npos);
      }
      REQUIRE(sim::runtime::free(mem) == cudaSuccess);
    }
  });
  CHECK(w.violations().empty());
}

TEST_CASE("sim capture model: a graph replays its nodes at each launch; what CUDA forbids during a capture is caught") {
  sim::world w(3);
  sim::scope use(w);
  on_ranks(w, 1, [&](int) {
    cudaStream_t s = sim::w().create_stream();
    void* mem = nullptr;
    REQUIRE(sim::runtime::malloc(&mem, sizeof(std::uint32_t)) == cudaSuccess);
    auto* word = static_cast<std::uint32_t*>(mem);
    static constexpr std::uint32_t zero = 0;
    sim::runtime::memcpy_async(word, &zero, sizeof zero, cudaMemcpyHostToDevice, s);
    // Three launches of a captured increment: three increments, none at capture.
    REQUIRE(sim::w().begin_capture(s) == cudaSuccess);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    REQUIRE(sim::runtime::stream_is_capturing(s, &st) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusActive);
    REQUIRE(sim::runtime::increment_u32(word, s) == cudaSuccess);
    cudaGraph_t g = nullptr;
    REQUIRE(sim::w().end_capture(s, &g) == cudaSuccess);
    cudaGraphExec_t x = nullptr;
    REQUIRE(sim::w().instantiate(&x, g) == cudaSuccess);
    std::uint32_t got = 99;
    sim::runtime::memcpy_async(&got, word, sizeof got, cudaMemcpyDeviceToHost, s);
    REQUIRE(sim::runtime::stream_synchronize(s) == cudaSuccess);
    CHECK(got == 0);
    for (int i = 0; i < 3; ++i) REQUIRE(sim::w().graph_launch(x, s) == cudaSuccess);
    sim::runtime::memcpy_async(&got, word, sizeof got, cudaMemcpyDeviceToHost, s);
    REQUIRE(sim::runtime::stream_synchronize(s) == cudaSuccess);
    CHECK(got == 3);
    CHECK(sim::w().violations().empty());

    cgx::comm::basic_cuda_event<sim::runtime> outside(cudaEventDisableTiming), inside(cudaEventDisableTiming);
    REQUIRE(sim::runtime::event_record(outside.get(), s) == cudaSuccess);
    // Each illegal call fails with CUDA's error, is reported, and invalidates the capture.
    auto illegal = [&](const char* what, auto&& call, cudaError_t want) {
      CAPTURE(what);
      const std::size_t before = sim::w().violations().size();
      REQUIRE(sim::w().begin_capture(s) == cudaSuccess);
      CHECK(call() == want);
      REQUIRE(sim::runtime::stream_is_capturing(s, &st) == cudaSuccess);
      CHECK(st == cudaStreamCaptureStatusInvalidated);
      cudaGraph_t bad = nullptr;
      CHECK(sim::w().end_capture(s, &bad) == cudaErrorStreamCaptureInvalidated);
      CHECK(bad == nullptr);
      CHECK(sim::w().violations().size() == before + 1);
    };
    void* p2 = nullptr;
    illegal("cudaMalloc", [&] { return sim::runtime::malloc(&p2, 64); }, cudaErrorStreamCaptureUnsupported);
    illegal("cudaFree", [&] { return sim::runtime::free(word); }, cudaErrorStreamCaptureUnsupported);
    illegal("cudaHostAlloc", [&] { return sim::runtime::host_alloc(&p2, 64); }, cudaErrorStreamCaptureUnsupported);
    illegal("cudaStreamSynchronize", [&] { return sim::runtime::stream_synchronize(s); },
            cudaErrorStreamCaptureUnsupported);
    illegal("a plain wait on an event recorded outside the capture",
            [&] { return sim::runtime::stream_wait_event(s, outside.get()); }, cudaErrorStreamCaptureIsolation);
    illegal("querying an event recorded inside the capture", [&] {
      (void)sim::runtime::event_record(inside.get(), s);
      return sim::runtime::event_query(inside.get());
    }, cudaErrorStreamCaptureUnsupported);
    illegal("a copy on the legacy stream",
            [&] { return sim::runtime::memcpy_async(word, &zero, sizeof zero, cudaMemcpyHostToDevice, nullptr); },
            cudaErrorStreamCaptureImplicit);
    // External record and wait nodes are legal, and run at each launch.
    REQUIRE(sim::w().begin_capture(s) == cudaSuccess);
    CHECK(sim::runtime::stream_wait_event_with_flags(s, outside.get(), cudaEventWaitExternal) == cudaSuccess);
    CHECK(sim::runtime::event_record_with_flags(outside.get(), s, cudaEventRecordExternal) == cudaSuccess);
    REQUIRE(sim::w().end_capture(s, &g) == cudaSuccess);
    CHECK(sim::w().graph_nodes(g) == 2);
    REQUIRE(sim::runtime::stream_synchronize(s) == cudaSuccess);
    REQUIRE(sim::runtime::free(word) == cudaSuccess);
  });
}
