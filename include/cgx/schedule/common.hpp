#pragma once
/// \file schedule/common.hpp
/// What every schedule description (schedule/sra.hpp, ring.hpp, tree.hpp,
/// direct_reduce_scatter.hpp, hierarchical.hpp) is made of.
///
/// A description is pure arithmetic: for rank r of p and a count n it says which
/// pieces of the buffer exist, which message goes to or comes from whom in which step,
/// where its bytes lie in the workspace, which random key and position each compression
/// uses, and in which order sums are formed. It does no I/O and knows no types: the
/// size of the compressed form of a count of values comes in as a function (for a
/// quantizer Q and values T, `&Q::template compressed_bytes<T>`). An executor (the
/// reducers in comm/) runs it; tests/test_schedule.cpp checks it alone.
///
/// Every description can list, for one rank:
///  - `messages(r, f)`: f(message) for each send and each receive of rank r, in the
///    order the executor posts them (transports match messages FIFO per peer and tag);
///  - `compressions(r, f)`: f(compression) for each compression rank r makes;
///  - `results(r, f)`: f(chunk) for each range rank r decodes (or keeps) as final.
/// These lists are what tests/test_schedule.cpp checks, alone and against the
/// executors (run over a recording transport); executors use the direct functions.

#include <cstddef>
#include <cstdint>

#include "../comm/chunking.hpp"
#include "../quant/rounding.hpp"

namespace cgx::schedule {

using comm::chunk;

/// Bytes of the compressed form of a count of values (e.g. `&Q::template compressed_bytes<T>`).
using size_fn = std::size_t (*)(std::size_t);

/// The random key of one compression: the stream of the counter-based generator and the
/// position of the first value, relative to the call's base position (rng_state::position).
/// Value i of the compressed range draws the bits of (stream, position + i).
struct key {
  std::uint32_t stream;   ///< rng_state::stream
  std::size_t position;   ///< added to rng_state::position
  friend constexpr bool operator==(const key&, const key&) = default;
};

/// The generator state of a compression with key k in a call whose state is `call`.
constexpr quant::rng_state keyed(const quant::rng_state& call, const key& k) {
  quant::rng_state s = call;
  s.stream = k.stream;
  s.position = call.position + k.position;
  return s;
}

/// The phases a message or compression belongs to (a message is matched by phase, peer
/// and order of posting: transports are FIFO per peer and tag).
enum class phase : std::uint8_t {
  scatter,  ///< a contribution to a chunk's owner (SRA, direct reduce-scatter)
  reduce,   ///< a running partial sum to the next rank (ring) or partner (tree halving)
  sum,      ///< the owner's single compression of a finished sum (no message)
  gather,   ///< a finished sum to the others (SRA, ring, direct allgather, tree doubling)
  fold,     ///< tree: a whole buffer from an even rank to the odd rank above it
  unfold,   ///< tree: the finished chunks back to the folded rank
  node,     ///< hierarchical, fused: a raw piece of a node part to its local owner
  cross,    ///< hierarchical, crossed: a compressed piece to the group's owner node
  back,     ///< hierarchical, crossed: a compressed sum back from the owner node
  share,    ///< hierarchical: a finished chunk to the other ranks of the node
};

/// Where a message's bytes lie: `offset` bytes into the rank's workspace, or the values
/// themselves in the user's buffer (raw messages) when offset == in_buffer.
inline constexpr std::size_t in_buffer = static_cast<std::size_t>(-1);

/// One send or receive of one rank.
struct message {
  phase ph;            ///< its phase
  int step;            ///< step of the schedule it belongs to (the same on both sides)
  int from;            ///< sending rank
  int to;              ///< receiving rank
  chunk values;        ///< the buffer values it carries
  std::size_t bytes;   ///< its size
  std::size_t offset;  ///< where the bytes are read (sender) or land (receiver); in_buffer: buf + values.begin
};

/// One compression of one rank.
struct compression {
  phase ph;            ///< scatter/reduce/fold/cross: a contribution or partial sum; sum: a finished sum
  int step;            ///< step of the schedule
  chunk values;        ///< the values compressed
  key k;               ///< its random key
  std::size_t offset;  ///< where in the workspace its bytes go
};

/// n values on p ranks, cut into p chunks whose boundaries fall on multiples of the
/// granule (comm::chunk_of): what the ring and the direct reduce-scatter start from.
struct cut {
  std::size_t n;        ///< values
  int p;                ///< ranks
  std::size_t granule;  ///< chunk boundaries fall on multiples of this
  constexpr chunk chunk_of(int c) const { return comm::chunk_of(n, p, c, granule); }  ///< chunk c's values
};

/// value i of [0, parts) skipping `skip`: the i-th addend of a sum that starts from the
/// part of rank `skip` and adds the others in rank order.
constexpr int rank_order_skipping(int skip, int i) { return i < skip ? i : i + 1; }

/// The largest compressed size of a chunk of the `parts`-way cut of n values.
constexpr std::size_t largest_compressed(std::size_t n, int parts, std::size_t granule, size_fn bytes) {
  return bytes(comm::largest_chunk(n, parts, granule));
}

}  // namespace cgx::schedule
