// GPU quantizer benchmark: cgx::quant::device<maxmin<Bits, 1024, R>> against streaming
// kernels measured in the same run on the same buffers.
//
//   compress        input bytes / s              vs  read:  a streaming read of the input
//   decompress      output (uncompressed) B / s  vs  write: a streaming store of the output
//   decompress_add  output (uncompressed) B / s  vs  axpy:  y += x over the same n and type
//
// ratio = gbps / baseline_gbps (both count the same uncompressed bytes, so the ratio is
// the baseline's time over ours). Times: cudaEvent around one call, best of --reps after
// two warm-up calls. Usage: quant_bench [--mib 256] [--reps 20] [--json FILE]
// Exits 77 when no CUDA device is present.
#include <cgx/quant.cuh>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace {

#define BENCH_CUDA(call)                                                                                     \
  do {                                                                                                       \
    const cudaError_t bench_e_ = (call);                                                                     \
    if (bench_e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(bench_e_));     \
      std::exit(1);                                                                                          \
    }                                                                                                        \
  } while (0)

struct record {
  std::string op, rounding, dtype, baseline;
  int bits;
  std::size_t bucket;
  double gbps, baseline_gbps;
};

// ---- baselines: 16-byte vector loads/stores, grid-stride ------------------------------

__global__ void read_kernel(const uint4* __restrict__ x, std::size_t n16, unsigned* sink) {
  unsigned acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = x[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; practically never stores
}

__global__ void write_kernel(uint4* __restrict__ y, std::size_t n16) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    y[i] = make_uint4(0x3f800000u, 0x3f800000u, 0x3f800000u, 0x3f800000u);
  }
}

/// y += x for T = float or bf16 (fp32 accumulation), 16 bytes per thread and step.
template <class T>
__global__ void axpy_kernel(const uint4* __restrict__ x, uint4* __restrict__ y, std::size_t n16) {
  constexpr int L = 16 / sizeof(T);
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    uint4 a = x[i], b = y[i];
    T xa[L], yb[L];
    std::memcpy(xa, &a, 16);
    std::memcpy(yb, &b, 16);
#pragma unroll
    for (int l = 0; l < L; ++l) {
      if constexpr (std::is_same_v<T, float>) {
        yb[l] = yb[l] + xa[l];
      } else {
        yb[l] = __float2bfloat16_rn(__bfloat162float(yb[l]) + __bfloat162float(xa[l]));
      }
    }
    std::memcpy(&b, yb, 16);
    y[i] = b;
  }
}

/// Deterministic pseudo-random input: per-1024-value scale changes, values in [-s, s].
template <class T>
__global__ void fill_kernel(T* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E3779B1u;
    h ^= h >> 15;
    h *= 0x85EBCA77u;
    h ^= h >> 13;
    const float u = static_cast<float>(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
    const float s = 1.0f + static_cast<float>((i >> 10) % 16);
    if constexpr (std::is_same_v<T, float>) {
      x[i] = u * s;
    } else {
      x[i] = __float2bfloat16_rn(u * s);
    }
  }
}

unsigned stream_grid() {
  int dev = 0, sms = 0;
  BENCH_CUDA(cudaGetDevice(&dev));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return static_cast<unsigned>(sms) * 8;  // 8 blocks of 256 threads per SM: full occupancy
}

/// Best time in seconds of f() over reps runs, after two warm-up runs.
template <class F>
double best_of(int reps, F&& f) {
  cudaEvent_t a, b;
  BENCH_CUDA(cudaEventCreate(&a));
  BENCH_CUDA(cudaEventCreate(&b));
  f();
  f();
  BENCH_CUDA(cudaDeviceSynchronize());
  float best = 1e30f;
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventRecord(a));
    f();
    BENCH_CUDA(cudaEventRecord(b));
    BENCH_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
    if (ms < best) best = ms;
  }
  BENCH_CUDA(cudaEventDestroy(a));
  BENCH_CUDA(cudaEventDestroy(b));
  return best * 1e-3;
}

template <class T>
const char* dtype_name() {
  return std::is_same_v<T, float> ? "fp32" : "bf16";
}

