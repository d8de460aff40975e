// The torch half of the extension (module cgx_torch._C): checks tensors and hands their
// memory to the plans of plans.cpp / device_plans.cu, with the GIL released while a
// plan runs. No cgx header here (see plans.hpp).
#include <torch/extension.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if TORCH_VERSION_MAJOR >= 2  // c10d::Backend (the gloo backend inside cgx_torch's `cgx` backend)
#define CGX_TORCH_HAS_BACKEND 1
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#ifdef CGX_TORCH_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "plans.hpp"
// the measured choice of the compressed path or the exact one (std headers only)
#include "cgx/detail/path_choice.hpp"

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

/// plans.hpp's channel over a torch.distributed process group: sends and receives are
/// the group's send/recv of byte tensors over the caller's memory (gloo for CPU tensors),
/// max_all its allreduce (MAX). Failure reports go through a key of the group's Store: a
/// failing rank sets it; while a wait lasts longer than poll_ms, a watcher thread looks
/// at the key every poll_ms and, when it is set, aborts the pending sends and receives
/// (c10d's Work::abort), so that the waiting rank stops and throws instead of waiting out
/// the group's timeout.
/// PG: c10d::ProcessGroup (a group of torch.distributed) or, on torch 2.x, c10d::Backend
/// (the gloo backend inside cgx_torch's own `cgx` backend).
template <class PG>
class pg_channel final : public cgx_torch::channel {
 public:
  static constexpr std::int64_t poll_ms = 20;

