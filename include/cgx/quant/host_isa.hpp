#pragma once
/// \file host_isa.hpp
/// Which instruction set the host kernels of the quantizers run with, chosen once per
/// process from the CPU's features, whatever flags the including code was compiled with.
///
/// cgx is header-only, so its kernels are compiled with the user's flags, usually
/// without `-march`. host_simd.hpp therefore compiles every kernel several times in the
/// same translation unit, once per instruction set (GCC/Clang function targets), and
/// each call picks one:
///
/// | host_isa | where | kernels |
/// |---|---|---|
/// | `scalar` | everywhere | the value-by-value reference (the only path where CGX_NO_HOST_SIMD is defined) |
/// | `sse2`   | x86-64 (its baseline) | 16-byte vectors, SSE2 intrinsics for float encode |
/// | `avx2`   | x86-64 with AVX2 and FMA | 32-byte vectors, AVX2 intrinsics for float encode |
/// | `avx512` | x86-64 with AVX-512 F/BW/DQ/VL | the AVX2 kernels compiled for AVX-512VL (32 registers, EVEX) |
/// | `neon`   | AArch64 (its baseline) | 16-byte vectors (Advanced SIMD) |
///
/// Every path writes the same bytes (tests/test_host_isa.cpp forces each one and
/// compares): the arithmetic is the one of wire_format.hpp, with no contraction into
/// fused multiply-adds on any path.
///
/// The choice: the best path the CPU supports (`detected_host_isa()`), unless the
/// environment variable `CGX_HOST_ISA` (scalar, sse2, avx2, avx512, neon) names another
/// one that the CPU supports, read once at the first call, or a program calls
/// `force_host_isa()`. A path's kernels are compiled with its instruction set added to
/// the translation unit's own: in a `-march=native` build the "sse2" path is 16-byte
/// code that may use that CPU's newer instructions (it still writes the same bytes).

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../config.hpp"
#include "../error.hpp"

