#pragma once
/// \file schedule_base.hpp
/// What the host reducers' schedules (comm::ring, comm::tree,
/// comm::scatter_reduce_allgather, comm::uncompressed) share: the granule their chunks
/// are cut at, and the first rule of their workspace sizes.

#include <cstddef>

#include "../detail/checked.hpp"
#include "chunking.hpp"

namespace cgx::comm::detail {

/// The base of a host reducer's `schedule<T, Q, X>`.
template <class T, class Q>
struct schedule_base {
  static constexpr std::size_t granule = granule_of<Q>;  ///< chunk boundaries fall on multiples of this many values

 protected:
  /// A schedule's workspace_bytes for n values: throws cgx::error(errc::invalid_argument)
  /// if n values of T do not fit in std::size_t bytes (detail/checked.hpp), else returns
  /// size(), which computes the layout's bytes with the checked helpers.
  template <class Size>
  static std::size_t workspace(std::size_t n, Size size) {
    cgx::detail::check_raw_bytes(n, sizeof(T));
    return size();
  }
};

}  // namespace cgx::comm::detail
