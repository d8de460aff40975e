// The cost model (include/cgx/model.hpp): its arithmetic, and its predictions against
// the measurements on emulated networks kept in docs/results/ (made by bench/netns-run
// and bench/netns-cluster; docs/results/README.md has the commands).
#include <cgx/model.hpp>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#ifndef CGX_RESULTS_DIR
#error "CGX_RESULTS_DIR must name docs/results"
#endif

namespace {

using namespace cgx::model;

// One flat JSON object per record, as bench/allreduce_bench writes them: string,
// number and null values only.
using record = std::map<std::string, std::string>;

std::vector<record> read_records(const std::string& path) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::vector<record> out;
  std::size_t i = 0;
  while ((i = s.find('{', i)) != std::string::npos) {
    const std::size_t end = s.find('}', i);
    REQUIRE(end != std::string::npos);
    record r;
    std::size_t k = i + 1;
    while (true) {
      const std::size_t q0 = s.find('"', k);
      if (q0 == std::string::npos || q0 > end) break;
      const std::size_t q1 = s.find('"', q0 + 1);
      const std::string key = s.substr(q0 + 1, q1 - q0 - 1);
      std::size_t v = s.find(':', q1) + 1;
      while (s[v] == ' ') ++v;
      std::string val;
      if (s[v] == '"') {
        const std::size_t v1 = s.find('"', v + 1);
        val = s.substr(v + 1, v1 - v - 1);
        k = v1 + 1;
      } else {
        std::size_t v1 = v;
        while (v1 < end && s[v1] != ',') ++v1;
        val = s.substr(v, v1 - v);
        while (!val.empty() && val.back() == ' ') val.pop_back();
        k = v1;
      }
      r[key] = val;
    }
    out.push_back(std::move(r));
    i = end + 1;
  }
  return out;
}

algorithm algorithm_of(const std::string& reducer) {
  if (reducer == "sra") return algorithm::sra;
  if (reducer == "ring") return algorithm::ring;
  if (reducer == "tree") return algorithm::tree;
  if (reducer == "hier") return algorithm::hierarchical;
  FAIL("unknown reducer " << reducer);
  return algorithm::sra;
}

// What the records from `min_bytes` are held to (see the last test case): every check
// within `loose`, and at least the share `within_share` of the checks within `tolerance`.
constexpr double min_bytes = 1 << 20, tolerance = 0.25, loose = 0.50, within_share = 0.90;

// The outcome of checking records against the model: checks made (two per record:
// cgx's time and Open MPI's ring), how many fell within `tolerance`, the largest miss.
struct tally {
  int records = 0, checks = 0, within = 0;
  double worst = 0;
};

// Checks every record of `file` of at least `min_bytes` against the model on
// `profile`: cgx's time, and that of Open MPI's ring allreduce timed in the same run
// (mpi_ring_time_s; the model's mpi_ring is that ring). Each must be within `loose`;
// those within `tolerance` are counted, the others printed.
// Each record's problem carries the idle time the benchmark leaves the links before a
// call, so that the tbf bucket is refilled only as much as it is in the measurement.
// The host's one-core quantizer throughputs during the stored run: bench/reproduce runs
// bench/quant_bench at its start (quant-host.json) and at its end (quant-host-after.json);
// each figure is the geometric mean of the two ends (4-bit float, bucket 1024: stochastic
// compress, decompress, decompress-add, and y += x, decompress-add's baseline). The host
// is shared and its speed drifts from day to day (one core's 4-bit compress has read
// 4.7 to 9.4 GB/s), so the model is held against the host as that run found it, not
// against the figures of another day; these are measurements of the same run, none of
// them fitted to the allreduce times.
machine as_in_stored_run(machine m) {
  double compress = 1, decompress = 1, decompress_add = 1, add = 1;
  int found = 0;
  for (const char* file : {"quant-host.json", "quant-host-after.json"}) {
    for (const record& r : read_records(std::string(CGX_RESULTS_DIR) + "/" + file)) {
      if (r.at("dtype") != "float" || r.at("bits") != "4" || r.at("bucket") != "1024") continue;
      const std::string& op = r.at("op");
      const double gbps = std::stod(r.at("gbps")) * 1e9;
      if (op == "compress" && r.at("rounding") == "stochastic") {
        compress *= gbps;
        ++found;
      } else if (op == "decompress") {
        decompress *= gbps;
        ++found;
      } else if (op == "decompress_add") {
        decompress_add *= gbps;
        add *= std::stod(r.at("baseline_gbps")) * 1e9;
        found += 2;
      }
    }
  }
  REQUIRE_MESSAGE(found == 8, "quant-host.json and quant-host-after.json need the 4-bit float rows");
  m.compress_bps = std::sqrt(compress);
  m.decompress_bps = std::sqrt(decompress);
  m.decompress_add_bps = std::sqrt(decompress_add);
  m.add_bps = std::sqrt(add);
  return m;
}

