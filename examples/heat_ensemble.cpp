// An ensemble of 2-D heat simulations whose fields are averaged through cgx's
// error-bounded allreduce. Every rank runs one ensemble member: an n x n grid of
// doubles, heated by a few hot spots of its own, cooled at the border, integrated with
// the explicit 5-point stencil. Every `every` steps the members' fields are summed over
// the ensemble (cgx::error_bounded_plan, SRA over MPI) and each member relaxes towards
// the ensemble mean, so the reduced field feeds back into the simulation.
//
// For each bound (relative to the range of the ensemble sum: 1e-2 .. 1e-6) the run
// starts from the same initial state and compares every reduction with an uncompressed
// MPI_Allreduce of the same fields. It prints the bound asked for, the worst error seen
// on any element of any rank, the bytes cgx put on the wire (all ranks, with the length
// headers) against the bytes the same schedule sends uncompressed, and the time of the
// cgx reductions and of the MPI_Allreduce ones, measured in the same run.
//
//   mpirun -np 4 ./heat_ensemble [--n 512] [--steps 200] [--every 20]
#include <cgx/cgx.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

using Q = cgx::quant::error_bounded<1024>;
using SRA = cgx::comm::scatter_reduce_allgather;
using plan_type = cgx::error_bounded_plan<double, Q, SRA, cgx::comm::mpi>;

struct options {
  int n = 512;
  int steps = 200;
  int every = 20;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--n") == 0) o.n = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--steps") == 0) o.steps = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--every") == 0) o.every = std::atoi(argv[i + 1]);
  }
  o.n = std::max(o.n, 8);
  o.steps = std::max(o.steps, 1);
  o.every = std::max(o.every, 1);
  return o;
}

/// One ensemble member: the field and its hot spots (cells held at a fixed temperature).
struct member {
  int n;
  std::vector<double> u, next;
  std::vector<std::size_t> spots;
  std::vector<double> spot_temp;

  member(int n_, int rank) : n(n_), u(static_cast<std::size_t>(n_) * n_, 0.0), next(u) {
    std::uint64_t s = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(rank + 1);
    auto rnd = [&s] {  // xorshift64*
      s ^= s >> 12;
      s ^= s << 25;
      s ^= s >> 27;
      return static_cast<double>((s * 2685821657736338717ull) >> 11) * 0x1p-53;
    };
    for (int k = 0; k < 4; ++k) {  // four hot spots of radius 6 per member
      const int ci = 8 + static_cast<int>(rnd() * (n - 16)), cj = 8 + static_cast<int>(rnd() * (n - 16));
      const double temp = 50 + 50 * rnd();
      for (int i = ci - 6; i <= ci + 6; ++i)
        for (int j = cj - 6; j <= cj + 6; ++j)
          if ((i - ci) * (i - ci) + (j - cj) * (j - cj) <= 36) {
            spots.push_back(static_cast<std::size_t>(i) * n + j);
            spot_temp.push_back(temp);
          }
    }
    hold_spots();
  }

  void hold_spots() {
    for (std::size_t k = 0; k < spots.size(); ++k) u[spots[k]] = spot_temp[k];
  }

  /// One explicit step of u_t = laplace(u) (dt/dx^2 = 0.2); the border stays at 0.
  void step() {
    for (int i = 1; i + 1 < n; ++i)
      for (int j = 1; j + 1 < n; ++j) {
        const std::size_t c = static_cast<std::size_t>(i) * n + j;
        next[c] = u[c] + 0.2 * (u[c - 1] + u[c + 1] + u[c - n] + u[c + n] - 4 * u[c]);
      }
    std::swap(u, next);
    hold_spots();
  }
};

double now() { return MPI_Wtime(); }

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    const options o = parse(argc, argv);
    int rank = 0, p = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    const std::size_t cells = static_cast<std::size_t>(o.n) * o.n;
    // Always compress: the table compares cgx's wire bytes and errors with
    // MPI_Allreduce's, and with the default threshold a field under 16 MiB (512 x 512
    // doubles are 2 MiB) on ranks of one node would go through MPI_Allreduce itself.
    cgx::plan_options opts;
    opts.native_below_bytes = 0;
    plan_type plan{cgx::comm::mpi{MPI_COMM_WORLD}, cells, opts};

    // The range of the ensemble sum at the first reduction sets the absolute bounds.
    double range = 0;
    {
      member m(o.n, rank);
      for (int s = 0; s < o.every; ++s) m.step();
      std::vector<double> sum(cells);
      MPI_Allreduce(m.u.data(), sum.data(), static_cast<int>(cells), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      const auto [lo, hi] = std::minmax_element(sum.begin(), sum.end());
      range = *hi - *lo;
    }
    if (rank == 0) {
      std::printf("cgx heat_ensemble: %d ranks (ensemble members), %d x %d doubles each, %d steps, ensemble sum "
                  "every %d steps (%d reductions per bound), error_bounded<1024> + SRA over MPI\n",
                  p, o.n, o.n, o.steps, o.every, o.steps / o.every);
      std::printf("range of the ensemble sum: %.4g\n", range);
      std::printf("%10s %10s %12s %11s %13s %13s %7s %9s %9s\n", "bound/rng", "bound", "worst_err", "worst/bnd",
                  "wire_bytes", "raw_bytes", "ratio", "cgx_ms", "mpi_ms");
    }

    bool all_held = true;
    for (double rel : {1e-2, 1e-3, 1e-4, 1e-5, 1e-6}) {
      const double bound = rel * range;
      member m(o.n, rank);
      std::vector<double> sum(cells), exact(cells);
      double worst = 0, t_cgx = 0, t_mpi = 0;
      unsigned long long bytes[2] = {0, 0};
      for (int s = 1; s <= o.steps; ++s) {
        m.step();
        if (s % o.every != 0) continue;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = now();
        MPI_Allreduce(m.u.data(), exact.data(), static_cast<int>(cells), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        t_mpi += now() - t0;
        sum = m.u;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = now();
        plan(sum.data(), cells, bound);
        t_cgx += now() - t0;
        bytes[0] += plan.last_stats().bytes_sent;
        bytes[1] += plan.last_stats().raw_bytes;
        for (std::size_t c = 0; c < cells; ++c) worst = std::max(worst, std::fabs(sum[c] - exact[c]));
        // Relax towards the ensemble mean (the reduced field feeds back into the run).
        for (std::size_t c = 0; c < cells; ++c) m.u[c] += 0.1 * (sum[c] / p - m.u[c]);
        m.hold_spots();
      }
      double w = worst;
      MPI_Allreduce(&w, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      unsigned long long total[2] = {0, 0};
      MPI_Allreduce(bytes, total, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      double t[2] = {t_cgx, t_mpi}, tmax[2];
      MPI_Allreduce(t, tmax, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      const bool held = worst <= bound;
      all_held = all_held && held;
      if (rank == 0)
        std::printf("%10.0e %10.3e %12.3e %11.3f %13llu %13llu %7.2f %9.1f %9.1f%s\n", rel, bound, worst,
                    worst / bound, total[0], total[1],
                    total[0] > 0 ? static_cast<double>(total[1]) / static_cast<double>(total[0]) : 1.0, 1e3 * tmax[0],
                    1e3 * tmax[1], held ? "" : "  BOUND VIOLATED");
    }
    if (rank == 0)
      std::printf("%s\n", all_held ? "bound held at every bound (worst error <= bound on every element of every rank)"
                                   : "BOUND VIOLATED");
  }
  MPI_Finalize();
}
