#pragma once
// The cgx half's view of plans.hpp's kv (the group's c10d::Store): a cgx::comm::kv_store,
// and the store_bootstrap over it that the device transports set up through
// (store_bootstrap.cpp, device_plans.cu). No torch header here (see plans.hpp).
#include "plans.hpp"

#include <cgx/comm/store_bootstrap.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace cgx_torch {

/// plans.hpp's kv as a cgx::comm::kv_store (copies share the store).
struct kv_ref {
  std::shared_ptr<kv> k;
  void set(const std::string& key, std::span<const std::byte> v) {
    std::vector<std::uint8_t> b(v.size());
    if (!v.empty()) std::memcpy(b.data(), v.data(), v.size());
    k->set(key, b);
  }
  std::optional<std::vector<std::byte>> try_get(const std::string& key) {
    std::vector<std::uint8_t> b;
    if (!k->try_get(key, b)) return std::nullopt;
    std::vector<std::byte> out(b.size());
    if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
    return out;
  }
  std::int64_t add(const std::string& key, std::int64_t d) { return k->add(key, d); }
};
static_assert(cgx::comm::kv_store<kv_ref>);

using kv_bootstrap = cgx::comm::store_bootstrap<kv_ref>;

}  // namespace cgx_torch
