// layerwise_device_plan on 3 thread-"ranks" sharing device 0 (thread_transport: no MPI
// needed): mixed bits, uncompressed small and one-dimensional layers, a gap, a settings
// change between calls; results identical on every rank, uncompressed layers exact,
// compressed ones within the SRA bound and close to the host plan's; bad input throws
// on every rank. Exits 77 without a CUDA device.
#include "gpu_test.hpp"
#include "thread_transport.hpp"

#include <cgx/layerwise_plan.cuh>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace {

using cgx::layer;
using cgx::layer_setting;
using gpu_test::thread_transport;

constexpr int ranks = 3;
constexpr std::size_t n = 14600;

std::vector<layer> model_layers() {
  return {{0, 5000, false},    {5000, 100, true},  {5100, 700, false},   {9000, 3001, false},
          {5800, 3000, false}, {12001, 1, true},  {12100, 2500, false}};
}

std::vector<layer_setting> mixed(const std::vector<layer>& ls) {
  auto s = cgx::default_settings(ls);
  s[0] = {2, 128};
  s[3] = {8, 512};
  s[4] = {4, 1024};
  s[6] = {1, 512};
  return s;
}

// Integer-valued inputs in [-1000, 1000]: uncompressed layers sum exactly.
float input(int r, std::size_t i) {
  std::uint64_t z = i * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(r) * 0xbf58476d1ce4e5b9ull + 1;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
  z ^= z >> 29;
  return static_cast<float>(static_cast<int>(z % 2001) - 1000);
}

struct rank_result {
  std::vector<float> dev[2], host[2];
  bool threw_on_null = false;
  std::string failure;
};

void run_rank(std::shared_ptr<gpu_test::thread_group> g, int r, rank_result& out) {
  try {
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t st;
    CUDA_OK(cudaStreamCreate(&st));
    const auto ls = model_layers();
    const cgx::layerwise_options o{.check = cgx::checking::collective};
    cgx::layerwise_device_plan<float, thread_transport, cgx::quant::nearest> dplan{thread_transport(g, r), n, ls, o};
    cgx::layerwise_plan<float, thread_transport, cgx::quant::nearest> hplan{thread_transport(g, r), n, ls, o};
    auto s = mixed(ls);
    std::vector<float> x(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = input(r, i);
    gpu_test::dev_buf<float> d(n);
    for (int call = 0; call < 2; ++call) {
      dplan.set_settings(s);
      hplan.set_settings(s);
      d.upload(x.data(), n);
      dplan(d.get(), n, st);
      out.dev[call].resize(n);
      d.download(out.dev[call].data(), n);
      out.host[call] = x;
      hplan(out.host[call].data(), n);
      s[0].bits = 3;  // the second call: another width for layer 0, same workspace
    }
    try {
      dplan(nullptr, n, st);
    } catch (const cgx::error&) {
      out.threw_on_null = true;
    }
    CUDA_OK(cudaStreamDestroy(st));
  } catch (const std::exception& e) {
    out.failure = e.what();
  }
}

}  // namespace

int main() {
  gpu_test::require_device("test_layerwise_device");
  auto g = std::make_shared<gpu_test::thread_group>(ranks);
  std::vector<rank_result> res(ranks);
  std::vector<std::thread> th;
  for (int r = 0; r < ranks; ++r) th.emplace_back(run_rank, g, r, std::ref(res[r]));
  for (auto& t : th) t.join();
  for (int r = 0; r < ranks; ++r) CHECK_MSG(res[r].failure.empty(), "rank " + std::to_string(r) + ": " + res[r].failure);
  for (int r = 0; r < ranks; ++r) CHECK_MSG(res[r].threw_on_null, "rank " + std::to_string(r) + " did not throw");
  if (gpu_test::failures != 0) return gpu_test::finish("test_layerwise_device");

  const auto ls = model_layers();
  std::vector<double> exact(n, 0.0);
  for (int r = 0; r < ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) exact[i] += input(r, i);
  for (int call = 0; call < 2; ++call) {
    auto s = mixed(ls);
    if (call == 1) s[0].bits = 3;
    std::size_t differ_ranks = 0, raw_wrong = 0, outside = 0, far_from_host = 0, same_as_host = 0, values = 0;
    std::vector<bool> in_layer(n, false);
    for (std::size_t l = 0; l < ls.size(); ++l) {
      // Loose SRA bound from the inputs' range (2000 per rank): sum_r u_r / 2 + u_s / 2.
      const double lv = s[l].bits == 0 ? 0 : std::ldexp(1.0, s[l].bits) - 1;
      const double ur = lv > 0 ? 2000.0 / lv : 0.0;
      const double us = lv > 0 ? (2000.0 * ranks + ranks * ur) / lv : 0.0;
      const double bound = ranks * ur / 2 + us / 2 + 1e-3;
      for (std::size_t i = ls[l].offset; i < ls[l].offset + ls[l].count; ++i) {
        in_layer[i] = true;
        ++values;
        const float v = res[0].dev[call][i];
        for (int r = 1; r < ranks; ++r) differ_ranks += !gpu_test::same_bits(res[r].dev[call][i], v);
        if (s[l].bits == 0) {
          raw_wrong += double(v) != exact[i];
          continue;
        }
        outside += std::abs(double(v) - exact[i]) > bound;
        far_from_host += std::abs(double(v) - double(res[0].host[call][i])) > 2 * bound;
        same_as_host += gpu_test::same_bits(v, res[0].host[call][i]);
      }
    }
    std::size_t gap_touched = 0;
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < n; ++i)
        if (!in_layer[i]) gap_touched += res[r].dev[call][i] != input(r, i);
    const std::string ctx = " (call " + std::to_string(call) + ")";
    CHECK_MSG(differ_ranks == 0, std::to_string(differ_ranks) + " values differ between ranks" + ctx);
    CHECK_MSG(raw_wrong == 0, std::to_string(raw_wrong) + " uncompressed values differ from the exact sum" + ctx);
    CHECK_MSG(outside == 0, std::to_string(outside) + " values outside the SRA bound" + ctx);
    CHECK_MSG(far_from_host == 0, std::to_string(far_from_host) + " values far from the host plan's" + ctx);
    CHECK_MSG(gap_touched == 0, std::to_string(gap_touched) + " values outside every layer changed" + ctx);
    std::printf("call %d: %zu of %zu layer values bit-identical to the host plan's (FMA in device decodes may differ)\n",
                call, same_as_host, values);
  }
  return gpu_test::finish("test_layerwise_device");
}
