// cgx_torch::pg_transport: a cgx transport (cgx::transport, concepts.hpp) over the byte
// channel of a torch.distributed process group (plans.hpp's `channel`, implemented by
// bindings.cpp over c10d's send/recv/allreduce and the group's Store). It lets the
// layer-wise plans run under torchrun with the job's own gloo group and no MPI.
//
// It keeps the promises comm::mpi keeps, over what c10d offers:
// - Headers: every payload carries detail::wire_header (call number, plan signature,
//   count, bytes, checksum flag), checked before a byte of the payload is used: ranks
//   that disagree on the count or the plan, or are a call apart, get errc::mismatch. A
//   payload of at most inline_bytes travels in one message with its header, through a
//   staging buffer on both sides; a larger one follows its header as a message of its own,
//   straight from and into the caller's memory. With set_verify the header carries the
//   payload's CRC-32C (errc::corrupt on a mismatch).
// - Wait limit: the group's own timeout (init_process_group's / new_group's `timeout`), or
//   the plan's (set_wait_limit, plan_options::timeout_ms) where that is shorter: a wait
//   that lasts longer throws errc::timeout naming the rank waited for. A peer whose process is gone (its connection closed) gives
//   errc::transport at once.
// - Failures: a rank whose call fails (its wait limit, a bad header, a throw of the plan)
//   reports it through the channel (a key of the group's Store); a peer waiting on the
//   channel hears it within the channel's poll interval and throws errc::peer_failed
//   (errc::timeout / errc::corrupt / errc::mismatch for those failures), naming the rank.
//   After a failure the transport is failed: every later call throws at once.
// No torch header here (see plans.hpp).
#pragma once

#include "plans.hpp"

#include <cgx/error.hpp>
#include <cgx/comm/header.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace cgx_torch {

class pg_transport {
 public:
  /// Payloads up to this many bytes travel in the message of their header.
  static constexpr std::size_t inline_bytes = std::size_t{64} << 10;

  /// A posted send or receive: its header message and, above inline_bytes, its payload.
  struct request {
    channel::handle header = 0;    ///< 0: nothing to wait for
    channel::handle payload = 0;   ///< 0: none (inline, or no payload)
    std::size_t staging = 0;       ///< index of its staging buffer
    void* data = nullptr;          ///< a receive's destination
    std::size_t bytes = 0;         ///< payload bytes
    int peer = -1;
    bool recv = false;
  };

  explicit pg_transport(std::shared_ptr<channel> ch) : ch_(std::move(ch)) {
    if (!ch_) throw cgx::error(cgx::errc::communicator, "cgx_torch: no process group channel");
  }
  pg_transport(pg_transport&&) noexcept = default;
  pg_transport& operator=(pg_transport&&) noexcept = default;

  [[nodiscard]] int rank() const { return ch_->rank(); }
  [[nodiscard]] int size() const { return ch_->size(); }

  request isend(const void* buf, std::size_t bytes, int peer, int tag) {
    throw_if_failed();
    request r = stage(bytes, peer, false);
    std::vector<std::byte>& st = staging_[r.staging];
    const cgx::comm::detail::wire_header h = stamp_.outgoing(buf, bytes);
    std::memcpy(st.data(), &h, sizeof h);
    const bool inl = bytes <= inline_bytes;
    if (inl && bytes > 0) std::memcpy(st.data() + sizeof h, buf, bytes);
    try {
      r.header = ch_->isend(st.data(), st.size(), peer, tag);
      if (!inl) r.payload = ch_->isend(buf, bytes, peer, tag);
    } catch (const std::exception& e) {
      refused(e, peer);
    }
    return r;
  }

  request irecv(void* buf, std::size_t bytes, int peer, int tag) {
    throw_if_failed();
    request r = stage(bytes, peer, true);
    r.data = buf;
    std::vector<std::byte>& st = staging_[r.staging];
    try {
      r.header = ch_->irecv(st.data(), st.size(), peer, tag);
      if (bytes > inline_bytes) r.payload = ch_->irecv(buf, bytes, peer, tag);
    } catch (const std::exception& e) {
      refused(e, peer);
    }
    return r;
  }

