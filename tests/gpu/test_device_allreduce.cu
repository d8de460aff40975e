// cgx::device_allreduce_plan on device buffers, over one transport chosen at compile
// time (CGX_TEST_TRANSPORT: 1 = comm::mpi, 2 = comm::cuda_ipc, 3 = comm::nccl). Run under
// mpiexec with 1..4 ranks; ranks share the node's GPUs (cudaSetDevice(rank % devices)),
// so on a single-GPU machine every rank uses GPU 0, which comm::mpi and comm::cuda_ipc
// allow and NCCL refuses (the nccl test skips when there are fewer GPUs than ranks).
//
// With CGX_TEST_FORK=1 (cuda_ipc only) the program needs no MPI at all: it forks its
// ranks itself (comm::run_forked) and cuda_ipc sets up over their comm::socket_bootstrap;
// `test_device_allreduce_cuda_ipc_fork NP` runs NP ranks, without an argument 2, 3 and 4
// one after the other. The supervising process never touches CUDA (CUDA does not survive
// fork); each rank initializes its own. The README example (it names MPI_COMM_WORLD) is
// left out there; everything else is the same.
//
// Checks, for every case and every one of several calls on one plan:
//  - every rank ends with the same bits (compared with rank 0's result);
//  - the error bound of the schedule (SRA: 2 quantizations on an element's path, ring:
//    p, tree: log2 q + 2 at most), against the exact sum in double (every rank generates
//    every rank's input, so it knows the exact sum);
//  - quant::none on integer-valued data is exact; so is the native path below the
//    threshold (MPI_Allreduce / ncclAllReduce);
//  - a host pointer or a count above max_count throws cgx::error on every rank.
// Exit 77 (CTest: skipped) without a CUDA device, before MPI starts.
#ifndef CGX_TEST_FORK
#define CGX_TEST_FORK 0
#endif
#if !CGX_TEST_FORK
#include <mpi.h>
#endif

#include "gpu_test.hpp"

#include <cgx/cgx.cuh>
#if CGX_TEST_TRANSPORT == 3
#include <cgx/comm/nccl.cuh>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace {

#if CGX_TEST_TRANSPORT == 1
using X = cgx::comm::mpi;
constexpr const char* transport_name = "mpi";
#elif CGX_TEST_TRANSPORT == 2
using X = cgx::comm::cuda_ipc;
constexpr const char* transport_name = "cuda_ipc";
#elif CGX_TEST_TRANSPORT == 3
using X = cgx::comm::nccl;
constexpr const char* transport_name = "nccl";
#else
#error "CGX_TEST_TRANSPORT must be 1 (mpi), 2 (cuda_ipc) or 3 (nccl)"
#endif
#if CGX_TEST_FORK && CGX_TEST_TRANSPORT != 2
#error "CGX_TEST_FORK needs CGX_TEST_TRANSPORT 2 (cuda_ipc): the other transports set up over MPI"
#endif

using R = cgx::comm::scatter_reduce_allgather;
using cgx::quant::nearest;
using cgx::quant::stochastic;

int rank_ = 0;
int size_ = 1;
cudaStream_t stream_ = nullptr;

#if CGX_TEST_FORK
cgx::comm::socket_bootstrap* boot_ = nullptr;  // this rank's, for the run of run_checks()
/// A transport over the ranks' bootstrap (a copy: one channel, calls in one order).
X make_transport() { return X{*boot_}; }
/// Rank 0's `bytes` bytes at p on every rank.
void bcast_from_0(void* p, std::size_t bytes) {
  std::vector<std::byte> all(bytes * static_cast<std::size_t>(size_));
  boot_->allgather(std::span<const std::byte>(static_cast<const std::byte*>(p), bytes), all);
  if (bytes != 0) std::memcpy(p, all.data(), bytes);
}
/// Element-wise sums of v over the ranks, in place.
void sum_all(std::span<int> v) {
  std::vector<int> all(v.size() * static_cast<std::size_t>(size_));
  boot_->allgather(std::as_bytes(std::span<const int>(v)), std::as_writable_bytes(std::span<int>(all)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = 0;
    for (int r = 0; r < size_; ++r) v[i] += all[static_cast<std::size_t>(r) * v.size() + i];
  }
}
#else
/// A transport over MPI_COMM_WORLD.
X make_transport() { return X{MPI_COMM_WORLD}; }
/// Rank 0's `bytes` bytes at p on every rank.
void bcast_from_0(void* p, std::size_t bytes) {
  if (bytes != 0) MPI_Bcast(p, static_cast<int>(bytes), MPI_BYTE, 0, MPI_COMM_WORLD);
}
/// Element-wise sums of v over the ranks, in place.
void sum_all(std::span<int> v) {
  MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_INT, MPI_SUM, MPI_COMM_WORLD);
}
#endif

