#pragma once
/// \file checked.hpp
/// Size arithmetic that cannot wrap: every workspace and message size of a plan is
/// computed with these helpers, so that a capacity whose bytes do not fit in
/// std::size_t (max_count = SIZE_MAX, 2^63 - 1, ...) is an error instead of a small
/// workspace that a later call writes past. And the allocation of a workspace, so that
/// a capacity the machine cannot hold is cgx::error(errc::workspace), not std::bad_alloc.
///
/// The helpers throw cgx::error(errc::invalid_argument) on overflow; a plan catches it
/// in `sized()` and names itself, its max_count and its rank count in the message.

#include <cstddef>
#include <limits>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "../error.hpp"

namespace cgx::detail {

/// Throws the overflow error of `a op b` (errc::invalid_argument).
[[noreturn]] inline void throw_size_overflow(std::size_t a, const char* op, std::size_t b) {
  throw error(errc::invalid_argument,
              "size " + std::to_string(a) + op + std::to_string(b) + " overflows std::size_t");
}

/// a * b; throws cgx::error(errc::invalid_argument) if it does not fit in std::size_t.
inline std::size_t checked_mul(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) throw_size_overflow(a, " x ", b);
  return r;
}

/// a + b; throws cgx::error(errc::invalid_argument) if it does not fit in std::size_t.
inline std::size_t checked_add(std::size_t a, std::size_t b) {
  std::size_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) throw_size_overflow(a, " + ", b);
  return r;
}

/// Largest number of raw bytes (count x sizeof(T)) a plan accepts: 2^60. Every codec of
/// cgx writes at most 2.25 bytes per raw byte plus one per value (quant::error_bounded's
/// escape of doubles for float data), so below this limit no compressed size, slot or
/// bucket count wraps, and the size functions that run on every call (and on the
/// device) need no checks of their own.
inline constexpr std::size_t max_raw_bytes = std::size_t{1} << 60;

/// Throws cgx::error(errc::invalid_argument) unless n values of `value_bytes` bytes
/// each stay within max_raw_bytes.
inline void check_raw_bytes(std::size_t n, std::size_t value_bytes) {
  if (checked_mul(n, value_bytes) > max_raw_bytes)
    throw error(errc::invalid_argument, std::to_string(n) + " values of " + std::to_string(value_bytes) +
                                            " bytes exceed the 2^60 bytes a plan accepts");
}

/// `bytes` rounded up to a multiple of 64 (a cache line), checked.
inline std::size_t checked_round_to_line(std::size_t bytes) { return checked_add(bytes, 63) / 64 * 64; }

/// Calls size(), which computes a workspace size with the checked helpers, and rethrows
/// its overflow as cgx::error(errc::invalid_argument) naming the plan `who`, its
/// max_count and its rank count.
template <class F>
std::size_t sized(const char* who, std::size_t max_count, int ranks, F size) {
  try {
    return size();
  } catch (const error& e) {
    if (e.code() != errc::invalid_argument) throw;
    throw error(errc::invalid_argument, std::string(who) + ": max_count " + std::to_string(max_count) + " on " +
                                            std::to_string(ranks) + " ranks: the workspace size cannot be computed (" +
                                            (e.what() + 5) + ")");  // what() starts with "cgx: "
  }
}

/// Allocates `bytes` of uninitialized workspace (at least one byte) for the plan `who`;
/// throws cgx::error(errc::workspace) when the allocation fails.
inline std::unique_ptr<std::byte[]> allocate_workspace(std::size_t bytes, const char* who, std::size_t max_count,
                                                       int ranks) {
  try {
    return std::make_unique_for_overwrite<std::byte[]>(bytes == 0 ? 1 : bytes);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  throw error(errc::workspace, std::string(who) + ": cannot allocate a workspace of " + std::to_string(bytes) +
                                   " bytes for max_count " + std::to_string(max_count) + " on " + std::to_string(ranks) +
                                   " ranks");
}

}  // namespace cgx::detail
