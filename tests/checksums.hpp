#pragma once
// The machinery of the "same bits" checksums of issue 17 (tests/test_checksums.cpp; the
// layer-wise cases live in tests/test_layerwise.cpp, which already compiles every
// layer-wise codec): fixed inputs, FNV-1a 64 of each rank's output, the comparison with
// the checksums recorded in tests/checksums/np<P>.txt.
//
// A test records its cases with record(name, hash) inside family(prefix, f); family then
// gathers every rank's hashes on rank 0 and checks them against the file's entries under
// `prefix`: a changed checksum fails naming the case, as does a case with no recorded
// checksum or a recorded case that no longer runs.
//
// Re-recording, for intentional changes of the output only (say why in the commit):
//   CGX_RECORD_CHECKSUMS=1 ctest -R 'test_checksums|test_layerwise'
// rewrites, at each rank count, the entries of the families that ran, in the source tree.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cgx/comm/mpi.hpp>
#include <cgx/comm/shm.hpp>

#include "mpi_test_util.hpp"

#ifndef CGX_CHECKSUM_DIR
#error "CGX_CHECKSUM_DIR must name the folder of the recorded checksums"
#endif

namespace cgx_checksums {
using cgx_test::world_rank;
using cgx_test::world_size;

// ---- inputs: this file's own generator, so that no other file can move the checksums ----

inline std::uint64_t splitmix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Rank r's values for call `salt`: uniform in buckets of differing ranges, or (smooth) a
// random walk, which the error-bounded codec's delta mode compresses. Pure arithmetic.
template <class T>
std::vector<T> input(int r, std::size_t n, std::uint64_t salt, bool smooth = false) {
  std::vector<T> x(n);
  double walk = 0.25 * r;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = splitmix(splitmix(salt * 4096 + static_cast<std::uint64_t>(r)) + i);
    const double u = static_cast<double>(h >> 11) * 0x1p-53 - 0.5;  // [-0.5, 0.5)
    if (smooth) {
      walk += 1e-3 * u;
      x[i] = static_cast<T>(walk);
    } else {
      x[i] = static_cast<T>(u * (0.5 + static_cast<double>((i / 700) % 7)) + 0.01 * r);
    }
  }
  return x;
}

struct fnv1a {
  std::uint64_t h = 1469598103934665603ull;
  template <class T>
  void add(const T* p, std::size_t n) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
};

// ---- the cases that ran on this rank, in order (the same on every rank) ----------------

inline std::vector<std::pair<std::string, std::uint64_t>>& results() {
  static std::vector<std::pair<std::string, std::uint64_t>> r;
  return r;
}
inline void record(std::string name, std::uint64_t h) { results().emplace_back(std::move(name), h); }

template <class Q>
std::string qname() {
  if constexpr (requires { typename Q::inner; }) {  // quant::rotated<maxmin<...>>
    return "rotated<" + qname<typename Q::inner>() + ">";
  } else if constexpr (Q::bits == 0) {
    return "none";
  } else {
    return "maxmin<" + std::to_string(Q::bits) + "," + std::to_string(Q::bucket_size) + "," +
           (std::is_same_v<typename Q::rounding, cgx::quant::stochastic> ? "s" : "n") + ">";
  }
}
template <class T>
std::string tname() {
  return std::is_same_v<T, float> ? "float" : "double";
}
template <class X>
std::string xname() {
  return std::is_same_v<X, cgx::comm::shm> ? "shm" : "mpi";
}
template <class X>
X make() {
  return X{MPI_COMM_WORLD};
}

// ---- comparison against tests/checksums/np<P>.txt ---------------------------------------

inline std::string checksum_file() { return std::string(CGX_CHECKSUM_DIR) + "/np" + std::to_string(world_size()) + ".txt"; }

// Lines "case hash_rank0 hash_rank1 ...", in file order.
inline std::vector<std::pair<std::string, std::string>> read_file(const std::string& path) {
  std::vector<std::pair<std::string, std::string>> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    out.emplace_back(line.substr(0, sp), line.substr(sp + 1));
  }
  return out;
}

// Gathers the hashes of the cases under `prefix` that ran since `first`, and on rank 0
// compares them with the file (or, with CGX_RECORD_CHECKSUMS=1, rewrites its entries
// under that prefix).
inline void compare(const std::string& prefix, std::size_t first) {
  const int p = world_size();
  const auto& res = results();
  std::vector<std::uint64_t> mine;
  for (std::size_t i = first; i < res.size(); ++i) mine.push_back(res[i].second);
  std::vector<std::uint64_t> all(mine.size() * static_cast<std::size_t>(p));
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_UINT64_T, all.data(), static_cast<int>(mine.size()),
             MPI_UINT64_T, 0, MPI_COMM_WORLD);
  if (world_rank() != 0) return;
  std::vector<std::pair<std::string, std::string>> now;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    std::string hs;
    for (int q = 0; q < p; ++q) {
      char b[20];
      std::snprintf(b, sizeof b, "%s%016llx", q ? " " : "",
                    static_cast<unsigned long long>(all[static_cast<std::size_t>(q) * mine.size() + i]));
      hs += b;
    }
    now.emplace_back(res[first + i].first, hs);
  }
  const std::string path = checksum_file();
  auto recorded = read_file(path);
  const auto under = [&](const std::string& name) { return name.compare(0, prefix.size(), prefix) == 0; };
  const char* rec = std::getenv("CGX_RECORD_CHECKSUMS");
  if (rec != nullptr && std::string(rec) == "1") {
    std::vector<std::pair<std::string, std::string>> keep;
    for (auto& e : recorded)
      if (!under(e.first)) keep.push_back(e);
    keep.insert(keep.end(), now.begin(), now.end());
    std::ofstream f(path, std::ios::trunc);
    f << "# FNV-1a 64 of each rank's output (rank 0 first) per case of tests/test_checksums.cpp and test_layerwise.cpp at " << p
      << " ranks.\n# Re-record only for an intentional change of the output: CGX_RECORD_CHECKSUMS=1.\n";
    for (auto& e : keep) f << e.first << ' ' << e.second << '\n';
    REQUIRE_MESSAGE(f.good(), "cannot write " << path);
    MESSAGE("recorded " << now.size() << " checksums under " << prefix << " in " << path);
    return;
  }
  std::map<std::string, std::string> want(recorded.begin(), recorded.end());
  std::map<std::string, bool> ran;
  for (auto& [name, hs] : now) {
    ran[name] = true;
    const auto it = want.find(name);
    CHECK_MESSAGE(it != want.end(), "case " << name << " has no recorded checksum in " << path
                                            << " (record it with CGX_RECORD_CHECKSUMS=1 if the case is new)");
    if (it != want.end())
      CHECK_MESSAGE(it->second == hs,
                    "checksum changed: case " << name << "\n  recorded " << it->second << "\n  now      " << hs);
  }
  for (auto& [name, hs] : recorded)
    if (under(name)) CHECK_MESSAGE(ran.count(name) == 1, "recorded case " << name << " did not run");
}

// Runs f (which records cases named under `prefix`) and compares what it recorded.
template <class F>
void family(const std::string& prefix, F&& f) {
  const std::size_t first = results().size();
  f();
  compare(prefix, first);
}

}  // namespace cgx_checksums
