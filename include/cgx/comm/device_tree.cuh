#pragma once
/// \file device_tree.cuh
/// `cgx::comm::device_tree<T, Q, X>`: the recursive halving / doubling of tree.hpp on
/// device buffers, stream-ordered, over a `device_transport` X: the same fold, virtual
/// ranks, halves, chunks, random keys, order of sums and wire bytes as the host tree,
/// hence its error bound (at most log2 q + 2 quantizations per value, see tree.hpp) and
/// the same bits on every rank (the doubling and the unfold forward the owners'
/// compressed chunks unchanged).
///
/// Every rank makes the same exchanges, in the same order, whatever its part (device
/// transports are collective per exchange): the fold (when p is not a power of two),
/// log2 q halving steps, log2 q doubling steps, the unfold (when p is not a power of
/// two). A rank with nothing to send or receive in one of them exchanges nothing.
///
/// Workspace (device, owned by the transport): q chunk slots (slot c holds the
/// compressed sum of chunk c), then two send and two receive slots of a whole
/// compressed buffer, used by exchange parity (the fold is exchange 0, halving step i
/// exchange i): a slot written before exchange k was last read by a peer in exchange
/// k - 2, the ordering that cuda_ipc's `prepare_send` relies on. Where the transport
/// hands over a peer's memory (cuda_ipc), a chunk received in the doubling is first
/// copied into this rank's own chunk slot, from which it may be forwarded.
///
/// The chunks, peers, virtual ranks, halves, keys and summation order are those of the
/// description schedule::tree (schedule/tree.hpp); the workspace layout is this file's.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "device_schedule.cuh"
#include "../schedule/tree.hpp"

namespace cgx::comm {

/// Recursive halving / doubling on device buffers (see the file comment).
template <class T, class Q, class X>
class device_tree {
  using D = device_kernels<Q, X>;
  static std::size_t slot_bytes(std::size_t n, int p) { return device_slot_bytes<D, T>(n, p, granule_of<Q>); }

 public:
  /// Buckets are never split between ranks.
  static constexpr std::size_t granule = granule_of<Q>;

  /// Bytes of device workspace for up to n values on p ranks: a slot per chunk of the
  /// power-of-two cut, two send and two receive slots of a whole compressed buffer.
  static std::size_t workspace_bytes(std::size_t n, int p) {
    if (p < 2) return 0;
    const sizes z = sizes_of(n, p);
    return static_cast<std::size_t>(description::pow2(p)) * z.slot + 4 * z.whole;
  }

