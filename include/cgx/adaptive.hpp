#pragma once
/// \file adaptive.hpp
/// `cgx::adaptive_bits`: CGX's layer-wise adaptive bit widths.
///
/// # Statistics
///
/// After each reduction, `observe(grad)` updates for every adapted layer l its
/// sensitivity s_l, a decayed average (factor `decay`) of the root mean square of the
/// layer's largest entries |g_i| (the top `top_fraction` of its values, at least one).
/// The largest entries set a max-min bucket's range and so its quantization unit. The
/// state is one double per layer. Observe the *reduced* gradient: it is the same bits
/// on every rank, so every rank computes the same statistics and, the arithmetic below
/// being deterministic (fixed initialization, fixed order, no threads), the same
/// assignment; no broadcast is needed (a plan with collective checking verifies it).
///
/// # Objective and target
///
/// A b-bit max-min quantization of layer l adds error of variance proportional to
/// unit^2 ~ s_l^2 / (2^b - 1)^2 per value. The assignment minimizes the total
/// quantization variance of the fused gradient
///
///     E(b) = sum_l n_l s_l^2 / (2^{b_l} - 1)^2
///
/// subject to the bit budget  sum_l n_l b_l <= target_bits * sum_l n_l  (the average
/// bits per value over the adapted layers, weighted by their counts; metadata not
/// counted), min_bits <= b_l <= max_bits, and CGX's structure: layers are grouped by
/// k-means on (log2 size, log2 sensitivity) (scaled to [0, 1/2] and [0, 1]; k =
/// `clusters`; centres initialized at quantiles of sensitivity; Lloyd iterations until
/// nothing moves), every layer of a cluster gets the cluster's bits, and a cluster of
/// lower mean sensitivity never gets more bits than a more sensitive one (the least
/// sensitive cluster gets the fewest). The bits are found greedily: all clusters start
/// at min_bits, then the raise (one bit of one cluster) with the largest decrease of E
/// per added bit-value is taken while it fits the budget and the order, until none fits.
/// A target below min_bits gives min_bits everywhere (the only feasible point closest
/// to it); `average_bits(assignment)` reports what was reached.
///
/// Re-run `assign()` every K steps (e.g. 100) and give the result to the plan
/// (`layerwise_plan::set_settings`); all ranks must do so at the same step.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "error.hpp"
#include "layerwise.hpp"

namespace cgx {

/// Parameters of the adaptive assignment.
struct adaptive_options {
  int min_bits = 2;             ///< fewest bits a layer gets
  int max_bits = 8;             ///< most bits a layer gets
  double target_bits = 4.0;     ///< average bits per value over the adapted layers, at most
  int clusters = 3;             ///< k of k-means
  double decay = 0.9;           ///< weight of the past in the sensitivity average
  double top_fraction = 0.01;   ///< share of a layer's values (largest |g|) its sensitivity measures
  std::size_t bucket = 1024;    ///< bucket of the settings produced
};

/// Statistics and assignment of the adaptive bit widths (see the file comment).
class adaptive_bits {
 public:
  /// Adapts the layers whose `initial` setting is compressed (bits > 0); the others
  /// (small and one-dimensional layers by CGX's defaults) keep their setting. Throws
  /// cgx::error(errc::invalid_argument) for bad options.
  adaptive_bits(std::vector<layer> layers, std::vector<layer_setting> initial, adaptive_options opts = {})
      : layers_(std::move(layers)), base_(std::move(initial)), o_(opts), sens_(layers_.size(), 0.0) {
    if (base_.size() != layers_.size())
      throw error(errc::invalid_argument, "adaptive_bits: one initial setting per layer needed");
    if (o_.min_bits < 1 || o_.max_bits > 8 || o_.min_bits > o_.max_bits)
      throw error(errc::invalid_argument, "adaptive_bits: need 1 <= min_bits <= max_bits <= 8");
    if (o_.clusters < 1) throw error(errc::invalid_argument, "adaptive_bits: clusters must be >= 1");
    if (!std::isfinite(o_.target_bits)) throw error(errc::invalid_argument, "adaptive_bits: target_bits must be finite");
    if (!(o_.decay >= 0 && o_.decay < 1)) throw error(errc::invalid_argument, "adaptive_bits: decay must be in [0, 1)");
    if (!(o_.top_fraction > 0 && o_.top_fraction <= 1))
      throw error(errc::invalid_argument, "adaptive_bits: top_fraction must be in (0, 1]");
    validate_setting(layer_setting{o_.min_bits, o_.bucket}, 0);
  }