/// A counter-based hash: input i of rank r for a given salt, identical on every rank.
std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Rank r's input value i: integers in [-8, 8] when `integers`, else values of varied
/// scale and offset per 256-value block (so buckets differ).
double input(int r, std::size_t i, std::uint64_t salt, bool integers) {
  const std::uint64_t h = mix(salt * 0x100000001B3ull + static_cast<std::uint64_t>(r) * 0x1000193ull + i);
  if (integers) return static_cast<double>(static_cast<int>(h % 17) - 8);
  const std::uint64_t b = mix(salt + static_cast<std::uint64_t>(r) * 7919 + i / 256);
  const double scale = std::ldexp(1.0, static_cast<int>(b % 9) - 4);
  const double offset = static_cast<double>(static_cast<int>((b >> 8) % 5) - 2) * scale;
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;
  return offset + scale * u;
}

template <class T>
std::vector<T> inputs(int r, std::size_t n, std::uint64_t salt, bool integers) {
  std::vector<T> x(n);
  for (std::size_t i = 0; i < n; ++i)
    x[i] = gpu_test::from_m<T>(static_cast<cgx::quant::meta_t<T>>(input(r, i, salt, integers)));
  return x;
}

std::string ctx(const std::string& what, std::size_t n, int call) {
  return std::string(transport_name) + " np" + std::to_string(size_) + " rank " + std::to_string(rank_) + ": " +
         what + " n=" + std::to_string(n) + " call " + std::to_string(call);
}

/// Every rank holds rank 0's bytes.
template <class T>
bool same_as_rank0(const std::vector<T>& got) {
  std::vector<T> zero(got);
  bcast_from_0(zero.data(), zero.size() * sizeof(T));
  return zero.empty() || std::memcmp(zero.data(), got.data(), got.size() * sizeof(T)) == 0;
}