void check_file(tally& t, const std::string& file, const std::string& profile_name) {
  const machine m = as_in_stored_run(profile(profile_name));
  for (const record& r : read_records(std::string(CGX_RESULTS_DIR) + "/" + file)) {
    const double bytes = std::stod(r.at("bytes"));
    if (bytes < min_bytes || r.at("dtype") != "float") continue;
    const int ranks = std::stoi(r.at("ranks"));
    int bits = std::stoi(r.at("bits"));
    if (bits == 32) bits = 0;
    problem pr{bytes, ranks, bits, std::stod(r.at("bucket"))};
    // allreduce_bench restores the input (a memcpy of the buffer, ~10 GB/s here) and
    // enters a barrier (~100 us over these links) before each timed call: all the time
    // the tbf buckets have to refill before it.
    pr.idle_before_s = bytes / 10e9 + 100e-6;
    const double cgx_pred = predict(algorithm_of(r.at("reducer")), pr, m).total_s();
    const double ring_pred = predict(algorithm::mpi_ring, pr, m).total_s();
    const double cgx_meas = std::stod(r.at("time_s"));
    const double ring_meas = std::stod(r.at("mpi_ring_time_s"));
    INFO(file << ": " << bytes << " bytes, " << r.at("bits") << " bits, " << r.at("reducer") << ": cgx measured "
              << cgx_meas << " s predicted " << cgx_pred << " s; MPI ring measured " << ring_meas << " s predicted "
              << ring_pred << " s");
    const std::pair<std::string, double> devs[] = {{"cgx", cgx_pred / cgx_meas - 1},
                                                   {"MPI ring", ring_pred / ring_meas - 1}};
    for (const auto& [who, dev] : devs) {
      CHECK(std::fabs(dev) <= loose);
      ++t.checks;
      t.worst = std::max(t.worst, std::fabs(dev));
      if (std::fabs(dev) <= tolerance)
        ++t.within;
      else
        MESSAGE("outside " << tolerance * 100 << "%: " << file << " " << bytes / (1 << 20) << " MiB " << r.at("bits")
                           << " bits " << r.at("reducer") << ", " << who << ": model " << std::string(dev > 0 ? "+" : "")
                           << dev * 100 << "%");
    }
    ++t.records;
  }
}

}  // namespace

TEST_CASE("model: compression ratio is quant::maxmin's exact byte ratio") {
  // 1024 fp32 values: 4096 bytes; 4-bit codes 512 bytes + 8 bytes of metadata.
  CHECK(compression_ratio(problem{1, 2, 4}) == doctest::Approx(4096.0 / 520.0));
  CHECK(compression_ratio(problem{1, 2, 8}) == doctest::Approx(4096.0 / 1032.0));
  CHECK(compression_ratio(problem{1, 2, 0}) == 1.0);
}

TEST_CASE("model: the uncompressed ring on a shared link costs 2 (p-1) S (less the burst) over the bandwidth") {
  const machine& m = profile("loopback-1gbit");
  for (int p : {2, 3, 4, 8}) {
    const double S = 64.0 * (1 << 20);
    const prediction t = predict(algorithm::mpi_ring, problem{S, p, 0}, m);
    CHECK(t.wire_s == doctest::Approx((2.0 * (p - 1) * S - m.intra.burst_bytes) / m.intra.bytes_per_s));
    CHECK(t.latency_s == doctest::Approx(2.0 * (p - 1) * m.intra.alpha_s));
  }
  // Back to back, the bucket refills only while a call does not send (its latency and
  // adds: 0.4 ms for 1 MiB on 4 ranks, less than the 2 ms the bucket holds): less than
  // a full bucket passes free, more than nothing; each further second of idle time
  // before the call takes a second off the wire, up to the full bucket.
  problem busy{1 << 20, 4, 0};
  const double full = predict(algorithm::mpi_ring, busy, m).wire_s;
  busy.idle_before_s = 0;
  const double w0 = predict(algorithm::mpi_ring, busy, m).wire_s;
  CHECK(w0 > full);
  CHECK(w0 < 2.0 * 3 * (1 << 20) / 4 * 4 / m.intra.bytes_per_s);
  busy.idle_before_s = 1e-3;
  CHECK(predict(algorithm::mpi_ring, busy, m).wire_s == doctest::Approx(w0 - 1e-3));
  busy.idle_before_s = 1;
  CHECK(predict(algorithm::mpi_ring, busy, m).wire_s == doctest::Approx(full));
  problem bad{1, 2, 4};
  bad.idle_before_s = -1;
  CHECK_THROWS_AS(predict(algorithm::sra, bad, profile("loopback-1gbit")), cgx::error);
}

