#pragma once
/// \file dispatch.hpp
/// The one place where run-time choices (a bit width read from a flag, a bucket size
/// picked by a tool) become compile-time types: `dispatch<V...>(v, f)` calls
/// `f(std::integral_constant<int, v>{})` for the value of the compiled set {V...} equal
/// to v.

#include <string>
#include <type_traits>

#include "error.hpp"

namespace cgx {

namespace detail {
template <int First, int...>
inline constexpr int first_of = First;
}  // namespace detail

/// Calls f(std::integral_constant<int, V>{}) for the V in {Vs...} that equals v and
/// returns its result; throws cgx::error(errc::invalid_argument) if v is not compiled in.

template <int... Vs, class F>
decltype(auto) dispatch(int v, F&& f) {
  using R = decltype(f(std::integral_constant<int, detail::first_of<Vs...>>{}));
  if constexpr (std::is_void_v<R>) {
    const bool hit = ((v == Vs ? (f(std::integral_constant<int, Vs>{}), true) : false) || ...);
    if (!hit) throw error(errc::invalid_argument, "dispatch: value " + std::to_string(v) + " is not in the compiled set");
  } else {
    R out{};
    const bool hit = ((v == Vs ? (out = f(std::integral_constant<int, Vs>{}), true) : false) || ...);
    if (!hit) throw error(errc::invalid_argument, "dispatch: value " + std::to_string(v) + " is not in the compiled set");
    return out;
  }
}

/// The bit widths of quant::maxmin: 1..8.
template <class F>
decltype(auto) dispatch_bits(int bits, F&& f) {
  return dispatch<1, 2, 3, 4, 5, 6, 7, 8>(bits, static_cast<F&&>(f));
}

}  // namespace cgx