/// Elements of `got` outside the bound of K quantizations (the generic bound of
/// tests/reducer_checks.hpp: each quantization of a partial sum adds at most c * its unit,
/// unit <= (sum of the ranks' bucket ranges + 2 err) / (2^bits - 1)), plus rounding.
template <class T, class Q>
std::size_t outside_bound(const std::vector<T>& got, const std::vector<std::vector<T>>& x, int K) {
  using M = cgx::quant::meta_t<T>;
  const std::size_t n = got.size();
  constexpr std::size_t B = Q::bucket_size;
  const double L = (1 << Q::bits) - 1;
  const double c = std::is_same_v<typename Q::rounding, nearest> ? 0.5 : 1.0;
  // Rounding of the stored type T (half types round every partial sum and the result).
  const double eps = std::is_same_v<T, __half> ? 0x1.0p-10 : std::is_same_v<T, __nv_bfloat16> ? 0x1.0p-7
                                                                                               : std::numeric_limits<M>::epsilon();
  std::size_t bad = 0;
  for (std::size_t b0 = 0; b0 < n; b0 += B) {
    const std::size_t b1 = std::min(n, b0 + B);
    double ranges = 0, mag = 0;
    for (const auto& xr : x) {
      double lo = INFINITY, hi = -INFINITY;
      for (std::size_t i = b0; i < b1; ++i) {
        const double v = static_cast<double>(gpu_test::to_m<T>(xr[i]));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      ranges += hi - lo;
      mag += std::max(std::fabs(lo), std::fabs(hi));
    }
    double err = 0;
    for (int k = 0; k < K; ++k) err += c * (ranges + 2 * err) / L;
    const double bound = err + 8.0 * (K + static_cast<int>(x.size())) * eps * (mag + err);
    for (std::size_t i = b0; i < b1; ++i) {
      double exact = 0;
      for (const auto& xr : x) exact += static_cast<double>(gpu_test::to_m<T>(xr[i]));
      if (!(std::fabs(static_cast<double>(gpu_test::to_m<T>(got[i])) - exact) <= bound)) ++bad;
    }
  }
  return bad;
}

/// Runs reductions of counts `ns` (one after the other) on one plan and checks each.
template <class T, class Q, class Red = R>
void check_plan(const char* name, std::size_t max_count, std::initializer_list<std::size_t> ns, bool integers,
                std::size_t native_below_bytes = 0) {
  cgx::plan_options opts;
  opts.native_below_bytes = native_below_bytes;
  opts.check = cgx::checking::collective;
  cgx::device_allreduce_plan<T, Q, Red, X> plan{make_transport(), max_count, opts};
  CHECK_MSG(plan.native_below_bytes() == native_below_bytes, std::string(name) + ": threshold not kept as given");
  gpu_test::dev_buf<T> d(max_count);
  int call = 0;
  for (std::size_t n : ns) {
    const std::uint64_t salt = 1000 + static_cast<std::uint64_t>(call) * 31 + n;
    std::vector<std::vector<T>> x;
    for (int r = 0; r < size_; ++r) x.push_back(inputs<T>(r, n, salt, integers));
    CUDA_OK(cudaMemcpyAsync(d.get(), x[static_cast<std::size_t>(rank_)].data(), n * sizeof(T), cudaMemcpyHostToDevice,
                            stream_));
    try {
      plan(d.get(), n, stream_);
    } catch (const cgx::error& e) {
      CHECK_MSG(false, ctx(name, n, call) + ": threw " + e.what());
      ++call;
      continue;
    }
    std::vector<T> got(n);
    if (n != 0) CUDA_OK(cudaMemcpyAsync(got.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    CHECK_MSG(same_as_rank0(got), ctx(name, n, call) + ": ranks differ");
    const bool lossless = Q::lossless || n * sizeof(T) < native_below_bytes;
    if (lossless && integers) {
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double exact = 0;
        for (const auto& xr : x) exact += static_cast<double>(gpu_test::to_m<T>(xr[i]));
        if (static_cast<double>(gpu_test::to_m<T>(got[i])) != exact) ++wrong;
      }
      CHECK_MSG(wrong == 0, ctx(name, n, call) + ": " + std::to_string(wrong) + " values differ from the exact sum");
    } else if constexpr (!Q::lossless) {
      const int K = Red::quantizations(size_);
      const std::size_t bad = outside_bound<T, Q>(got, x, K);
      CHECK_MSG(bad == 0, ctx(name, n, call) + ": " + std::to_string(bad) + " values outside the error bound");
    }
    ++call;
  }
}

/// device_reduce_scatter_plan and device_allgather_plan (issue 36, item 4) on the GPU:
/// the reduce-scatter leaves in each rank's chunk the bits device_allreduce_plan (SRA,
/// same seed and call counter) leaves there, and the rest of the buffer as it was; the
/// allgather gives every rank rank 0's bits, each block within one quantization of its
/// rank's input. Two calls each (the workspace halves), odd counts.
template <class T, class Q>
void check_collectives(const char* name, std::size_t max_count) {
  cgx::plan_options opts;
  opts.native_below_bytes = 0;
  cgx::device_allreduce_plan<T, Q, R, X> ar{make_transport(), max_count, opts};
  cgx::device_reduce_scatter_plan<T, Q, X> rs{make_transport(), max_count, opts};
  cgx::device_allgather_plan<T, Q, X> ag{make_transport(), max_count, opts};
  gpu_test::dev_buf<T> a(max_count), b(max_count), g(max_count * static_cast<std::size_t>(size_));
  int call = 0;
  for (const std::size_t n : {max_count, max_count / 3 + 1}) {
    const std::uint64_t salt = 5000 + static_cast<std::uint64_t>(call) * 17 + n;
    std::vector<std::vector<T>> x;
    for (int r = 0; r < size_; ++r) x.push_back(inputs<T>(r, n, salt, false));
    const auto& mine = x[static_cast<std::size_t>(rank_)];
    CUDA_OK(cudaMemcpyAsync(a.get(), mine.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream_));
    CUDA_OK(cudaMemcpyAsync(b.get(), mine.data(), n * sizeof(T), cudaMemcpyHostToDevice, stream_));
    std::vector<T> sum(n), part(n), all(n * static_cast<std::size_t>(size_));
    try {
      ar(a.get(), n, stream_);
      rs(b.get(), n, stream_);
      ag(a.get(), n, g.get(), stream_);  // gathers the allreduce's result, the same on every rank
    } catch (const cgx::error& e) {
      CHECK_MSG(false, ctx(name, n, call) + ": threw " + e.what());
      ++call;
      continue;
    }
    CUDA_OK(cudaMemcpyAsync(sum.data(), a.get(), n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaMemcpyAsync(part.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaMemcpyAsync(all.data(), g.get(), all.size() * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(stream_));
    const auto c = rs.my_chunk(n);
    std::size_t differ = 0, touched = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool in = i >= c.begin && i < c.begin + c.count;
      if (in && std::memcmp(&part[i], &sum[i], sizeof(T)) != 0) ++differ;
      if (!in && std::memcmp(&part[i], &mine[i], sizeof(T)) != 0) ++touched;
    }
    CHECK_MSG(differ == 0, ctx(name, n, call) + ": reduce-scatter: " + std::to_string(differ) +
                               " values of the chunk differ from the allreduce's");
    CHECK_MSG(touched == 0, ctx(name, n, call) + ": reduce-scatter: " + std::to_string(touched) +
                                " values outside the chunk changed");
    CHECK_MSG(same_as_rank0(all), ctx(name, n, call) + ": allgather: ranks differ");
    // Block r is rank r's allreduce result (the same on every rank) after one quantization.
    const std::vector<std::vector<T>> one{sum};
    for (int r = 0; r < size_; ++r) {
      const std::vector<T> block(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * n),
                                 all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * n));
      const std::size_t bad = outside_bound<T, Q>(block, one, 1);
      CHECK_MSG(bad == 0, ctx(name, n, call) + ": allgather: block " + std::to_string(r) + ": " + std::to_string(bad) +
                              " values outside one quantization");
    }
    ++call;
  }
}

#if !CGX_TEST_FORK
/// The example of docs/device.md (quoted verbatim: test doc_snippet.device), run and checked.
void readme_example(float* d_grad, std::size_t n, cudaStream_t stream) {
// [snippet:device]
  using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
  using R = cgx::comm::scatter_reduce_allgather;
  // X: cgx::comm::mpi, cgx::comm::cuda_ipc or cgx::comm::nccl; cudaSetDevice() first
  cgx::device_allreduce_plan<float, Q, R, X> plan{X{MPI_COMM_WORLD}, n};
  plan(d_grad, n, stream);  // compress, exchange, decode on the GPU; ready in stream order
// [snippet:device]
}

void check_readme_example() {
  const std::size_t n = 1 << 20;
  std::vector<std::vector<float>> x;
  for (int r = 0; r < size_; ++r) x.push_back(inputs<float>(r, n, 7, false));
  gpu_test::dev_buf<float> d(n);
  // On stream_ (non-blocking: it would not wait for a copy on the legacy stream).
  CUDA_OK(cudaMemcpyAsync(d.get(), x[static_cast<std::size_t>(rank_)].data(), n * sizeof(float),
                          cudaMemcpyHostToDevice, stream_));
  readme_example(d.get(), n, stream_);
  std::vector<float> got(n);
  CUDA_OK(cudaStreamSynchronize(stream_));
  d.download(got.data(), n);
  CHECK_MSG(same_as_rank0(got), ctx("readme example", n, 0) + ": ranks differ");
  const std::size_t bad = outside_bound<float, cgx::quant::maxmin<4, 1024, stochastic>>(
      got, x, cgx::comm::scatter_reduce_allgather::quantizations(size_));
  CHECK_MSG(bad == 0, ctx("readme example", n, 0) + ": " + std::to_string(bad) + " values outside the error bound");
}
#endif

/// CUDA graphs (issue 36, item 3). Over a transport that can be captured (cuda_ipc, nccl):
/// a call of plan G captured in a graph and launched `launches` times, then an eager call
/// of G, give the bits of the eager calls of a twin plan E (same options, same call
/// sequence, same inputs): the random keys advance on every launch, not frozen at
/// capture, and the eager calls after the launches continue the sequence. Over comm::mpi
/// the capture is refused with errc::invalid_argument on every rank, the buffer untouched.
template <class T, class Q>
void check_graph(const char* name, std::size_t n) {
  constexpr int launches = 3;
  cgx::plan_options opts;
  opts.native_below_bytes = 0;
  opts.check = cgx::checking::collective;
  cgx::device_allreduce_plan<T, Q, R, X> g{make_transport(), n, opts};
  cgx::device_allreduce_plan<T, Q, R, X> e{make_transport(), n, opts};
  gpu_test::dev_buf<T> a(n), b(n);
  cudaStream_t cs = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
  std::vector<std::vector<T>> in;
  for (int k = 0; k < launches + 2; ++k) in.push_back(inputs<T>(rank_, n, 9000 + static_cast<std::uint64_t>(k), false));
  std::vector<T> got(n), want(n);
  // Call k of both plans on input k; G's on stream cs (by `run`), E's on stream_.
  auto compare = [&](int k, const std::function<void()>& run) {
    CUDA_OK(cudaMemcpyAsync(a.get(), in[static_cast<std::size_t>(k)].data(), n * sizeof(T), cudaMemcpyHostToDevice, cs));
    run();
    CUDA_OK(cudaMemcpyAsync(got.data(), a.get(), n * sizeof(T), cudaMemcpyDeviceToHost, cs));
    CUDA_OK(cudaMemcpyAsync(b.get(), in[static_cast<std::size_t>(k)].data(), n * sizeof(T), cudaMemcpyHostToDevice,
                            stream_));
    e(b.get(), n, stream_);
    CUDA_OK(cudaMemcpyAsync(want.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost, stream_));
    CUDA_OK(cudaStreamSynchronize(cs));
    CUDA_OK(cudaStreamSynchronize(stream_));
    std::size_t differ = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) ++differ;
    CHECK_MSG(differ == 0, ctx(name, n, k) + ": " + std::to_string(differ) + " values differ from the eager call");
    CHECK_MSG(same_as_rank0(got), ctx(name, n, k) + ": ranks differ");
  };
  try {
    if constexpr (cgx::comm::graph_capture_v<cgx::comm::device_transport_t<X>>) {
      compare(0, [&] { g(a.get(), n, cs); });  // eager: call 0
      CUDA_OK(cudaStreamSynchronize(cs));
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
      g(a.get(), n, cs);  // captured as call 1
      CUDA_OK(cudaStreamEndCapture(cs, &graph));
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int k = 1; k <= launches; ++k) compare(k, [&] { CUDA_OK(cudaGraphLaunch(exec, cs)); });
      compare(launches + 1, [&] { g(a.get(), n, cs); });  // eager again: the call after the launches
      CHECK_MSG(g.captured_calls() == 1, ctx(name, n, 0) + ": captured_calls() != 1");
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
    } else {
      // The transport moves bytes on the host: refused before anything is enqueued.
      CUDA_OK(cudaMemcpyAsync(a.get(), in[0].data(), n * sizeof(T), cudaMemcpyHostToDevice, cs));
      CUDA_OK(cudaStreamSynchronize(cs));
      CUDA_OK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal));
      bool refused = false;
      try {
        g(a.get(), n, cs);
      } catch (const cgx::error& ex) {
        refused = ex.code() == cgx::errc::invalid_argument;
      }
      cudaGraph_t graph = nullptr;
      CUDA_OK(cudaStreamEndCapture(cs, &graph));
      if (graph != nullptr) CUDA_OK(cudaGraphDestroy(graph));
      CHECK_MSG(refused, ctx(name, n, 0) + ": a capture over a host-driven transport was not refused");
      CUDA_OK(cudaMemcpyAsync(got.data(), a.get(), n * sizeof(T), cudaMemcpyDeviceToHost, cs));
      CUDA_OK(cudaStreamSynchronize(cs));
      CHECK_MSG(std::memcmp(got.data(), in[0].data(), n * sizeof(T)) == 0, ctx(name, n, 0) + ": buffer touched");
    }
  } catch (const cgx::error& ex) {
    CHECK_MSG(false, ctx(name, n, 0) + ": threw " + ex.what());
  }
  CUDA_OK(cudaStreamDestroy(cs));
}

