#pragma once
/// \file model.hpp
/// `cgx::model`: an alpha-beta cost model of cgx's reducers and of an uncompressed ring
/// allreduce, to pick a reducer and a bit width for a machine before running on it.
///
/// A machine is nodes of `ranks_per_node` ranks. Inside a node ranks talk over the
/// `intra` link (shared memory, PCIe, or the emulated loopback); nodes talk over one
/// `inter` link each (the node's NIC: full duplex, shared by the node's ranks). A link
/// is (alpha, bandwidth): a message of b bytes takes alpha + b / bandwidth. When
/// `intra_shared` is set, the ranks of a node share the intra bandwidth (a memory bus,
/// one loopback interface), so a phase costs the node's total intra bytes over it.
/// Ranks are placed on nodes in rank order.
///
/// For a buffer of S bytes, compressed size c = S / ratio (quant::maxmin's exact size),
/// p = N L ranks (N nodes of L), the model adds (less what overlaps: the CPU cost of
/// moving bytes overlaps the wire; the pipelined SRA also overlaps its quantizer):
///   latency  rounds * alpha (alpha of inter when N > 1, else intra);
///   wire     node NIC time  (bytes out of one node - burst) / inter bandwidth
///            + intra time   (node's intra bytes if shared, else one rank's) / intra bandwidth;
///            where a link is a token bucket (emulated links), burst is what refilled
///            while it was idle: problem::idle_before_s plus the call's own time off
///            the wire (latency, compute that nothing overlaps), at most the bucket;
///   compute  bytes (de)compressed or added by one rank over that rank's throughput,
///            plus the CPU cost of the bytes it sends through a network stack
///            (cpu_s_per_byte; not shared-memory bytes, see intra_pays_cpu), the one-core
///            figures scaled by min(1, cores_per_node / L).
/// Per reducer (see the reducers' own files for the schedules):
///   sra          2 rounds of p - 1 messages of c/p to every peer: 2 (p-1) c/p sent per rank;
///                compress S, decompress-add (p-1)/p S, decompress S; pipelined in K
///                pieces per chunk, so all but 1/(K+1) of min(wire, compute) overlaps.
///   ring         2 (p-1) rounds of c/p to the right neighbour (one rank per node crosses
///                the NIC); same compute as sra, in p - 1 dependent steps.
///   tree         2 log2 q rounds of c/2, c/4, ... (q = 2^floor(log2 p); partners at distance
///                >= L are on other nodes); + a fold of c each way when p > q; same compute.
///   hierarchical hierarchical<uncompressed, ring>: a raw reduce-scatter inside each node
///                ((L-1)/L S per rank, adds), ring across nodes on S/L per rank (L rings
///                per NIC), then an allgather of raw values inside the node ((L-1)/L S).
///                On two nodes (L >= 2, chunks S/L of 2 MiB and more) the groups are
///                crossed instead of ringed: the same bytes each way, the same compute
///                per rank on average, pipelined in pieces like sra, and the allgather
///                inside the node moves the compressed sums ((L-1)/L c, decoded)
///                (see comm/hierarchical.hpp).
///   mpi_ring     the uncompressed ring allreduce: c = S, 2 (p-1) rounds, adds (p-1)/p S.
/// The model is checked against measurements on emulated networks by tests/test_model.cpp
/// (docs/results/ holds the data) and prints projections with
/// `allreduce_bench --project PROFILE|all`.

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "error.hpp"
#include "schedule/hierarchical.hpp"
#include "schedule/sra.hpp"

