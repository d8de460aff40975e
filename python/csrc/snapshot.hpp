#pragma once
// plan_snapshot (plans.hpp) of a cgx layer-wise plan (host or device) with its optional
// adaptive statistics, shared by host_plan.inl and device_plans.cu.
#include "plans.hpp"

#include <cgx/adaptive.hpp>
#include <cgx/error.hpp>
#include <cgx/layerwise.hpp>

#include <cmath>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cgx_torch::detail {

/// plans.hpp's layer descriptions as cgx::layer (host and device plans).
inline std::vector<cgx::layer> to_layers(const std::vector<layer_desc>& ls) {
  std::vector<cgx::layer> out;
  out.reserve(ls.size());
  for (const auto& l : ls) out.push_back(cgx::layer{l.offset, l.count, l.one_dimensional});
  return out;
}

/// The snapshot of `p` (a layerwise_plan or layerwise_device_plan) and `a`, with the
/// error-feedback residuals `residual` (empty without error feedback).
template <class Plan, class T>
plan_snapshot take_snapshot(const Plan& p, const std::optional<cgx::adaptive_bits>& a, std::span<const T> residual) {
  plan_snapshot s;
  s.calls = p.calls();
  for (const auto& x : p.settings()) s.settings.emplace_back(x.bits, x.bucket);
  if (a) {
    s.observed = a->observed();
    s.sensitivity = a->sensitivity();
  }
  s.residual.resize(residual.size_bytes());
  if (!residual.empty()) std::memcpy(s.residual.data(), residual.data(), residual.size_bytes());
  return s;
}

/// Restores `s` into `p` and `a`; `set_residual(std::span<const T>)` takes the residuals
/// (called only when the plan has error feedback, `ef_values` of them). Everything is
/// checked before anything changes.
template <class T, class Plan, class SetResidual>
void restore_snapshot(Plan& p, std::optional<cgx::adaptive_bits>& a, std::size_t ef_values, const plan_snapshot& s,
                      SetResidual&& set_residual) {
  auto bad = [](const std::string& why) { throw cgx::error(cgx::errc::invalid_argument, "cgx_torch: snapshot " + why); };
  if (s.settings.size() != p.settings().size())
    bad("has " + std::to_string(s.settings.size()) + " layers, the plan " + std::to_string(p.settings().size()));
  if (s.residual.size() != ef_values * sizeof(T))
    bad(ef_values == 0 ? std::string("has error-feedback residuals; the plan has no error feedback")
                       : "has " + std::to_string(s.residual.size()) + " bytes of residuals, the plan needs " +
                             std::to_string(ef_values * sizeof(T)));
  if (s.observed && !a) bad("has adaptive statistics; the plan is not adaptive");
  if (s.observed && s.sensitivity.size() != s.settings.size()) bad("has a wrong number of sensitivities");
  for (std::size_t i = 0; i < s.settings.size(); ++i)
    cgx::validate_setting(cgx::layer_setting{s.settings[i].first, s.settings[i].second}, i);
  for (const double v : s.sensitivity)
    if (!std::isfinite(v) || v < 0) bad("has a sensitivity that is not finite and >= 0");
  // The residuals first: set_residual checks them (count, finite) and changes nothing when
  // it throws; after it nothing can fail on the snapshot's account.
  if (ef_values) {
    std::vector<T> r(ef_values);  // the bytes need not be aligned for T
    std::memcpy(r.data(), s.residual.data(), s.residual.size());
    set_residual(std::span<const T>(r));
  }
  std::vector<cgx::layer_setting> st;
  for (const auto& [bits, bucket] : s.settings) st.push_back(cgx::layer_setting{bits, bucket});
  p.set_settings(std::move(st));
  if (a && s.observed) a->set_sensitivity(s.sensitivity);
  p.set_calls(s.calls);
}

}  // namespace cgx_torch::detail