/// The default threshold of a device plan is 64 KiB on every device transport (none
/// has single_node(): the 16 MiB one-node pick of host plans was measured on host
/// buffers), also when the plan is given comm::mpi.
void check_default_threshold() {
  cgx::device_allreduce_plan<float, cgx::quant::none, R, X> plan{make_transport(), 16};
  CHECK_MSG(plan.native_below_bytes() == cgx::default_native_below_bytes,
            "default threshold of a device plan: " + std::to_string(plan.native_below_bytes()));
}

/// Bad arguments throw cgx::error on every rank, before any data moves.
void check_errors() {
  using Q = cgx::quant::maxmin<4, 256, nearest>;
  cgx::plan_options opts;
  opts.check = cgx::checking::collective;
  opts.native_below_bytes = 0;
  cgx::device_allreduce_plan<float, Q, R, X> plan{make_transport(), 4096, opts};
  std::vector<float> host(4096, 1.0f);
  // Rank 0 passes a host pointer; every rank must throw.
  gpu_test::dev_buf<float> d(4096);
  float* p = rank_ == 0 ? host.data() : d.get();
  bool threw = false;
  try {
    plan(p, 4096, stream_);
  } catch (const cgx::error& e) {
    threw = e.code() == cgx::errc::invalid_argument;
  }
  CHECK_MSG(threw, ctx("host pointer on rank 0", 4096, 0) + ": no invalid_argument");
  threw = false;
  try {
    plan(d.get(), 4097, stream_);
  } catch (const cgx::error& e) {
    threw = e.code() == cgx::errc::invalid_argument;
  }
  CHECK_MSG(threw, ctx("count above max_count", 4097, 0) + ": no invalid_argument");
  CHECK_MSG(std::all_of(host.begin(), host.end(), [](float v) { return v == 1.0f; }), "host buffer was touched");
}


