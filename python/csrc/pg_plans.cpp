// The cgx half's plans over a torch.distributed process group (pg_transport over the
// channel bindings.cpp implements). No torch header here (see plans.hpp).
#include "plans.hpp"

#include "host_plan.inl"

#include <memory>
#include <utility>

namespace cgx_torch {

namespace {
template <class T>
std::unique_ptr<plan> make_pg_t(std::shared_ptr<channel> ch, std::size_t n, std::vector<cgx::layer> layers,
                                const plan_config& c) {
  if (c.stochastic) return detail::make_pg_host<T, cgx::quant::stochastic>(std::move(ch), n, std::move(layers), c);
  return detail::make_pg_host<T, cgx::quant::nearest>(std::move(ch), n, std::move(layers), c);
}
}  // namespace

std::unique_ptr<plan> make_pg_host_plan(std::shared_ptr<channel> ch, dtype t, std::size_t n,
                                        std::vector<layer_desc> layers, const plan_config& c) {
  if (t == dtype::f32) return make_pg_t<float>(std::move(ch), n, detail::to_layers(layers), c);
  return make_pg_t<double>(std::move(ch), n, detail::to_layers(layers), c);
}

}  // namespace cgx_torch
