// Where a compressed allreduce's time goes on a fast link, measured in one run: the
// call itself (cgx's SRA, compressed path forced), MPI_Allreduce, and the two halves it
// is made of, each alone on the same ranks and sizes:
//   passes  this rank's quantizer work of one call with no communication: compress the
//           chunks it sends ((p-1)/p n values), add_requantize its own chunk (n/p values,
//           one received part per peer: p-2 decompress_add and the fused last step),
//           decompress the others' sums ((p-1)/p n values);
//   wire    the call's messages with no quantizer work: the compressed pieces to every
//           peer, then the compressed sums to every peer, through comm::mpi, the same
//           sizes as the call's;
//   floor   the roofline's memory floor (model::allreduce_roofline at the copy bandwidth
//           measured now).
// Rounds alternate the five; each figure is the median over rounds of the slowest rank.
// On a link that is faster than the quantizer, call ~ passes + wire means the two do not
// overlap (they share the rank's core: the kernel's socket copies run in the rank's own
// system calls); call ~ max(passes, wire) would mean they do.
//   bench/netns-run unlimited 2 build/bench/bench/fastlink_account [MiB] [rounds] [bits] [stochastic|nearest]
#include <cgx/cgx.hpp>
#include <cgx/model.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

namespace {

template <int Bits, class Rounding>
int run(std::size_t mib, int rounds) {
  using Q = cgx::quant::maxmin<Bits, 1024, Rounding>;
  constexpr bool stochastic = std::is_same_v<Rounding, cgx::quant::stochastic>;
  using R = cgx::comm::scatter_reduce_allgather;
  int rank = 0, p = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const std::size_t n = (mib << 20) / sizeof(float);
  std::vector<float> x(n), work(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 2654435761u + static_cast<unsigned>(rank)) % 1000) * 1e-3f;

  cgx::plan_options o;
  o.native_below_bytes = 0;  // the compressed path on every call
  cgx::allreduce_plan<float, Q, R, cgx::comm::mpi> plan{cgx::comm::mpi{MPI_COMM_WORLD}, n, o};

  // The call's pieces: this rank's chunk and the others', as SRA splits them.
  const std::size_t own = n / static_cast<std::size_t>(p);  // near enough: chunks differ by < a bucket
  const std::size_t others = n - own;
  const std::size_t c_own = Q::template compressed_bytes<float>(own);
  std::vector<std::byte> sent(Q::template compressed_bytes<float>(others)), part(c_own), sum(c_own);
  Q::template compress<float>(x.data(), own, part.data(), cgx::quant::rng_state{});
  auto passes = [&] {
    Q::template compress<float>(x.data() + own, others, sent.data(), cgx::quant::rng_state{});
    for (int i = 0; i + 2 < p; ++i) Q::template decompress_add<float>(part.data(), own, work.data());
    cgx::quant::add_requantize<Q, float>(part.data(), work.data(), own, sum.data(), cgx::quant::rng_state{}, {});
    Q::template decompress<float>(sent.data(), others, work.data() + own);
  };

  cgx::comm::mpi wire_x{MPI_COMM_WORLD};
  std::vector<std::byte> out_buf(c_own * static_cast<std::size_t>(p)), in_buf(c_own * static_cast<std::size_t>(p));
  auto wire = [&] {
    for (int phase = 0; phase < 2; ++phase) {
      std::vector<cgx::comm::mpi::request> reqs;
      for (int r = 0; r < p; ++r)
        if (r != rank) reqs.push_back(wire_x.irecv(in_buf.data() + c_own * static_cast<std::size_t>(r), c_own, r, 7 + phase));
      for (int r = 0; r < p; ++r)
        if (r != rank) reqs.push_back(wire_x.isend(out_buf.data() + c_own * static_cast<std::size_t>(r), c_own, r, 7 + phase));
      wire_x.wait_all(std::span(reqs));
    }
  };
  auto call = [&] { plan(work.data(), n); };
  auto mpi = [&] { MPI_Allreduce(MPI_IN_PLACE, work.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };

  // Each part starts from the input (copied in, untimed): in place, as a user's call.
  auto timed = [&](auto&& f) {
    work = x;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    f();
    double t = MPI_Wtime() - t0, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
  };
  const double copy_bps = cgx::model::copy_bandwidth(std::size_t{64} << 20, [] { MPI_Barrier(MPI_COMM_WORLD); });
  std::vector<double> tc, tm, tp, tw;
  for (int i = 0; i < rounds + 2; ++i) {
    const double a = timed(call), b = timed(mpi), c = timed(passes), d = timed(wire);
    if (i < 2) continue;  // warm-up
    tc.push_back(a);
    tm.push_back(b);
    tp.push_back(c);
    tw.push_back(d);
  }
  auto med = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2] * 1e3;
  };
  const cgx::model::roofline f =
      cgx::model::allreduce_roofline(n, sizeof(float), Q::template compressed_bytes<float>(n), p, copy_bps, 0);
  if (rank == 0) {
    const double call_ms = med(tc), mpi_ms = med(tm), pass_ms = med(tp), wire_ms = med(tw);
    std::printf("# fastlink_account: %d ranks, %zu MiB fp32, %d bits, bucket 1024, %s rounding, comm::mpi; median of %d rounds of the slowest rank\n",
                p, mib, Bits, stochastic ? "stochastic" : "nearest", rounds);
    std::printf("# copy bandwidth %.2f GB/s per rank (measured now); every part runs in place on a fresh copy of the input (untimed)\n",
                copy_bps / 1e9);
    std::printf("%-28s %9s %9s\n", "part", "ms", "x call");
    std::printf("%-28s %9.2f %9.2f\n", "call (cgx, compressed)", call_ms, 1.0);
    std::printf("%-28s %9.2f %9.2f\n", "MPI_Allreduce", mpi_ms, mpi_ms / call_ms);
    std::printf("%-28s %9.2f %9.2f\n", "passes alone", pass_ms, pass_ms / call_ms);
    std::printf("%-28s %9.2f %9.2f\n", "wire alone", wire_ms, wire_ms / call_ms);
    std::printf("%-28s %9.2f %9.2f\n", "passes + wire", pass_ms + wire_ms, (pass_ms + wire_ms) / call_ms);
    std::printf("%-28s %9.2f %9.2f\n", "memory floor (roofline)", f.mem_s * 1e3, f.mem_s * 1e3 / call_ms);
    std::printf("speedup %.2fx (MPI / call); call / roofline %.2fx; call / (passes + wire) %.2f\n", mpi_ms / call_ms,
                call_ms / (f.mem_s * 1e3), call_ms / (pass_ms + wire_ms));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  const std::size_t mib = argc > 1 ? static_cast<std::size_t>(std::atoi(argv[1])) : 64;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
  const int bits = argc > 3 ? std::atoi(argv[3]) : 4;
  const bool nearest = argc > 4 && std::string(argv[4]) == "nearest";
  using S = cgx::quant::stochastic;
  using N = cgx::quant::nearest;
  int rc = 0;
  if (nearest)
    rc = bits == 2 ? run<2, N>(mib, rounds) : bits == 8 ? run<8, N>(mib, rounds) : run<4, N>(mib, rounds);
  else
    rc = bits == 2 ? run<2, S>(mib, rounds) : bits == 8 ? run<8, S>(mib, rounds) : run<4, S>(mib, rounds);
  MPI_Finalize();
  return rc;
}