/// Everything after the ranks exist and chose their GPU: the checks, then the totals.
/// Returns the rank's exit code (0 when every check on every rank passed).
int run_checks(int devices) {
  CUDA_OK(cudaSetDevice(rank_ % devices));
  CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  if (rank_ == 0) {
    cudaDeviceProp prop{};
    CUDA_OK(cudaGetDeviceProperties(&prop, rank_ % devices));
    std::printf("test_device_allreduce (%s%s): %d ranks on %d GPU(s), %s (sm_%d%d)\n", transport_name,
                CGX_TEST_FORK ? ", forked, no MPI" : "", size_, devices, prop.name, prop.major, prop.minor);
  }

  try {
    // Compressed paths (threshold 0: never native). Counts: several buckets per rank, a
    // partial last bucket, fewer buckets than ranks (empty chunks), nothing; then again.
    check_plan<float, cgx::quant::maxmin<4, 512, nearest>>("float 4-bit nearest", 300000,
                                                             {300000, 3 * 512 + 7, 1000, 0, 511, 300000}, false);
    check_plan<float, cgx::quant::maxmin<2, 1024, stochastic>>("float 2-bit stochastic", 1 << 18,
                                                                 {1 << 18, 12345, 1 << 18}, false);
    check_plan<float, cgx::quant::maxmin<8, 128, stochastic>>("float 8-bit stochastic", 70000, {70000, 70000}, false);
    check_plan<__half, cgx::quant::maxmin<4, 256, nearest>>("half 4-bit nearest", 100000, {100000, 777, 100000}, false);
    check_plan<__nv_bfloat16, cgx::quant::maxmin<4, 256, stochastic>>("bf16 4-bit stochastic", 50000, {50000, 50000},
                                                                        false);
    check_plan<double, cgx::quant::maxmin<6, 1024, nearest>>("double 6-bit nearest", 40000, {40000}, false);
    // Passthrough: exact on integer-valued data.
    check_plan<float, cgx::quant::none>("float none", 200000, {200000, 1001, 200000}, true);
    check_plan<__half, cgx::quant::none>("half none", 20000, {20000}, true);
    // Below the threshold: the transport's native allreduce where it has one (exact on
    // integers); cuda_ipc has none and compresses, so use none there too.
    check_plan<float, cgx::quant::none>("float native", 4096, {4096, 100}, true, std::size_t{64} << 10);
    // The ring schedule (p quantizations on the longest path).
    using ring = cgx::comm::ring;
    check_plan<float, cgx::quant::maxmin<4, 512, nearest>, ring>("ring float 4-bit nearest", 300000,
                                                                   {300000, 3 * 512 + 7, 0, 300000}, false);
    check_plan<__half, cgx::quant::maxmin<8, 256, stochastic>, ring>("ring half 8-bit stochastic", 60000,
                                                                       {60000, 60000}, false);
    check_plan<float, cgx::quant::none, ring>("ring float none", 100000, {100000, 999, 100000}, true);
    // The tree schedule (log2 q + 1 quantizations on the longest path, + 1 for a folded rank).
    using tree = cgx::comm::tree;
    check_plan<float, cgx::quant::maxmin<4, 512, nearest>, tree>("tree float 4-bit nearest", 300000,
                                                                   {300000, 3 * 512 + 7, 0, 300000}, false);
    check_plan<__half, cgx::quant::maxmin<8, 256, stochastic>, tree>("tree half 8-bit stochastic", 60000,
                                                                       {60000, 60000}, false);
    check_plan<float, cgx::quant::none, tree>("tree float none", 100000, {100000, 999, 100000}, true);
    check_collectives<float, cgx::quant::maxmin<4, 512, stochastic>>("collectives float 4-bit", 100003);
    check_collectives<__half, cgx::quant::maxmin<8, 256, stochastic>>("collectives half 8-bit", 30001);
    check_collectives<__nv_bfloat16, cgx::quant::maxmin<4, 256, nearest>>("collectives bf16 4-bit", 30001);
    check_graph<float, cgx::quant::maxmin<4, 512, stochastic>>("graph float 4-bit stochastic", 100003);
    check_graph<__half, cgx::quant::maxmin<2, 256, stochastic>>("graph half 2-bit stochastic", 30001);
    check_errors();
    check_default_threshold();
#if !CGX_TEST_FORK
    check_readme_example();
#endif
  } catch (const std::exception& ex) {
    CHECK_MSG(false, std::string("exception: ") + ex.what());
  }

  CUDA_OK(cudaStreamDestroy(stream_));
  int counts[2] = {gpu_test::failures, gpu_test::checks};
  sum_all(counts);
  if (rank_ == 0) std::printf("test_device_allreduce (%s): %d checks on all ranks, %d failed\n", transport_name,
                              counts[1], counts[0]);
  return counts[0] == 0 && counts[1] > 0 ? 0 : 1;
}

}  // namespace

