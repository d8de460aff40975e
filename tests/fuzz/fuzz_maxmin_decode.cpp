// libFuzzer harness: quant::maxmin's decoders (decompress, decompress_add) on arbitrary
// bytes: metadata that are NaN, Inf, huge, subnormal or "wide", any codes.
//
// Input: byte 0 = mode (bit 0: double, else float; bit 1: decompress_add; bits 2-3: 1, 2,
// 4 or 8 bits; bit 4: the scalar kernels, else the CPU's best), bytes 1-2 = n
// (little-endian), then the payload. maxmin's streams have a fixed size: n is lowered to
// the largest count whose compressed size fits the payload, and the decoder is given
// exactly that many bytes (a copy of that length: ASan sees any read past it). Any
// decoded value, NaN included, is an answer: the harness looks for crashes, reads out of
// bounds and undefined behaviour (UBSan), not for values.
#include <cgx/quant/host_isa.hpp>
#include <cgx/quant/maxmin.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_input.hpp"

namespace {

template <int Bits, class T>
void decode(const std::uint8_t* data, std::size_t size, std::size_t n, bool add) {
  using Q = cgx::quant::maxmin<Bits, 64, cgx::quant::nearest>;  // small buckets: many per input
  while (n > 0 && Q::template compressed_bytes<T>(n) > size) n = n * 7 / 8;
  const std::size_t bytes = Q::template compressed_bytes<T>(n);
  std::vector<std::byte> in(bytes);
  if (bytes != 0) std::memcpy(in.data(), data, bytes);
  std::vector<T> out(n, T(0.5));
  if (add)
    Q::template decompress_add<T>(in.data(), n, out.data());
  else
    Q::template decompress<T>(in.data(), n, out.data());
}

template <int Bits>
void decode_type(const std::uint8_t* data, std::size_t size, std::size_t n, bool dbl, bool add) {
  if (dbl)
    decode<Bits, double>(data, size, n, add);
  else
    decode<Bits, float>(data, size, n, add);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  cgx_fuzz::input in{data, size};
  const unsigned mode = in.byte();
  const std::size_t n = in.u16();
  const bool dbl = (mode & 1) != 0, add = (mode & 2) != 0;
  cgx::quant::force_host_isa((mode & 0x10) != 0 ? cgx::quant::host_isa::scalar : cgx::quant::detected_host_isa());
  switch ((mode >> 2) & 3) {
    case 0: decode_type<1>(in.p, in.left, n, dbl, add); break;
    case 1: decode_type<2>(in.p, in.left, n, dbl, add); break;
    case 2: decode_type<4>(in.p, in.left, n, dbl, add); break;
    default: decode_type<8>(in.p, in.left, n, dbl, add); break;
  }
  return 0;
}
