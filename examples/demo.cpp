// The cgx demo: an allreduce of gradient-like fp32 buffers (64 MiB per rank by
// default), MPI_Allreduce against cgx at 8, 4 and 2 bits (bucket 1024) and the
// uncompressed passthrough, timed in the same run, in the columns of nccl-tests.
// The cgx rows always run the compressed schedule, whatever --mib says: the plans set
// plan_options::native_below_bytes = 0, where the library's default would hand a small
// buffer (below 16 MiB when all ranks share one node, 64 KiB otherwise) to
// MPI_Allreduce and the rows would compare MPI_Allreduce with itself.
//
// Each cgx row also gives its roofline (cgx/model.hpp, docs/benchmarks.md): the memory
// floor at the copy bandwidth measured at the start of the run, the wire time when
// $CGX_LINK names a rate (bench/netns-run sets it), and time / the larger (x_roof).
//
//   mpirun -np 4 ./demo [--mib 64] [--iters 5] [--warmup 1] [--json out.json]
#include <cgx/cgx.hpp>
#include <cgx/model.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

using Q4 = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;  // bits, bucket, rounding
using SRA = cgx::comm::scatter_reduce_allgather;
using plan4 = cgx::allreduce_plan<float, Q4, SRA, cgx::comm::mpi>;

struct options {
  double mib = 64;
  int iters = 5;
  int warmup = 1;
  std::string json;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "demo: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mib") o.mib = std::atof(next());
    else if (a == "--iters") o.iters = std::atoi(next());
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--json") o.json = next();
    else if (a == "--help" || a == "-h") {
      std::printf("usage: demo [--mib MiB per rank, default 64] [--iters 5] [--warmup 1] [--json FILE]\n");
      std::exit(0);
    } else {
      std::fprintf(stderr, "demo: unknown argument %s (try --help)\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.mib <= 0 || o.iters < 1 || o.warmup < 0) {
    std::fprintf(stderr, "demo: --mib must be > 0, --iters >= 1, --warmup >= 0\n");
    std::exit(2);
  }
  return o;
}

// Gradient-like data: roughly normal, with per-layer scales that vary by orders of
// magnitude and a few outliers, different on every rank.
void fill(std::vector<float>& x, int rank) {
  std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<double>(s >> 11) * 0x1p-53;
  };
  const std::size_t layer = 1 << 18;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double scale = std::pow(10.0, -3.0 + static_cast<double>((i / layer) % 4));
    const double g = (next() + next() + next() + next() - 2.0) * 1.7;  // ~N(0,1)
    x[i] = static_cast<float>(scale * (next() < 1e-4 ? 20 * g : g));
  }
}

struct row {
  std::string name;
  int bits;
  std::function<void(float*, std::size_t)> run;
  std::vector<double> times;
  double max_abs = 0, rel_l2 = 0, ratio = 1;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const options o = parse(argc, argv);
  const auto n = static_cast<std::size_t>(o.mib * 1024 * 1024 / sizeof(float));

