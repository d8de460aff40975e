#pragma once
/// \file error_bounded_schedules.hpp
/// The SRA and ring schedules for a variable-size, error-bounded quantizer
/// (quant::error_bounded), used by error_bounded_plan. They run the descriptions
/// schedule::sra (its `whole` form) and schedule::ring, as scatter_reduce_allgather.hpp
/// and ring.hpp do, with three differences:
/// messages carry their length first (comm/varsize.hpp), partial sums are accumulated
/// in double, and every quantization is given the same absolute bound e.
///
/// # Error terms (e = the bound given to every quantization; see error_bounded.hpp)
///
/// SRA, element i of chunk o: the owner adds its own exact value and the p - 1 other
/// ranks' decoded contributions (each within e of the input), then quantizes the sum
/// once more (within e, checked on the value decoded to T):
///
///     |result_i - sum_i| <= (p - 1) e + e = p e  (+ the double rounding of the p - 1 additions)
///
/// Ring, element i of chunk c: the running sum is quantized at each of the p - 1 hops
/// (each hop adds at most e to the error, whatever the sum's range, since the bound is
/// absolute) and once more by the owner:
///
///     |result_i - sum_i| <= (p - 1) e + e = p e  (+ the double rounding of the p - 1 additions)
///
/// So both have `error_terms(p) = p` quantization errors (0 on one rank, where nothing
/// is quantized and the result is the input), and a plan asked for a final bound E gives
/// every quantization e = E / p. The residual is the rounding of the p - 1 additions in
/// double, at most (p - 1) 2^-53 sum_r |x_r,i| (plus the errors), about 1e-16 of the
/// magnitudes, and, only where E / p is below half an ulp of T at the result (float
/// data with a bound near float's precision), the rounding of the result to T.
///
/// Every received message is decoded with its received length (varsize_exchange::
/// received()), and must be consumed exactly: a malformed message, an empty one where
/// values were expected, or one with bytes left over makes run() finish its exchanges
/// (the peers are not left waiting) and then throw cgx::error(errc::corrupt) on the
/// rank that received it. The decoder never reads past the received bytes.
///
/// Both give every rank the same bits (the owner decodes its own compressed sum; the
/// allgather forwards bytes unchanged). On one rank nothing is sent or quantized.
///
/// comm::tree is not supported: its recursive doubling sends several chunks to one
/// partner in one step, which varsize_exchange (one message per peer and direction)
/// does not carry; its error terms would also be p (q - 1 halving edges of the binomial
/// tree, p - q folds, the final quantization).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../detail/checked.hpp"
#include "../error.hpp"
#include "chunking.hpp"
#include "ring.hpp"
#include "scatter_reduce_allgather.hpp"
#include "varsize.hpp"
#include "../detail/tags.hpp"
#include "../schedule/ring.hpp"
#include "../schedule/sra.hpp"

