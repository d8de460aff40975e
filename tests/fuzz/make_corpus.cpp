// Writes the seed corpus of the fuzz harnesses (tests/fuzz/corpus/<harness>/) from cgx's
// own encoders: valid streams in each mode and layout the harnesses read, plus the
// minimal crash input of issue 18 (0a 0a 0a 0a). Run once by hand when an input format
// changes: make_corpus <dir of corpus>; the files are checked in.
#include <cgx/comm/error_bounded_schedules.hpp>
#include <cgx/quant/error_bounded.hpp>
#include <cgx/quant/maxmin.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "fuzz_input.hpp"

namespace {

using bytes = std::vector<std::uint8_t>;

void write(const std::string& dir, const std::string& name, const bytes& b) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(b.data(), 1, b.size(), f);
  std::fclose(f);
}

bytes header(unsigned mode, std::size_t n, unsigned exponent) {
  return {static_cast<std::uint8_t>(mode), static_cast<std::uint8_t>(n & 0xff), static_cast<std::uint8_t>(n >> 8),
          static_cast<std::uint8_t>(exponent)};
}

void append(bytes& b, const void* p, std::size_t len) {
  const auto* c = static_cast<const std::uint8_t*>(p);
  b.insert(b.end(), c, c + len);
}

// Test data of kind k: 0 smooth, 1 rough, 2 constant, 3 smooth with NaN and Inf.
template <class T>
std::vector<T> data(int k, std::size_t n) {
  std::vector<T> x(n);
  std::uint64_t s = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double noise = static_cast<double>(s >> 11) * 0x1p-53 - 0.5;
    x[i] = static_cast<T>(k == 1 ? noise : k == 2 ? 3.25 : cgx_fuzz::value_of(0, i));
  }
  if (k == 3 && n > 70) {
    x[5] = std::numeric_limits<T>::quiet_NaN();
    x[70] = -std::numeric_limits<T>::infinity();
  }
  return x;
}

template <class Q, class T>
bytes eb_stream(const std::vector<T>& x, double e) {
  std::vector<std::byte> w(Q::template max_compressed_bytes<T>(x.size()));
  w.resize(Q::template compress<T>(x.data(), x.size(), w.data(), e));
  bytes b(w.size());
  if (!w.empty()) std::memcpy(b.data(), w.data(), w.size());
  return b;
}

template <class T>
void eb_decode_seeds(const std::string& dir) {
  using cgx::quant::eb_prediction;
  const unsigned dbl = std::is_same_v<T, double> ? 1 : 0;
  const std::size_t n = 3000;
  for (int k = 0; k < 4; ++k)
    for (int ex = 4; ex <= 24; ex += 10) {
      const std::string tag = std::string(dbl ? "d" : "f") + "-k" + std::to_string(k) + "-e" + std::to_string(ex);
      const double e = std::ldexp(1.0, -ex);
      // Decoding seeds: bucket 1024 (mode bits 2-3 = 0) and 16 (1), each prediction.
      bytes b = header(dbl, n, 0);
      const bytes s1 = eb_stream<cgx::quant::error_bounded<1024, eb_prediction::automatic>>(data<T>(k, n), e);
      b.insert(b.end(), s1.begin(), s1.end());
      write(dir, "dec-b1024-auto-" + tag, b);
      b = header(dbl | 2 | (1 << 2), n, 0);
      const bytes s2 = eb_stream<cgx::quant::error_bounded<16, eb_prediction::delta>>(data<T>(k, n), e);
      b.insert(b.end(), s2.begin(), s2.end());
      write(dir, "dec-b16-delta-add-" + tag, b);
      b = header(dbl | (1 << 2), n, 0);
      const bytes s3 = eb_stream<cgx::quant::error_bounded<16, eb_prediction::none>>(data<T>(k, n), e);
      b.insert(b.end(), s3.begin(), s3.end());
      write(dir, "dec-b16-plain-" + tag, b);
      // Round-trip seeds: the values themselves, each prediction.
      for (unsigned pred = 0; pred < 3; ++pred) {
        b = header(0x10 | dbl | pred << 5, 0, static_cast<unsigned>(ex));
        const std::vector<T> x = data<T>(k, 256);
        append(b, x.data(), x.size() * sizeof(T));
        write(dir, "rt-p" + std::to_string(pred) + "-" + tag, b);
      }
    }
}

