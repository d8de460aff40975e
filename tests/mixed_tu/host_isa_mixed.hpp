// The two halves of tests/mixed_tu: one translation unit compiled by nvcc, one by the C++
// compiler, each quantizing with the same cgx host plan types (the functions and
// templates the one-definition rule says must be the same code in both).
#pragma once

#include <cstddef>
#include <vector>

namespace mixed {
struct report {
  bool simd_compiled = false;  // CGX_HAS_HOST_SIMD in this translation unit
  int active = -1;             // cgx::quant::active_host_isa() seen from it
  int detected = -1;           // cgx::quant::detected_host_isa() seen from it
};
report cu_report();
report cpp_report();
// maxmin<4, 1024, stochastic>::compress of x (seed 7) from each unit.
std::vector<std::byte> cu_compress(const std::vector<float>& x);
std::vector<std::byte> cpp_compress(const std::vector<float>& x);
/// out[i] += the decoded bytes (decompress_add), from each unit.
void cu_decompress_add(const std::vector<std::byte>& bytes, std::vector<float>& out);
void cpp_decompress_add(const std::vector<std::byte>& bytes, std::vector<float>& out);
}  // namespace mixed

// The two functions of one half, compiled in the unit that expands it (after including
// cgx): PREFIX_report() and PREFIX_compress(), not inline, so each unit keeps its own.
#define CGX_MIXED_HALF(PREFIX)                                                                        \
  namespace mixed {                                                                                   \
  report PREFIX##_report() {                                                                          \
    return {CGX_HAS_HOST_SIMD != 0, static_cast<int>(cgx::quant::active_host_isa()),                  \
            static_cast<int>(cgx::quant::detected_host_isa())};                                       \
  }                                                                                                   \
  std::vector<std::byte> PREFIX##_compress(const std::vector<float>& x) {                             \
    using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;                                    \
    std::vector<std::byte> out(Q::compressed_bytes<float>(x.size()));                                 \
    cgx::quant::rng_state r{};                                                                        \
    r.seed = 7;                                                                                       \
    Q::compress(x.data(), x.size(), out.data(), r, cgx::quant::host_exec{1});                         \
    return out;                                                                                       \
  }                                                                                                   \
  void PREFIX##_decompress_add(const std::vector<std::byte>& bytes, std::vector<float>& out) {        \
    using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;                                    \
    Q::decompress_add(bytes.data(), out.size(), out.data(), cgx::quant::host_exec{1});                \
  }                                                                                                   \
  }
