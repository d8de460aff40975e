#pragma once
/// \file device_plan.cuh
/// `cgx::device_allreduce_plan<T, Q, R, X>`: the compressed allreduce of device buffers.
///
/// ```cpp
/// #include <cgx/cgx.cuh>
/// using Q = cgx::quant::maxmin<4, 1024, cgx::quant::stochastic>;
/// using R = cgx::comm::scatter_reduce_allgather;
/// using X = cgx::comm::mpi;                       // or cgx::comm::cuda_ipc, cgx::comm::nccl
/// cudaSetDevice(local_rank % device_count);        // before the transport is made
/// cgx::device_allreduce_plan<float, Q, R, X> plan{X{MPI_COMM_WORLD}, n};
/// plan(d_grad, n, stream);                         // device buffer, stream-ordered
/// ```
///
/// Semantics of a call `plan(d_buf, n, stream)`:
///  - d_buf is read in `stream` order: work enqueued on `stream` before the call (that
///    produced d_buf) is complete before cgx reads it; nothing else is waited for.
///  - The result is ready in `stream` order: work enqueued on `stream` after the call
///    sees the sum. Do not touch d_buf from other streams until then.
///  - Whether the host blocks depends on the transport: comm::mpi blocks until its
///    messages are complete (it synchronizes on the copies that feed MPI: on each staged
///    chunk, or on the whole stream for a CUDA-aware MPI); comm::cuda_ipc and comm::nccl
///    do not block (cuda_ipc's ranks meet in device waits, comm/cuda_ipc.cuh). The native path below the threshold blocks for MPI
///    (it synchronizes the stream) and not for NCCL.
///  - Collective: every rank calls it with the same n, in the same order as its other
///    plans' calls.
///
/// CUDA graphs. Over a transport that allows it (comm::graph_capture_v: comm::nccl and
/// comm::cuda_ipc), a device_allreduce_plan or layerwise_device_plan call may be made while `stream`
/// captures a graph (cudaStreamBeginCapture, torch.cuda.graph): the argument check, the
/// native-or-compressed choice and the messages are decided at capture, and every launch
/// of the graph runs the call's kernels and the transport's operations (NCCL calls;
/// cuda_ipc's post and wait kernels, whose epochs advance on the device). Launching it N times gives
/// the bits of N eager calls, because the stochastic-rounding call counter is not frozen
/// at capture: the compress kernels add a device word to it when they run, and each
/// launch of a captured call increments that word in a kernel node at the call's end
/// (detail::graph_call_counter). A call captured as call c draws the keys of calls c,
/// c + 1, ... on successive launches, and the eager calls after them continue the
/// sequence; eager calls enqueue nothing more than without graphs. The workspace fence
/// becomes external event nodes, so launches and eager calls on any streams are ordered
/// as eager calls are. Rules: the graph holds the plan's workspace and the buffer by
/// address (keep both alive while the graph may be launched); launches of graphs holding
/// a plan's calls are collective calls of that plan, made in the same order on every
/// rank; calls() counts calls made on the host (a captured call once). Over comm::mpi,
/// comm::mpi_device and staged host transports, whose exchanges need the host, a call on a capturing stream throws cgx::error(errc::invalid_argument)
/// before it enqueues anything (with collective checking on every rank: the others learn
/// that a rank refused), and the buffer is untouched; device_reduce_scatter_plan and
/// device_allgather_plan refuse on every transport.
/// It is a separate class from the host `allreduce_plan` because it needs the CUDA
/// runtime, which the host headers (.hpp) must not.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "allreduce_plan.hpp"
#include "comm/device_ring.cuh"
#include "comm/device_sra.cuh"
#include "comm/device_transport.cuh"
#include "comm/device_tree.cuh"
#include "comm/host_device.cuh"
#if __has_include(<mpi.h>)  // comm::mpi and comm::mpi_device; a build without MPI has cuda_ipc
#include "comm/mpi.hpp"
#include "comm/mpi_device.cuh"
#endif
#include "comm/ring.hpp"
#include "comm/scatter_reduce_allgather.hpp"
#include "comm/runtime.cuh"
#include "comm/tree.hpp"
#include "error.hpp"
#if defined(__CUDACC__)
#include "quant/maxmin.cuh"  // cuda_runtime's kernels (a simulated runtime brings its own)
#endif
#include "quant/rounding.hpp"