namespace cgx::model {

/// A link: per-message latency (seconds), bandwidth (bytes per second, each direction),
/// and the bytes it passes at once before the rate applies (a token bucket's burst;
/// 0 for a plain link).
struct link {
  double alpha_s;          ///< latency per message, seconds
  double bytes_per_s;      ///< bandwidth, bytes per second in each direction
  double burst_bytes = 0;  ///< bytes passed at once before the rate applies
};

/// A machine: its links and the throughputs of one core (bytes of input per second).
struct machine {
  std::string_view name;         ///< short name, e.g. "eth-25g"
  std::string_view description;  ///< one line for tables
  link inter;                    ///< one per node (its NIC), full duplex
  link intra;                    ///< between ranks of one node
  bool intra_shared;             ///< the ranks of a node share the intra bandwidth
  int ranks_per_node;            ///< L
  int cores_per_node;            ///< cores that quantize; the node's ranks share them
  double compress_bps;           ///< compress, 4 bits (the other widths are within 2x)
  double decompress_bps;         ///< decompress
  double decompress_add_bps;     ///< decompress-add
  double add_bps;                ///< the uncompressed reduction y[i] += x[i]
  /// CPU seconds one core spends per byte a rank sends over a network stack (kernel TCP
  /// copies on both ends); 0 where the network offloads (RDMA, NCCL on GPUs).
  double cpu_s_per_byte = 0;
  /// Whether bytes between ranks of one node also pay cpu_s_per_byte: true where the
  /// intra-node link is itself a network stack (TCP over loopback); false for shared
  /// memory, whose CPU cost is the copy that `intra`'s bandwidth already times.
  bool intra_pays_cpu = false;
};

/// What is reduced.
struct problem {
  double bytes;                ///< uncompressed bytes per rank (S)
  int ranks;                   ///< p; a multiple of the machine's ranks_per_node (or fewer)
  int bits;                    ///< 1..8, or 0 for uncompressed (cgx with quant::none)
  double bucket = 1024;        ///< values per bucket
  double value_bytes = 4;      ///< sizeof(T)
  double meta_bytes = 8;       ///< per-bucket metadata (fp32 min and unit)
  /// Seconds the links sat idle before the call. A token bucket (link::burst_bytes)
  /// refills at the link's rate only while the link is idle: before the call, and
  /// during the call while the ranks compute instead of send. Infinite (a full bucket)
  /// unless calls come back to back, as in a benchmark loop.
  double idle_before_s = std::numeric_limits<double>::infinity();
};

/// The schedules the model knows.
enum class algorithm { mpi_ring, sra, ring, tree, hierarchical };

/// Every algorithm, in the order of the enum.
inline constexpr std::array<algorithm, 5> all_algorithms{algorithm::mpi_ring, algorithm::sra, algorithm::ring,
                                                        algorithm::tree, algorithm::hierarchical};

/// Name of an algorithm, as allreduce_bench's --reducer spells it ("mpi" for mpi_ring).
constexpr std::string_view name(algorithm a) noexcept {
  switch (a) {
    case algorithm::mpi_ring: return "mpi";
    case algorithm::sra: return "sra";
    case algorithm::ring: return "ring";
    case algorithm::tree: return "tree";
    case algorithm::hierarchical: return "hier";
  }
  return "?";
}

/// A predicted time and its parts (seconds).
struct prediction {
  double latency_s = 0;  ///< per-message latencies on the critical path
  double wire_s = 0;     ///< bytes on the busiest link over its bandwidth
  double compute_s = 0;  ///< quantizer and reduction time on the critical path
  double overlap_s = 0;  ///< wire and compute time that run at the same time
  /// The predicted time of the call.
  [[nodiscard]] double total_s() const noexcept { return latency_s + wire_s + compute_s - overlap_s; }
};

/// Compression ratio S / c of quant::maxmin<bits, bucket> (1 for bits == 0).
constexpr double compression_ratio(const problem& pr) noexcept {
  if (pr.bits == 0) return 1.0;
  const double values = pr.bucket;
  return values * pr.value_bytes / (values * pr.bits / 8.0 + pr.meta_bytes);
}

namespace detail {

/// Traffic of one flat schedule over p ranks placed L per node.
struct traffic {
  double rounds = 0;        ///< message rounds on the critical path
  double node_out = 0;      ///< bytes one node sends to other nodes (= receives)
  double node_intra = 0;    ///< bytes the node's ranks send to each other, in total
  double rank_intra = 0;    ///< bytes one rank sends to ranks of its node
};

inline double pow2_floor(int p) { return static_cast<double>(std::bit_floor(static_cast<unsigned>(p))); }

/// sra: every rank sends c/p to every other rank, twice.
inline traffic sra_traffic(double c, int p, int L) {
  traffic t;
  t.rounds = 2.0 * (p - 1);
  const double per_peer = 2.0 * c / p;
  t.node_out = L * per_peer * (p - L);
  t.rank_intra = per_peer * (L - 1);
  t.node_intra = L * t.rank_intra;
  return t;
}

/// ring: 2 (p - 1) steps of c/p to the right neighbour; one rank per node crosses nodes.
inline traffic ring_traffic(double c, int p, int L) {
  traffic t;
  t.rounds = 2.0 * (p - 1);
  const double per_rank = 2.0 * (p - 1) * c / p;
  const bool multi = p > L;
  t.node_out = multi ? per_rank : 0;
  t.node_intra = (multi ? L - 1 : L) * per_rank;
  t.rank_intra = per_rank;
  return t;
}

/// tree: recursive halving then doubling among q = 2^k ranks, plus a fold when p > q.
inline traffic tree_traffic(double c, int p, int L) {
  traffic t;
  const double q = pow2_floor(p);
  const double steps = std::log2(q);
  t.rounds = 2 * steps + (p > q ? 2 : 0);
  // At distance d a rank sends c d / q in each phase; distances >= L leave the node.
  double out = 0, in = 0;
  for (double d = q / 2; d >= 1; d /= 2) (d >= L ? out : in) += 2 * c * d / q;
  if (p > q) (L >= 2 ? in : out) += 2 * c;  // the fold pairs neighbours 2i, 2i + 1
  t.node_out = L * out;
  t.rank_intra = in;
  t.node_intra = L * in;
  return t;
}

/// Time of `bytes` over link l whose token bucket has refilled for `idle_s` seconds.
inline double over(double bytes, const link& l, double idle_s) {
  const double bucket = std::min(l.burst_bytes, l.bytes_per_s * idle_s);
  return std::max(0.0, bytes - bucket) / l.bytes_per_s;
}

inline double wire_time(const traffic& t, const machine& m, double idle_s) {
  const double intra = m.intra_shared ? t.node_intra : t.rank_intra;
  return over(t.node_out, m.inter, idle_s) + over(intra, m.intra, idle_s);
}

/// Pieces per chunk of the pipelined SRA (schedule::sra::pieces, on chunks of bytes / p).
inline double sra_pieces(double bytes, int p) {
  return std::clamp(std::floor(bytes / p / static_cast<double>(schedule::sra::piece_bytes)), 1.0,
                    static_cast<double>(schedule::sra::max_pieces));
}

/// predict() with the links' token buckets refilled for `idle_s` seconds.
inline prediction predict_idle(algorithm a, const problem& pr, const machine& m, double idle_s) {
  prediction out;
  const int p = pr.ranks;
  if (p == 1) return out;
  const int L = std::min(m.ranks_per_node, p);
  const int N = (p + L - 1) / L;
  const double S = pr.bytes;
  const double share = std::min(1.0, static_cast<double>(m.cores_per_node) / L);
  const double C = m.compress_bps * share, D = m.decompress_bps * share, DA = m.decompress_add_bps * share,
               A = m.add_bps * share;
  const double alpha = N > 1 ? m.inter.alpha_s : m.intra.alpha_s;
  // CPU time of moving `sent` bytes out of one rank (and into another).
  auto net_cpu = [&](double sent) { return sent * m.cpu_s_per_byte / share; };
  // Bytes one rank sends through a network stack.
  auto rank_sent = [&](const traffic& t) { return t.node_out / L + (m.intra_pays_cpu ? t.rank_intra : 0); };
  const double c = a == algorithm::mpi_ring ? S : S / compression_ratio(pr);
  // Compute of one compressed flat schedule over P ranks on `bytes`.
  auto flat_compute = [&](double bytes, int P) {
    if (pr.bits == 0) return bytes * (P - 1) / P / A;
    return bytes / C + bytes * (P - 1) / P / DA + bytes / D;
  };
  switch (a) {
    case algorithm::mpi_ring: {
      const auto t = ring_traffic(c, p, L);
      out.latency_s = t.rounds * alpha;
      out.wire_s = wire_time(t, m, idle_s);
      const double cpu = net_cpu(rank_sent(t));  // moves with the bytes: overlaps the wire
      out.compute_s = S * (p - 1) / p / A + cpu;
      out.overlap_s = std::min(out.wire_s, cpu);
      break;
    }
    case algorithm::sra:
    case algorithm::ring:
    case algorithm::tree: {
      const auto t = a == algorithm::sra ? sra_traffic(c, p, L)
                     : a == algorithm::ring ? ring_traffic(c, p, L)
                                            : tree_traffic(c, p, L);
      out.latency_s = t.rounds * alpha;
      out.wire_s = wire_time(t, m, idle_s);
      const double cpu = net_cpu(rank_sent(t));
      out.compute_s = flat_compute(S, p) + (a == algorithm::tree && p > pow2_floor(p) ? S / C + S / DA : 0) + cpu;
      if (a == algorithm::sra && pr.bits != 0) {
        // Pipelined: compute and transfer of different pieces overlap; what does not
        // overlap is about one piece's share of the smaller of the two.
        const double K = sra_pieces(S, p);
        out.overlap_s = std::min(out.wire_s, out.compute_s) * K / (K + 1);
      } else {
        out.overlap_s = std::min(out.wire_s, cpu);
      }
      break;
    }
    case algorithm::hierarchical: {
      // 1. raw reduce-scatter inside the node (hierarchical<uncompressed, ring>).
      traffic t1;
      t1.rounds = L > 1 ? 1 : 0;
      t1.rank_intra = (L - 1) * S / L;
      t1.node_intra = L * t1.rank_intra;
      // 2. L rings across the N nodes, each on S / L; all L leave through the node's NIC.
      const auto t2 = ring_traffic(c / L, N, 1);
      // 3. allgather inside the node: raw values, or on two nodes under compression the
      // compressed sums (each rank decodes the L - 1 chunks it receives).
      const bool crossed = N == 2 && L >= 2 && S / L >= static_cast<double>(schedule::hierarchical::cross_min_bytes);
      const bool packed = crossed && pr.bits != 0;
      traffic t3;
      t3.rounds = L > 1 ? 1 : 0;
      t3.rank_intra = (L - 1) * (packed ? c : S) / L;
      t3.node_intra = L * t3.rank_intra;
      traffic t2n = t2;
      t2n.node_out = L * t2.node_out;
      out.latency_s = t1.rounds * m.intra.alpha_s + t2.rounds * m.inter.alpha_s + t3.rounds * m.intra.alpha_s;
      const double w1 = wire_time(t1, m, idle_s), w2 = wire_time(t2n, m, idle_s), w3 = wire_time(t3, m, idle_s);
      out.wire_s = w1 + w2 + w3;
      // The three phases run one after the other; in each, the CPU cost of moving the
      // bytes overlaps that phase's wire time only.
      const double c1 = net_cpu(rank_sent(t1)), c2 = net_cpu(rank_sent(t2n) / L), c3 = net_cpu(rank_sent(t3));
      const double q2 = N > 1 ? flat_compute(S / L, N) : 0;
      out.compute_s = (L - 1) * S / L / A + q2 + (packed ? (L - 1) * S / L / D : 0) + c1 + c2 + c3;
      // Crossed on two nodes: two halves of the wire, one after the other. The
      // contributions go to the owners (whose adds, quantization and decoding of the sum
      // run as the pieces arrive, beside the senders' compression), then the sums come
      // back (decoded as they arrive). Each half hides its own work but about one
      // piece's share (as in sra). (Steps 1 and 2 also run fused, piece by piece; that
      // overlap is not modelled: on the 2-core development host it gained 5-6%, the
      // ranks' CPU being the limit.)
      const double K = sra_pieces(S, L), hide = K / (K + 1);
      const double qB = N == 2 ? S / L / 2 / D : 0;  // the receivers' decoding of the sums
      const double ov2 = crossed ? std::min(w2 / 2, c2 / 2 + (q2 - qB) * hide) + std::min(w2 / 2, c2 / 2 + qB * hide)
                                 : std::min(w2, c2);
      out.overlap_s = std::min(w1, c1) + ov2 + std::min(w3, c3);
      break;
    }
  }
  return out;
}

}  // namespace detail

/// Predicted time of one allreduce of `pr` with algorithm `a` on machine `m`.
/// Throws cgx::error for a problem the model does not cover (p < 1, bits outside 0..8).
inline prediction predict(algorithm a, const problem& pr, const machine& m) {
  if (pr.ranks < 1 || pr.bits < 0 || pr.bits > 8 || !(pr.bytes >= 0) || m.ranks_per_node < 1 ||
      !(pr.idle_before_s >= 0))
    throw error(errc::invalid_argument, "model::predict: need ranks >= 1, bits in 0..8, bytes >= 0, idle_before_s >= 0");
  if (!std::isinf(pr.idle_before_s)) {
    // The buckets refill before the call and while the call does not send: its time
    // with empty buckets less its wire time (latency and compute that nothing overlaps).
    const prediction empty = detail::predict_idle(a, pr, m, 0);
    return detail::predict_idle(a, pr, m, pr.idle_before_s + std::max(0.0, empty.total_s() - empty.wire_s));
  }
  return detail::predict_idle(a, pr, m, pr.idle_before_s);
}

/// Named machine profiles: the emulated networks of bench/ (checked against
/// measurements) and typical clusters (assumed figures, stated in `description`). The
/// emulated ones use figures measured on the development machine, none of them fitted
/// to the allreduce times the model is checked against: the quantizer and add
/// throughputs of bench/quant_bench as run on 2026-11-29 (4-bit stochastic compress
/// 8.9 GB/s, decompress 13.1, decompress-add 12.1, y += x 9.75; the host is shared and
/// drifts from day to day, so tests/test_model.cpp replaces them with the figures that
/// docs/results/quant-host*.json recorded at both ends of the stored run),
/// the tbf rate and bucket of the namespace scripts, shared-memory bandwidth from the
/// uncompressed cgx rows of shm-mpi.json (64 MiB, 2026-11-29), and the CPU cost per
/// byte sent over TCP from the whole-machine profiles of bench/profile
/// (docs/results/profile-tcp-*.txt).
namespace detail {
// The development machine's one-core figures, shared by the emulated profiles.
// dev_tcp_cpu: in the profiles of the 4-bit SRA at 64 MiB, the CPU time of the ranks
// that is not the quantizer (kernel, MPI library, libc: 43% of all samples over
// unlimited TCP, 47% at 10 Gbit/s, in the profiles of 2026-11-30 before progress())
// per byte the ranks send: 1.16 ns and 1.30 ns; 1.2 ns here. It is more than the
// copies: it holds the scheduling and polling of ranks that wait for bytes. (It was
// 0.9 ns, fitted to the uncompressed tcp-unlimited rows, where the wire hides most of
// it; the compressed 10 Gbit/s rows were then under-predicted by up to 30%.) The
// quantizer figures are those of one rank alone, and the profiles agree: the
// quantizer's samples at 10 Gbit/s (46%: 65 ms of CPU per call) are what these
// throughputs give for 4 ranks (67 ms).
inline constexpr double dev_compress = 8.9e9, dev_decompress = 13.1e9, dev_decompress_add = 12.1e9,
                        dev_add = 9.75e9, dev_tcp_cpu = 1.2e-9;
}  // namespace detail

/// Named machines: this project's emulated links (measured) and common networks.
inline constexpr std::array<machine, 8> profiles{{
    {"loopback-1gbit", "one 2-core host, ranks share a 1 Gbit/s tbf loopback (bench/netns-run 1gbit)",
     {50e-6, 125e6, 262144}, {50e-6, 125e6, 262144}, true, 1 << 20, 2,
     detail::dev_compress, detail::dev_decompress, detail::dev_decompress_add, detail::dev_add, detail::dev_tcp_cpu, true},
    {"loopback-10gbit", "one 2-core host, ranks share a 10 Gbit/s tbf loopback (bench/netns-run 10gbit)",
     {50e-6, 1.25e9, 2.5e6}, {50e-6, 1.25e9, 2.5e6}, true, 1 << 20, 2,
     detail::dev_compress, detail::dev_decompress, detail::dev_decompress_add, detail::dev_add, detail::dev_tcp_cpu, true},
    {"cluster-1gbit", "emulated nodes of 2 ranks on one 2-core host, 1 Gbit/s per node link (bench/netns-cluster)",
     {60e-6, 125e6, 262144}, {5e-6, 3.5e9}, true, 2, 1,
     detail::dev_compress, detail::dev_decompress, detail::dev_decompress_add, detail::dev_add, detail::dev_tcp_cpu},
    {"eth-10g", "10 Gbit/s Ethernet, 1 rank per node (CPU), 25 us",
     {25e-6, 1.25e9}, {1e-6, 20e9}, true, 1, 16, 6.0e9, 10.0e9, 8.0e9, 8.0e9, 0.3e-9},
    {"eth-25g", "25 Gbit/s Ethernet, 1 rank per node (CPU), 15 us",
     {15e-6, 3.125e9}, {1e-6, 20e9}, true, 1, 16, 6.0e9, 10.0e9, 8.0e9, 8.0e9, 0.3e-9},
    {"eth-100g", "100 Gbit/s Ethernet/InfiniBand, 1 rank per node (CPU), 5 us",
     {5e-6, 12.5e9}, {1e-6, 20e9}, true, 1, 16, 6.0e9, 10.0e9, 8.0e9, 8.0e9, 0.3e-9},
    {"pcie-8gpu-25g", "8 GPUs per node on PCIe 4 (no NVLink), 25 Gbit/s between nodes; GPU quantizer (assumed)",
     {15e-6, 3.125e9}, {10e-6, 20e9}, true, 8, 8, 400e9, 800e9, 600e9, 800e9},
    {"pcie-8gpu-100g", "8 GPUs per node on PCIe 4 (no NVLink), 100 Gbit/s between nodes; GPU quantizer (assumed)",
     {5e-6, 12.5e9}, {10e-6, 20e9}, true, 8, 8, 400e9, 800e9, 600e9, 800e9},
}};

/// The roofline of one SRA or ring allreduce call (docs/benchmarks.md, "Roofline"): what a
/// rank cannot do with less, on a host and link measured or named by the caller.
struct roofline {
  double mem_bytes = 0;  ///< 2 n sizeof(T) + 4 (p-1)/p w: the input read once, the output
                         ///< written once, the compressed bytes sent written once and those
                         ///< received read once
  double mem_s = 0;      ///< mem_bytes at the copy bandwidth
  double wire_s = 0;     ///< 2 (p-1) w over a link all ranks share; 0 when its rate is unknown
  /// The floor of the call: the larger of the two.
  double bound_s() const noexcept { return std::max(mem_s, wire_s); }
};

/// The roofline of an allreduce of n values of `value_bytes` bytes whose compressed form
/// is `wire_bytes` bytes (the whole buffer's), on p ranks, at `copy_bps` bytes read plus
/// written per second per rank and a shared link of `link_bps` bits per second (0: unknown).
inline roofline allreduce_roofline(std::size_t n, std::size_t value_bytes, std::size_t wire_bytes, int p,
                                   double copy_bps, double link_bps) noexcept {
  roofline r;
  const double w = static_cast<double>(wire_bytes), q = static_cast<double>(p);
  r.mem_bytes = 2.0 * static_cast<double>(n) * static_cast<double>(value_bytes) + (p > 1 ? 4.0 * (q - 1) / q * w : 0.0);
  r.mem_s = copy_bps > 0 ? r.mem_bytes / copy_bps : 0.0;
  if (link_bps > 0 && p > 1) r.wire_s = 2.0 * (q - 1) * w * 8.0 / link_bps;
  return r;
}

/// This process's copy bandwidth: bytes read plus written per second by a memcpy of
/// `bytes`, the median of 7 (after one untimed copy). `sync()` runs before each timed copy:
/// a barrier, so that every rank of a job copies at once and the figure is what each sees
/// when all of them move memory, as they do in a call. Allocates 2 * bytes.
template <class Sync>
double copy_bandwidth(std::size_t bytes, Sync&& sync) {
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  std::memcpy(dst.data(), src.data(), bytes);
  std::array<double, 7> t{};
  for (std::size_t i = 0; i < t.size(); ++i) {
    sync();
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    t[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    src[i] = dst[bytes - 1 - i];  // each copy's result is used: not optimized away
  }
  std::nth_element(t.begin(), t.begin() + 3, t.end());
  return 2.0 * static_cast<double>(bytes) / t[3];
}

/// A link's rate in bits per second from its name as bench/netns-run gives it
/// ("tcp-10gbit", "tcp-500mbit", "1gbit"): 0 when the name carries none (unlimited, shm).
inline double link_rate_bps(std::string_view link) noexcept {
  const std::size_t at = link.find_first_of("0123456789");
  if (at == std::string_view::npos) return 0;
  double v = 0;
  const auto [end, ec] = std::from_chars(link.data() + at, link.data() + link.size(), v);
  if (ec != std::errc{}) return 0;
  const std::string_view unit(end, static_cast<std::size_t>(link.data() + link.size() - end));
  if (unit == "gbit") return v * 1e9;
  if (unit == "mbit") return v * 1e6;
  if (unit == "kbit") return v * 1e3;
  return 0;
}

/// The profile named `n`; throws cgx::error(errc::invalid_argument) if there is none.
inline const machine& profile(std::string_view n) {
  for (const auto& m : profiles)
    if (m.name == n) return m;
  throw error(errc::invalid_argument, "model::profile: no profile named '" + std::string(n) + "'");
}

}  // namespace cgx::model
