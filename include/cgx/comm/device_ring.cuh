#pragma once
/// \file device_ring.cuh
/// `cgx::comm::device_ring<T, Q, X>`: the ring schedule of ring.hpp on device buffers,
/// stream-ordered, over a `device_transport` X: the same chunks, hops, random streams
/// and wire bytes as the host ring, hence its error bound (p quantizations on the
/// longest path, see ring.hpp) and the same bits on every rank (the allgather forwards
/// the owner's compressed bytes unchanged).
///
/// Workspace (device, owned by the transport): p allgather slots (slot c holds the
/// compressed sum of chunk c), then two send and two receive slots for the
/// reduce-scatter, used by step parity: a slot written at step s was last read by a
/// peer at step s - 2, the ordering that cuda_ipc's `prepare_send` relies on. Where the
/// transport hands over a peer's memory (cuda_ipc), a forwarded chunk is first copied
/// into this rank's own allgather slot.
///
/// The chunks, peers, steps, random keys and summation order are those of the
/// description schedule::ring (schedule/ring.hpp); the workspace layout is this file's.

#include <cstddef>
#include <cstdint>
#include <span>

#include "device_schedule.cuh"
#include "../schedule/ring.hpp"

namespace cgx::comm {

/// The ring on device buffers (see the file comment).
template <class T, class Q, class X>
class device_ring {
  using D = device_kernels<Q, X>;
  static std::size_t slot_bytes(std::size_t n, int p) { return device_slot_bytes<D, T>(n, p, granule_of<Q>); }

 public:
  /// Buckets are never split between ranks.
  static constexpr std::size_t granule = granule_of<Q>;

  /// Bytes of device workspace for up to n values on p ranks: p gather slots, two send
  /// and two receive slots.
  static std::size_t workspace_bytes(std::size_t n, int p) {
    return p < 2 ? 0 : (static_cast<std::size_t>(p) + 4) * slot_bytes(n, p);
  }

  /// The values of chunk c.
  static chunk chunk_of(std::size_t n, int p, int c) { return comm::chunk_of(n, p, c, granule); }

  /// In-place sum over all ranks of d_buf[0..n), enqueued on `stream`; `max_n` (>= n) is
  /// the count the workspace was sized for, the same on every rank. Collective.
  void run(T* d_buf, std::size_t n, std::size_t max_n, X& x, std::byte* ws, const quant::rng_state& rng,
           cudaStream_t stream) {
    const int p = x.size();
    const int me = x.rank();
    if (p == 1 || n == 0) return;
    const std::size_t slot = slot_bytes(max_n, p);
    auto gather_off = [&](int c) { return static_cast<std::size_t>(c) * slot; };
    auto send_off = [&](int s) { return static_cast<std::size_t>(p + (s & 1)) * slot; };
    auto recv_off = [&](int s) { return static_cast<std::size_t>(p + 2 + (s & 1)) * slot; };
    // Chunks, peers and keys; the slots are this file's (sized for max_n, parity send/receive).
    const description d = description::make(n, p, granule, &D::template compressed_bytes<T>);
    const int right = d.right(me);
    const int left = d.left(me);
    auto bytes_of = [&](const chunk& c) { return D::template compressed_bytes<T>(c.count); };
    device_message snd[1];
    device_message rcv[1];

    // 1. Reduce-scatter: at step s send the running sum of chunk me - s, add chunk me - s - 1.
    for (int s = 0; s + 1 < p; ++s) {
      const chunk out = d.chunk_of(d.reduce_out(me, s));
      const chunk in = d.chunk_of(d.reduce_in(me, s));
      x.prepare_send(stream);
      std::size_t ns = 0, nr = 0;
      if (out.count != 0) {
        D::template compress<T>(d_buf + out.begin, out.count, ws + send_off(s),
                                ::cgx::schedule::keyed(rng, description::contribution_key(me, out)), stream);
        snd[ns++] = device_msg(right, send_off(s), recv_off(s), bytes_of(out));
      }
      if (in.count != 0) rcv[nr++] = device_msg(left, recv_off(s), send_off(s), bytes_of(in));
      x.exchange(std::span<const device_message>(snd, ns), std::span<const device_message>(rcv, nr), stream,
                 [&](std::size_t, const std::byte* d) {
                   D::template decompress_add<T>(d, in.count, d_buf + in.begin, stream);
                 });
    }

    // 2. The owner quantizes the finished sum once and keeps the decoded bytes.
    const int own = d.owned(me);
    const chunk mine = d.chunk_of(own);
    x.prepare_send(stream);
    if (mine.count != 0) {
      D::template compress<T>(d_buf + mine.begin, mine.count, ws + gather_off(own), ::cgx::schedule::keyed(rng, d.sum_key(me, mine)),
                              stream);
      if constexpr (!Q::lossless)
        D::template decompress<T>(ws + gather_off(own), mine.count, d_buf + mine.begin, stream);
    }

    // 3. Allgather: forward the compressed chunks unchanged.
    for (int s = 0; s + 1 < p; ++s) {
      const int cout = d.gather_out(me, s);
      const int cin = d.gather_in(me, s);
      const chunk out = d.chunk_of(cout);
      const chunk in = d.chunk_of(cin);
      if (s > 0) x.prepare_send(stream);
      std::size_t ns = 0, nr = 0;
      if (out.count != 0) snd[ns++] = device_msg(right, gather_off(cout), gather_off(cout), bytes_of(out));
      if (in.count != 0) rcv[nr++] = device_msg(left, gather_off(cin), gather_off(cin), bytes_of(in));
      x.exchange(std::span<const device_message>(snd, ns), std::span<const device_message>(rcv, nr), stream,
                 [&](std::size_t, const std::byte* d) {
                   std::byte* mine_copy = ws + gather_off(cin);
                   if (d != mine_copy)  // a peer's memory (cuda_ipc): keep a copy to forward
                     detail::cuda_check<runtime_of<X>>(
                         runtime_of<X>::memcpy_async(mine_copy, d, bytes_of(in), cudaMemcpyDeviceToDevice, stream),
                         "cgx::comm::device_ring: cudaMemcpyAsync (forwarded chunk)");
                   D::template decompress<T>(mine_copy, in.count, d_buf + in.begin, stream);
                 });
    }
  }

 private:
  using description = ::cgx::schedule::ring;
};

}  // namespace cgx::comm
