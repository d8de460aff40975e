#pragma once
// What the bootstrap tests (test_bootstrap, test_store_bootstrap) share: a blob pattern
// and one checked allgather over any cgx::comm::bootstrap.
#include <cstddef>
#include <vector>

namespace cgx_test {

/// Byte i of rank r's blob of call c.
inline std::byte pattern(int r, std::size_t i, int c) {
  return static_cast<std::byte>((static_cast<std::size_t>(r) * 131 + i * 7 + static_cast<std::size_t>(c) * 29) & 0xff);
}

/// One allgather of m bytes per rank on `b`; true when every blob arrived in rank order.
template <class B>
bool allgather_ok(B& b, std::size_t m, int c) {
  const auto p = static_cast<std::size_t>(b.size());
  std::vector<std::byte> mine(m), all(p * m, std::byte{0xEE});
  for (std::size_t i = 0; i < m; ++i) mine[i] = pattern(b.rank(), i, c);
  b.allgather(mine, all);
  for (std::size_t r = 0; r < p; ++r)
    for (std::size_t i = 0; i < m; ++i)
      if (all[r * m + i] != pattern(static_cast<int>(r), i, c)) return false;
  return true;
}

}  // namespace cgx_test