namespace cgx {

namespace comm {
/// The device transport that a plan over X uses: X itself when it is one (cuda_ipc,
/// nccl, mpi_device), comm::mpi_device for comm::mpi, and for any other host transport
/// (cgx::transport) basic_host_device over it, staged through pinned host memory.
template <class X>
struct device_transport_of {
  using type = X;  ///< the device transport
};
/// A host transport moves device buffers through basic_host_device (staged).
template <class X>
  requires(transport<X> && !device_transport<X>)
struct device_transport_of<X> {
  using type = basic_host_device<X, cuda_runtime>;  ///< the device transport
};
#if __has_include(<mpi.h>)
/// comm::mpi moves device buffers through comm::mpi_device.
template <>
struct device_transport_of<mpi> {
  using type = mpi_device;  ///< the device transport
};
#endif

/// The device transport that a device plan over X drives (device_transport_of), checked:
/// anything but a device or host transport fails to compile here, with what it lacks.
template <class X>
struct checked_device_transport_of {
  using type = typename device_transport_of<X>::type;  ///< the device transport
  static_assert(device_transport<type>,
                "cgx::device_allreduce_plan, cgx::layerwise_device_plan: X must be a device transport "
                "(cgx::comm::mpi, cgx::comm::cuda_ipc or cgx::comm::nccl) or a host transport: the plan needs "
                "rank(), size(), reserve(), prepare_send(), exchange() and max_all()");
};
/// The checked device transport of X (checked_device_transport_of).
template <class X>
using device_transport_t = typename checked_device_transport_of<X>::type;
}  // namespace comm

namespace detail {
/// The device schedule of reducer R: `type<T, Q, X>`, where one exists.
template <class R>
struct device_schedule {
  static constexpr bool exists = false;
};
template <>
struct device_schedule<comm::scatter_reduce_allgather> {
  static constexpr bool exists = true;
  template <class T, class Q, class X>
  using type = comm::device_sra<T, Q, X>;
};
template <>
struct device_schedule<comm::ring> {
  static constexpr bool exists = true;
  template <class T, class Q, class X>
  using type = comm::device_ring<T, Q, X>;
};
template <>
struct device_schedule<comm::tree> {
  static constexpr bool exists = true;
  template <class T, class Q, class X>
  using type = comm::device_tree<T, Q, X>;
};

/// True for quantizers with kernels in runtime policy RT (CUDA kernels for cuda_runtime).
template <class RT, class Q>
inline constexpr bool has_device_kernels = requires { typename RT::template kernels<Q>::quantizer; };

/// True when p[0..n) cannot be a device buffer of runtime RT: n > 0 and p is neither
/// device nor managed memory (a null p is the caller's other error). A device plan's
/// argument check.
template <class RT>
bool not_device_memory(const void* p, std::size_t n) {
  if (p == nullptr || n == 0) return false;
  cudaPointerAttributes a{};
  const cudaError_t e = RT::pointer_attributes(&a, p);
  if (e != cudaSuccess) {
    (void)RT::get_last_error();
    return true;
  }
  return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

/// A device plan's signature: differs between element types (bf16 and fp16 too),
/// quantizers, schedules (`what`), thresholds, and from every host plan's.
template <class T, class Q>
std::int64_t device_signature(const char* what, std::uint64_t extra) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(sizeof(T));
  mix(std::is_same_v<T, __nv_bfloat16> ? 1 : 0);
  mix(static_cast<std::uint64_t>(Q::bits));
  mix(Q::bucket_size);
  mix(std::is_same_v<typename Q::rounding, quant::stochastic> ? 1 : 0);
  if constexpr (requires { Q::signature_tag; }) mix(static_cast<std::uint64_t>(Q::signature_tag));  // quant::rotated
  for (const char* c = what; *c != 0; ++c) mix(static_cast<unsigned char>(*c));
  mix(extra);
  mix(0x646576u);  // "dev": never equal to a host plan's
  return static_cast<std::int64_t>(h >> 1);
}
}  // namespace detail

namespace detail {
/// Throws what transport x's device work reported to the host (comm::cuda_ipc: a device
/// wait that timed out), before the call makes any CUDA call. The device plans' calls
/// begin with it.
template <class DX>
void raise_device_failure(const DX& x) {
  if constexpr (requires { x.raise_device_failure(); }) x.raise_device_failure();
}

/// Why a device plan's call over device transport DX must be refused when its stream is
/// `capturing` a CUDA graph (nullptr: it need not).
template <class DX>
const char* transport_capture_refusal(bool capturing) {
  if (!capturing || comm::graph_capture_v<DX>) return nullptr;
  return "the stream is capturing a CUDA graph, and this plan's transport cannot run inside one: comm::mpi, "
         "comm::mpi_device and staged host transports move the bytes on the host; call the plan outside the "
         "capture, or use comm::nccl or comm::cuda_ipc";
}

/// The device half of the call counter of a plan whose calls may be captured into CUDA
/// graphs (device_allreduce_plan, layerwise_device_plan; see "CUDA graphs" in the file
/// comment): a 4-byte device word, zero at construction, that every launch of a captured
/// call increments (one kernel node behind the call's work), and that the compress
/// kernels add to their counter when they run (rng_state::device_calls). A call whose
/// host counter is c, made after `captured()` captured calls, gets counter c -
/// captured(): its kernels draw c - captured() + (launches of captured calls run
/// before it). Eager calls alone: c, the host plan's. A call captured as call c and
/// launched three times: c, c + 1, c + 2, as three eager calls; the eager calls after
/// continue from there. Eager calls enqueue nothing more than without graphs.
template <class R>
class graph_call_counter {
 public:
  /// Allocates and zeroes the word on the device current now; blocks until it is zero.
  graph_call_counter() : mem_(sizeof(std::uint32_t)) {
    static constexpr std::uint32_t zero = 0;
    comm::detail::cuda_check<R>(R::memcpy_async(mem_.get(), &zero, sizeof zero, cudaMemcpyHostToDevice, nullptr),
                  "cgx device plan: cudaMemcpyAsync (call counter)");
    comm::detail::cuda_check<R>(R::stream_synchronize(nullptr), "cgx device plan: cudaStreamSynchronize (call counter)");
  }
  /// `rng` (a host plan's state, counter c) for kernels that add the device word.
  [[nodiscard]] quant::rng_state apply(quant::rng_state rng) const noexcept {
    rng.counter -= captured_;
    rng.device_calls = reinterpret_cast<const std::uint32_t*>(mem_.get());
    return rng;
  }
  /// After a captured call's work on `stream` (captured too): the increment, behind that
  /// work in stream order (the call began by ordering itself after the previous calls'
  /// work, whatever their streams), and before the next calls' reads (x's workspace
  /// fence, recorded after it).
  template <class X>
  void advance(X& x, cudaStream_t stream) {
    comm::detail::cuda_check<R>(R::increment_u32(reinterpret_cast<std::uint32_t*>(mem_.get()), stream),
                  "cgx device plan: the call counter's increment (kernel launch)");
    x.fence(stream);
    ++captured_;
  }
  /// Calls captured so far.
  [[nodiscard]] std::uint32_t captured() const noexcept { return captured_; }