namespace cgx::comm {

/// The error-bounded schedule of reducer R, or none: only the specializations below exist.
template <class R>
struct error_bounded_schedule {
  static constexpr bool supported = false;  ///< R has no error-bounded schedule
};

/// Bytes sent by one call of an error-bounded schedule on this rank.
struct error_bounded_traffic {
  std::size_t sent = 0;  ///< bytes this rank sent: payloads and 8-byte length headers
  std::size_t raw = 0;   ///< bytes the same schedule sends uncompressed (values of T)
};

namespace detail {
/// The double accumulator of a schedule (one chunk), in bytes.
template <class Q>
std::size_t eb_acc_bytes(std::size_t n, int p) {
  return round_to_line(largest_chunk(n, p, granule_of<Q>) * sizeof(double));
}

/// Decodes the message of `count` values received in in[0..bytes) into out (added to
/// it with Add). Returns false if the message is malformed (error_bounded's decoder
/// throws errc::corrupt; nothing is read past `bytes`) or longer than its values.
template <class Q, bool Add, class Out>
bool eb_decode(const std::byte* in, std::size_t bytes, std::size_t count, Out* out) {
  try {
    if constexpr (Add)
      return Q::template decompress_add<Out>(in, bytes, count, out) == bytes;
    else
      return Q::template decompress<Out>(in, bytes, count, out) == bytes;
  } catch (const error& e) {
    if (e.code() != errc::corrupt) throw;
    return false;
  }
}

/// The first malformed message of a call: the schedule finishes its exchanges (so that
/// the peers are not left waiting) and throws at the end.
struct eb_corruption {
  int peer = -1;  ///< rank the first malformed message came from, -1 if none
  /// Notes a message from `from` that failed to decode (ok == false).
  void note(bool ok, int from) noexcept {
    if (!ok && peer < 0) peer = from;
  }
  /// Throws cgx::error(errc::corrupt) if a message was malformed.
  void raise(int me) const {
    if (peer >= 0)
      throw error(errc::corrupt, "error_bounded_plan (rank " + std::to_string(me) + "): the message from rank " +
                                     std::to_string(peer) +
                                     " is malformed or its length does not match its values; the result is invalid");
  }
};

/// What both error-bounded reducers declare: they have a schedule, and p quantization
/// errors reach an element of the result (see the file comment).
struct eb_reducer {
  static constexpr bool supported = true;  ///< R has an error-bounded schedule
  /// Quantization errors on an element's path.
  static constexpr int error_terms(int p) { return p > 1 ? p : 0; }
};

/// The base of both error-bounded schedules for quantizer Q: their chunks, their
/// workspace rule and the frame of a call.
template <class Q>
struct eb_schedule_base {
  /// The values of n that rank r of p owns (its chunk: bucket-aligned, balanced).
  static chunk chunk_of(std::size_t n, int p, int r) { return comm::chunk_of(n, p, r, granule_of<Q>); }

 protected:
  /// A schedule's workspace_bytes for n values on p ranks: throws
  /// cgx::error(errc::invalid_argument) if n doubles do not fit in std::size_t bytes,
  /// else the layout's slots (slots(), computed with the checked helpers), then the
  /// double accumulator of one chunk (eb_acc_bytes).
  template <class Slots>
  static std::size_t workspace(std::size_t n, int p, Slots slots) {
    cgx::detail::check_raw_bytes(n, sizeof(double));
    return cgx::detail::checked_add(slots(), eb_acc_bytes<Q>(n, p));
  }

  /// One call on n values over x, exchanging through vx: nothing is sent on one rank or
  /// for n = 0; otherwise exchange(p, me, t, bad) runs the schedule, adding the raw bytes
  /// it stands for to t.raw and noting malformed messages in bad, and then t.sent is
  /// what vx sent and the first malformed message throws cgx::error(errc::corrupt).
  template <class X, class Exchange>
  static error_bounded_traffic call(std::size_t n, X& x, varsize_exchange<X>& vx, Exchange&& exchange) {
    const int p = x.size();
    const int me = x.rank();
    error_bounded_traffic t;
    if (p == 1 || n == 0) return t;
    eb_corruption bad;
    vx.reset_sent();
    exchange(p, me, t, bad);
    t.sent = vx.sent();
    bad.raise(me);
    return t;
  }
};
}  // namespace detail

/// SRA with variable-size messages (see the file comment). Chunks, peers, the order of
/// sums and workspace slots: schedule::sra::whole, sized for the worst-case compressed
/// chunk. It has no random keys: error_bounded rounds deterministically.
template <>
struct error_bounded_schedule<scatter_reduce_allgather> : detail::eb_reducer {
  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule : public detail::eb_schedule_base<Q> {
    using base = detail::eb_schedule_base<Q>;

   public:
    /// schedule::sra::whole's workspace (p send and p receive slots, each holding the
    /// largest compressed chunk), then a double accumulator for one chunk.
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      return base::workspace(n, p, [&] {
        const description d = describe(n, p);
        return cgx::detail::checked_mul(d.slots_used(), d.slot);
      });
    }

    /// Binds to the plan's transport; allocates only its own request lists.
    explicit schedule(X& x) : vx_(x.size()) {}

