#pragma once
/// \file layerwise.hpp
/// Layers of a fused buffer, their compression settings, and how a layer-wise
/// scatter-reduce-allgather cuts the fused buffer into per-rank chunks. Shared by the
/// host plan (layerwise_plan.hpp) and the device plan (layerwise_plan.cuh); no MPI.
///
/// # Layout -> chunks
///
/// The layers, sorted by offset, are laid end to end (gaps between them are not
/// reduced); m is the total of their counts. Rank r owns the values between the cuts
/// c_r and c_{r+1}, where c_r is m r / p moved *down* to the nearest legal cut: any
/// value of an uncompressed layer, a bucket boundary (offset + k * bucket) of a
/// compressed one. So buckets never straddle layers or chunks, a chunk is a list of
/// layer *pieces*, and a piece quantizes exactly the buckets the whole layer would.
/// Every rank computes the same cuts and the same per-chunk compressed sizes from the
/// layout and the settings, so each pair of ranks exchanges one message per phase.
///
/// # The one dispatcher
///
/// A setting's run-time bits and bucket become a quantizer type in `with_quantizer`
/// only: bits 1..8 (`dispatch_bits`) x buckets `layerwise_buckets` (64, 128, 512, 1024,
/// 2048 on the host; the device plans compile `layerwise_device_buckets`, 128, 512 and
/// 1024), or `quant::none` for bits 0. Other buckets are rejected with cgx::error.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/chunking.hpp"
#include "dispatch.hpp"
#include "error.hpp"
#include "quant/maxmin.hpp"
#include "quant/none.hpp"

namespace cgx {

/// One layer of a fused buffer: values [offset, offset + count).
struct layer {
  std::size_t offset = 0;        ///< first value of the layer in the fused buffer
  std::size_t count = 0;         ///< number of values
  bool one_dimensional = false;  ///< a bias, a norm's scale: sent uncompressed by default
};

/// How one layer travels: `bits` 1..8 with max-min buckets of `bucket` values, or
/// uncompressed (bits == 0).
struct layer_setting {
  int bits = 0;                ///< 1..8, or 0 = uncompressed
  std::size_t bucket = 1024;   ///< values per bucket (ignored when uncompressed); one of layerwise_buckets
  friend bool operator==(const layer_setting&, const layer_setting&) = default;
};

/// The bucket sizes compiled into the host layer-wise plans (64 and 2048: the sizes
/// torch_cgx's users set, besides cgx's own 128, 512 and 1024).
inline constexpr std::size_t layerwise_buckets[] = {64, 128, 512, 1024, 2048};
/// The bucket sizes compiled into the device layer-wise plans (each one more set of kernels).
inline constexpr std::size_t layerwise_device_buckets[] = {128, 512, 1024};

/// CGX's defaults: what a layer gets unless told otherwise.
struct layerwise_defaults {
  int bits = 4;                      ///< bits of a compressed layer
  std::size_t bucket = 1024;         ///< bucket of a compressed layer
  std::size_t min_compressed = 1024; ///< layers with fewer values are sent uncompressed
};

/// CGX's default settings: `d.bits` with bucket `d.bucket` for every layer, except that
/// layers under `d.min_compressed` values and one-dimensional layers are uncompressed.
inline std::vector<layer_setting> default_settings(std::span<const layer> layers, layerwise_defaults d = {}) {
  std::vector<layer_setting> s(layers.size());
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const bool small = layers[i].count < d.min_compressed || layers[i].one_dimensional;
    s[i] = layer_setting{small ? 0 : d.bits, d.bucket};
  }
  return s;
}

/// Throws cgx::error(errc::invalid_argument) unless s can be dispatched.
inline void validate_setting(const layer_setting& s, std::size_t index) {
  if (s.bits < 0 || s.bits > 8)
    throw error(errc::invalid_argument, "layer " + std::to_string(index) + ": bits " + std::to_string(s.bits) +
                                            " outside 0..8 (0 = uncompressed)");
  if (s.bits == 0) return;
  if (std::find(std::begin(layerwise_buckets), std::end(layerwise_buckets), s.bucket) == std::end(layerwise_buckets))
    throw error(errc::invalid_argument, "layer " + std::to_string(index) + ": bucket " + std::to_string(s.bucket) +
                                            " is not compiled in (use 64, 128, 512, 1024 or 2048)");
}

