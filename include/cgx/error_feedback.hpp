#pragma once
/// \file error_feedback.hpp
/// `cgx::error_feedback<T>`: error feedback (EF) over a bucketed quantizer, in a form
/// that cannot diverge. Each rank keeps a residual e per value; one EF quantization of
/// a range x of the caller's buffer is, bucket by bucket:
///
///     c = x + d e                                      the compensated input
///     y = decode(encode(c))                            what is sent (encoding: below)
///     e = clamp(c - y, -B, B),  B = max(clip_factor * (max x - min x), max |d e_old| / 2)
///
/// and x is left holding y. d is the decay (1 unless the constructor is given another in
/// [0, 1]). With d = 1, summed over calls, the decoded values are the inputs minus the
/// last residual wherever the clamp did not act: the error of one call is sent in the
/// next and nothing is lost (the fix that makes 1-2 bit compression converge).
///
/// Decay (a leaky residual). With d < 1 a residual sent late is sent only in part, and
/// what is not sent after k calls is d^k of it: the sum of the decoded values misses
/// (1 - d) of each call's residual. d = 0 is the deterministic encoding alone, with no
/// residual carried (at 2..8 bits: max-min with nearest rounding). Why it is there: with
/// Adam, an optimizer that divides each coordinate by the root of its running mean
/// square, a full residual turns a small gradient that nearest rounding sends as 0 into
/// a level sent every few calls, and each such burst moves that weight by several
/// learning rates; halving the residual each call keeps most of error feedback's
/// correction of the biased low-width encodings (1 bit) and limits the bursts. Measured
/// with cgx_torch's hook on a transformer LM with AdamW, 4 ranks (docs/results/lm-adam.md):
/// 1 bit d = 1 +0.050 validation loss over fp32, d = 0.5 +0.025, no error feedback +0.039
/// (means of 3 seeds).
///
/// The encoding is deterministic, never stochastic rounding (the plan's default):
/// - 2..8 bits: max-min with nearest rounding, |c - y| <= unit / 2, unit = (max c -
///   min c) / (2^b - 1).
/// - 1 bit: two levels, the mean of the bucket's compensated values at or above their
///   mean and the mean of those below (the reconstruction of 1-bit SGD, Seide et al.,
///   Interspeech 2014), written in max-min's 1-bit format (min = the lower level, unit =
///   the difference), so a receiver decodes it as any 1-bit bucket. Each level is the
///   mean of its values, so sum (c - y)^2 <= sum (c - mean c)^2: it never expands.
///
/// Why. EF's convergence theory assumes a contractive compressor (|c - C(c)| smaller
/// than |c|). An unbiased stochastic max-min quantizer is not one: its residual is
/// zero-mean noise as large as the bucket's range, which widens the next range, which
/// widens the next residual (1 bit, Gaussian input, 1024-value buckets: the residual
/// reached 4e26 times the input's range within 100 steps). Nor is 1-bit max-min with
/// nearest rounding, whose two levels are the bucket's extremes: values near the middle
/// are sent as an extreme, and the residual grew without bound (47 times the range after
/// 10^4 steps). Max-min with nearest rounding at 2+ bits contracts (below). The clamp
/// makes "bounded" a guarantee rather than an observation, for any quantizer.
///
/// Guarantee. After every call, for every value i of a bucket (R: the range max - min
/// of the bucket's input x before compensation; m: the largest |d e| of the bucket before
/// the call), e_i is finite and
///
///     |e_i| <= max(clip_factor * R, m / 2),
///
/// whatever the quantizer (computed in T exactly as stated). With fixed buckets the
/// residual after call t is at most max over s <= t of clip_factor R_s / 2^(t - s): it
/// is bounded by recent inputs and forgets older ones by halves; it cannot feed on
/// itself. At 2..8 bits with nearest rounding the clamp never acts: |c - y| <= (R +
/// 2m) / (2 (2^b - 1)) <= 5/6 max(R, m/2) (the decode's few-ulp rounding fits in the
/// rest), so the errors telescope exactly and over calls whose ranges stay below R the
/// residual stays below R / (2 (2^b - 2)) (R/4 at 2 bits, R/28 at 4). At 1 bit the clamp
/// acts at times: the two levels reach a bucket's extreme values only with a residual
/// larger than the bucket's range, so the part of the extremes beyond it is dropped.
///
/// Non-finite values. A bucket whose input (before or after compensation) holds a NaN or
/// an Inf, or whose input range overflows T, or whose residual would not be finite, gets
/// a zero residual: the non-finite values still travel (the quantizer decodes the whole
/// bucket to NaN on every rank, so loss scalers see the overflow), the bucket's old
/// residual is dropped, and the next call starts clean there. Other buckets are untouched.
///
/// Measured (examples/train_mlp, 4 ranks, 8 epochs, held-out accuracy at 1 bit on its
/// default task / with --hidden 512 --momentum 0 --lr 0.1 --batch 16, fp32 98.1% /
/// 98.3%): plain 1-bit 9.6% / 83.4%; the former EF (stochastic, unclamped) NaN / NaN;
/// nearest max-min unclamped NaN / NaN, clamped at 1x R 51% / 63%, at 2x R 29% / NaN,
/// scaled down instead of clamped 12% / 20%, decayed by 0.9 19% / NaN; stochastic
/// clamped at 1x NaN / NaN; EF21 on the sum (stochastic or nearest) chance or NaN on
/// both; this formulation 98.1% / 98.2%. Two levels split at 0 or at the midpoint of
/// the range, clamped at 2x R or not at all: all within 0.5 points of it (on harder
/// data, noise 1.5, all of them between 84.9% and 86.4%, fp32 85.6%); the clamp at 1x R
/// keeps the tightest guarantee. Every width: run examples/train_mlp (the ctests
/// train_mlp.np4 and train_mlp_sgd.np4 check it).
///
/// Memory: one T per value of the buffer it covers (n * sizeof(T) bytes per rank),
/// allocated once at construction, plus one T per bucket of the largest range quantized
/// at once (scratch, reused).
///
/// With the layer-wise plan (layerwise_options::error_feedback) one residual covers
/// both quantizations of SRA: in the chunks this rank sends to their owners it holds
/// the residual of this rank's contribution; in the chunk it owns, the residual of the
/// quantized sum (added into the next call's sum once; R is then the range of the sum
/// before compensation), unless layerwise_options::error_feedback_sum is false: then the
/// owned chunk's sum is encoded with the same deterministic encoder and keeps a zero
/// residual (only the rank's own contributions are compensated). Uncompressed values keep
/// a zero residual.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "concepts.hpp"
#include "error.hpp"
#include "quant/host_exec.hpp"
#include "quant/rounding.hpp"

