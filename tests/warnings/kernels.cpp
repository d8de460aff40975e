// Compiled by the warnings test (check.cmake) with -Wall -Wextra -Werror: every kind of
// host kernel the quantizer has (the packing shapes: one bit, an odd width that straddles
// bytes, whole bytes, a nibble in double; both roundings; compress, decompress,
// decompress_add), so that a warning from any instruction set's
// copy of cgx/quant/host_kernels.inl fails the build of a user's code as it fails here.
#include <cgx/quant/maxmin.hpp>

#include <cstddef>

namespace {
template <int Bits, class T>
void all_ops(const T* x, std::size_t n, std::byte* c, T* y) {
  using cgx::quant::maxmin;
  maxmin<Bits, 1024, cgx::quant::stochastic>::compress(x, n, c);
  maxmin<Bits, 1024, cgx::quant::nearest>::compress(x, n, c);
  maxmin<Bits, 1024>::decompress(c, n, y);
  maxmin<Bits, 1024>::decompress_add(c, n, y);
}
}  // namespace

void cgx_warnings_kernels(const float* xf, double* xd, std::size_t n, std::byte* c, float* yf) {
  all_ops<1>(xf, n, c, yf);
  all_ops<3>(xf, n, c, yf);
  all_ops<8>(xf, n, c, yf);
  all_ops<4>(xd, n, c, xd);
}
