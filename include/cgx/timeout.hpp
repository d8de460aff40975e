#pragma once
/// \file timeout.hpp
/// The default wait limit of plans and transports, and CGX_TIMEOUT_MS.

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "error.hpp"

namespace cgx {

/// The wait limit a plan gets when its options do not set one: 10 minutes (600,000 ms),
/// long past any call a real job makes (a 1 GiB allreduce over 1 Gbit/s takes seconds),
/// short enough that a stalled or lost peer ends as errc::timeout on every rank instead
/// of a job that waits until someone kills it. The environment variable CGX_TIMEOUT_MS
/// (milliseconds; 0: no limit) replaces it for a job; a value that is not a number of
/// milliseconds below 2^32 throws cgx::error(errc::invalid_argument) where options are made.
inline constexpr std::uint32_t default_timeout_ms_value = 600000;

/// The default wait limit in force: CGX_TIMEOUT_MS when set (read each time options are
/// made), else default_timeout_ms_value. What plan_options::timeout_ms,
/// layerwise_options::timeout_ms and a transport's construction limit
/// (comm::mpi's constructors) start as.
inline std::uint32_t default_timeout_ms() {
  const char* env = std::getenv("CGX_TIMEOUT_MS");
  if (env == nullptr || *env == 0) return default_timeout_ms_value;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*env == '-' || *end != 0 || errno != 0 || v > 0xffffffffull)
    throw error(errc::invalid_argument, std::string("CGX_TIMEOUT_MS='") + env +
                                            "' is not a wait limit in milliseconds (0 to 4294967295; 0: no limit)");
  return static_cast<std::uint32_t>(v);
}

}  // namespace cgx
