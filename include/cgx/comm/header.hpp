#pragma once
/// \file header.hpp
/// The in-band message header of the host transports (comm::mpi, comm::shm), and the
/// call context a plan gives its transport at the start of each call.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "../detail/crc32c.hpp"

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

using cgx::detail::crc32c;

/// The in-band header of every message of comm::mpi and comm::shm: 40 bytes ahead of
/// the payload (comm::mpi: a message of its own, same peer and tag, so the payload still
/// travels from and into the caller's memory; comm::shm: the ring's next 40 bytes).
struct wire_header {
  std::uint32_t magic = 0;     ///< header_magic
  std::uint32_t call = 0;      ///< the sender transport's call number (count of begin_call)
  std::int64_t signature = 0;  ///< call_context::signature
  std::uint64_t count = 0;     ///< call_context::count
  std::uint64_t bytes = 0;     ///< payload bytes that follow
  std::uint32_t flags = 0;     ///< header_verified when the sender checksums its payloads
  std::uint32_t crc = 0;       ///< with header_verified: the payload's CRC-32C, else 0
};
static_assert(sizeof(wire_header) == 40);
inline constexpr std::uint32_t header_magic = 0x63677848u;  // "cgxH"
/// wire_header::flags: the payload's CRC-32C is in `crc` (plan_options::verify).
inline constexpr std::uint32_t header_verified = 1u;

/// The header of a message of `bytes` payload bytes in call `call` of context `c`, from
/// a transport that does (`verified`) or does not checksum its payloads (the checksum
/// itself is filled in by the sender).
inline wire_header make_header(const call_context& c, std::uint32_t call, std::size_t bytes,
                               bool verified = false) noexcept {
  wire_header h;
  h.magic = header_magic;
  h.call = call;
  h.signature = c.signature;
  h.count = c.count;
  h.bytes = bytes;
  h.flags = verified ? header_verified : 0u;
  return h;
}

/// What a host transport stamps on its messages and expects on those it receives: the
/// current call's context and number (begin_call), and whether payloads are checksummed
/// (set_verify). comm::mpi and comm::shm each keep one.
struct call_stamp {
  call_context ctx{};      ///< the current call's context
  std::uint32_t call = 0;  ///< number of calls begun
  bool verify = false;     ///< payloads carry their CRC-32C

  /// Starts the next call, of context `c`.
  void begin(const call_context& c) noexcept {
    ctx = c;
    ++call;
  }
  /// The header expected on a received message of `bytes` payload bytes.
  [[nodiscard]] wire_header expected(std::size_t bytes) const noexcept { return make_header(ctx, call, bytes, verify); }
  /// The header of an outgoing message of data[0..bytes) (with its checksum, under verify).
  [[nodiscard]] wire_header outgoing(const void* data, std::size_t bytes) const noexcept {
    wire_header h = expected(bytes);
    if (verify) h.crc = crc32c(data, bytes);
    return h;
  }
};

/// Empty if `got` (from rank `peer`) is the header this rank expects, else why not.
inline std::string header_mismatch(const wire_header& got, const wire_header& want, int peer) {
  if (got.magic == header_magic && got.call == want.call && got.signature == want.signature && got.count == want.count &&
      got.bytes == want.bytes && got.flags == want.flags)
    return {};  // the common case: no string is built
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
  if (got.flags != want.flags)
    return from + ((got.flags & header_verified) ? " is checksummed and this rank's plan is not"
                                                 : " is not checksummed and this rank's plan is") +
           " (the ranks disagree on plan_options::verify)";
  return {};
}

/// Test seam of the integrity check: when set, comm::mpi and comm::shm call it on every
/// received payload of a checksummed message (plan_options::verify) before they check
/// it, with the sending rank, the bytes and their length. The fault tests set it to flip
/// a bit, as a faulty link or memory would; nothing else should.
inline std::atomic<void (*)(int peer, void* data, std::size_t bytes)> received_payload_hook{nullptr};

/// Empty if `data[0..bytes)`, received from rank `peer` under header `h`, has the CRC-32C
/// the header announces (or the header announces none), else why not. Calls
/// received_payload_hook first, where one is set.
inline std::string payload_corrupt(const wire_header& h, void* data, std::size_t bytes, int peer) {
  if (!(h.flags & header_verified)) return {};
  if (auto* hook = received_payload_hook.load(std::memory_order_relaxed)) hook(peer, data, bytes);
  const std::uint32_t got = crc32c(data, bytes);
  if (got == h.crc) return {};
  return "the " + std::to_string(bytes) + "-byte message from rank " + std::to_string(peer) +
         " fails its CRC-32C check (plan_options::verify): it was corrupted on the way";
}

}  // namespace detail
}  // namespace cgx::comm