template <class T>
void run_type(std::size_t bytes, int reps, std::vector<record>& out) {
  constexpr std::size_t B = 1024;
  const std::size_t n = bytes / sizeof(T), n16 = bytes / 16;
  const double gb = static_cast<double>(bytes) * 1e-9;
  T *x = nullptr, *y = nullptr;
  std::byte* wire = nullptr;
  unsigned* sink = nullptr;
  BENCH_CUDA(cudaMalloc(&x, bytes));
  BENCH_CUDA(cudaMalloc(&y, bytes));
  BENCH_CUDA(cudaMalloc(&wire, cgx::quant::device<cgx::quant::maxmin<8, B>>::compressed_bytes<T>(n)));
  BENCH_CUDA(cudaMalloc(&sink, sizeof(unsigned)));
  fill_kernel<T><<<stream_grid(), 256>>>(x, n);
  fill_kernel<T><<<stream_grid(), 256>>>(y, n);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaDeviceSynchronize());

  const unsigned grid = stream_grid();
  const double t_read = best_of(reps, [&] { read_kernel<<<grid, 256>>>(reinterpret_cast<const uint4*>(x), n16, sink); });
  const double t_write = best_of(reps, [&] { write_kernel<<<grid, 256>>>(reinterpret_cast<uint4*>(y), n16); });
  const double t_axpy = best_of(reps, [&] {
    axpy_kernel<T><<<grid, 256>>>(reinterpret_cast<const uint4*>(x), reinterpret_cast<uint4*>(y), n16);
  });
  BENCH_CUDA(cudaGetLastError());
  fill_kernel<T><<<grid, 256>>>(y, n);  // y stays finite for decompress_add

  cgx::quant::rng_state rng;
  rng.seed = 12345;
  auto one = [&]<int Bits>(std::integral_constant<int, Bits>) {
    auto comp = [&]<class R>(R, const char* rname) {
      using D = cgx::quant::device<cgx::quant::maxmin<Bits, B, R>>;
      const double t = best_of(reps, [&] { D::compress(x, n, wire, rng, nullptr); });
      out.push_back({"compress", rname, dtype_name<T>(), "read", Bits, B, gb / t, gb / t_read});
    };
    comp(cgx::quant::nearest{}, "nearest");
    comp(cgx::quant::stochastic{}, "stochastic");
    using D = cgx::quant::device<cgx::quant::maxmin<Bits, B, cgx::quant::stochastic>>;
    D::compress(x, n, wire, rng, nullptr);
    const double td = best_of(reps, [&] { D::decompress(wire, n, y, nullptr); });
    out.push_back({"decompress", "-", dtype_name<T>(), "write", Bits, B, gb / td, gb / t_write});
    const double ta = best_of(reps, [&] { D::decompress_add(wire, n, y, nullptr); });
    out.push_back({"decompress_add", "-", dtype_name<T>(), "axpy", Bits, B, gb / ta, gb / t_axpy});
  };
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (one(std::integral_constant<int, I + 1>{}), ...);
  }(std::make_integer_sequence<int, 8>{});
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaFree(x));
  BENCH_CUDA(cudaFree(y));
  BENCH_CUDA(cudaFree(wire));
  BENCH_CUDA(cudaFree(sink));
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 256;
  int reps = 20;
  const char* json = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--mib 256] [--reps 20] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("quant_bench: no CUDA device: skipped\n");
    return 77;
  }
  if (mib == 0 || reps < 1) {
    std::fprintf(stderr, "quant_bench: --mib and --reps must be positive\n");
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# device: %s (sm_%d%d), %zu MiB per buffer, best of %d\n", prop.name, prop.major, prop.minor, mib, reps);

  std::vector<record> recs;
  const std::size_t bytes = mib << 20;
  run_type<float>(bytes, reps, recs);
  run_type<__nv_bfloat16>(bytes, reps, recs);

  std::printf("%-15s %5s %4s %6s %-10s %10s %8s %14s %7s\n", "op", "dtype", "bits", "bucket", "rounding", "GB/s",
              "baseline", "baseline GB/s", "ratio");
  for (const auto& r : recs) {
    std::printf("%-15s %5s %4d %6zu %-10s %10.1f %8s %14.1f %7.3f\n", r.op.c_str(), r.dtype.c_str(), r.bits, r.bucket,
                r.rounding.c_str(), r.gbps, r.baseline.c_str(), r.baseline_gbps, r.gbps / r.baseline_gbps);
  }
  if (json != nullptr) {
    std::FILE* f = std::fopen(json, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "quant_bench: cannot write %s\n", json);
      return 1;
    }
    std::fprintf(f, "[\n");
    for (std::size_t i = 0; i < recs.size(); ++i) {
      const auto& r = recs[i];
      std::fprintf(f,
                   "  {\"op\": \"%s\", \"bits\": %d, \"bucket\": %zu, \"rounding\": \"%s\", \"dtype\": \"%s\", "
                   "\"gbps\": %.3f, \"baseline\": \"%s\", \"baseline_gbps\": %.3f, \"ratio\": %.4f, "
                   "\"device\": \"%s\", \"mib\": %zu}%s\n",
                   r.op.c_str(), r.bits, r.bucket, r.rounding.c_str(), r.dtype.c_str(), r.gbps, r.baseline.c_str(),
                   r.baseline_gbps, r.gbps / r.baseline_gbps, prop.name, mib, i + 1 < recs.size() ? "," : "");
    }
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  return 0;
}
