#pragma once
/// \file header.hpp
/// The in-band message header of the host transports (comm::mpi, comm::shm), and the
/// call context a plan gives its transport at the start of each call.

#include <cstdint>
#include <string>

namespace cgx::comm {

/// What a plan tells its transport at the start of each call, once its arguments are
/// checked (`begin_call`): the plan's signature (value type, quantizer, reducer,
/// options) and the call's count. The transport stamps them, with its own call number,
/// on every message of the call (detail::wire_header) and checks them on every message
/// it receives, before it uses a byte of the payload: ranks that passed different
/// counts or plans, or that are a call apart, get errc::mismatch at any checking level.
struct call_context {
  std::int64_t signature = 0;  ///< the plan's signature (detail::plan_signature)
  std::uint64_t count = 0;     ///< the call's count of values
};

namespace detail {

/// The in-band header of every message of comm::mpi and comm::shm: 32 bytes ahead of
/// the payload (comm::mpi: a message of its own, same peer and tag, so the payload still
/// travels from and into the caller's memory; comm::shm: the ring's next 32 bytes).
struct wire_header {
  std::uint32_t magic = 0;     ///< header_magic
  std::uint32_t call = 0;      ///< the sender transport's call number (count of begin_call)
  std::int64_t signature = 0;  ///< call_context::signature
  std::uint64_t count = 0;     ///< call_context::count
  std::uint64_t bytes = 0;     ///< payload bytes that follow
};
static_assert(sizeof(wire_header) == 32);
inline constexpr std::uint32_t header_magic = 0x63677848u;  // "cgxH"

/// The header of a message of `bytes` payload bytes in call `call` of context `c`.
inline wire_header make_header(const call_context& c, std::uint32_t call, std::size_t bytes) noexcept {
  wire_header h;
  h.magic = header_magic;
  h.call = call;
  h.signature = c.signature;
  h.count = c.count;
  h.bytes = bytes;
  return h;
}

/// Empty if `got` (from rank `peer`) is the header this rank expects, else why not.
inline std::string header_mismatch(const wire_header& got, const wire_header& want, int peer) {
  const std::string from = "the message from rank " + std::to_string(peer);
  if (got.magic != header_magic) return from + " does not start with a cgx header (corrupt, or out of step)";
  if (got.call != want.call)
    return from + " belongs to its call " + std::to_string(got.call) + ", this rank is in call " +
           std::to_string(want.call) + " (a rank skipped or added a call)";
  if (got.signature != want.signature)
    return from + " comes from a plan of another value type, quantizer, reducer or options";
  if (got.count != want.count)
    return from + " is for a count of " + std::to_string(got.count) + ", this rank's call has " +
           std::to_string(want.count) + " (the ranks passed different counts)";
  if (got.bytes != want.bytes)
    return from + " carries " + std::to_string(got.bytes) + " bytes, this rank expects " + std::to_string(want.bytes);
  return {};
}

}  // namespace detail
}  // namespace cgx::comm