 private:
  comm::basic_device_memory<R> mem_;
  std::uint32_t captured_ = 0;
};

/// A plan's graph_call_counter, held in a base class that the plan lists before the base
/// holding its transport: bases are destroyed in reverse order, so the counter's memory
/// is freed after the transport is gone. cudaFree waits for the device's pending work,
/// and after a failure that work may wait for peers until the transport aborts it
/// (ncclCommAbort in comm::nccl's destructor): freed first, it would hang.
template <class R>
struct graph_counter_holder {
  std::optional<graph_call_counter<R>> counter_;  ///< made by the plan's constructor on the transport's device
};
}  // namespace detail

/// What the device plans (device_allreduce_plan, device_reduce_scatter_plan,
/// device_allgather_plan) share (public, so that its members appear on their pages): the
/// transport, the device workspace sized for the largest max_count of any rank, the
/// options, the call counter, the call flag and the argument check.
template <class T, class Q, class X>
class device_plan_core {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, __half> ||
                    std::is_same_v<T, __nv_bfloat16>,
                "cgx::device_allreduce_plan, cgx::device_reduce_scatter_plan, cgx::device_allgather_plan: T must be "
                "float, double, __half or __nv_bfloat16");
  static_assert(detail::has_device_kernels<comm::runtime_of<comm::device_transport_t<X>>, Q>,
                "cgx::device_allreduce_plan, cgx::device_reduce_scatter_plan, cgx::device_allgather_plan: Q must "
                "have CUDA kernels (cgx::quant::maxmin<Bits, Bucket, Rounding> or cgx::quant::none)");