  pg_channel(c10::intrusive_ptr<PG> pg, c10::intrusive_ptr<c10d::Store> store, std::int64_t timeout_ms,
             std::string key)
      : pg_(std::move(pg)), store_(std::move(store)), key_(std::move(key)), timeout_ms_(timeout_ms) {
    if (!pg_) throw py::value_error("cgx_torch: no process group");
    rank_ = pg_->getRank();
    size_ = pg_->getSize();
    if (store_) watcher_ = std::thread([this] { watch(); });
  }
  ~pg_channel() override {
    {
      std::lock_guard<std::mutex> g(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watcher_.joinable()) watcher_.join();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::int64_t timeout_ms() const override { return timeout_ms_; }

  // A send or receive the group refuses (its link to the peer is closed) throws; the
  // failure key is read first, so that a peer's report is heard before the broken link.
  handle isend(const void* p, std::size_t bytes, int peer, int tag) override {
    std::vector<at::Tensor> v{bytes_of(const_cast<void*>(p), bytes)};
    try {
      return keep(pg_->send(v, peer, tag), peer);
    } catch (...) {
      poll();
      throw;
    }
  }
  handle irecv(void* p, std::size_t bytes, int peer, int tag) override {
    std::vector<at::Tensor> v{bytes_of(p, bytes)};
    try {
      return keep(pg_->recv(v, peer, tag), peer);
    } catch (...) {
      poll();
      throw;
    }
  }

  cgx_torch::wait_result wait(const handle* h, std::size_t n, std::int64_t limit_ms) override {
    using clock = std::chrono::steady_clock;
    const auto limit = std::chrono::milliseconds(limit_ms > 0 ? limit_ms : timeout_ms_);
    const auto until = clock::now() + limit;
    {
      std::lock_guard<std::mutex> g(m_);
      ++waiting_;
      wait_since_ = clock::now();
    }
    cv_.notify_all();
    cgx_torch::wait_result r;
    for (std::size_t i = 0; i < n; ++i) {
      entry e = take(h[i]);
      if (!e.work) continue;
      if (r.kind == cgx_torch::wait_result::ok && heard_flag_.load(std::memory_order_acquire))
        r = {cgx_torch::wait_result::peer_failed, e.peer, ""};
      if (r.kind != cgx_torch::wait_result::ok) {  // failed already: the rest is aborted, not waited for
        abort_quietly(e.work);
        done(h[i]);
        continue;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock::now());
      try {
        if (left.count() <= 0) {
          r = {cgx_torch::wait_result::timeout, e.peer, ""};
          abort_quietly(e.work);
        } else if (!e.work->wait(left)) {  // aborted by the watcher: a peer's report
          r = {cgx_torch::wait_result::peer_failed, e.peer, ""};
        }
      } catch (const std::exception& x) {
        const std::string what = x.what();
        const bool timed_out = what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
        r = {timed_out ? cgx_torch::wait_result::timeout : cgx_torch::wait_result::broken, e.peer, first_line(what)};
        if (r.kind == cgx_torch::wait_result::broken) {  // after a peer's failure? its report says more
          poll();
          if (heard_flag_.load(std::memory_order_acquire)) r.kind = cgx_torch::wait_result::peer_failed;
        }
      }
      done(h[i]);
    }
    {
      std::lock_guard<std::mutex> g(m_);
      --waiting_;
    }
    return r;
  }

  void max_all(std::int64_t* v, std::size_t n) override {
    std::vector<at::Tensor> t{at::from_blob(v, {static_cast<std::int64_t>(n)}, at::TensorOptions().dtype(at::kLong))};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    auto w = pg_->allreduce(t, o);
    w->wait(std::chrono::milliseconds(timeout_ms_));
  }

  void report(int origin, int code, int waited_for, const std::string& why) noexcept override {
    try {
      if (!store_) return;
      std::ostringstream os;
      os << origin << ' ' << code << ' ' << waited_for << ' ' << why;
      const std::string s = os.str();
      std::lock_guard<std::mutex> g(store_m_);
      if (!store_->check({key_})) store_->set(key_, std::vector<std::uint8_t>(s.begin(), s.end()));
    } catch (...) {  // the peers are left with their wait limit
    }
    abort_all();
  }

  heard_report heard() override {
    if (!heard_flag_.load(std::memory_order_acquire)) return {};
    std::lock_guard<std::mutex> g(m_);
    return heard_;
  }

  /// Reads the failure key once (collective checks call it between plans). Throws nothing.
  void look() noexcept { poll(); }

 private:
  struct entry {
    c10::intrusive_ptr<c10d::Work> work;
    int peer = -1;
  };

  static at::Tensor bytes_of(void* p, std::size_t bytes) {
    return at::from_blob(p, {static_cast<std::int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte));
  }
  static std::string first_line(const std::string& s) {
    const auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }
  static void abort_quietly(const c10::intrusive_ptr<c10d::Work>& w) noexcept {
    try {
      w->abort();
    } catch (...) {
    }
  }

  handle keep(c10::intrusive_ptr<c10d::Work> w, int peer) {
    std::lock_guard<std::mutex> g(m_);
    const handle id = next_++;
    works_.emplace(id, entry{std::move(w), peer});
    return id;
  }
  entry take(handle id) {
    std::lock_guard<std::mutex> g(m_);
    auto it = works_.find(id);
    if (it == works_.end()) return {};
    entry e = it->second;
    works_.erase(it);
    active_.emplace(id, e);  // the watcher's abort reaches it while it is waited for
    return e;
  }
  void done(handle id) {
    std::lock_guard<std::mutex> g(m_);
    active_.erase(id);
  }

  void abort_all() noexcept {
    std::vector<c10::intrusive_ptr<c10d::Work>> ws;
    {
      std::lock_guard<std::mutex> g(m_);
      for (auto& [id, e] : works_) ws.push_back(e.work);
      for (auto& [id, e] : active_) ws.push_back(e.work);
      active_.clear();
    }
    for (auto& w : ws) abort_quietly(w);
  }

  /// One look at the failure key; on a report: remember it and abort everything pending.
  void poll() noexcept {
    if (!store_ || heard_flag_.load(std::memory_order_acquire)) return;
    try {
      std::string s;
      {
        std::lock_guard<std::mutex> g(store_m_);
        if (!store_->check({key_})) return;
        const auto v = store_->get(key_);
        s.assign(v.begin(), v.end());
      }
      heard_report h;
      std::istringstream is(s);
      is >> h.origin >> h.code >> h.waited_for;
      std::getline(is >> std::ws, h.why);
      {
        std::lock_guard<std::mutex> g(m_);
        heard_ = h;
      }
      heard_flag_.store(true, std::memory_order_release);
      abort_all();
    } catch (...) {  // the store is gone (the job is ending): nothing to hear
    }
  }

  void watch() {
    std::unique_lock<std::mutex> g(m_);
    while (!stop_) {
      if (waiting_ == 0) {
        cv_.wait(g, [&] { return stop_ || waiting_ > 0; });
        continue;
      }
      cv_.wait_for(g, std::chrono::milliseconds(poll_ms), [&] { return stop_; });
      if (stop_ || waiting_ == 0) continue;
      if (std::chrono::steady_clock::now() - wait_since_ < std::chrono::milliseconds(poll_ms)) continue;
      g.unlock();
      poll();
      g.lock();
    }
  }

  c10::intrusive_ptr<PG> pg_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string key_;
  std::int64_t timeout_ms_;
  int rank_ = 0, size_ = 1;
  std::mutex m_;        // works_, active_, waiting_, heard_
  std::mutex store_m_;  // this channel's use of the store
  std::condition_variable cv_;
  std::unordered_map<handle, entry> works_;   // posted, not yet waited for
  std::unordered_map<handle, entry> active_;  // being waited for
  handle next_ = 1;
  int waiting_ = 0;
  bool stop_ = false;
  std::chrono::steady_clock::time_point wait_since_{};
  std::atomic<bool> heard_flag_{false};
  heard_report heard_;
  std::thread watcher_;
};

/// What Python holds as a cgx_torch._C.Channel: the channel of one group (or backend).
struct py_channel {
  std::shared_ptr<cgx_torch::channel> ch;
  std::function<void()> look;  // one read of the failure key

  template <class PG>
  static std::shared_ptr<py_channel> over(c10::intrusive_ptr<PG> pg, c10::intrusive_ptr<c10d::Store> store,
                                          std::int64_t timeout_ms, std::string key) {
    auto c = std::make_shared<pg_channel<PG>>(std::move(pg), std::move(store), timeout_ms, std::move(key));
    auto h = std::make_shared<py_channel>();
    h->look = [raw = c.get()] { raw->look(); };
    h->ch = std::move(c);
    return h;
  }
};

/// plans.hpp's kv over a c10d::Store (the group's: TCPStore under torchrun, FileStore,
/// HashStore, PrefixStore). try_get asks check() first, so it never blocks on a missing key.
class store_kv final : public cgx_torch::kv {
 public:
  explicit store_kv(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {
    if (!s_) throw py::value_error("cgx_torch: the store is None");
  }
  void set(const std::string& key, const std::vector<std::uint8_t>& value) override { s_->set(key, value); }
  bool try_get(const std::string& key, std::vector<std::uint8_t>& out) override {
    if (!s_->check({key})) return false;
    out = s_->get(key);
    return true;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return s_->add(key, delta); }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

/// A layer-wise plan for one fused buffer: one dtype, one device, one size.
class py_plan {
 public:
  using layer_list = std::vector<std::tuple<std::size_t, std::size_t, bool>>;

  /// Over an mpi4py communicator (its Fortran handle).
  py_plan(int comm_f, const std::string& dtype, const std::string& device, int device_index, std::size_t n,
          const layer_list& layers, const cgx_torch::plan_config& cfg)
      : py_plan(dtype, device, device_index) {
    build(comm_f, nullptr, n, layers, cfg);
  }
  /// Over a torch.distributed group's Store: a device plan (CUDA tensors) whose transport
  /// (`transport`: "cuda_ipc"; "nccl" where compiled) sets up through the Store, keys
  /// under `prefix` (unique per plan, the same on every rank).
  py_plan(c10::intrusive_ptr<c10d::Store> store, const std::string& prefix, int rank, int size,
          std::int64_t timeout_ms, const std::string& transport, const std::string& dtype,
          const std::string& device, int device_index, std::size_t n, const layer_list& layers,
          const cgx_torch::plan_config& cfg)
      : py_plan(dtype, device, device_index) {
    if (!cuda_) throw py::value_error("cgx_torch: a plan over the group's Store reduces CUDA tensors");
    cgx_torch::device_transport x{};
    if (transport == "cuda_ipc")
      x = cgx_torch::device_transport::cuda_ipc;
    else if (transport == "nccl")
      x = cgx_torch::device_transport::nccl;
    else
      throw py::value_error("cgx_torch: device transport '" + transport + "' is not one of cuda_ipc, nccl");
    auto k = std::make_shared<store_kv>(std::move(store));
    std::vector<cgx_torch::layer_desc> ls = descs(layers);
    py::gil_scoped_release nogil;
    guarded([&] {
#ifdef CGX_TORCH_WITH_CUDA
      c10::cuda::CUDAGuard g(static_cast<c10::DeviceIndex>(device_index_));
#endif
      p_ = cgx_torch::make_store_device_plan(std::move(k), prefix, rank, size, timeout_ms, x, dtype_, n, std::move(ls),
                                             cfg);
    });
  }
  /// Over a torch.distributed process group (its channel); CPU tensors.
  py_plan(std::shared_ptr<py_channel> ch, const std::string& dtype, const std::string& device, int device_index,
          std::size_t n, const layer_list& layers, const cgx_torch::plan_config& cfg)
      : py_plan(dtype, device, device_index) {
    if (!ch) throw py::value_error("cgx_torch: no channel");
    if (cuda_)
      throw py::value_error("cgx_torch: a plan over a torch.distributed process group reduces CPU tensors "
                            "(cgx_torch stages CUDA tensors through the host there)");
    build(0, ch->ch, n, layers, cfg);
  }

 private:
  py_plan(const std::string& dtype, const std::string& device, int device_index)
      : dtype_(parse_dtype(dtype)), dtype_name_(dtype), cuda_(device == "cuda"), device_index_(device_index) {
    if (device != "cpu" && device != "cuda")
      throw py::value_error("cgx_torch: device '" + device + "' is not supported (cpu or cuda)");
  }

  static std::vector<cgx_torch::layer_desc> descs(const layer_list& layers) {
    std::vector<cgx_torch::layer_desc> ls;
    ls.reserve(layers.size());
    for (const auto& [o, c, one_d] : layers) ls.push_back({o, c, one_d});
    return ls;
  }

  void build(int comm_f, std::shared_ptr<cgx_torch::channel> ch, std::size_t n, const layer_list& layers,
             const cgx_torch::plan_config& cfg) {
    std::vector<cgx_torch::layer_desc> ls = descs(layers);
    py::gil_scoped_release nogil;
    guarded([&] {
      if (ch) {
        p_ = cgx_torch::make_pg_host_plan(std::move(ch), dtype_, n, std::move(ls), cfg);
        return;
      }
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

 public:

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

  /// Reduce-scatter of t over the ranks, in place (collective; CPU tensors): this rank's
  /// chunk of the sum is left in t.
  void reduce_scatter(at::Tensor t) {
    check(t);
    if (cuda_) throw py::value_error("cgx_torch: reduce_scatter takes CPU tensors (device plans do not have it)");
    void* data = t.data_ptr();
    const std::size_t n = static_cast<std::size_t>(t.numel());
    py::gil_scoped_release nogil;
    guarded([&] { p_->reduce_scatter(data, n); });
  }

  py::list settings() const {
    py::list out;
    for (const auto& [b, k] : p_->settings()) out.append(py::make_tuple(b, k));
    return out;
  }
  /// This rank's state for a checkpoint, as a dict (plans.hpp: plan_snapshot).
  py::dict snapshot() const {
    const cgx_torch::plan_snapshot s = guarded([&] { return p_->snapshot(); });
    py::list st;
    for (const auto& [b, k] : s.settings) st.append(py::make_tuple(b, k));
    py::dict d;
    d["calls"] = s.calls;
    d["settings"] = st;
    d["observed"] = s.observed;
    d["sensitivity"] = s.sensitivity;
    d["residual"] = py::bytes(reinterpret_cast<const char*>(s.residual.data()), s.residual.size());
    return d;
  }
  /// Takes over a snapshot() dict of a plan of the same layout and settings.
  void restore(const py::dict& d) {
    cgx_torch::plan_snapshot s;
    try {
      s.calls = d["calls"].cast<std::uint32_t>();
      for (const auto& x : d["settings"].cast<py::list>()) {
        const auto t = x.cast<py::tuple>();
        s.settings.emplace_back(t[0].cast<int>(), t[1].cast<std::size_t>());
      }
      s.observed = d["observed"].cast<bool>();
      s.sensitivity = d["sensitivity"].cast<std::vector<double>>();
      const std::string r = d["residual"].cast<std::string>();
      s.residual.assign(r.begin(), r.end());
    } catch (const std::exception&) {  // a missing key (error_already_set) or a wrong type (cast_error)
      throw py::value_error("cgx_torch: not a plan snapshot (a dict of calls, settings, observed, sensitivity, residual)");
    }
    guarded([&] { p_->restore(s); });
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

/// cgx_torch._C.StoreBootstrap: the set-up of the device transports over the job's Store
/// (comm::store_bootstrap), exposed for tests and diagnostics.
struct py_store_bootstrap {
  std::unique_ptr<cgx_torch::bootstrap> b;
  static std::unique_ptr<py_store_bootstrap> make(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                  const std::string& prefix, std::int64_t timeout_ms) {
    auto k = std::make_shared<store_kv>(std::move(store));
    auto out = std::make_unique<py_store_bootstrap>();
    py::gil_scoped_release nogil;
    out->b = guarded([&] { return cgx_torch::make_store_bootstrap(k, rank, size, prefix, timeout_ms); });
    return out;
  }
  py::list allgather(const py::bytes& mine) {
    const std::string m = mine;
    std::string all(m.size() * static_cast<std::size_t>(b->size()), '\0');
    {
      py::gil_scoped_release nogil;
      guarded([&] { b->allgather(m.data(), m.size(), all.data()); });
    }
    py::list out;
    for (int r = 0; r < b->size(); ++r) out.append(py::bytes(all.data() + static_cast<std::size_t>(r) * m.size(), m.size()));
    return out;
  }
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
      .def_readwrite("ef_decay", &cgx_torch::plan_config::ef_decay,
                     "Error feedback: the factor the residual is carried into the next call with, in [0, 1].")
      .def_readwrite("ef_sum", &cgx_torch::plan_config::ef_sum,
                     "Error feedback: also feed back the owned chunk's sum quantization error (False: contributions only).")
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

  py::class_<py_channel, std::shared_ptr<py_channel>> chan(
      m, "Channel",
      "cgx's messages over a torch.distributed process group (its send/recv and allreduce), failure reports "
      "through the group's Store. One per group; every plan over the group shares it.");
  chan.def(py::init(&py_channel::over<c10d::ProcessGroup>), py::arg("group"), py::arg("store"),
           py::arg("timeout_ms"), py::arg("key"),
           "group: the ProcessGroup; store: its Store (None: no failure reports, peers wait out the timeout); "
           "timeout_ms: the wait limit (the group's timeout); key: the Store key of failure reports (the same on "
           "every rank).");
#ifdef CGX_TORCH_HAS_BACKEND
  chan.def(py::init(&py_channel::over<c10d::Backend>), py::arg("group"), py::arg("store"), py::arg("timeout_ms"),
           py::arg("key"), "The same over a c10d Backend (the gloo backend of cgx_torch's `cgx` backend).");
#endif
  chan.def_property_readonly("rank", [](const py_channel& c) { return c.ch->rank(); })
      .def_property_readonly("size", [](const py_channel& c) { return c.ch->size(); })
      .def(
          "check",
          [](py_channel& c, std::int64_t hash, bool bad) {
            py::gil_scoped_release nogil;
            c.look();
            const auto h = c.ch->heard();
            if (h.origin >= 0)
              throw cgx_failure("cgx: rank " + std::to_string(h.origin) + " of this process group failed earlier (" +
                                h.why + ")");
            std::int64_t v[3] = {hash, -hash, bad ? 1 : 0};
            guarded([&] { c.ch->max_all(v, 3); });
            return std::make_tuple(v[0] == -v[1], v[2] != 0);
          },
          py::arg("hash"), py::arg("bad"),
          "Collective: (every rank passed the same hash, some rank passed bad=True); raises CGXError when a rank "
          "of the group reported a failure.");

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
      .def(py::init<std::shared_ptr<py_channel>, const std::string&, const std::string&, int, std::size_t,
                    const std::vector<std::tuple<std::size_t, std::size_t, bool>>&, const cgx_torch::plan_config&>(),
           py::arg("channel"), py::arg("dtype"), py::arg("device"), py::arg("device_index"), py::arg("n"),
           py::arg("layers"), py::arg("config"),
           "Collective over the process group of channel (a Channel); CPU tensors.")
      .def(py::init<c10::intrusive_ptr<c10d::Store>, const std::string&, int, int, std::int64_t, const std::string&,
                    const std::string&, const std::string&, int, std::size_t,
                    const std::vector<std::tuple<std::size_t, std::size_t, bool>>&, const cgx_torch::plan_config&>(),
           py::arg("store"), py::arg("prefix"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"),
           py::arg("transport"), py::arg("dtype"), py::arg("device"), py::arg("device_index"), py::arg("n"),
           py::arg("layers"), py::arg("config"),
           "Collective over the ranks of a torch.distributed group through its Store: a device plan (CUDA "
           "tensors) over transport 'cuda_ipc' (the ranks of one node), set up with keys under prefix (unique per "
           "plan, the same on every rank); every wait bounded by timeout_ms. CGXError where this build has no "
           "device plans or the transport, or the ranks are not on one node.")
      .def("check", &py_plan::check, py::arg("tensor"),
           "Raises TypeError/ValueError unless the tensor fits the plan (dtype, device, contiguous, size).")
      .def("run", &py_plan::run, py::arg("tensor"),
           "Sums the tensor over the ranks, in place; collective. Checks it first (TypeError/ValueError); "
           "CGXError when cgx fails.")
      .def("reduce_scatter", &py_plan::reduce_scatter, py::arg("tensor"),
           "Reduce-scatter in place, collective, half of run()'s bytes: this rank's chunk of the sum (with one "
           "layer per rank of equal size, layer rank) is left in the tensor, the rest unspecified. CPU tensors.")
      .def("settings", &py_plan::settings, "The current (bits, bucket) of every layer (bits 0: uncompressed).")
      .def("snapshot", &py_plan::snapshot,
           "This rank's state for a checkpoint: a dict of calls (the key of the next call's random bits), settings, "
           "observed and sensitivity (adaptive statistics) and residual (error feedback's, bytes).")
      .def("restore", &py_plan::restore, py::arg("snapshot"),
           "Takes over a snapshot() of a plan of the same layout and settings (local; every rank its own): the next "
           "run() reduces with the bits that plan's next run() would have. ValueError for a dict that is not a "
           "snapshot, CGXError for one that does not fit (nothing changed).")
      .def_property_readonly("average_bits", &py_plan::average_bits,
                             "Average bits per value (uncompressed values count 32 or 64), metadata excluded.")
      .def_property_readonly("bytes_sent", &py_plan::bytes_sent, "Bytes this rank sends per call.")
      .def_property_readonly("size", &py_plan::size, "Values in the fused buffer.")
      .def_property_readonly("calls", &py_plan::calls, "Calls made so far.")
      .def_property_readonly("rank", &py_plan::rank, "This rank in the plan's communicator.")
      .def_property_readonly("world", &py_plan::world, "Ranks in the plan's communicator.")
      .def_property_readonly("on_device", &py_plan::on_device, "Whether this is a device (CUDA) plan.")
      .def_property_readonly("dtype", &py_plan::dtype, "'float32' or 'float64'.");

  // cgx::detail::path_choice itself (one algorithm for the C++ plans and cgx_torch's
  // backend and hook): its schedule, its records and its agreement points.
  using cgx::detail::path_choice;
  py::class_<path_choice>(m, "PathChoice",
                          "cgx's measured choice between the compressed path and the exact (native) one, per size "
                          "class of call (bytes rounded down to a power of two; calls under measured_floor_bytes "
                          "always exact): cgx::detail::path_choice (docs/threshold.md). Every rank must make the same "
                          "calls in the same order.")
      .def(py::init<>())
      .def_readonly_static("measured_floor_bytes", &path_choice::measured_floor_bytes)
      .def_readonly_static("probe_calls", &path_choice::probe_calls)
      .def_readonly_static("first_interval", &path_choice::first_interval)
      .def_readonly_static("max_interval", &path_choice::max_interval)
      .def("compress_next", &path_choice::compress_next, py::arg("bytes"),
           "True if the next call of `bytes` bytes takes the compressed path (changes nothing).")
      .def("times_next", &path_choice::times_next, py::arg("bytes"),
           "True if record() will use the time of the next call of `bytes` bytes (the others are only counted).")
      .def(
          "record",
          [](path_choice& c, std::size_t bytes, bool compressed, std::int64_t ns, const py::object& agree) {
            c.record(bytes, compressed, ns, [&agree](std::span<std::int64_t> v) {
              py::list in;
              for (auto x : v) in.append(x);
              const auto out = agree(in).cast<std::vector<std::int64_t>>();
              if (out.size() != v.size()) throw py::value_error("PathChoice: agree must return as many values");
              std::copy(out.begin(), out.end(), v.begin());
            });
          },
          py::arg("bytes"), py::arg("compressed"), py::arg("ns"), py::arg("agree"),
          "Records a call of `bytes` that took `compressed` and lasted `ns` nanoseconds on this rank. At a decision "
          "point calls agree([native_ns, compressed_ns]), which must return the elementwise maximum over the ranks "
          "(a collective): collective at decision points only.")
      .def(
          "pick_for",
          [](const path_choice& c, std::size_t bytes) {
            const cgx::path_pick p = c.pick_for(bytes);
            py::dict d;
            d["measured"] = p.measured;
            d["inferred"] = p.inferred;
            d["compressed"] = p.compressed;
            d["native_s"] = p.native_s;
            d["compressed_s"] = p.compressed_s;
            d["calls"] = p.calls;
            d["decisions"] = p.decisions;
            d["flips"] = p.flips;
            return d;
          },
          py::arg("bytes"),
          "What is known of the size class of `bytes`: a dict of measured (False while probing), inferred (the "
          "pick was carried over from a measured neighbouring class, not yet re-checked), compressed (the pick), native_s and compressed_s (the agreed, slowest rank's, times at the last decision), calls, "
          "decisions and flips.")
      .def_static("size_class", &path_choice::size_class, py::arg("bytes"),
                  "The size class of a call of `bytes` bytes: floor(log2(bytes)).");

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
  m.def("mpi_compiled", &cgx_torch::mpi_compiled,
        "Whether this build has plans over mpi4py communicators (mpi4py was importable when it was built).");
  m.def("device_plans_compiled", &cgx_torch::device_plans_compiled,
        "Whether device (CUDA) plans were compiled into this build.");
  py::class_<py_store_bootstrap>(
      m, "StoreBootstrap",
      "cgx::comm::store_bootstrap over a torch.distributed Store: what sets up the device transports (the NCCL "
      "id, CUDA IPC handles) with no MPI. Every call is collective and bounded by timeout_ms (0: none); a step "
      "ends the same way on every rank, CGXError (naming the missing ranks) when some rank did not come.")
      .def(py::init(&py_store_bootstrap::make), py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("prefix"),
           py::arg("timeout_ms"),
           "Collective (a first barrier). store: the group's Store; prefix: its keys (unique per bootstrap).")
      .def_property_readonly("rank", [](const py_store_bootstrap& x) { return x.b->rank(); })
      .def_property_readonly("size", [](const py_store_bootstrap& x) { return x.b->size(); })
      .def("allgather", &py_store_bootstrap::allgather, py::arg("mine"),
           "Every rank's bytes (one length on every rank), in rank order.")
      .def("barrier", [](py_store_bootstrap& x) {
            py::gil_scoped_release nogil;
            guarded([&] { x.b->barrier(); });
          })
      .def("same_node", [](py_store_bootstrap& x) {
            py::gil_scoped_release nogil;
            return guarded([&] { return x.b->same_node(); });
          }, "True on every rank when all ranks run on one node (host name and boot).");

  m.def("device_transports", [] { return cgx_torch::device_transports_compiled(); },
        "The device transports compiled into this build, e.g. 'cuda_ipc (Store), mpi (mpi4py)' ('' without CUDA).");
  m.def("build_info", [] { return guarded([] { return cgx_torch::build_info(); }); },
        "cgx version, host kernels, MPI library and whether device plans were compiled.");
}