  std::vector<float> input(n), work(n);
  fill(input, rank);
  // Exact reference: the fp64 sum of the fp32 inputs (exact for up to 2^29 ranks).
  std::vector<double> exact(input.begin(), input.end());
  MPI_Allreduce(MPI_IN_PLACE, exact.data(), static_cast<int>(n), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

  // The copy bandwidth every rank sees while all copy at once (the slowest rank's), and
  // the link's rate when bench/netns-run names it: the roofline of the cgx rows.
  double copy_bps = cgx::model::copy_bandwidth(std::size_t{64} << 20, [] { MPI_Barrier(MPI_COMM_WORLD); });
  MPI_Allreduce(MPI_IN_PLACE, &copy_bps, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  const char* link = std::getenv("CGX_LINK");
  const double link_bps = cgx::model::link_rate_bps(link ? link : "");

  {
    using none = cgx::quant::none;
    using Q8 = cgx::quant::maxmin<8, 1024, cgx::quant::stochastic>;
    using Q2 = cgx::quant::maxmin<2, 1024, cgx::quant::stochastic>;
    cgx::plan_options compress;
    compress.native_below_bytes = 0;  // show the compressed numbers at every size (see the file comment)
    cgx::allreduce_plan<float, none, SRA, cgx::comm::mpi> p32{cgx::comm::mpi{MPI_COMM_WORLD}, n, compress};
    cgx::allreduce_plan<float, Q8, SRA, cgx::comm::mpi> p8{cgx::comm::mpi{MPI_COMM_WORLD}, n, compress};
    plan4 p4{cgx::comm::mpi{MPI_COMM_WORLD}, n, compress};
    cgx::allreduce_plan<float, Q2, SRA, cgx::comm::mpi> p2{cgx::comm::mpi{MPI_COMM_WORLD}, n, compress};

    std::vector<row> rows;
    rows.push_back({"MPI_Allreduce", 32, [](float* b, std::size_t c) {
                      MPI_Allreduce(MPI_IN_PLACE, b, static_cast<int>(c), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
                    }, {}});
    rows.push_back({"cgx none", 32, [&](float* b, std::size_t c) { p32(b, c); }, {}});
    rows.push_back({"cgx 8-bit", 8, [&](float* b, std::size_t c) { p8(b, c); }, {}});
    rows.push_back({"cgx 4-bit", 4, [&](float* b, std::size_t c) { p4(b, c); }, {}});
    rows.push_back({"cgx 2-bit", 2, [&](float* b, std::size_t c) { p2(b, c); }, {}});

    // Interleave the methods so that each sees the same machine noise.
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      for (auto& r : rows) {
        std::copy(input.begin(), input.end(), work.begin());
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        r.run(work.data(), n);
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (it >= o.warmup) r.times.push_back(t);
        if (it == o.warmup + o.iters - 1) {
          double mx = 0, num = 0, den = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const double e = static_cast<double>(work[i]) - exact[i];
            mx = std::max(mx, std::fabs(e));
            num += e * e;
            den += exact[i] * exact[i];
          }
          r.max_abs = mx;
          r.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
        }
      }
    }

    if (rank == 0) {
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      const double bytes = static_cast<double>(n) * sizeof(float);
      const double base = median(rows[0].times);
      std::printf("# cgx demo: allreduce (sum) of %zu fp32 values (%.1f MiB) per rank on %d ranks, "
                  "SRA, bucket 1024, stochastic rounding\n",
                  n, bytes / 1048576.0, p);
      std::printf("# median of %d iterations (after %d warm-up), max over ranks; busbw = algbw * 2(p-1)/p on the "
                  "uncompressed size; errors against the exact fp64 sum\n",
                  o.iters, o.warmup);
      std::printf("# cgx rows always run the compressed schedule (plan_options::native_below_bytes = 0), at "
                  "every size; host kernels: %s (picked at run time from this CPU)\n",
                  cgx::quant::to_string(cgx::quant::active_host_isa()));
      std::printf("# roofline of the cgx rows: copy bandwidth %.2f GB/s per rank (read + written, all ranks at "
                  "once, measured now); link %s\n",
                  copy_bps / 1e9, link_bps > 0 ? link : "rate unknown (no wire time; set CGX_LINK, e.g. tcp-10gbit)");
      std::printf("%-14s %12s %10s %5s | %10s %9s %9s | %8s %5s %7s | %11s %11s | %9s %9s %7s\n", "method", "size(B)",
                  "count", "type", "time(ms)", "algbw", "busbw", "speedup", "bits", "ratio", "max_abs_err", "rel_l2",
                  "floor(ms)", "wire(ms)", "x_roof");
      std::printf("%-14s %12s %10s %5s | %10s %9s %9s | %8s %5s %7s | %11s %11s | %9s %9s %7s\n", "", "", "", "", "",
                  "(GB/s)", "(GB/s)", "vs MPI", "", "", "", "", "", "", "");
      FILE* js = o.json.empty() ? nullptr : std::fopen(o.json.c_str(), "w");
      if (js) std::fprintf(js, "[\n");
      for (std::size_t k = 0; k < rows.size(); ++k) {
        auto& r = rows[k];
        const double t = median(r.times);
        const double algbw = bytes / t / 1e9;
        const double busbw = algbw * 2.0 * (p - 1) / p;
        std::size_t wire = n * sizeof(float);
        if (r.bits == 8) wire = cgx::quant::maxmin<8, 1024>::compressed_bytes<float>(n);
        if (r.bits == 4) wire = Q4::compressed_bytes<float>(n);
        if (r.bits == 2) wire = cgx::quant::maxmin<2, 1024>::compressed_bytes<float>(n);
        r.ratio = bytes / static_cast<double>(wire);
        const bool cgx_row = k > 0;  // row 0 is MPI_Allreduce itself
        const cgx::model::roofline f = cgx::model::allreduce_roofline(n, sizeof(float), wire, p, copy_bps, link_bps);
        char fl[32] = "-", wi[32] = "-", xr[32] = "-", roof_js[160] = "";
        if (cgx_row) {
          std::snprintf(fl, sizeof fl, "%.2f", f.mem_s * 1e3);
          if (f.wire_s > 0) std::snprintf(wi, sizeof wi, "%.2f", f.wire_s * 1e3);
          std::snprintf(xr, sizeof xr, "%.2fx", t / f.bound_s());
          char wire_js[32] = "null";
          if (f.wire_s > 0) std::snprintf(wire_js, sizeof wire_js, "%.6e", f.wire_s);
          std::snprintf(roof_js, sizeof roof_js, ", \"copy_bw_gbps\": %.4f, \"mem_floor_s\": %.6e, \"wire_s\": %s, "
                        "\"x_roof\": %.4f", copy_bps / 1e9, f.mem_s, wire_js, t / f.bound_s());
        }
        std::printf("%-14s %12.0f %10zu %5s | %10.2f %9.2f %9.2f | %7.2fx %5d %6.2fx | %11.3e %11.3e | %9s %9s %7s\n",
                    r.name.c_str(), bytes, n, "float", t * 1e3, algbw, busbw, base / t, r.bits, r.ratio, r.max_abs,
                    r.rel_l2, fl, wi, xr);
        if (js)
          std::fprintf(js,
                       "  {\"method\": \"%s\", \"ranks\": %d, \"bytes\": %.0f, \"count\": %zu, \"type\": \"float\", "
                       "\"bits\": %d, \"bucket\": 1024, \"time_s\": %.6e, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
                       "\"baseline_time_s\": %.6e, \"speedup\": %.4f, \"ratio\": %.4f, \"max_abs_err\": %.6e, "
                       "\"rel_l2\": %.6e%s}%s\n",
                       r.name.c_str(), p, bytes, n, r.bits, t, algbw, busbw, base, base / t, r.ratio, r.max_abs,
                       r.rel_l2, roof_js, k + 1 < rows.size() ? "," : "");
      }
      if (js) {
        std::fprintf(js, "]\n");
        std::fclose(js);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
