#pragma once
/// \file requantize.hpp
/// `cgx::quant::add_requantize<Q, T>`: the owner's last step in a compressed reduction,
/// with the fused form a codec may provide.

#include <cstddef>

#include "host_exec.hpp"
#include "rounding.hpp"

namespace cgx::quant {

/// The owner's last step in a compressed reduction: buf[0..n) += the decoded `addend`
/// (when it is not null), then compress buf into out, then (unless Q is lossless) replace
/// buf by the decoded out, so that the owner holds what every other rank decodes.
///
/// A codec may do the three as one pass by providing
/// `Q::add_requantize<T>(addend, buf, n, out, rng, ex)`; it must write the bytes and
/// values of the separate calls (quant::maxmin does: its buffer is then read from memory
/// once instead of three times). Otherwise the separate calls run.
template <class Q, class T>
void add_requantize(const std::byte* addend, T* buf, std::size_t n, std::byte* out, const rng_state& rng, host_exec ex) {
  if constexpr (requires { Q::template add_requantize<T>(addend, buf, n, out, rng, ex); }) {
    Q::template add_requantize<T>(addend, buf, n, out, rng, ex);
  } else {
    if (addend != nullptr) Q::template decompress_add<T>(addend, n, buf, ex);
    Q::template compress<T>(buf, n, out, rng, ex);
    if constexpr (!Q::lossless) Q::template decompress<T>(out, n, buf, ex);
  }
}

}  // namespace cgx::quant
