#pragma once
/// \file varsize.hpp
/// `cgx::comm::varsize_exchange`: messages whose size only the sender knows (the output
/// of a variable-size quantizer such as quant::error_bounded), over any cgx transport.
///
/// A message travels as a fixed 8-byte header (its length in bytes, little-endian
/// uint64) followed by the payload. The receiver posts the header receive, and once the
/// header has arrived posts a receive of exactly that many payload bytes. This needs
/// nothing from the transport beyond exact-size, in-order point-to-point messages, so it
/// works on comm::shm (a byte stream per pair of ranks, matched in posting order) as on
/// comm::mpi (header and payload carry tags `tag` and `tag + 1`). The fixed-size
/// quantizers never come here: their schedules are unchanged.
///
/// One exchange carries at most one message per (peer, direction); the payload of an
/// empty message is not sent. Buffers passed to post_send/post_recv must stay valid
/// until wait() returns.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../concepts.hpp"
#include "../error.hpp"

namespace cgx::comm {

/// One round of variable-size sends and receives (see the file comment). Reusable:
/// post, wait, post again. Allocates at construction only.
template <class X>
class varsize_exchange {
 public:
  /// For a transport of `ranks` ranks.
  explicit varsize_exchange(int ranks)
      : send_len_(static_cast<std::size_t>(ranks)), recv_len_(static_cast<std::size_t>(ranks)),
        recv_buf_(static_cast<std::size_t>(ranks)), recv_cap_(static_cast<std::size_t>(ranks)),
        recv_tag_(static_cast<std::size_t>(ranks)) {
    reqs_.reserve(4 * static_cast<std::size_t>(ranks));
    heads_.reserve(static_cast<std::size_t>(ranks));
    peers_.reserve(static_cast<std::size_t>(ranks));
  }

  /// Starts sending bytes [buf, buf + bytes) to `peer`.
  void post_send(X& x, const std::byte* buf, std::size_t bytes, int peer, int tag) {
    const auto p = static_cast<std::size_t>(peer);
    send_len_[p] = static_cast<std::uint64_t>(bytes);
    reqs_.push_back(x.isend(&send_len_[p], sizeof(std::uint64_t), peer, tag));
    if (bytes != 0) reqs_.push_back(x.isend(buf, bytes, peer, tag + 1));
    sent_ += bytes + sizeof(std::uint64_t);
  }

  /// Starts receiving a message of at most `capacity` bytes from `peer` into buf.
  void post_recv(X& x, std::byte* buf, std::size_t capacity, int peer, int tag) {
    const auto p = static_cast<std::size_t>(peer);
    recv_buf_[p] = buf;
    recv_cap_[p] = capacity;
    recv_tag_[p] = tag;
    peers_.push_back(peer);
    heads_.push_back(x.irecv(&recv_len_[p], sizeof(std::uint64_t), peer, tag));
  }

  /// Completes every posted send and receive. Throws cgx::error(errc::corrupt) if a
  /// length header exceeds its receive's capacity (nothing is written past it; the
  /// payload stays unreceived, so the transport is unusable afterwards). Plans size
  /// receives from the sender's upper bound, so only a corrupt header or a peer running
  /// another plan gets there. The payload itself is not checked here: received() gives
  /// its length, which the caller's decoder must consume exactly.
  void wait(X& x) {
    x.wait_all(std::span(heads_));
    bool too_long = false;
    for (int peer : peers_) {
      const auto p = static_cast<std::size_t>(peer);
      if (recv_len_[p] > recv_cap_[p]) {
        too_long = true;  // still drain the other messages before throwing
        continue;
      }
      if (recv_len_[p] != 0) reqs_.push_back(x.irecv(recv_buf_[p], static_cast<std::size_t>(recv_len_[p]), peer, recv_tag_[p] + 1));
    }
    x.wait_all(std::span(reqs_));
    reqs_.clear();
    heads_.clear();
    peers_.clear();
    if (too_long) throw error(errc::corrupt, "varsize_exchange: a length header exceeds its receive buffer");
  }

  /// Length of the message received from `peer` in the last completed exchange.
  [[nodiscard]] std::size_t received(int peer) const { return static_cast<std::size_t>(recv_len_[static_cast<std::size_t>(peer)]); }

  /// Bytes this rank has sent (headers and payloads) since construction or reset_sent().
  [[nodiscard]] std::size_t sent() const noexcept { return sent_; }
  /// Restarts the count of sent().
  void reset_sent() noexcept { sent_ = 0; }

 private:
  std::vector<std::uint64_t> send_len_, recv_len_;
  std::vector<std::byte*> recv_buf_;
  std::vector<std::size_t> recv_cap_;
  std::vector<int> recv_tag_;
  std::vector<typename X::request> reqs_, heads_;
  std::vector<int> peers_;
  std::size_t sent_ = 0;
};

}  // namespace cgx::comm