 public:
  /// The transport the plan drives (comm::mpi_device for X = comm::mpi).
  using device_transport_type = comm::device_transport_t<X>;
  using value_type = T;      ///< the element type of the buffers
  using quantizer_type = Q;  ///< the quantizer (codec) on the wire
  using transport_type = X;  ///< the transport as given

  device_plan_core(const device_plan_core&) = delete;
  device_plan_core& operator=(const device_plan_core&) = delete;

  /// The device transport.
  device_transport_type& transport() noexcept { return x_; }
  /// Largest count a call may pass.
  std::size_t max_count() const noexcept { return max_count_; }
  /// Number of calls that ran the schedule (the stochastic-rounding call counter; an
  /// allreduce's native calls are not counted).
  std::uint32_t calls() const noexcept { return calls_; }
  /// The options the plan was made with, as given (`threads` is ignored; only the
  /// allreduce uses native_below_bytes).
  const plan_options& options() const noexcept { return opts_; }

 protected:
  using runtime = comm::runtime_of<device_transport_type>;            ///< the runtime policy (comm/runtime.cuh)
  using kernels = comm::device_kernels<Q, device_transport_type>;  ///< Q's kernels in that runtime

  /// Collective: agrees on the largest max_count and has the transport reserve
  /// `bytes(that count, ranks)` of device workspace on the device current now.
  template <class Bytes>
  device_plan_core(X transport, std::size_t max_count, plan_options opts, Bytes bytes)
      : x_(std::move(transport)), max_count_(max_count), opts_(opts) {
    // The wait limit of the transport's device waits (comm::cuda_ipc), where it has one.
    if constexpr (requires { x_.set_wait_limit(std::chrono::milliseconds(1)); })
      x_.set_wait_limit(std::chrono::milliseconds(opts_.timeout_ms));
    std::array<std::int64_t, 1> most{static_cast<std::int64_t>(max_count)};
    x_.max_all(most);
    sized_count_ = static_cast<std::size_t>(most[0]);
    ws_ = x_.reserve(bytes(sized_count_, x_.size()));
  }

  /// The argument check of a call (check_call): null or host buffers, counts above
  /// max_count, a call that cannot be captured on a capturing stream (`refusal`: why,
  /// or nullptr), and (collective checking) counts and plan types that differ.
  /// `host_plan`: the plan a host buffer needs instead, named in the message.
  void check(const char* who, std::int64_t sig, bool null_buffer, std::size_t n, bool not_device,
             const char* host_plan, const char* refusal = nullptr) {
    detail::check_call(x_, opts_.check, who, null_buffer, n, max_count_, sig, not_device || refusal != nullptr,
                       [host_plan, not_device, refusal] {
                         if (not_device)
                           return std::string("the buffer is not device (or managed) memory; use ") + host_plan +
                                  " for host buffers";
                         return std::string(refusal);
                       });
  }