namespace cgx::quant {

/// An instruction set of the host kernels (see the file comment).
enum class host_isa : int { scalar = 0, sse2 = 1, avx2 = 2, avx512 = 3, neon = 4 };

/// Lower-case name of a path ("avx2").
[[nodiscard]] inline const char* to_string(host_isa i) noexcept {
  switch (i) {
    case host_isa::scalar: return "scalar";
    case host_isa::sse2: return "sse2";
    case host_isa::avx2: return "avx2";
    case host_isa::avx512: return "avx512";
    case host_isa::neon: return "neon";
  }
  return "?";
}

/// True when this build compiled the kernels of `i` (the scalar path always).
[[nodiscard]] constexpr bool host_isa_compiled(host_isa i) noexcept {
  switch (i) {
    case host_isa::scalar: return true;
#if defined(CGX_HOST_SIMD_X86)
    case host_isa::sse2:
    case host_isa::avx2:
    case host_isa::avx512: return true;
#endif
#if defined(CGX_HOST_SIMD_NEON)
    case host_isa::neon: return true;
#endif
    default: return false;
  }
}

/// The CPU features a path needs, as a pure function of what the CPU reports (so that
/// the choice can be tested for CPUs other than this one).
struct cpu_features {
  bool sse2 = false;      ///< x86-64 baseline
  bool avx2 = false;      ///< AVX2
  bool fma = false;       ///< FMA3 (the avx2 path needs it with AVX2)
  bool avx512f = false;   ///< AVX-512 Foundation
  bool avx512bw = false;  ///< AVX-512 byte and word instructions
  bool avx512dq = false;  ///< AVX-512 doubleword and quadword instructions
  bool avx512vl = false;  ///< AVX-512 on 128- and 256-bit registers
  bool neon = false;      ///< AArch64 Advanced SIMD
};

/// True when a CPU with features `f` can run path `i` (and this build compiled it).
[[nodiscard]] constexpr bool host_isa_supported(host_isa i, const cpu_features& f) noexcept {
  if (!host_isa_compiled(i)) return false;
  switch (i) {
    case host_isa::scalar: return true;
    case host_isa::sse2: return f.sse2;
    case host_isa::avx2: return f.avx2 && f.fma;
    case host_isa::avx512: return f.avx2 && f.fma && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl;
    case host_isa::neon: return f.neon;
  }
  return false;
}

/// The best path for a CPU with features `f`.
[[nodiscard]] constexpr host_isa best_host_isa(const cpu_features& f) noexcept {
  for (host_isa i : {host_isa::avx512, host_isa::avx2, host_isa::neon, host_isa::sse2})
    if (host_isa_supported(i, f)) return i;
  return host_isa::scalar;
}

/// The features of the CPU this process runs on.
[[nodiscard]] inline cpu_features this_cpu() noexcept {
  cpu_features f;
#if defined(CGX_HOST_SIMD_X86)
  __builtin_cpu_init();
  f.sse2 = __builtin_cpu_supports("sse2");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
#elif defined(CGX_HOST_SIMD_NEON)
  f.neon = true;  // Advanced SIMD is part of the AArch64 baseline
#endif
  return f;
}

/// The best path this CPU supports.
[[nodiscard]] inline host_isa detected_host_isa() noexcept { return best_host_isa(this_cpu()); }

/// Parses a path's name ("avx2"); false for an unknown name.
[[nodiscard]] inline bool parse_host_isa(const char* s, host_isa& out) noexcept {
  for (host_isa i : {host_isa::scalar, host_isa::sse2, host_isa::avx2, host_isa::avx512, host_isa::neon}) {
    if (std::strcmp(s, to_string(i)) == 0) {
      out = i;
      return true;
    }
  }
  return false;
}

namespace detail {
inline constexpr int host_isa_unset = -1;
inline std::atomic<int>& host_isa_choice() noexcept {
  static std::atomic<int> choice{host_isa_unset};
  return choice;
}

/// The first choice: CGX_HOST_ISA when set (an unknown name or a path this CPU cannot
/// run throws), else the detected path.
inline host_isa initial_host_isa() {
  const char* env = std::getenv("CGX_HOST_ISA");
  if (env == nullptr || *env == '\0') return detected_host_isa();
  host_isa i{};
  if (!parse_host_isa(env, i))
    throw error(errc::invalid_argument, std::string("CGX_HOST_ISA=") + env +
                                            " is not one of scalar, sse2, avx2, avx512, neon");
  if (!host_isa_supported(i, this_cpu()))
    throw error(errc::invalid_argument, std::string("CGX_HOST_ISA=") + env + ": this CPU or build cannot run it (best: " +
                                            to_string(detected_host_isa()) + ")");
  return i;
}
}  // namespace detail

/// The path the host kernels run with now. The first call makes the choice (see the
/// file comment); later calls read one atomic.
[[nodiscard]] inline host_isa active_host_isa() {
  int c = detail::host_isa_choice().load(std::memory_order_relaxed);
  if (c == detail::host_isa_unset) {
    int expected = detail::host_isa_unset;
    const int first = static_cast<int>(detail::initial_host_isa());
    detail::host_isa_choice().compare_exchange_strong(expected, first, std::memory_order_relaxed);
    c = detail::host_isa_choice().load(std::memory_order_relaxed);
  }
  return static_cast<host_isa>(c);
}

/// Makes every later host kernel call of this process run with path `i`, and returns
/// the path used before. Throws cgx::error(errc::invalid_argument) when this CPU or
/// build cannot run `i`. For tests and benchmarks; not meant to be called while other
/// threads run kernels (they may finish a call on the old path).
inline host_isa force_host_isa(host_isa i) {
  if (!host_isa_supported(i, this_cpu()))
    throw error(errc::invalid_argument, std::string("force_host_isa: this CPU or build cannot run ") + to_string(i) +
                                            " (best: " + to_string(detected_host_isa()) + ")");
  const host_isa before = active_host_isa();
  detail::host_isa_choice().store(static_cast<int>(i), std::memory_order_relaxed);
  return before;
}

}  // namespace cgx::quant
