// The torch half of the extension (module cgx_torch._C): checks tensors and hands their
// memory to the plans of plans.cpp / device_plans.cu, with the GIL released while a
// plan runs. No cgx header here (see plans.hpp).
#include <torch/extension.h>

#ifdef CGX_TORCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "plans.hpp"

namespace py = pybind11;

namespace {

/// A failure reported by cgx (cgx::error and the MPI/CUDA failures it wraps); Python
/// sees cgx_torch.CGXError, a RuntimeError.
struct cgx_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Runs f, turning the plans' std::runtime_error (cgx::error) into cgx_failure.
template <class F>
decltype(auto) guarded(F&& f) {
  try {
    return f();
  } catch (const cgx_failure&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw cgx_failure(e.what());
  }
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return std::string(c10::toString(t));
  }
}

cgx_torch::dtype parse_dtype(const std::string& s) {
  if (s == "float32") return cgx_torch::dtype::f32;
  if (s == "float64") return cgx_torch::dtype::f64;
  throw py::type_error("cgx_torch: dtype " + s +
                       " is not supported: the plans reduce float32 and float64 (float16/bfloat16 gradients: "
                       "keep an fp32 copy, or cast with .float() before and back after)");
}

/// A layer-wise plan for one fused buffer: one dtype, one device, one size.
class py_plan {
 public:
  py_plan(int comm_f, const std::string& dtype, const std::string& device, int device_index, std::size_t n,
          const std::vector<std::tuple<std::size_t, std::size_t, bool>>& layers, const cgx_torch::plan_config& cfg)
      : dtype_(parse_dtype(dtype)), dtype_name_(dtype), cuda_(device == "cuda"), device_index_(device_index) {
    if (device != "cpu" && device != "cuda")
      throw py::value_error("cgx_torch: device '" + device + "' is not supported (cpu or cuda)");
    std::vector<cgx_torch::layer_desc> ls;
    ls.reserve(layers.size());
    for (const auto& [o, c, one_d] : layers) ls.push_back({o, c, one_d});
    py::gil_scoped_release nogil;
    guarded([&] {
      if (!cuda_) {
        p_ = cgx_torch::make_host_plan(comm_f, dtype_, n, std::move(ls), cfg);
        return;
      }
#ifdef CGX_TORCH_WITH_CUDA
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device_index_));
      p_ = cgx_torch::make_device_plan(comm_f, dtype_, n, std::move(ls), cfg);
#else
      throw std::runtime_error("cgx: this cgx_torch was built without CUDA (CPU-only torch or no CUDA toolkit at "
                               "build time): CUDA tensors cannot be reduced");
#endif
    });
  }

  /// Checks t against the plan; throws TypeError / ValueError before anything runs.
  void check(const at::Tensor& t) const {
    const std::string dt = dtype_name(t.scalar_type());
    if (t.scalar_type() != at::kFloat && t.scalar_type() != at::kDouble) parse_dtype(dt);
    if (dt != dtype_name_)
      throw py::type_error("cgx_torch: tensor of dtype " + dt + " given to a plan built for " + dtype_name_);
    const bool is_cuda = t.device().is_cuda();
    if (!is_cuda && !t.device().is_cpu())
      throw py::value_error("cgx_torch: tensors on " + t.device().str() + " are not supported (cpu or cuda)");
    if (is_cuda != cuda_ || (cuda_ && t.device().index() != device_index_))
      throw py::value_error("cgx_torch: tensor on " + t.device().str() + " given to a plan built for " +
                            (cuda_ ? "cuda:" + std::to_string(device_index_) : std::string("cpu")));
    if (t.layout() != at::kStrided) throw py::value_error("cgx_torch: sparse tensors are not supported");
    if (!t.is_contiguous())
      throw py::value_error("cgx_torch: the tensor is not contiguous (strides " + c10::str(t.strides()) +
                            "); reduce t.contiguous() and copy back");
    if (static_cast<std::size_t>(t.numel()) != p_->size())
      throw py::value_error("cgx_torch: tensor of " + std::to_string(t.numel()) + " values given to a plan for " +
                            std::to_string(p_->size()));
  }

  /// Sums t over the ranks, in place (collective).
  void run(at::Tensor t) {
    check(t);
    void* data = t.data_ptr();
    const std::size_t n = static_cast<std::size_t>(t.numel());
    void* stream = nullptr;
#ifdef CGX_TORCH_WITH_CUDA
    std::unique_ptr<c10::cuda::CUDAGuard> g;
    if (cuda_) {
      g = std::make_unique<c10::cuda::CUDAGuard>(static_cast<c10::DeviceIndex>(device_index_));
      stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index_)).stream();
    }
