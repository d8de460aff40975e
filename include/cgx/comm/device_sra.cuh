#pragma once
/// \file device_sra.cuh
/// `cgx::comm::device_sra<T, Q, X>`: the scatter-reduce-allgather schedule of
/// scatter_reduce_allgather.hpp on device buffers, stream-ordered, over a
/// `device_transport` X. Same chunks, same random streams, same summation order (rank
/// order), same wire bytes as the host schedule, and therefore the same error bound
/// (see scatter_reduce_allgather.hpp); every rank ends with the same bits, because the
/// owner of a chunk decodes its own re-quantized sum like everyone else.
///
/// Chunks, peers, slots, random keys and the order of sums are those of the description
/// schedule::sra (its whole form: one message per chunk and phase), in this workspace
/// (device, owned by the transport): each slot of the compressed size of the largest
/// chunk of max_n rounded to a cache line. The messages are device_sra_executor's,
/// shared with layerwise_device_plan.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "device_schedule.cuh"
#include "../schedule/sra.hpp"

namespace cgx::comm {

/// The device executor of scatter-reduce-allgather: the messages, slots and summation
/// order of a schedule::sra_pattern over a `device_transport`, stream-ordered, for one
/// rank. What is compressed into a slot and how an arrived slot is decoded is the
/// caller's *chunk codec* C, which enqueues on the stream given to run():
///  - `bytes(o)`: compressed bytes of chunk o (0: an empty chunk, never sent);
///  - `contribute(o, out)`: this rank's values of chunk o, compressed into `out` with
///    the pattern's contribution key;
///  - `add(in)`: an addend of this rank's chunk, decoded from `in` and added;
///  - `finish(out)`: this rank's summed chunk compressed into `out` with the sum key and,
///    for a lossy codec, decoded back into the buffer (the owner keeps the bits everyone
///    gets);
///  - `decode(o, in)`: chunk o decoded from `in` into the buffer.
/// comm::device_sra (one codec call per chunk) and layerwise_device_plan (per-layer
/// pieces) share it. Phase 1 writes send slots r != me; the owned sum goes to send slot
/// me, which phase 1 never sends: the rule cuda_ipc relies on (see there).
class device_sra_executor {
 public:
  /// One reduction: in place in the codec's buffer, on `stream`. `ws` is x's workspace;
  /// the slots of `d` lie at byte `at` of it. With `gather` false it stops after the
  /// scatter-reduce: each rank holds its own chunk's sum, decoded from its quantized form
  /// (`finish`), and nothing else changes (a reduce-scatter). Collective.
  template <class X, class C>
  void run(X& x, const ::cgx::schedule::sra_pattern& d, std::byte* ws, const C& c, cudaStream_t stream,
           bool gather = true, std::size_t at = 0) {
    const int p = x.size();
    const int me = x.rank();
    const std::size_t mine_bytes = c.bytes(me);
    // Messages name workspace offsets; the codec gets addresses.
    auto msg = [at](int peer, std::size_t offset, std::size_t remote, std::size_t b) {
      return device_msg(peer, at + offset, at + remote, b);
    };
    ws += at;

    // Phase 1: scatter-reduce. Compress this rank's part of every other chunk.
    x.prepare_send(stream);
    sends_.clear();
    recvs_.clear();
    for (int step = 1; step < p; ++step) {
      const int o = d.to(me, step);
      const std::size_t b = c.bytes(o);
      if (b == 0) continue;
      c.contribute(o, ws + d.send_slot(o));
      sends_.push_back(msg(o, d.send_slot(o), d.recv_slot(me), b));
    }
    if (mine_bytes != 0)
      for (int i = 0; i + 1 < p; ++i) {
        const int r = d.addend(me, i);
        recvs_.push_back(msg(r, d.recv_slot(r), d.send_slot(me), mine_bytes));
      }
    // In the pattern's order (a fixed summation order), each part as soon as it has arrived.
    x.exchange(std::span<const device_message>(sends_), std::span<const device_message>(recvs_), stream,
               [&](std::size_t, const std::byte* in) { c.add(in); });

    // The sum is quantized once; the owner keeps the decoded bytes, like everyone else.
    x.prepare_send(stream);
    if (mine_bytes != 0) c.finish(ws + d.send_slot(me));
    if (!gather) {
      // finish's work on the workspace comes after the last exchange: fenced, so that
      // the next call (on any stream) writes nothing it still reads.
      if constexpr (requires { x.fence(stream); }) x.fence(stream);
      return;
    }

    // Phase 2: allgather of the compressed sums, received into the gather slots.
    sends_.clear();
    recvs_.clear();
    if (mine_bytes != 0)
      for (int step = 1; step < p; ++step) sends_.push_back(msg(d.to(me, step), d.send_slot(me), d.gather_slot(me), mine_bytes));
    for (int step = 1; step < p; ++step) {
      const int o = d.from(me, step);
      const std::size_t b = c.bytes(o);
      if (b != 0) recvs_.push_back(msg(o, d.gather_slot(o), d.send_slot(o), b));
    }
    x.exchange(std::span<const device_message>(sends_), std::span<const device_message>(recvs_), stream,
               [&](std::size_t i, const std::byte* in) { c.decode(recvs_[i].peer, in); });
  }