template <int Bits, class T>
void maxmin_seed(const std::string& dir, unsigned code, int k) {
  using Q = cgx::quant::maxmin<Bits, 64, cgx::quant::nearest>;
  const std::size_t n = 1000;
  const std::vector<T> x = data<T>(k, n);
  std::vector<std::byte> w(Q::template compressed_bytes<T>(n));
  Q::template compress<T>(x.data(), n, w.data());
  const unsigned dbl = std::is_same_v<T, double> ? 1 : 0;
  bytes b = header(dbl | (k & 1) << 1 | code << 2, n, 0);
  b.pop_back();  // maxmin's harness has no exponent byte
  append(b, w.data(), w.size());
  write(dir, "b" + std::to_string(Bits) + (dbl ? "-d" : "-f") + "-k" + std::to_string(k), b);
}

// The bytes rank 0 of 2 receives in one call of the error-bounded schedule of R: a
// length header and a valid stream for each message (values of the right count).
template <class R, class T>
bytes varsize_messages(std::size_t n, double e) {
  using Q = cgx::quant::error_bounded<64>;
  using S = typename cgx::comm::error_bounded_schedule<R>::template schedule<T, Q, cgx::detail::transport_archetype>;
  const cgx::comm::chunk c0 = S::chunk_of(n, 2, 0), c1 = S::chunk_of(n, 2, 1);
  // SRA: rank 1's part of chunk 0, then rank 1's sum of chunk 1. Ring: rank 1's chunk 1
  // (reduce step), then the sum of chunk 0 forwarded back (allgather step).
  const bool ring = std::is_same_v<R, cgx::comm::ring>;
  const cgx::comm::chunk first = ring ? c1 : c0, second = ring ? c0 : c1;
  bytes b;
  for (const cgx::comm::chunk& c : {first, second}) {
    std::vector<double> x(c.count);
    for (std::size_t i = 0; i < c.count; ++i) x[i] = cgx_fuzz::value_of(1, c.begin + i);
    const bytes s = eb_stream<Q>(x, e);
    const std::uint64_t len = s.size();
    append(b, &len, sizeof(len));
    b.insert(b.end(), s.begin(), s.end());
  }
  return b;
}

template <class R, class T>
void varsize_seed(const std::string& dir, const std::string& name, unsigned mode) {
  const std::size_t n = 1000;
  const unsigned ex = 10;
  bytes b = {static_cast<std::uint8_t>(mode), 0, static_cast<std::uint8_t>(n & 0xff), static_cast<std::uint8_t>(n >> 8),
             static_cast<std::uint8_t>(ex)};
  const bytes m = varsize_messages<R, T>(n, std::ldexp(1.0, -static_cast<int>(ex)));
  b.insert(b.end(), m.begin(), m.end());
  write(dir, name, b);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_corpus <corpus dir>\n");
    return 2;
  }
  const std::string root = argv[1];
  const bytes crash = {0x0a, 0x0a, 0x0a, 0x0a};  // issue 18's minimal crash input
  for (const char* h : {"fuzz_eb_decode", "fuzz_maxmin_decode", "fuzz_varsize"}) write(root + "/" + h, "crash-0a0a0a0a", crash);

  eb_decode_seeds<float>(root + "/fuzz_eb_decode");
  eb_decode_seeds<double>(root + "/fuzz_eb_decode");

  const std::string mm = root + "/fuzz_maxmin_decode";
  for (int k = 0; k < 4; ++k) {
    maxmin_seed<1, float>(mm, 0, k);
    maxmin_seed<2, double>(mm, 1, k);
    maxmin_seed<4, float>(mm, 2, k);
    maxmin_seed<8, double>(mm, 3, k);
  }

  const std::string vs = root + "/fuzz_varsize";
  // mode: bit 0 ring, bit 3 double; two ranks where (mode >> 1) % 3 == 0 (0, 1, 12, 13).
  varsize_seed<cgx::comm::scatter_reduce_allgather, float>(vs, "sra-f-p2", 0);
  varsize_seed<cgx::comm::scatter_reduce_allgather, double>(vs, "sra-d-p2", 12);
  varsize_seed<cgx::comm::ring, float>(vs, "ring-f-p2", 1);
  varsize_seed<cgx::comm::ring, double>(vs, "ring-d-p2", 13);
  return 0;
}