  /// True when `stream` captures a CUDA graph.
  static bool capturing(cudaStream_t stream) { return comm::stream_capturing<runtime>(stream, "cgx device plan"); }
  /// Why a call must be refused when its stream is `capturing` a CUDA graph, or nullptr
  /// when it is not or the call can be captured (`plan_can`: the plan's own part; the
  /// transport's is comm::graph_capture_v).
  static const char* capture_refusal(bool capturing, bool plan_can) {
    if (capturing && !plan_can)
      return "the stream is capturing a CUDA graph, and this plan cannot be captured (device_reduce_scatter_plan and "
             "device_allgather_plan choose their workspace half on the host, per call); call it outside the capture";
    return detail::transport_capture_refusal<device_transport_type>(capturing);
  }

  /// The random state of the next call (the host plans' next_rng()).
  quant::rng_state next_rng() noexcept {
    quant::rng_state rng;
    rng.seed = opts_.seed;
    rng.counter = calls_++;
    return rng;
  }

  /// The guard of a call: makes the transport's device current, where it has one, and
  /// the caller's again at the end.
  using device_guard = std::optional<comm::detail::basic_device_guard<runtime>>;
  /// Makes the transport's device current for `on`'s lifetime, where it has one.
  void on_device(device_guard& on) {
    if constexpr (requires { x_.device(); }) on.emplace(x_.device());
  }

  device_transport_type x_;        ///< the device transport
  std::size_t max_count_;          ///< largest count a call may pass
  plan_options opts_;              ///< the options as given
  std::size_t sized_count_ = 0;    ///< the largest max_count of any rank: the workspace's size
  std::byte* ws_ = nullptr;        ///< the device workspace (the transport's)
  std::uint32_t calls_ = 0;        ///< the call counter (next_rng())
  std::atomic<bool> busy_{false};  ///< held by a call in progress (detail::call_guard)
};