    /// In place sum of buf[0..n) over all ranks, every quantization within e. Collective.
    error_bounded_traffic run(T* buf, std::size_t n, X& x, std::byte* ws, double e) {
      return base::call(n, x, vx_, [&](int p, int me, error_bounded_traffic& t, detail::eb_corruption& bad) {
        const description d = describe(n, p);
        auto* acc = reinterpret_cast<double*>(ws + d.slots_used() * d.slot);
        const chunk mine = d.chunk_of(me);

        // 1. Scatter-reduce: each contribution within e of the input, summed in double.
        for (int s = 1; s < p; ++s) {
          const int from = d.from(me, s);
          const int to = d.to(me, s);
          const chunk c = d.chunk_of(to);
          if (mine.count != 0) vx_.post_recv(x, ws + d.recv_slot(from), d.slot, from, tag_scatter);
          if (c.count == 0) continue;
          const std::size_t len = Q::template compress<T, double>(buf + c.begin, c.count, ws + d.send_slot(to), e);
          vx_.post_send(x, ws + d.send_slot(to), len, to, tag_scatter);
          t.raw += c.count * sizeof(T);
        }
        vx_.wait(x);
        std::size_t mine_len = 0;
        std::byte* sum = ws + d.send_slot(me);
        if (mine.count != 0) {
          for (std::size_t i = 0; i < mine.count; ++i) acc[i] = static_cast<double>(buf[mine.begin + i]);
          for (int i = 0; i + 1 < p; ++i) {
            const int r = description::addend(me, i);
            bad.note(detail::eb_decode<Q, true>(ws + d.recv_slot(r), vx_.received(r), mine.count, acc), r);
          }
          // 2. The sum is quantized once, checked as decoded to T; the owner keeps the decoded bytes.
          mine_len = Q::template compress<double, T>(acc, mine.count, sum, e);
          Q::template decompress<T>(sum, mine_len, mine.count, buf + mine.begin);
        }

        // 3. Allgather of the compressed sums, received into the receive slots.
        for (int s = 1; s < p; ++s) {
          const int from = d.from(me, s);
          if (d.chunk_of(from).count != 0) vx_.post_recv(x, ws + d.gather_slot(from), d.slot, from, tag_gather);
          if (mine.count != 0) {
            vx_.post_send(x, sum, mine_len, d.to(me, s), tag_gather);
            t.raw += mine.count * sizeof(T);
          }
        }
        vx_.wait(x);
        for (int s = 1; s < p; ++s) {
          const int o = d.from(me, s);
          const chunk c = d.chunk_of(o);
          if (c.count != 0) bad.note(detail::eb_decode<Q, false>(ws + d.gather_slot(o), vx_.received(o), c.count, buf + c.begin), o);
        }
      });
    }

   private:
    using description = ::cgx::schedule::sra;
    /// schedule::sra::whole with the worst-case compressed size as its size function: its
    /// slots are this layout's; the messages carry their real lengths (varsize_exchange).
    static description describe(std::size_t n, int p) {
      return description::whole(n, p, granule_of<Q>, &Q::template max_compressed_bytes<double>);
    }
    static constexpr int tag_scatter = cgx::detail::tag_value(cgx::detail::tag::eb_sra_scatter_head);  // + 1: payloads
    static constexpr int tag_gather = cgx::detail::tag_value(cgx::detail::tag::eb_sra_gather_head);    // + 1: payloads
    varsize_exchange<X> vx_;
  };
};

/// Ring with variable-size messages (see the file comment). Chunks, peers, steps and
/// workspace slots: schedule::ring, sized for the worst-case compressed chunk.
template <>
struct error_bounded_schedule<ring> : detail::eb_reducer {
  /// The schedule for values T, quantizer Q and transport X; the plan owns the workspace.
  template <class T, class Q, class X>
  class schedule : public detail::eb_schedule_base<Q> {
    using base = detail::eb_schedule_base<Q>;

   public:
    /// schedule::ring's workspace (p slots for the allgather, one send and one receive
    /// slot, each holding the largest compressed chunk), then a double accumulator.
    /// Throws cgx::error(errc::invalid_argument) if that size does not fit (detail/checked.hpp).
    static std::size_t workspace_bytes(std::size_t n, int p) {
      return base::workspace(n, p, [&] { return cgx::detail::checked_mul(description::slots(p), describe(n, p).slot); });
    }