TEST_CASE("model: fewer bits send fewer bytes; one rank costs nothing; bad input throws") {
  for (const auto& m : profiles) {
    for (algorithm a : {algorithm::sra, algorithm::ring, algorithm::tree, algorithm::hierarchical}) {
      // One node (the loopback profiles): hierarchical moves raw values only.
      if (a == algorithm::hierarchical && m.ranks_per_node >= 16) continue;
      const double w8 = predict(a, problem{1 << 26, 16, 8}, m).wire_s;
      const double w4 = predict(a, problem{1 << 26, 16, 4}, m).wire_s;
      const double w2 = predict(a, problem{1 << 26, 16, 2}, m).wire_s;
      CHECK(w2 < w4);
      CHECK(w4 < w8);
      CHECK(predict(a, problem{1 << 26, 1, 4}, m).total_s() == 0.0);
    }
  }
  CHECK_THROWS_AS(predict(algorithm::sra, problem{1, 0, 4}, profiles[0]), cgx::error);
  CHECK_THROWS_AS(predict(algorithm::sra, problem{1, 4, 9}, profiles[0]), cgx::error);
  CHECK_THROWS_AS(profile("no-such-network"), cgx::error);
}

TEST_CASE("model: hierarchical sends less between nodes than flat sra, and pays for it inside the node") {
  machine m = profile("pcie-8gpu-25g");
  const problem pr{256.0 * (1 << 20), 64, 4};
  // With PCIe inside the node, raw intra-node traffic costs more than it saves...
  CHECK(predict(algorithm::hierarchical, pr, m).wire_s > predict(algorithm::sra, pr, m).wire_s);
  // ...with an intra-node link that costs nothing, only the inter-node bytes remain.
  m.intra.bytes_per_s = 1e15;
  CHECK(predict(algorithm::hierarchical, pr, m).wire_s < predict(algorithm::sra, pr, m).wire_s / 4);
}

// What the model is held to, on the measurements of docs/results/ (one run of
// bench/reproduce): from 1 MiB, on the loopback links (1 and 10 Gbit/s) and on the
// emulated cluster (2 nodes x 2 ranks, 1 Gbit/s), cgx's time and Open MPI's ring on
// every record, each within 50%, and at least 90% of them within 25%; the test prints
// the others. Not all within 25%: on this shared 2-core host, running 4 ranks, the
// host's speed drifts by more than that within one run (one core's 4-bit compress read
// 4.71 GB/s at the start of the stored run and 6.96 at its end; the quantizer figures the
// model uses are the mean of the two ends, as_in_stored_run), and the calls it moves
// most are the CPU-bound ones and those that hand bytes between processes many times.
// The three sets of these files of 2026-11-30 (docs/results/README.md) had 6, 2 and 5
// of their 112 checks outside 25%, not the same ones each time, all within 50%:
// - cgx's compressed hierarchical calls at 4 MiB (every step waits for the scheduler to
//   run the receiving rank: 7.2 to 9.6 ms in the three runs, 5.5 ms in a quiet spell,
//   5.1 ms predicted; traced step by step in docs/results/README.md);
// - the uncompressed flat SRA on the cluster, whose pairs send both ways at once: over
//   Open MPI's TCP such a pair gets 0.66-0.73 of the link for messages of 256 KiB and
//   more, which the model does not count (docs/results/README.md);
// - the CPU-bound 4-bit SRA at 1-2 MiB at 10 Gbit/s (1 MiB: 0.98 to 1.34 ms, 1.30 ms
//   predicted).
TEST_CASE("model: predictions within 25% from 1 MiB on the emulated links, but for the host's spread") {
  tally t;
  check_file(t, "tcp-1gbit.json", "loopback-1gbit");
  check_file(t, "tcp-1gbit-256M.json", "loopback-1gbit");
  check_file(t, "tcp-10gbit.json", "loopback-10gbit");
  check_file(t, "cluster-2x2-1gbit-sra.json", "cluster-1gbit");
  check_file(t, "cluster-2x2-1gbit.json", "cluster-1gbit");
  MESSAGE(t.records << " records from 1 MiB, " << t.checks << " checks (cgx and Open MPI's ring): " << t.within
                    << " within " << tolerance * 100 << "%, all within " << t.worst * 100 << "%");
  CHECK(t.records >= 56);
  CHECK(t.within >= within_share * t.checks);
}
