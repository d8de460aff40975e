#pragma once
/// \file error_feedback.hpp
/// `cgx::error_feedback<T>`: error feedback (EF) over any quantizer. Each rank keeps
/// the residual e = c - decode(Q(c)) of what it quantized, where c = x + e_prev is
/// its input compensated with the previous call's residual; so the error of one call
/// is sent in the next and, summed over calls, nothing is lost: the standard fix that
/// makes 1-2 bit compression converge.
///
/// Memory: one T per value of the buffer it covers (n * sizeof(T) bytes per rank),
/// allocated once at construction; no other storage (the compensated input and the
/// decoded values are formed in place, in the caller's buffer and in the residual).
///
/// With the layer-wise plan (layerwise_options::error_feedback) one residual covers
/// both quantizations of SRA: in the chunks this rank sends to their owners it holds
/// the residual of this rank's contribution; in the chunk it owns, the residual of the
/// quantized sum (added into the owner's contribution on the next call, so into the
/// next sum once). Uncompressed values keep a zero residual.

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

#include "concepts.hpp"
#include "quant/host_exec.hpp"
#include "quant/rounding.hpp"

namespace cgx {

/// The residuals of one rank for a buffer of n values of T (see the file comment).
template <class T>
class error_feedback {
  static_assert(std::is_floating_point_v<T>, "cgx::error_feedback: T must be a floating-point type");

 public:
  /// Residuals for n values, all zero. Allocates n * sizeof(T) bytes.
  explicit error_feedback(std::size_t n = 0) : e_(n, T(0)) {}

  /// Error-feedback compression of x[begin, begin + count) with quantizer Q into out
  /// (Q::compressed_bytes<T>(count) bytes): x becomes x + e (the compensated input, which
  /// is what was quantized) and e becomes (x + e) - decode(Q(x + e)). A lossless Q sends
  /// x + e and leaves e zero.
  template <class Q>
  void compress(T* x, std::size_t begin, std::size_t count, std::byte* out, const quant::rng_state& rng = {},
                quant::host_exec ex = {}) {
    static_assert(quantizer_for<Q, T>, "cgx::error_feedback::compress: Q must be a quantizer for T");
    compensate(x, begin, count);
    Q::template compress<T>(x + begin, count, out, rng, ex);
    if constexpr (Q::lossless)
      clear(begin, count);
    else
      record(x, begin, count, [&](T* dec, std::size_t k) { Q::template decompress<T>(out, k, dec, ex); });
  }

  /// x[begin, begin + count) += e: the compensated input, to be quantized next.
  void compensate(T* x, std::size_t begin, std::size_t count) const {
    const T* e = e_.data() + begin;
    for (std::size_t i = 0; i < count; ++i) x[begin + i] += e[i];
  }

  /// After c[begin, begin + count) was quantized: e = c - decode, where `dec(T* y, k)`
  /// writes the k decoded values into y (a run-time quantizer's decoder works too).
  template <class Dec>
  void record(const T* c, std::size_t begin, std::size_t count, Dec&& dec) {
    T* e = e_.data() + begin;
    dec(e, count);
    for (std::size_t i = 0; i < count; ++i) e[i] = c[begin + i] - e[i];
  }

  /// Zero residual for values sent losslessly.
  void clear(std::size_t begin, std::size_t count) { std::fill_n(e_.data() + begin, count, T(0)); }

  /// Forgets every residual (e.g. when the model or the learning rate is reset).
  void reset() { std::fill(e_.begin(), e_.end(), T(0)); }
  /// The residuals.
  std::span<const T> residual() const noexcept { return e_; }
  /// Values covered.
  std::size_t size() const noexcept { return e_.size(); }
  /// Bytes of memory held: size() * sizeof(T).
  std::size_t memory_bytes() const noexcept { return e_.size() * sizeof(T); }

 private:
  std::vector<T> e_;
};

}  // namespace cgx