/// The dispatcher over the buckets {Buckets...}: calls f(std::type_identity<Q>{}) with
/// Q = quant::maxmin<s.bits, s.bucket, Rounding>, or quant::none for s.bits == 0, and
/// returns its result. Throws cgx::error(errc::invalid_argument) for a setting outside
/// the compiled set.
template <class Rounding, int... Buckets, class F>
decltype(auto) with_quantizer_in(const layer_setting& s, F&& f) {
  if (s.bits == 0) return f(std::type_identity<quant::none>{});
  if (((s.bucket != static_cast<std::size_t>(Buckets)) && ...)) {
    std::string set;
    ((set += (set.empty() ? "" : ", ") + std::to_string(Buckets)), ...);
    throw error(errc::invalid_argument, "layer-wise plan: bucket " + std::to_string(s.bucket) +
                                            " is not compiled into this plan (its buckets: " + set + ")");
  }
  return dispatch_bits(s.bits, [&](auto b) -> decltype(auto) {
    return dispatch<Buckets...>(static_cast<int>(s.bucket), [&](auto k) -> decltype(auto) {
      return f(std::type_identity<quant::maxmin<decltype(b)::value, static_cast<std::size_t>(decltype(k)::value), Rounding>>{});
    });
  });
}

/// The host plans' dispatcher: with_quantizer_in over `layerwise_buckets`.
template <class Rounding, class F>
decltype(auto) with_quantizer(const layer_setting& s, F&& f) {
  return with_quantizer_in<Rounding, 64, 128, 512, 1024, 2048>(s, static_cast<F&&>(f));
}

/// The device plans' dispatcher: with_quantizer_in over `layerwise_device_buckets`.
template <class Rounding, class F>
decltype(auto) with_device_quantizer(const layer_setting& s, F&& f) {
  return with_quantizer_in<Rounding, 128, 512, 1024>(s, static_cast<F&&>(f));
}

/// Bytes of the compressed form of `count` values of T with setting s.
template <class T>
std::size_t setting_bytes(const layer_setting& s, std::size_t count) {
  if (s.bits == 0) return count * sizeof(T);
  // Rounding does not change sizes.
  return with_quantizer<quant::nearest>(s, [&](auto q) { return decltype(q)::type::template compressed_bytes<T>(count); });
}

/// The layers of a fused buffer of n values, checked and sorted, and the cut of that
/// buffer into per-rank chunks of layer pieces for one set of settings (see the file
/// comment). Pure arithmetic: every rank computes the same.
class layerwise_layout {
 public:
  /// A run of values of one layer inside one chunk.
  struct piece {
    std::size_t begin;   ///< first value, in the fused buffer
    std::size_t count;   ///< values
    std::size_t layer;   ///< index into the caller's layer list
    std::size_t bytes;   ///< compressed bytes
    std::size_t offset;  ///< byte offset of its compressed form within its chunk's message
  };

  layerwise_layout() = default;