  /// Waits for every request in reqs; checks each received header (and checksum), copies
  /// an inline payload into place once its header passed. Throws cgx::error.
  void wait_all(std::span<request> reqs) {
    throw_if_failed();
    handles_.clear();
    std::size_t posted = 0;
    for (const request& r : reqs) {
      if (r.header == 0) continue;
      ++posted;
      handles_.push_back(r.header);
      if (r.payload != 0) handles_.push_back(r.payload);
    }
    const wait_result w = ch_->wait(handles_.data(), handles_.size(), effective_limit_ms());
    in_flight_ -= posted;
    if (w.kind != wait_result::ok) {
      for (request& r : reqs) r.header = r.payload = 0;
      fail_from_wait(w);
    }
    if (w.kind != wait_result::ok) fail_from_wait(w);
    for (request& r : reqs) {
      const bool was_posted = r.header != 0;
      r.header = r.payload = 0;
      if (!r.recv || !was_posted) continue;
      std::vector<std::byte>& st = staging_[r.staging];
      cgx::comm::detail::wire_header got;
      std::memcpy(&got, st.data(), sizeof got);
      const cgx::comm::detail::wire_header want = stamp_.expected(r.bytes);
      if (std::string why = cgx::comm::detail::header_mismatch(got, want, r.peer); !why.empty())
        fail(cgx::errc::mismatch, where() + why, -1);
      if (r.bytes > 0 && r.bytes <= inline_bytes) std::memcpy(r.data, st.data() + sizeof got, r.bytes);
      if (std::string why = cgx::comm::detail::payload_corrupt(got, r.data, r.bytes, r.peer); !why.empty())
        fail(cgx::errc::corrupt, where() + why, -1);
    }
    if (in_flight_ == 0) used_ = 0;  // the staging buffers are free for reuse
  }

  /// Element-wise maximum over the ranks (the group's allreduce).
  void max_all(std::span<std::int64_t> v) {
    throw_if_failed();
    try {
      ch_->max_all(v.data(), v.size());
    } catch (const std::exception& e) {
      fail(cgx::errc::transport, where() + "the process group's allreduce (MAX) failed: " + e.what(), -1);
    }
  }

  /// Bounds every later wait (zero, or longer than the group's timeout: the group's timeout).
  void set_wait_limit(std::chrono::milliseconds limit) noexcept { limit_ = limit; }
  [[nodiscard]] std::chrono::milliseconds wait_limit_value() const noexcept { return limit_; }
  void set_verify(bool on) noexcept { stamp_.verify = on; }
  [[nodiscard]] bool verify() const noexcept { return stamp_.verify; }
  void begin_call(const cgx::comm::call_context& c) noexcept { stamp_.begin(c); }
  [[nodiscard]] const cgx::comm::call_context& context() const noexcept { return stamp_.ctx; }

  /// Tells the peers that this rank's call failed (the channel's report); the transport
  /// is failed from then on. Never throws.
  void abort(cgx::errc code, const std::string& why, int waited_for = -1) noexcept {
    if (failed_) return;
    try {
      failed_.emplace(code, why.empty() ? where() + "a rank threw during the call" : why);
    } catch (...) {
      return;
    }
    ch_->report(rank(), static_cast<int>(code), waited_for, why);
  }

  /// Throws an earlier failure, or a peer's report heard so far.
  void throw_if_failed() {
    if (failed_) throw cgx::error(failed_->first, failed_->second);
    const channel::heard_report h = ch_->heard();
    if (h.origin >= 0) {
      wait_result w;
      w.kind = wait_result::peer_failed;
      w.peer = h.origin;
      fail_from_wait(w);
    }
  }
  [[nodiscard]] bool failed() const noexcept { return failed_.has_value(); }

 private:
  /// The wait limit: the plan's (timeout_ms) where it is shorter than the group's timeout.
  [[nodiscard]] std::int64_t effective_limit_ms() const noexcept {
    const std::int64_t g = ch_->timeout_ms();
    return limit_.count() > 0 && limit_.count() < g ? static_cast<std::int64_t>(limit_.count()) : g;
  }
  std::string where() const { return "cgx_torch process group transport (rank " + std::to_string(rank()) + "): "; }

