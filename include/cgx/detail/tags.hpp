#pragma once
/// \file tags.hpp
/// Every message tag cgx's schedules and plans pass to a transport, in one enum, so that
/// no two kinds of message share a tag (checked below). What a tag means to each
/// transport, and the order a schedule may rely on, is the transport contract in
/// concepts.hpp.

#include <array>
#include <cstddef>

namespace cgx::detail {

/// The tag of each kind of message. All values are distinct and below 32768 (the least
/// MPI_TAG_UB the MPI standard allows). A variable-size message (comm/varsize.hpp)
/// travels as a length header with its tag and a payload with the next value, so each
/// `*_head` is followed by its `*_payload`.
enum class tag : int {
  sra_scatter = 0x6367,        ///< scatter_reduce_allgather: a compressed piece to its owner
  sra_gather = 0x6368,         ///< scatter_reduce_allgather: the owner's compressed sum
  ring_reduce = 0x6369,        ///< ring: reduce-scatter steps
  ring_gather = 0x636a,        ///< ring: allgather steps
  layerwise_scatter = 0x636b,  ///< layerwise plans (host and device): a chunk to its owner
  layerwise_gather = 0x636c,   ///< layerwise plans: the owner's compressed sum
  tree_fold = 0x6370,          ///< tree: the ranks beyond the power of two fold in
  tree_halve = 0x6371,         ///< tree: recursive halving
  tree_double = 0x6372,        ///< tree: recursive doubling (several chunks per pair, in chunk order)
  tree_unfold = 0x6373,        ///< tree: the result back to the folded ranks
  allgather = 0x6374,          ///< allgather_plan
  broadcast = 0x6375,          ///< broadcast_plan
  device_even = 0x6376,        ///< mpi_device: the exchanges of even sequence number
  device_odd = 0x6377,         ///< mpi_device: the exchanges of odd sequence number
  hier_share = 0x6380,         ///< hierarchical: a piece of the node sum shared inside the node
  hier_cross = 0x6381,         ///< hierarchical, crossed groups: to the owner across nodes
  hier_back = 0x6382,          ///< hierarchical, crossed groups: the sum back from the owner
  hier_node = 0x6383,          ///< hierarchical, fused step 1: a piece of the node sum
  uncompressed_scatter = 0x6390,  ///< uncompressed reducer: reduce-scatter
  uncompressed_gather = 0x6391,   ///< uncompressed reducer: allgather
  eb_ring_reduce_head = 0x6394,   ///< error-bounded ring: reduce steps (length header)
  eb_ring_reduce_payload = 0x6395,
  eb_ring_gather_head = 0x6396,   ///< error-bounded ring: allgather steps (length header)
  eb_ring_gather_payload = 0x6397,
  eb_sra_scatter_head = 0x6398,   ///< error-bounded SRA: pieces to their owners (length header)
  eb_sra_scatter_payload = 0x6399,
  eb_sra_gather_head = 0x639a,    ///< error-bounded SRA: the owners' sums (length header)
  eb_sra_gather_payload = 0x639b,
};

/// The int a transport receives for tag t.
constexpr int tag_value(tag t) noexcept { return static_cast<int>(t); }

/// Every tag, for the checks below: a new tag goes here too.
inline constexpr std::array<tag, 28> all_tags{
    tag::sra_scatter,         tag::sra_gather,          tag::ring_reduce,          tag::ring_gather,
    tag::layerwise_scatter,   tag::layerwise_gather,    tag::tree_fold,            tag::tree_halve,
    tag::tree_double,         tag::tree_unfold,         tag::allgather,            tag::broadcast,
    tag::device_even,         tag::device_odd,          tag::hier_share,           tag::hier_cross,
    tag::hier_back,           tag::hier_node,           tag::uncompressed_scatter, tag::uncompressed_gather,
    tag::eb_ring_reduce_head, tag::eb_ring_reduce_payload, tag::eb_ring_gather_head, tag::eb_ring_gather_payload,
    tag::eb_sra_scatter_head, tag::eb_sra_scatter_payload, tag::eb_sra_gather_head, tag::eb_sra_gather_payload,
};

/// True when the tags are pairwise distinct, non-negative and below 32768.
constexpr bool tags_distinct() noexcept {
  for (std::size_t i = 0; i < all_tags.size(); ++i) {
    if (tag_value(all_tags[i]) < 0 || tag_value(all_tags[i]) >= 32768) return false;
    for (std::size_t j = i + 1; j < all_tags.size(); ++j)
      if (all_tags[i] == all_tags[j]) return false;
  }
  return true;
}
static_assert(tags_distinct(), "cgx: two message kinds share a tag (include/cgx/detail/tags.hpp)");
static_assert(tag_value(tag::eb_ring_reduce_payload) == tag_value(tag::eb_ring_reduce_head) + 1 &&
                  tag_value(tag::eb_ring_gather_payload) == tag_value(tag::eb_ring_gather_head) + 1 &&
                  tag_value(tag::eb_sra_scatter_payload) == tag_value(tag::eb_sra_scatter_head) + 1 &&
                  tag_value(tag::eb_sra_gather_payload) == tag_value(tag::eb_sra_gather_head) + 1,
              "cgx: a variable-size message's payload tag must follow its header's (comm/varsize.hpp)");
static_assert(tag_value(tag::device_odd) == tag_value(tag::device_even) + 1,
              "cgx: mpi_device alternates between device_even and device_even + 1");

}  // namespace cgx::detail