/// Compressed allreduce (sum, in place) of up to `max_count` values of T in device memory.
///
/// \tparam T  float, double, __half or __nv_bfloat16 (half types travel with fp32 bucket
///            metadata and are summed in fp32, rounded once per addition)
/// \tparam Q  quantizer with CUDA kernels: quant::maxmin<...> or quant::none
/// \tparam R  reducer: comm::scatter_reduce_allgather (comm/device_sra.cuh), comm::ring
///            (comm/device_ring.cuh) or comm::tree (comm/device_tree.cuh); hierarchical has
///            no device schedule yet
/// \tparam X  transport: comm::mpi (staged through pinned host memory, or direct with a
///            CUDA-aware MPI), comm::mpi_device, comm::cuda_ipc, comm::nccl, or any other
///            host transport (staged, through comm::basic_host_device)
///
/// Below `native_below_bytes()` a call uses the transport's own uncompressed allreduce
/// when it has one for T (MPI_Allreduce for float/double, ncclAllReduce); cuda_ipc has
/// none and always runs the schedule. For plan_options::native_below_bytes =
/// auto_threshold (and static_threshold) the plan picks default_native_below_bytes (64 KiB) on every device
/// transport: none has single_node(), and the one-node pick of host plans (16 MiB) was
/// measured for host buffers only. (A device plan does not time its calls: they are
/// stream-ordered, and the host plans' measured choice, detail::path_choice, would need
/// events.) `plan_options::threads` is ignored.
template <class T, class Q, class R, class X>
class device_allreduce_plan
    : private detail::graph_counter_holder<comm::runtime_of<comm::device_transport_t<X>>>,  // after the core's transport
      public device_plan_core<T, Q, X> {
  using core = device_plan_core<T, Q, X>;
  static_assert(detail::device_schedule<R>::exists,
                "cgx::device_allreduce_plan: R must be a reducer with a device schedule: "
                "cgx::comm::scatter_reduce_allgather, cgx::comm::ring or cgx::comm::tree (hierarchical has none yet)");

 public:
  using device_transport_type = typename core::device_transport_type;  ///< comm::mpi_device for X = comm::mpi
  using reducer_type = R;  ///< the reducer (schedule)

 private:
  using schedule_type = typename detail::device_schedule<R>::template type<T, Q, device_transport_type>;

 public:
  /// Bytes of device workspace a plan for `max_count` values on `ranks` ranks needs (the
  /// transport allocates it).
  static std::size_t workspace_bytes(std::size_t max_count, int ranks) {
    return schedule_type::workspace_bytes(max_count, ranks);
  }

  /// Collective. Takes the transport (converting comm::mpi into comm::mpi_device) and
  /// has it allocate the device workspace, sized for the largest `max_count` passed by
  /// any rank, on the CUDA device current now.
  device_allreduce_plan(X transport, std::size_t max_count, plan_options opts = {})
      : core(std::move(transport), max_count, opts, &workspace_bytes) {
    typename core::device_guard on;
    this->on_device(on);
    this->counter_.emplace();
  }

  /// Sums d_buf[0..n) over all ranks, in place, in `stream` order (see the file comment
  /// for what blocks). Collective: every rank calls it with the same n. Throws
  /// cgx::error before moving data for a null d_buf with n > 0, a pointer that is not
  /// device memory, n > max_count(), or (collective checking) counts or plan types that
  /// differ between ranks; errc::cuda / errc::transport when CUDA, MPI or NCCL fail;
  /// errc::invalid_argument at once, before any communication, when another thread is
  /// in a call of this plan. While `stream` captures a CUDA graph the call is captured
  /// (see "CUDA graphs" in the file comment) over a transport that can be
  /// (comm::graph_capture_v: comm::nccl, comm::cuda_ipc), and refused with errc::invalid_argument, before
  /// anything is enqueued, over the others.
  void operator()(T* d_buf, std::size_t n, cudaStream_t stream = nullptr) {
    const detail::call_guard claimed(this->busy_, "device_allreduce_plan");
    detail::raise_device_failure(this->x_);
    // The schedule's kernels go to the transport's device, whatever device is current
    // (one thread may drive plans on several GPUs); the caller's is restored after.
    typename core::device_guard on;
    this->on_device(on);
    const bool capturing = core::capturing(stream);
    const char* refusal = core::capture_refusal(capturing, true);
    this->check("device_allreduce_plan", sig_, d_buf == nullptr, n,
                detail::not_device_memory<typename core::runtime>(d_buf, n), "allreduce_plan", refusal);
    auto& x = this->x_;
    if constexpr (requires { x.native_allreduce(d_buf, n, stream); }) {
      if (n * sizeof(T) < native_below_) {
        x.native_allreduce(d_buf, n, stream);
        return;
      }
    }
    sched_.run(d_buf, n, this->sized_count_, x, this->ws_, this->counter_->apply(this->next_rng()), stream);
    if (capturing) this->counter_->advance(x, stream);
  }

  /// Calls captured into CUDA graphs so far (each launch of such a graph advances the
  /// random keys by one call: see "CUDA graphs" in the file comment).
  std::uint32_t captured_calls() const noexcept { return this->counter_->captured(); }

  /// The native-allreduce threshold in use: plan_options::native_below_bytes, or for
  /// auto_threshold the plan's pick at construction (see the class comment).
  std::size_t native_below_bytes() const noexcept { return native_below_; }

 private:
  std::size_t native_below_ = detail::resolve_native_below(this->x_, this->opts_.native_below_bytes);
  std::int64_t sig_ = detail::device_signature<T, Q>(R::name, native_below_);  // differs with T, Q, R, threshold
  schedule_type sched_;
};

}  // namespace cgx