  /// In-place sum over all ranks of d_buf[0..n), enqueued on `stream`; `max_n` (>= n) is
  /// the count the workspace was sized for, the same on every rank. Collective.
  void run(T* d_buf, std::size_t n, std::size_t max_n, X& x, std::byte* ws, const quant::rng_state& rng,
           cudaStream_t stream) {
    const int p = x.size();
    const int me = x.rank();
    if (p == 1 || n == 0) return;
    const description d = description::make(n, p, granule, &D::template compressed_bytes<T>);
    const int q = d.q;
    const sizes z = sizes_of(max_n, p);  // slots sized for max_n: the same offsets in every call
    auto chunk_off = [&](int c) { return static_cast<std::size_t>(c) * z.slot; };
    auto send_off = [&](int k) { return static_cast<std::size_t>(q) * z.slot + static_cast<std::size_t>(k & 1) * z.whole; };
    auto recv_off = [&](int k) {
      return static_cast<std::size_t>(q) * z.slot + static_cast<std::size_t>(2 + (k & 1)) * z.whole;
    };
    auto bytes_of = [&](std::size_t count) { return D::template compressed_bytes<T>(count); };
    auto chunk_index = [&](std::size_t off) { return static_cast<int>(off / z.slot); };  // of a chunk slot
    auto compress = [&](const chunk& c, std::size_t off, int step) {
      D::template compress<T>(d_buf + c.begin, c.count, ws + off, ::cgx::schedule::keyed(rng, d.key_of(me, step, c)),
                              stream);
    };
    // One message each way per step at most, but in the doubling and the unfold: one per chunk.
    msgs_.clear();
    recvs_.clear();
    auto exchange = [&](auto&& arrived) {
      x.exchange(std::span<const device_message>(msgs_), std::span<const device_message>(recvs_), stream, arrived);
      msgs_.clear();
      recvs_.clear();
    };
    const int v = d.virtual_rank(me);  // -1: sits out after the fold
    const bool folded = me < 2 * d.extra();

    // 0. Fold (exchange 0): the even rank of each of the first e pairs sends its whole buffer.
    if (d.extra() > 0) {
      x.prepare_send(stream);
      if (folded && me % 2 == 0) {
        compress(chunk{0, n}, send_off(0), 0);
        msgs_.push_back(device_msg(me + 1, send_off(0), recv_off(0), bytes_of(n)));
      } else if (folded) {
        recvs_.push_back(device_msg(me - 1, recv_off(0), send_off(0), bytes_of(n)));
      }
      exchange([&](std::size_t, const std::byte* data) { D::template decompress_add<T>(data, n, d_buf, stream); });
    }

    // 1. Halving (exchange i): keep the half holding v, send the other half.
    for (int i = 1; i <= d.levels(); ++i) {
      x.prepare_send(stream);
      chunk keep{0, 0};
      if (v >= 0) {
        const auto h = d.halve(v, i);
        keep = d.span_of(h.klo, h.khi);
        const chunk send = d.span_of(h.slo, h.shi);
        const int partner = d.real(h.partner);
        if (send.count != 0) {
          compress(send, send_off(i), i);
          msgs_.push_back(device_msg(partner, send_off(i), recv_off(i), bytes_of(send.count)));
        }
        if (keep.count != 0) recvs_.push_back(device_msg(partner, recv_off(i), send_off(i), bytes_of(keep.count)));
      }
      exchange([&](std::size_t, const std::byte* data) {
        D::template decompress_add<T>(data, keep.count, d_buf + keep.begin, stream);
      });
    }

    // 2. The owner of chunk v quantizes the finished sum once and keeps the decoded values.
    if (v >= 0) {
      const chunk mine = d.chunk_of(v);
      x.prepare_send(stream);  // chunk slot v: read by peers in the last call's doubling
      if (mine.count != 0) {
        compress(mine, chunk_off(v), d.levels() + 1);
        if constexpr (!Q::lossless) D::template decompress<T>(ws + chunk_off(v), mine.count, d_buf + mine.begin, stream);
      }
    }

    // 3. Doubling: exchange the aligned block of dist chunks held for the partner's block.
    for (int dist = 1; dist < q; dist *= 2) {
      // Before the first step, the sum's prepare_send already ordered the only write (chunk
      // slot v); a rank that sits out writes nothing.
      if (dist > 1) x.prepare_send(stream);
      if (v >= 0) {
        const int lo = description::block_lo(v, dist), plo = lo ^ dist;
        const int partner = d.real(v ^ dist);
        for (int c = plo; c < plo + dist; ++c)
          if (d.chunk_of(c).count != 0)
            recvs_.push_back(device_msg(partner, chunk_off(c), chunk_off(c), bytes_of(d.chunk_of(c).count)));
        for (int c = lo; c < lo + dist; ++c)
          if (d.chunk_of(c).count != 0)
            msgs_.push_back(device_msg(partner, chunk_off(c), chunk_off(c), bytes_of(d.chunk_of(c).count)));
      }
      exchange([&](std::size_t i, const std::byte* data) {
        const chunk c = d.chunk_of(chunk_index(recvs_[i].offset));
        std::byte* own = ws + recvs_[i].offset;
        if (data != own)  // a peer's memory (cuda_ipc): keep a copy to forward
          detail::cuda_check<runtime_of<X>>(
              runtime_of<X>::memcpy_async(own, data, bytes_of(c.count), cudaMemcpyDeviceToDevice, stream),
              "cgx::comm::device_tree: cudaMemcpyAsync (forwarded chunk)");
        D::template decompress<T>(own, c.count, d_buf + c.begin, stream);
      });
    }

    // 4. Unfold: the odd rank of each folded pair sends the q compressed chunks to its partner.
    if (d.extra() > 0) {
      x.prepare_send(stream);
      if (folded) {
        const bool receiver = me % 2 == 0;
        for (int c = 0; c < q; ++c) {
          const chunk cc = d.chunk_of(c);
          if (cc.count == 0) continue;
          const device_message m = device_msg(receiver ? me + 1 : me - 1, chunk_off(c), chunk_off(c), bytes_of(cc.count));
          (receiver ? recvs_ : msgs_).push_back(m);
        }
      }
      exchange([&](std::size_t i, const std::byte* data) {
        const chunk c = d.chunk_of(chunk_index(recvs_[i].offset));
        D::template decompress<T>(data, c.count, d_buf + c.begin, stream);
      });
    }
  }

 private:
  using description = ::cgx::schedule::tree;

  struct sizes {
    std::size_t slot;   // one chunk of the q-way cut, compressed, cache-line rounded
    std::size_t whole;  // the whole buffer, compressed, cache-line rounded
  };
  static sizes sizes_of(std::size_t n, int p) {
    return {slot_bytes(n, description::pow2(p)), round_to_line(D::template compressed_bytes<T>(n))};
  }

  std::vector<device_message> msgs_;   // this exchange's sends
  std::vector<device_message> recvs_;  // this exchange's receives
};

}  // namespace cgx::comm
