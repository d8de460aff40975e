#pragma once
/// \file concepts.hpp
/// The three policy concepts of cgx: quantizer, transport, reducer. Public templates
/// check them with `static_assert`s that say in plain English what is wrong.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include "quant/host_exec.hpp"
#include "quant/none.hpp"
#include "quant/rounding.hpp"

namespace cgx {

/// Q turns values of type T into bytes and back on the host: `compressed_bytes<T>(n)`,
/// `compress<T>`, `decompress<T>`, `decompress_add<T>`, and says whether it is `lossless`.
template <class Q, class T>
concept quantizer_for = requires(const T* in, T* out, std::size_t n, std::byte* w, const std::byte* r,
                                 const quant::rng_state& rng, quant::host_exec ex) {
  { Q::template compressed_bytes<T>(n) } -> std::convertible_to<std::size_t>;
  Q::template compress<T>(in, n, w, rng, ex);
  Q::template decompress<T>(r, n, out, ex);
  Q::template decompress_add<T>(r, n, out, ex);
  { Q::lossless } -> std::convertible_to<bool>;
  { Q::bits } -> std::convertible_to<int>;
  { Q::bucket_size } -> std::convertible_to<std::size_t>;
};

/// X moves bytes between the ranks of one group: `rank()`, `size()`, non-blocking
/// `isend`/`irecv` returning `X::request`, `wait_all` on a span of requests, and a
/// small collective `max_all` (element-wise maximum of int64 values over all ranks,
/// in place) used to check that ranks agree on a call's arguments.
///
/// The contract a schedule may rely on, and must keep:
///  - **Matching.** A receive of b bytes from `peer` with tag t is matched by a send of
///    b bytes to this rank with tag t. Every tag a schedule or plan passes comes from
///    `cgx::detail::tag` (detail/tags.hpp), whose values are distinct: messages of
///    different steps or different schedules never share a tag.
///  - **Order.** Messages between one ordered pair of ranks with one tag are received in
///    the order they were sent (FIFO per pair and tag): several messages of one step
///    may travel between a pair under one tag when both sides post them in the same
///    order (tree's doubling step does). Nothing is promised across tags or pairs.
///  - **Posting order across tags.** A schedule posts, for each ordered pair, its
///    receives in the order the peer posts the matching sends, even across tags: then
///    it is correct both on transports that match by tag and on comm::shm, which
///    ignores tags.
///  - **One schedule at a time per transport object.** A transport object carries the
///    messages of one call at a time; `max_all` is collective over it. Plans therefore
///    own their transport: two plans made from one MPI communicator each hold a
///    comm::mpi of their own (MPI_Comm_dup) or a comm::shm of their own (its own
///    segment), and run one after the other or overlapped (allreduce_plan::start /
///    wait, where the MPI thread level allows) without cross-talk. The distinct tags
///    keep messages apart where one transport does carry several schedules (a plan's
///    nested reducers, successive device exchanges).
///
/// Per transport: comm::mpi passes tags to MPI on its own duplicated communicator
/// (MPI's non-overtaking rule gives FIFO per pair, tag and communicator). comm::shm
/// ignores tags and matches the messages of one ordered pair strictly in posting order
/// (FIFO per pair, whatever the tag: stronger than the contract, hence the posting-order
/// rule above). The device transports (device_transport.cuh) take no tags: an
/// `exchange` matches its sends and receives pairwise within the call, and calls are
/// collective, in the same order on every rank; comm::mpi_device tags its MPI messages
/// `device_even` / `device_odd` by the parity of the exchange's number, cuda_ipc and
/// nccl need none.
template <class X>
concept transport = requires(X& x, const X& cx, void* p, const void* cp, std::size_t bytes, int peer, int tag,
                             std::span<typename X::request> reqs, std::span<std::int64_t> vals) {
  typename X::request;
  { cx.rank() } -> std::convertible_to<int>;
  { cx.size() } -> std::convertible_to<int>;
  { x.isend(cp, bytes, peer, tag) } -> std::same_as<typename X::request>;
  { x.irecv(p, bytes, peer, tag) } -> std::same_as<typename X::request>;
  x.wait_all(reqs);
  x.max_all(vals);
};

namespace comm {
/// The optional transport hook `x.progress()`: lets the messages in flight move while
/// the caller computes between posting and waiting (comm::mpi: MPI's progress engine).
/// Reducers call it between quantizer passes; a transport without it moves bytes on
/// its own, or inside wait_all.
template <class X>
void progress(X& x) {
  if constexpr (requires { x.progress(); }) x.progress();
}
}  // namespace comm

namespace detail {
/// A type that models `transport` and nothing else; used to check reducers.
struct transport_archetype {
  struct request {};
  int rank() const;
  int size() const;
  request isend(const void*, std::size_t, int, int);
  request irecv(void*, std::size_t, int, int);
  void wait_all(std::span<request>);
  void max_all(std::span<std::int64_t>);
};
static_assert(transport<transport_archetype>);
}  // namespace detail

/// R is a reduction schedule: a `name` and a nested `schedule<T, Q, X>` that knows its
/// workspace size for n values on p ranks and runs the reduction.
template <class R>
concept reducer = requires(std::size_t n, int p) {
  { R::name } -> std::convertible_to<const char*>;
  { R::template schedule<float, quant::none, detail::transport_archetype>::workspace_bytes(n, p) }
      -> std::convertible_to<std::size_t>;
};

}  // namespace cgx
