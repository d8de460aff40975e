// Compiled instead of device_plans.cu where the extension is built without CUDA (a
// CPU-only torch, or no CUDA toolkit): device plans are absent and say so.
#include "plans.hpp"

#include <stdexcept>

namespace cgx_torch {

bool device_plans_compiled() { return false; }

std::string device_transports_compiled() { return ""; }

std::unique_ptr<plan> make_store_device_plan(std::shared_ptr<kv>, const std::string&, int, int, std::int64_t,
                                             device_transport, dtype, std::size_t, std::vector<layer_desc>,
                                             const plan_config&) {
  throw std::runtime_error(
      "cgx: this cgx_torch was built without CUDA (CPU-only torch or no CUDA toolkit at build time): "
      "device plans are not available");
}

std::unique_ptr<plan> make_device_plan(int, dtype, std::size_t, std::vector<layer_desc>, const plan_config&) {
  throw std::runtime_error(
      "cgx: this cgx_torch was built without CUDA (CPU-only torch or no CUDA toolkit at build time): "
      "device plans are not available; reduce CPU tensors, or rebuild against a CUDA torch with nvcc on PATH");
}

}  // namespace cgx_torch