namespace cgx {

/// The residuals of one rank for a buffer of n values of T (see the file comment).
template <class T>
class error_feedback {
  static_assert(std::is_floating_point_v<T>, "cgx::error_feedback: T must be a floating-point type");

 public:
  /// The residuals of a bucket are clamped to max(clip_factor * R, m / 2) (see the file
  /// comment). A power of two, so the bound is exact in T.
  static constexpr double clip_factor = 1.0;

  /// Residuals for n values, all zero, carried into the next call multiplied by `decay`
  /// (1: whole; see the file comment). Allocates n * sizeof(T) bytes. Throws
  /// cgx::error(errc::invalid_argument) for a decay outside [0, 1] or not a number.
  explicit error_feedback(std::size_t n = 0, double decay = 1.0) : d_(checked_decay(decay)), e_(n, T(0)) {}

  /// Error-feedback compression of x[begin, begin + count) with the compile-time
  /// quantizer Q into out (Q::compressed_bytes<T>(count) bytes), as `quantize` with Q's
  /// bits and bucket: x becomes the decoded values. Use a Q with quant::nearest rounding
  /// (the guarantee holds with any Q; the quality argument of the file comment needs
  /// nearest). A lossless Q sends x + e, leaves x = x + e and e zero.
  template <class Q>
  void compress(T* x, std::size_t begin, std::size_t count, std::byte* out, const quant::rng_state& rng = {},
                quant::host_exec ex = {}) {
    static_assert(quantizer_for<Q, T>, "cgx::error_feedback::compress: Q must be a quantizer for T");
    if constexpr (Q::lossless) {
      compensate(x, begin, count);
      Q::template compress<T>(x + begin, count, out, rng, ex);
      clear(begin, count);
    } else {
      quantize(x, begin, count, Q::bucket_size, Q::bits,
               [&](const T* in, std::size_t k) { Q::template compress<T>(in, k, out, rng, ex); },
               [&](T* y, std::size_t k) { Q::template decompress<T>(out, k, y, ex); });
    }
  }

  /// One error-feedback quantization of x[begin, begin + count) (see the file comment),
  /// with a quantizer known at run time: `encode(const T* in, std::size_t k)` writes the
  /// bytes of the k values at `in` (a max-min encoder of `bits` bits and buckets of
  /// `bucket` values, nearest rounding: its buckets must be those of this call, counted
  /// from `begin`), `decode(T* y, std::size_t k)` decodes those bytes into y. On return
  /// x[begin, begin + count) holds the decoded values and the residual is updated.
  /// `encode` may be given a pointer into the residual's storage (the 1-bit levels).
  template <class Encode, class Decode>
  void quantize(T* x, std::size_t begin, std::size_t count, std::size_t bucket, int bits, Encode&& encode,
                Decode&& decode) {
    if (count == 0) return;
    if (bucket == 0) bucket = count;
    T* e = e_.data() + begin;
    x += begin;
    const std::size_t nb = (count + bucket - 1) / bucket;
    bound_.resize(nb);
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t i0 = b * bucket, i1 = std::min(count, i0 + bucket);
      bound_[b] = compensate_bucket(x + i0, e + i0, i1 - i0, bits == 1, d_);
    }
    encode(bits == 1 ? e : x, count);
    decode(e, count);
    for (std::size_t b = 0; b < nb; ++b) {
      const std::size_t i0 = b * bucket, i1 = std::min(count, i0 + bucket);
      const T B = bound_[b];
      bool finite = B >= T(0);  // a negative bound marks a non-finite input
      for (std::size_t i = i0; i < i1; ++i) {
        const T y = e[i];
        const T r = x[i] - y;
        finite = finite && std::isfinite(r);
        e[i] = std::clamp(r, -std::abs(B), std::abs(B));
        x[i] = y;
      }
      if (!finite) std::fill(e + i0, e + i1, T(0));
    }
  }

