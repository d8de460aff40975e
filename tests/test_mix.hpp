#pragma once
// A 64-bit mixing function for reproducible test inputs (no MPI: single-process tests
// and cross builds use it too).
#include <cstdint>

namespace cgx_test {

inline std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace cgx_test