#if CGX_TEST_FORK
int main(int argc, char** argv) {
  std::vector<int> nps = {2, 3, 4};
  if (argc > 1) nps = {std::atoi(argv[1])};
  int result = 0;
  for (int np : nps) {
    if (np < 1) {
      std::printf("usage: %s [NP >= 1]\n", argv[0]);
      return 2;
    }
    // Bootstrap waits are bounded (a dead rank fails the others at once, a hung one
    // within a minute); the whole run is killed after 280 s (CTest allows 300).
    const auto res = cgx::comm::run_forked(
        np,
        [](cgx::comm::socket_bootstrap& b) {
          boot_ = &b;
          rank_ = b.rank();
          size_ = b.size();
          // In the rank, not in the supervisor: CUDA is first touched after the fork.
          const int devices = gpu_test::device_count("test_device_allreduce (cuda_ipc, forked)");
          if (devices == 0) return 77;
          return run_checks(devices);
        },
        cgx::comm::fork_options{std::chrono::seconds(60), std::chrono::seconds(280)});
    std::printf("test_device_allreduce (cuda_ipc, forked) np%d: exit codes", np);
    for (int c : res.codes) std::printf(" %d", c);
    std::printf("\n");
    const int code = res.code();
    if (code == 77 && nps.size() > 1) return 77;  // no device: every rank skipped
    if (code != 0 && result == 0) result = code;
  }
  return result;
}
#else
int main(int argc, char** argv) {
  // Decide about the device before MPI starts: every rank of a node sees the same.
  const std::string name = std::string("test_device_allreduce (") + transport_name + ")";
  const int devices = gpu_test::device_count(name.c_str());
  if (devices == 0) return 77;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
#if CGX_TEST_TRANSPORT == 3
  if (devices < size_) {
    if (rank_ == 0)
      std::printf("test_device_allreduce (nccl): %d ranks but %d GPU(s); NCCL needs one GPU per rank: skipped\n", size_,
                  devices);
    MPI_Finalize();
    return 77;
  }
#endif
  const int rc = run_checks(devices);
  MPI_Finalize();
  return rc;
}
#endif