    /// Binds to the plan's transport; allocates only its own request lists.
    explicit schedule(X& x) : vx_(x.size()), len_(static_cast<std::size_t>(x.size())) {}

    /// In place sum of buf[0..n) over all ranks, every quantization within e. Collective.
    error_bounded_traffic run(T* buf, std::size_t n, X& x, std::byte* ws, double e) {
      return base::call(n, x, vx_, [&](int p, int me, error_bounded_traffic& t, detail::eb_corruption& bad) {
        const description d = describe(n, p);
        const std::size_t slot = d.slot;
        auto gslot = [&](int c) { return ws + d.gather_slot(c); };
        std::byte* sbuf = ws + d.send_slot();
        std::byte* rbuf = ws + d.recv_slot();
        auto* acc = reinterpret_cast<double*>(ws + description::slots(p) * slot);
        const int right = d.right(me);
        const int left = d.left(me);

        // 1. Reduce: step 0 sends this rank's own chunk, later steps the running sum (in
        //    acc) that arrived at the previous step plus this rank's values.
        for (int s = 0; s + 1 < p; ++s) {
          const chunk out = d.chunk_of(d.reduce_out(me, s));
          const chunk in = d.chunk_of(d.reduce_in(me, s));
          if (in.count != 0) vx_.post_recv(x, rbuf, slot, left, tag_reduce);
          if (out.count != 0) {
            const std::size_t len = s == 0 ? Q::template compress<T, double>(buf + out.begin, out.count, sbuf, e)
                                           : Q::template compress<double, double>(acc, out.count, sbuf, e);
            vx_.post_send(x, sbuf, len, right, tag_reduce);
            t.raw += out.count * sizeof(T);
          }
          vx_.wait(x);
          if (in.count != 0) {
            for (std::size_t i = 0; i < in.count; ++i) acc[i] = static_cast<double>(buf[in.begin + i]);
            bad.note(detail::eb_decode<Q, true>(rbuf, vx_.received(left), in.count, acc), left);
          }
        }

        // 2. The owner quantizes the finished sum once, checked as decoded to T.
        const int own = d.owned(me);
        const chunk mine = d.chunk_of(own);
        if (mine.count != 0) {
          const std::size_t len = Q::template compress<double, T>(acc, mine.count, gslot(own), e);
          len_[static_cast<std::size_t>(own)] = len;
          Q::template decompress<T>(gslot(own), len, mine.count, buf + mine.begin);
        }

        // 3. Gather: forward the compressed chunks unchanged.
        for (int s = 0; s + 1 < p; ++s) {
          const int cout = d.gather_out(me, s);
          const int cin = d.gather_in(me, s);
          const chunk out = d.chunk_of(cout);
          const chunk in = d.chunk_of(cin);
          if (in.count != 0) vx_.post_recv(x, gslot(cin), slot, left, tag_gather);
          if (out.count != 0) {
            vx_.post_send(x, gslot(cout), len_[static_cast<std::size_t>(cout)], right, tag_gather);
            t.raw += out.count * sizeof(T);
          }
          vx_.wait(x);
          if (in.count != 0) {
            len_[static_cast<std::size_t>(cin)] = vx_.received(left);
            bad.note(detail::eb_decode<Q, false>(gslot(cin), vx_.received(left), in.count, buf + in.begin), left);
          }
        }
      });
    }

   private:
    using description = ::cgx::schedule::ring;
    /// schedule::ring with the worst-case compressed size as its size function: its
    /// slots are this layout's; the messages carry their real lengths (varsize_exchange).
    static description describe(std::size_t n, int p) {
      return description::make(n, p, granule_of<Q>, &Q::template max_compressed_bytes<double>);
    }
    static constexpr int tag_reduce = cgx::detail::tag_value(cgx::detail::tag::eb_ring_reduce_head);  // + 1: payloads
    static constexpr int tag_gather = cgx::detail::tag_value(cgx::detail::tag::eb_ring_gather_head);  // + 1: payloads
    varsize_exchange<X> vx_;
    std::vector<std::size_t> len_;
  };
};

}  // namespace cgx::comm
