// One program, a .cu and a .cpp translation unit, both including cgx and both
// instantiating the same host quantizer: their host code must be the same (the one-
// definition rule), or the linker keeps one unit's copy of each inline function and
// template for both. When nvcc's host pass compiled the scalar kernels alone, the copy it
// kept could be the scalar one, and a CUDA program (or cgx_torch's CUDA build: its
// build_info() said "host kernels: scalar") ran its host kernels scalar, silently: 3.2x
// slower compress, 2.6x slower decompress_add (4-bit, 64 MiB, AVX2 host, 2026-12-03).
// Checks, without a GPU (no CUDA call is made): both units compiled the SIMD kernels;
// both see the same choice, the best this CPU supports; both write the bytes the scalar
// reference writes. Exit status 0 when all hold.
#include <cgx/cgx.hpp>

#include <cstdio>
#include <vector>

#include "host_isa_mixed.hpp"

CGX_MIXED_HALF(cpp)

int main() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    std::printf("%s  %s\n", ok ? "ok    " : "FAILED", what);
    failures += ok ? 0 : 1;
  };
  const mixed::report cu = mixed::cu_report(), cpp = mixed::cpp_report();
  std::printf("host kernels: .cu unit %s, active %s; .cpp unit %s, active %s; this CPU's best %s\n",
              cu.simd_compiled ? "SIMD" : "scalar only", cgx::quant::to_string(static_cast<cgx::quant::host_isa>(cu.active)),
              cpp.simd_compiled ? "SIMD" : "scalar only",
              cgx::quant::to_string(static_cast<cgx::quant::host_isa>(cpp.active)),
              cgx::quant::to_string(static_cast<cgx::quant::host_isa>(cpp.detected)));
  check(cu.simd_compiled == cpp.simd_compiled, "the .cu and the .cpp unit compiled the same host kernels");
  check(cu.active == cpp.active && cu.detected == cpp.detected, "both units see the same choice");
  check(cpp.active == cpp.detected, "the choice is the best this CPU supports");
#if defined(__x86_64__) || defined(__aarch64__)
  check(cpp.active != static_cast<int>(cgx::quant::host_isa::scalar), "the choice is a SIMD path (x86-64, AArch64)");
#endif
  std::vector<float> x(10 * 1024 + 333);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) * 0.01f - 5.0f;
  const auto a = mixed::cu_compress(x), b = mixed::cpp_compress(x);
  std::vector<float> da(x), db(x);
  mixed::cu_decompress_add(a, da);
  mixed::cpp_decompress_add(a, db);
  cgx::quant::force_host_isa(cgx::quant::host_isa::scalar);
  const auto ref = mixed::cpp_compress(x);
  check(a == ref && b == ref, "both units write the scalar reference's bytes");
  std::vector<float> dref(x);
  mixed::cpp_decompress_add(ref, dref);
  check(da == dref && db == dref, "both units decode-add the scalar reference's values");
  return failures == 0 ? 0 : 1;
}