  /// A request with a staging buffer for its header (and an inline payload).
  request stage(std::size_t bytes, int peer, bool recv) {
    if (peer < 0 || peer >= size())
      throw cgx::error(cgx::errc::invalid_argument, where() + "peer " + std::to_string(peer) + " out of range");
    request r;
    r.bytes = bytes;
    r.peer = peer;
    r.recv = recv;
    if (used_ == staging_.size()) staging_.emplace_back();
    r.staging = used_++;
    const std::size_t len = sizeof(cgx::comm::detail::wire_header) + (bytes <= inline_bytes ? bytes : 0);
    staging_[r.staging].resize(len);
    ++in_flight_;
    return r;
  }

  /// A send or receive the group refused: a peer's report heard (the channel reads it
  /// before it throws), or this rank's failure.
  [[noreturn]] void refused(const std::exception& e, int peer) {
    if (ch_->heard().origin >= 0) {
      wait_result w;
      w.kind = wait_result::peer_failed;
      w.peer = peer;
      fail_from_wait(w);
    }
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    fail(cgx::errc::transport, where() + "the process group refused a message to or from rank " +
                                   std::to_string(peer) + ": " + what, peer);
  }

  /// Fails the transport (reporting to the peers) and throws.
  [[noreturn]] void fail(cgx::errc code, const std::string& why, int waited_for) {
    abort(code, why, waited_for);
    throw cgx::error(code, why);
  }

  /// The error of a failed wait: a timeout or a broken link is this rank's failure (told
  /// to the peers); a report heard is a peer's (not told again).
  [[noreturn]] void fail_from_wait(const wait_result& w) {
    if (w.kind == wait_result::timeout)
      fail(cgx::errc::timeout,
           where() + "timed out waiting for rank " + std::to_string(w.peer) + " (after " +
               std::to_string(effective_limit_ms()) + " ms: " +
               (effective_limit_ms() < ch_->timeout_ms() ? "the plan's timeout_ms" : "the process group's timeout") +
               ")" + (w.what.empty() ? "" : ": " + w.what),
           w.peer);
    if (w.kind == wait_result::broken)
      fail(cgx::errc::transport,
           where() + "the link to rank " + std::to_string(w.peer) + " failed (its process may have exited): " + w.what,
           w.peer);
    channel::heard_report h = ch_->heard();
    if (h.origin < 0) {  // the wait was stopped for a report this rank has not read back
      h.origin = w.peer;
      h.code = static_cast<int>(cgx::errc::transport);
    }
    const auto code = static_cast<cgx::errc>(h.code);
    cgx::errc mine = cgx::errc::peer_failed;
    if (code == cgx::errc::timeout || code == cgx::errc::corrupt) mine = code;
    std::string what = where() + "rank " + std::to_string(h.origin) + " ";
    if (code == cgx::errc::timeout) {
      what += "timed out";
      if (h.waited_for >= 0) what += " waiting for rank " + std::to_string(h.waited_for);
    } else if (code == cgx::errc::corrupt) {
      what += "received a corrupt message (plan_options::verify)";
    } else if (code == cgx::errc::mismatch) {
      what += "received a message of another count, plan or call (the ranks disagree)";
    } else {
      what += "failed (it threw)";
    }
    what += "; this call was abandoned" + (h.why.empty() ? std::string() : " (its report: " + h.why + ")");
    failed_.emplace(mine, what);
    throw cgx::error(mine, what);
  }

  std::shared_ptr<channel> ch_;
  cgx::comm::detail::call_stamp stamp_;
  std::chrono::milliseconds limit_{0};
  std::deque<std::vector<std::byte>> staging_;  // headers and inline payloads; reused once nothing is in flight
  std::size_t used_ = 0;                        // staging buffers in use
  std::size_t in_flight_ = 0;                   // requests posted and not yet waited for
  std::vector<channel::handle> handles_;
  std::optional<std::pair<cgx::errc, std::string>> failed_;
};

}  // namespace cgx_torch
