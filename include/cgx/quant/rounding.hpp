#pragma once
/// \file rounding.hpp
/// Rounding policies of the quantizers and the key of stochastic rounding's random bits.

#include <cstdint>
#include <type_traits>

namespace cgx::quant {

/// Round each value to the nearest level: error at most half a quantization unit, biased.
struct nearest {};

/// Round each value up or down at random with probabilities that make the expected
/// decoded value equal the input: E[decode(encode(x))] = x (to within 2^-16 of a unit),
/// error below one unit.
struct stochastic {};

/// True for the rounding policies above.
template <class R>
inline constexpr bool is_rounding_v = std::is_same_v<R, nearest> || std::is_same_v<R, stochastic>;

/// Where stochastic rounding takes its random bits from. The bits of an element are a
/// pure function of (seed, stream, counter, position): `position` is the index of the
/// first element passed to `compress` within the caller's whole buffer, so compressing
/// a buffer in pieces or on another device or thread layout gives the same bytes.
/// Ranks use distinct `stream`s so that their rounding errors are independent, and a
/// plan bumps `counter` on every call. Ignored by `nearest`.
///
/// `device_calls` is for device kernels only (the host kernels ignore it): a device
/// address whose value the kernel adds to `counter` when it runs. Device plans keep
/// their call counter there and advance it in stream order, so that a call captured in
/// a CUDA graph draws new bits on every replay instead of the bits frozen at capture.
struct rng_state {
  std::uint64_t seed = 0x63677821u;              ///< user seed
  std::uint32_t counter = 0;                     ///< call counter
  std::uint32_t stream = 0;                      ///< independent stream, e.g. the rank
  std::uint64_t position = 0;                    ///< global index of element 0 of this compress call
  const std::uint32_t* device_calls = nullptr;   ///< device kernels: added to counter at run time
};

}  // namespace cgx::quant