  /// Updates the statistics from a (reduced) fused gradient: grad[layer.offset ...].
  template <class T>
  void observe(const T* grad) {
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (base_[l].bits == 0 || layers_[l].count == 0) continue;
      const std::size_t n = layers_[l].count;
      scratch_.resize(n);
      for (std::size_t i = 0; i < n; ++i) scratch_[i] = std::abs(static_cast<double>(grad[layers_[l].offset + i]));
      const std::size_t k = std::max<std::size_t>(1, static_cast<std::size_t>(o_.top_fraction * static_cast<double>(n)));
      std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(k - 1), scratch_.end(),
                       std::greater<double>());
      double sq = 0;
      for (std::size_t i = 0; i < k; ++i) sq += scratch_[i] * scratch_[i];
      const double s = std::sqrt(sq / static_cast<double>(k));
      sens_[l] = observed_ ? o_.decay * sens_[l] + (1 - o_.decay) * s : s;
    }
    observed_ = true;
  }

  /// Sets the sensitivities directly (e.g. from another statistic), one per layer.
  void set_sensitivity(std::vector<double> s) {
    if (s.size() != layers_.size()) throw error(errc::invalid_argument, "adaptive_bits: one sensitivity per layer needed");
    sens_ = std::move(s);
    observed_ = true;
  }

  /// The current sensitivities (0 for layers not adapted or not observed).
  const std::vector<double>& sensitivity() const noexcept { return sens_; }
  /// Whether any statistic was taken yet (observe or set_sensitivity): the first one
  /// replaces the sensitivities, later ones are averaged in with `decay`.
  bool observed() const noexcept { return observed_; }

  /// The assignment for the current statistics: one setting per layer. Before any
  /// observation, the initial settings with min(max_bits, max(min_bits, target)) bits.
  std::vector<layer_setting> assign() const {
    std::vector<layer_setting> out = base_;
    std::vector<std::size_t> ad;  // adapted layers
    for (std::size_t l = 0; l < layers_.size(); ++l)
      if (base_[l].bits != 0 && layers_[l].count != 0) ad.push_back(l);
    if (ad.empty()) return out;
    if (!observed_) {
      const int b = std::clamp(static_cast<int>(std::floor(o_.target_bits)), o_.min_bits, o_.max_bits);
      for (std::size_t l : ad) out[l] = layer_setting{b, o_.bucket};
      return out;
    }
    const std::vector<int> cl = cluster(ad);
    const int k = *std::max_element(cl.begin(), cl.end()) + 1;
    // Per cluster: values, sum n s^2, mean log sensitivity (its rank in the order).
    std::vector<double> n(static_cast<std::size_t>(k), 0), w(static_cast<std::size_t>(k), 0), ls(static_cast<std::size_t>(k), 0);
    std::vector<int> members(static_cast<std::size_t>(k), 0);
    for (std::size_t j = 0; j < ad.size(); ++j) {
      const auto c = static_cast<std::size_t>(cl[j]);
      const double cnt = static_cast<double>(layers_[ad[j]].count), s = sens_[ad[j]];
      n[c] += cnt;
      w[c] += cnt * s * s;
      ls[c] += std::log2(std::max(s, 1e-300));
      ++members[c];
    }
    std::vector<std::size_t> order(static_cast<std::size_t>(k));  // clusters, least sensitive first
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return ls[a] / members[a] < ls[b] / members[b];
    });
    std::vector<int> bits(static_cast<std::size_t>(k), o_.min_bits);
    const double total = std::accumulate(n.begin(), n.end(), 0.0);
    const double budget = o_.target_bits * total;
    double used = o_.min_bits * total;
    auto err = [](double wc, int b) { const double lv = std::ldexp(1.0, b) - 1; return wc / (lv * lv); };
    for (;;) {
      std::size_t best = order.size();
      double best_gain = -1;
      for (std::size_t q = 0; q < order.size(); ++q) {
        const std::size_t c = order[q];
        if (bits[c] >= o_.max_bits || used + n[c] > budget * (1 + 1e-12)) continue;
        if (q + 1 < order.size() && bits[c] + 1 > bits[order[q + 1]]) continue;  // keep the order
        const double gain = (err(w[c], bits[c]) - err(w[c], bits[c] + 1)) / n[c];
        if (gain > best_gain) best_gain = gain, best = q;
      }
      if (best == order.size()) break;
      ++bits[order[best]];
      used += n[order[best]];
    }
    for (std::size_t j = 0; j < ad.size(); ++j) out[ad[j]] = layer_setting{bits[static_cast<std::size_t>(cl[j])], o_.bucket};
    return out;
  }

  /// The k-means cluster of each adapted layer (in layer order), as assign() uses it.
  std::vector<int> clusters() const {
    std::vector<std::size_t> ad;
    for (std::size_t l = 0; l < layers_.size(); ++l)
      if (base_[l].bits != 0 && layers_[l].count != 0) ad.push_back(l);
    return cluster(ad);
  }

  /// Average bits per value of `s` over the adapted layers, weighted by their counts.
  double average_bits(const std::vector<layer_setting>& s) const {
    double b = 0, c = 0;
    for (std::size_t l = 0; l < layers_.size(); ++l)
      if (base_[l].bits != 0) b += static_cast<double>(layers_[l].count) * s[l].bits, c += static_cast<double>(layers_[l].count);
    return c == 0 ? 0 : b / c;
  }

  /// The objective E of `s` for the current sensitivities (see the file comment).
  double objective(const std::vector<layer_setting>& s) const {
    double e = 0;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      if (base_[l].bits == 0) continue;
      const double lv = std::ldexp(1.0, s[l].bits) - 1;
      e += static_cast<double>(layers_[l].count) * sens_[l] * sens_[l] / (lv * lv);
    }
    return e;
  }

  /// The options.
  const adaptive_options& options() const noexcept { return o_; }

 private:
  /// Sizes count half as much as sensitivities in the k-means distance: the objective
  /// depends on sensitivity; size only groups layers of like cost.
  static constexpr double size_weight = 0.5;

  /// Deterministic k-means on (log2 size, log2 sensitivity), scaled to [0, size_weight]
  /// and [0, 1].
  std::vector<int> cluster(const std::vector<std::size_t>& ad) const {
    const std::size_t L = ad.size();
    if (L == 0) return {};
    const std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(o_.clusters), L);
    std::vector<double> fx(L), fy(L);
    for (std::size_t j = 0; j < L; ++j) {
      fx[j] = std::log2(static_cast<double>(layers_[ad[j]].count));
      fy[j] = std::log2(std::max(sens_[ad[j]], 1e-300));
    }
    auto scale = [](std::vector<double>& f) {
      const auto [lo, hi] = std::minmax_element(f.begin(), f.end());
      const double a = *lo, d = *hi - *lo;
      for (double& v : f) v = d > 0 ? (v - a) / d : 0.0;
    };
    scale(fx);
    scale(fy);
    for (double& v : fx) v *= size_weight;
    std::vector<std::size_t> by_s(L);
    std::iota(by_s.begin(), by_s.end(), std::size_t{0});
    std::stable_sort(by_s.begin(), by_s.end(), [&](std::size_t a, std::size_t b) { return fy[a] < fy[b]; });
    std::vector<double> cx(k), cy(k);
    for (std::size_t c = 0; c < k; ++c) {
      const std::size_t j = by_s[(2 * c + 1) * L / (2 * k)];
      cx[c] = fx[j];
      cy[c] = fy[j];
    }
    std::vector<int> as(L, -1);
    for (int it = 0; it < 100; ++it) {
      bool moved = false;
      for (std::size_t j = 0; j < L; ++j) {
        int best = 0;
        double bd = 1e300;
        for (std::size_t c = 0; c < k; ++c) {
          const double d = (fx[j] - cx[c]) * (fx[j] - cx[c]) + (fy[j] - cy[c]) * (fy[j] - cy[c]);
          if (d < bd) bd = d, best = static_cast<int>(c);
        }
        if (as[j] != best) as[j] = best, moved = true;
      }
      if (!moved) break;
      for (std::size_t c = 0; c < k; ++c) {
        double sx = 0, sy = 0, m = 0;
        for (std::size_t j = 0; j < L; ++j)
          if (as[j] == static_cast<int>(c)) sx += fx[j], sy += fy[j], m += 1;
        if (m > 0) cx[c] = sx / m, cy[c] = sy / m;  // an empty cluster keeps its centre
      }
    }
    // Renumber the clusters that have members 0, 1, ... in order of first appearance.
    std::vector<int> id(k, -1);
    int next = 0;
    for (int& a : as) {
      if (id[static_cast<std::size_t>(a)] < 0) id[static_cast<std::size_t>(a)] = next++;
      a = id[static_cast<std::size_t>(a)];
    }
    return as;
  }

  std::vector<layer> layers_;
  std::vector<layer_setting> base_;
  adaptive_options o_;
  std::vector<double> sens_;
  std::vector<double> scratch_;
  bool observed_ = false;
};

}  // namespace cgx