 private:
  std::vector<device_message> sends_;
  std::vector<device_message> recvs_;
};

/// Scatter-reduce-allgather on device buffers (see the file comment).
template <class T, class Q, class X>
class device_sra {
  using D = device_kernels<Q, X>;
  static std::size_t slot_bytes(std::size_t n, int p) { return device_slot_bytes<D, T>(n, p, granule_of<Q>); }

 public:
  /// Buckets are never split between ranks.
  static constexpr std::size_t granule = granule_of<Q>;

  /// Bytes of device workspace for up to n values on p ranks: 2p slots.
  static std::size_t workspace_bytes(std::size_t n, int p) {
    return p < 2 ? 0 : 2 * static_cast<std::size_t>(p) * slot_bytes(n, p);
  }

  /// The values owned by rank r.
  static chunk chunk_of(std::size_t n, int p, int r) { return comm::chunk_of(n, p, r, granule); }

  /// In-place sum over all ranks of d_buf[0..n), enqueued on `stream` (the transport
  /// may block the host in its exchanges). `max_n` (>= n) is the count the workspace was
  /// sized for, the same on every rank. With `gather` false, a reduce-scatter: only this
  /// rank's chunk (chunk_of) receives the sum, the host reduce_scatter_plan's bits. The
  /// slots lie at byte `at` of the workspace `ws`. Collective.
  void run(T* d_buf, std::size_t n, std::size_t max_n, X& x, std::byte* ws, const quant::rng_state& rng,
           cudaStream_t stream, bool gather = true, std::size_t at = 0) {
    const int p = x.size();
    if (p == 1 || n == 0) return;
    // Chunks, peers, slots, keys and the order of sums: schedule::sra's whole form in
    // this workspace (slots sized for max_n); one quantizer call per chunk.
    const description d = description::whole_in(n, p, granule, bytes, slot_bytes(max_n, p));
    exec_.run(x, d, ws, codec{d, d_buf, rng, stream, x.rank()}, stream, gather, at);
  }

 private:
  using description = ::cgx::schedule::sra;
  static constexpr ::cgx::schedule::size_fn bytes = &D::template compressed_bytes<T>;

  /// The chunk codec of device_sra_executor: chunk o is description chunk o.
  struct codec {
    const description& d;
    T* buf;
    const quant::rng_state& rng;
    cudaStream_t stream;
    int me;
    std::size_t bytes(int o) const { return device_sra::bytes(d.chunk_of(o).count); }
    void contribute(int o, std::byte* out) const {
      const chunk c = d.chunk_of(o);
      D::template compress<T>(buf + c.begin, c.count, out,
                              ::cgx::schedule::keyed(rng, description::contribution_key(me, c)), stream);
    }
    void add(const std::byte* in) const {
      const chunk c = d.chunk_of(me);
      D::template decompress_add<T>(in, c.count, buf + c.begin, stream);
    }
    void finish(std::byte* out) const {
      const chunk c = d.chunk_of(me);
      D::template compress<T>(buf + c.begin, c.count, out, ::cgx::schedule::keyed(rng, d.sum_key(me, c)), stream);
      if constexpr (!Q::lossless) D::template decompress<T>(out, c.count, buf + c.begin, stream);
    }
    void decode(int o, const std::byte* in) const {
      const chunk c = d.chunk_of(o);
      D::template decompress<T>(in, c.count, buf + c.begin, stream);
    }
  };

  device_sra_executor exec_;
};

}  // namespace cgx::comm