#endif
    py::gil_scoped_release nogil;
    guarded([&] { p_->run(data, n, stream); });
  }

  py::list settings() const {
    py::list out;
    for (const auto& [b, k] : p_->settings()) out.append(py::make_tuple(b, k));
    return out;
  }
  double average_bits() const { return p_->average_bits(); }
  std::size_t bytes_sent() const { return p_->bytes_sent(); }
  std::size_t size() const { return p_->size(); }
  std::uint32_t calls() const { return p_->calls(); }
  int rank() const { return p_->rank(); }
  int world() const { return p_->world(); }
  bool on_device() const { return p_->on_device(); }
  std::string dtype() const { return dtype_name_; }

 private:
  std::unique_ptr<cgx_torch::plan> p_;
  cgx_torch::dtype dtype_;
  std::string dtype_name_;
  bool cuda_;
  int device_index_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "cgx_torch._C: cgx's layer-wise compressed allreduce plans for torch tensors (use the cgx_torch package)";
  py::register_exception<cgx_failure>(m, "CGXError", PyExc_RuntimeError);

  py::class_<cgx_torch::plan_config>(m, "PlanConfig",
                                     "Settings of a layer-wise plan; must be the same on every rank.")
      .def(py::init<>(), "Default settings: 4 bits, buckets of 1024, stochastic rounding, layers under 1024 values "
                         "and one-dimensional layers uncompressed.")
      .def_readwrite("bits", &cgx_torch::plan_config::bits, "Bits of a compressed layer, 1..8 (0: uncompressed).")
      .def_readwrite("bucket", &cgx_torch::plan_config::bucket, "Values per bucket: 128, 512 or 1024.")
      .def_readwrite("min_compressed", &cgx_torch::plan_config::min_compressed,
                     "Layers with fewer values are sent uncompressed.")
      .def_readwrite("stochastic", &cgx_torch::plan_config::stochastic,
                     "Stochastic rounding (True, CGX's) or nearest (False).")
      .def_readwrite("error_feedback", &cgx_torch::plan_config::error_feedback,
                     "Keep each rank's quantization residual and add it to the next call (host plans only).")
      .def_readwrite("check_each_call", &cgx_torch::plan_config::check_each_call,
                     "cgx's collective argument check on every call (one small exchange per call).")
      .def_readwrite("seed", &cgx_torch::plan_config::seed, "Seed of stochastic rounding.")
      .def_readwrite("threads", &cgx_torch::plan_config::threads, "Host threads for (de)compression per rank.")
      .def_readwrite("adaptive_interval", &cgx_torch::plan_config::adaptive_interval,
                     "Adaptive bits: re-assign every this many calls (0: off).")
      .def_readwrite("min_bits", &cgx_torch::plan_config::min_bits, "Adaptive: fewest bits of a layer.")
      .def_readwrite("max_bits", &cgx_torch::plan_config::max_bits, "Adaptive: most bits of a layer.")
      .def_readwrite("target_bits", &cgx_torch::plan_config::target_bits,
                     "Adaptive: average bits per value over the adapted layers, at most.")
      .def_readwrite("clusters", &cgx_torch::plan_config::clusters, "Adaptive: k of the k-means over layers.")
      .def_readwrite("decay", &cgx_torch::plan_config::decay, "Adaptive: weight of the past in the sensitivity.")
      .def_readwrite("top_fraction", &cgx_torch::plan_config::top_fraction,
                     "Adaptive: share of a layer's largest values its sensitivity measures.");

  py::class_<py_plan>(m, "Plan",
                      "A cgx layer-wise allreduce plan for one fused buffer (one dtype, device and size) over an MPI "
                      "communicator. Construction and run() are collective.")
      .def(py::init<int, const std::string&, const std::string&, int, std::size_t,
                    const std::vector<std::tuple<std::size_t, std::size_t, bool>>&, const cgx_torch::plan_config&>(),
           py::arg("comm_f"), py::arg("dtype"), py::arg("device"), py::arg("device_index"), py::arg("n"),
           py::arg("layers"), py::arg("config"),
           "Collective over the communicator with Fortran handle comm_f (mpi4py: comm.py2f()). dtype 'float32' or "
           "'float64', device 'cpu' or 'cuda', n values, layers a list of (offset, count, one_dimensional). Raises "
           "TypeError for another dtype, CGXError for bad layers or settings.")
      .def("check", &py_plan::check, py::arg("tensor"),
           "Raises TypeError/ValueError unless the tensor fits the plan (dtype, device, contiguous, size).")
      .def("run", &py_plan::run, py::arg("tensor"),
           "Sums the tensor over the ranks, in place; collective. Checks it first (TypeError/ValueError); "
           "CGXError when cgx fails.")
      .def("settings", &py_plan::settings, "The current (bits, bucket) of every layer (bits 0: uncompressed).")
      .def_property_readonly("average_bits", &py_plan::average_bits,
                             "Average bits per value (uncompressed values count 32 or 64), metadata excluded.")
      .def_property_readonly("bytes_sent", &py_plan::bytes_sent, "Bytes this rank sends per call.")
      .def_property_readonly("size", &py_plan::size, "Values in the fused buffer.")
      .def_property_readonly("calls", &py_plan::calls, "Calls made so far.")
      .def_property_readonly("rank", &py_plan::rank, "This rank in the plan's communicator.")
      .def_property_readonly("world", &py_plan::world, "Ranks in the plan's communicator.")
      .def_property_readonly("on_device", &py_plan::on_device, "Whether this is a device (CUDA) plan.")
      .def_property_readonly("dtype", &py_plan::dtype, "'float32' or 'float64'.");

  m.def("comm_size", [](int f) { return guarded([&] { return cgx_torch::comm_size(f); }); }, py::arg("comm_f"),
        "Ranks in the communicator with Fortran handle comm_f.");
  m.def("comm_rank", [](int f) { return guarded([&] { return cgx_torch::comm_rank(f); }); }, py::arg("comm_f"),
        "This rank in the communicator with Fortran handle comm_f.");
  m.def(
      "collective_check",
      [](int f, std::int64_t hash, bool bad) {
        py::gil_scoped_release nogil;
        auto r = guarded([&] { return cgx_torch::collective_check(f, hash, bad); });
        return std::make_tuple(r.same, r.bad);
      },
      py::arg("comm_f"), py::arg("hash"), py::arg("bad"),
      "Collective: returns (every rank passed the same hash, some rank passed bad=True).");
  m.def("device_plans_compiled", &cgx_torch::device_plans_compiled,
        "Whether device (CUDA) plans were compiled into this build.");
  m.def("build_info", [] { return guarded([] { return cgx_torch::build_info(); }); },
        "cgx version, host kernels, MPI library and whether device plans were compiled.");
}
