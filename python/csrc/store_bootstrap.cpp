// The cgx half of the Store set-up: cgx::comm::store_bootstrap over the kv that
// bindings.cpp implements on the group's c10d::Store. No torch header here (see plans.hpp).
#include "plans.hpp"
#include "kv_ref.hpp"

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

namespace cgx_torch {

namespace {

class store_boot final : public bootstrap {
 public:
  store_boot(std::shared_ptr<kv> k, int rank, int size, const std::string& prefix, std::int64_t timeout_ms)
      : b_(kv_ref{std::move(k)}, rank, size, prefix, std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms)) {}
  int rank() const override { return b_.rank(); }
  int size() const override { return b_.size(); }
  void allgather(const void* mine, std::size_t m, void* all) override {
    b_.allgather(std::span<const std::byte>(static_cast<const std::byte*>(mine), m),
                 std::span<std::byte>(static_cast<std::byte*>(all), m * static_cast<std::size_t>(b_.size())));
  }
  void barrier() override { b_.barrier(); }
  bool same_node() override { return b_.same_node(); }

 private:
  kv_bootstrap b_;
};

}  // namespace

std::unique_ptr<bootstrap> make_store_bootstrap(std::shared_ptr<kv> store, int rank, int size,
                                                const std::string& prefix, std::int64_t timeout_ms) {
  return std::make_unique<store_boot>(std::move(store), rank, size, prefix, timeout_ms);
}

}  // namespace cgx_torch