  /// Checks the layers against a buffer of n values: inside [0, n), not overlapping
  /// (empty layers are allowed). Throws cgx::error(errc::invalid_argument) otherwise.
  layerwise_layout(std::size_t n, std::vector<layer> layers) : n_(n), layers_(std::move(layers)) {
    order_.resize(layers_.size());
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      const layer& l = layers_[i];
      if (l.offset > n_ || l.count > n_ - l.offset)
        throw error(errc::invalid_argument, "layer " + std::to_string(i) + " [" + std::to_string(l.offset) + ", +" +
                                                std::to_string(l.count) + ") is outside the buffer of " +
                                                std::to_string(n_) + " values");
    }
    std::stable_sort(order_.begin(), order_.end(),
                     [&](std::size_t a, std::size_t b) { return layers_[a].offset < layers_[b].offset; });
    for (std::size_t k = 1; k < order_.size(); ++k) {
      const layer& a = layers_[order_[k - 1]];
      const layer& b = layers_[order_[k]];
      if (a.count != 0 && b.count != 0 && a.offset + a.count > b.offset)
        throw error(errc::invalid_argument, "layers " + std::to_string(order_[k - 1]) + " and " +
                                                std::to_string(order_[k]) + " overlap");
    }
  }

  /// Cuts the buffer into p chunks for `settings` (one per layer, already validated);
  /// `bytes(setting, count)` gives a piece's compressed size. Each piece starts at a
  /// multiple of `align` bytes within its message (device kernels want aligned input).
  template <class Bytes>
  void cut(std::span<const layer_setting> settings, int p, Bytes&& bytes, std::size_t align = 1) {
    const auto P = static_cast<std::size_t>(p);
    std::vector<std::size_t> cum(order_.size() + 1, 0);  // start of each sorted layer, concatenated
    for (std::size_t k = 0; k < order_.size(); ++k) cum[k + 1] = cum[k] + layers_[order_[k]].count;
    const std::size_t m = cum.back();
    auto legal_cut = [&](std::size_t t) -> std::size_t {
      if (t >= m) return m;
      const std::size_t k = static_cast<std::size_t>(std::upper_bound(cum.begin(), cum.end(), t) - cum.begin()) - 1;
      std::size_t o = t - cum[k];
      const layer_setting& s = settings[order_[k]];
      if (s.bits != 0) o = o / s.bucket * s.bucket;
      return cum[k] + o;
    };
    pieces_.clear();
    first_piece_.assign(P + 1, 0);
    chunk_bytes_.assign(P, 0);
    chunk_count_.assign(P, 0);
    std::size_t k = 0;  // sorted layer index
    for (std::size_t r = 0; r < P; ++r) {
      const std::size_t c0 = legal_cut(m * r / P), c1 = legal_cut(m * (r + 1) / P);
      first_piece_[r] = pieces_.size();
      while (k < order_.size() && cum[k + 1] <= c0) ++k;
      for (std::size_t j = k; j < order_.size() && cum[j] < c1; ++j) {
        const std::size_t b = std::max(c0, cum[j]) - cum[j], e = std::min(c1, cum[j + 1]) - cum[j];
        if (e <= b) continue;
        const layer& l = layers_[order_[j]];
        const std::size_t nb = bytes(settings[order_[j]], e - b);
        const std::size_t at = (chunk_bytes_[r] + align - 1) / align * align;
        pieces_.push_back(piece{l.offset + b, e - b, order_[j], nb, at});
        chunk_bytes_[r] = at + nb;
        chunk_count_[r] += e - b;
      }
    }
    first_piece_[P] = pieces_.size();
    slot_ = 0;
    for (std::size_t b : chunk_bytes_) slot_ = std::max(slot_, comm::round_to_line(b));
  }

  /// Values in the fused buffer.
  std::size_t size() const noexcept { return n_; }
  /// The layers as given.
  const std::vector<layer>& layers() const noexcept { return layers_; }
  /// The pieces of chunk r (after cut()).
  std::span<const piece> pieces(int r) const {
    const auto R = static_cast<std::size_t>(r);
    return std::span<const piece>(pieces_.data() + first_piece_[R], first_piece_[R + 1] - first_piece_[R]);
  }
  /// Compressed bytes of chunk r (its message in either phase).
  std::size_t chunk_bytes(int r) const { return chunk_bytes_[static_cast<std::size_t>(r)]; }
  /// Values of chunk r.
  std::size_t chunk_count(int r) const { return chunk_count_[static_cast<std::size_t>(r)]; }
  /// The largest chunk_bytes, rounded up to a cache line: one workspace slot.
  std::size_t slot_bytes() const noexcept { return slot_; }

 private:
  std::size_t n_ = 0;
  std::vector<layer> layers_;
  std::vector<std::size_t> order_;  // layer indices by offset
  std::vector<piece> pieces_;
  std::vector<std::size_t> first_piece_, chunk_bytes_, chunk_count_;
  std::size_t slot_ = 0;
};

}  // namespace cgx