  /// x[begin, begin + count) += d e: the compensated input of values sent losslessly
  /// (clear their residual after sending).
  void compensate(T* x, std::size_t begin, std::size_t count) const {
    const T* e = e_.data() + begin;
    for (std::size_t i = 0; i < count; ++i) x[begin + i] += d_ * e[i];
  }

  /// Zero residual for values sent losslessly.
  void clear(std::size_t begin, std::size_t count) { std::fill_n(e_.data() + begin, count, T(0)); }

  /// Forgets every residual (e.g. when the model or the learning rate is reset).
  void reset() { std::fill(e_.begin(), e_.end(), T(0)); }
  /// The residuals.
  std::span<const T> residual() const noexcept { return e_; }
  /// Replaces the residuals with r (e.g. from a checkpoint: residual() of a run that is
  /// resumed). Throws cgx::error(errc::invalid_argument), keeping the old ones, when
  /// r.size() != size() or a value is not finite.
  void assign(std::span<const T> r) {
    if (r.size() != e_.size())
      throw error(errc::invalid_argument, "error_feedback: " + std::to_string(r.size()) + " residuals given for " +
                                              std::to_string(e_.size()) + " values");
    for (const T v : r)
      if (!std::isfinite(static_cast<double>(v)))
        throw error(errc::invalid_argument, "error_feedback: a residual given is not finite");
    std::copy(r.begin(), r.end(), e_.begin());
  }
  /// The factor the residuals are carried into the next call with (1: whole).
  double decay() const noexcept { return static_cast<double>(d_); }
  /// Values covered.
  std::size_t size() const noexcept { return e_.size(); }
  /// Bytes of memory held for the residuals: size() * sizeof(T).
  std::size_t memory_bytes() const noexcept { return e_.size() * sizeof(T); }

 private:
  static T checked_decay(double d) {
    if (!(d >= 0.0 && d <= 1.0))
      throw error(errc::invalid_argument,
                  "error_feedback: the decay must be in [0, 1] (got " + std::to_string(d) + ")");
    return static_cast<T>(d);
  }

  /// One bucket of k values: x += d e (the compensated input); for 1 bit, e = the two
  /// levels to encode. Returns the clamp bound B, or -1 when an input is not finite.
  static T compensate_bucket(T* x, T* e, std::size_t k, bool two_levels, T d) {
    T lo = x[0], hi = x[0], old = 0;
    bool finite = true;
    double sum = 0;
    for (std::size_t i = 0; i < k; ++i) {
      const T v = x[i];
      finite = finite && std::isfinite(v);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      const T carried = d * e[i];  // exact when d = 1
      old = std::max(old, std::abs(carried));
      x[i] = v + carried;
      sum += static_cast<double>(x[i]);
    }
    const T range = hi - lo;  // may overflow T for finite inputs
    // -1: the residual is zeroed after encoding.
    const T bound = finite && std::isfinite(range)
                        ? std::max(static_cast<T>(clip_factor * static_cast<double>(range)), old / 2)
                        : T(-1);
    if (!two_levels) return bound;
    // 1 bit: the means of the values at or above the mean and of those below.
    const double mean = sum / static_cast<double>(k);
    double up = 0, down = 0;
    std::size_t n_up = 0;
    for (std::size_t i = 0; i < k; ++i) {
      if (static_cast<double>(x[i]) >= mean) {
        up += static_cast<double>(x[i]);
        ++n_up;
      } else {
        down += static_cast<double>(x[i]);
      }
    }
    if (n_up == 0 || n_up == k || !std::isfinite(mean)) {
      std::copy(x, x + k, e);  // a constant or non-finite bucket: encoded as it is
      return bound;
    }
    const T level_up = static_cast<T>(up / static_cast<double>(n_up));
    const T level_down = static_cast<T>(down / static_cast<double>(k - n_up));
    for (std::size_t i = 0; i < k; ++i) e[i] = static_cast<double>(x[i]) >= mean ? level_up : level_down;
    return bound;
  }

  T d_ = T(1);
  std::vector<T> e_;
  std::vector<T> bound_;
};

}  // namespace cgx
