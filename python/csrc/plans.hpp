#pragma once
// The interface between the two halves of the extension: plans.cpp, pg_plans.cpp (and
// device_plans.cu where CUDA is compiled) include cgx (and MPI, where the build has it)
// but no torch header; bindings.cpp includes torch but no cgx header. Only plain types cross it, so each half compiles with its
// own flags (torch 1.13's headers are C++14 code; cgx needs C++20).

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cgx_torch {

/// Element types the plans reduce.
enum class dtype { f32, f64 };

/// One layer of a fused buffer (cgx::layer).
struct layer_desc {
  std::size_t offset = 0;
  std::size_t count = 0;
  bool one_dimensional = false;
};

/// Everything a plan is built from; the same on every rank (the Python side checks it).
struct plan_config {
  int bits = 4;                       // 1..8, 0 = uncompressed
  std::size_t bucket = 1024;          // 128, 512 or 1024
  std::size_t min_compressed = 1024;  // layers with fewer values go uncompressed
  bool stochastic = true;             // rounding: stochastic (CGX's) or nearest
  bool error_feedback = false;        // host plans only
  double ef_decay = 1.0;              // error feedback: residual carried times this, in [0, 1]
  bool ef_sum = true;                 // error feedback: also of the owned chunk's sum (layerwise_options::error_feedback_sum)
  bool check_each_call = false;       // cgx's collective checking on every call
  std::uint64_t seed = 0x63677821u;
  int threads = 1;                    // host threads for (de)compression
  // adaptive bit widths (cgx::adaptive_bits); off when adaptive_interval == 0
  int adaptive_interval = 0;          // re-assign every this many calls
  int min_bits = 2;
  int max_bits = 8;
  double target_bits = 4.0;
  int clusters = 3;
  double decay = 0.9;
  double top_fraction = 0.01;
};

/// What a plan carries from call to call, for a checkpoint (CGXState's state_dict and
/// pickling): restored into a new plan of the same layout and settings, the next call
/// reduces with the bits the uninterrupted plan's next call would have.
struct plan_snapshot {
  std::uint32_t calls = 0;                               ///< the key of the next call's random bits
  std::vector<std::pair<int, std::size_t>> settings;     ///< (bits, bucket) per layer
  bool observed = false;                                 ///< adaptive: statistics taken yet
  std::vector<double> sensitivity;                       ///< adaptive: per layer; empty when not adaptive
  std::vector<unsigned char> residual;                   ///< error feedback: this rank's residuals' bytes
};

/// A layer-wise plan over one communicator, type-erased over the element type and the
/// rounding. run() sums in place over the ranks (collective).
class plan {
 public:
  virtual ~plan() = default;
  /// Sums data[0..n) over the ranks, in place. `stream` is a cudaStream_t for device
  /// plans and ignored by host plans. Throws cgx::error (a std::runtime_error).
  virtual void run(void* data, std::size_t n, void* stream) = 0;
  /// Reduce-scatter in place (layerwise_plan::reduce_scatter): leaves this rank's chunk
  /// of the sum in data, half of run()'s bytes. Host plans; device plans throw.
  virtual void reduce_scatter(void* data, std::size_t n) = 0;
  /// The current (bits, bucket) of every layer, in the order given.
  virtual std::vector<std::pair<int, std::size_t>> settings() const = 0;
  virtual double average_bits() const = 0;
  virtual std::size_t bytes_sent() const = 0;
  virtual std::size_t size() const = 0;
  virtual std::uint32_t calls() const = 0;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual bool on_device() const = 0;
  /// This rank's state for a checkpoint (local).
  virtual plan_snapshot snapshot() const = 0;
  /// Takes over a snapshot of a plan of the same layout, settings and element type
  /// (local: every rank restores its own before the next call). Throws cgx::error
  /// (invalid_argument) for one that does not fit, before changing anything.
  virtual void restore(const plan_snapshot& s) = 0;
};

/// What a channel's wait found (channel::wait).
struct wait_result {
  enum kind_t { ok, timeout, peer_failed, broken } kind = ok;
  int peer = -1;     ///< timeout: a rank waited for; peer_failed: the rank whose failure was heard
  std::string what;  ///< empty when ok
};

/// Byte messages between the ranks of a torch.distributed process group: implemented by
/// the torch half (bindings.cpp) over c10d's ProcessGroup (send, recv, allreduce) and the
/// group's Store (failure reports), used by the cgx half as a cgx transport (pg_transport.hpp).
/// Messages between a pair of ranks with the same tag arrive in the order they were sent.
class channel {
 public:
  using handle = std::size_t;
  virtual ~channel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Posts a send of p[0..bytes) to `peer` (p must stay valid until waited for).
  virtual handle isend(const void* p, std::size_t bytes, int peer, int tag) = 0;
  /// Posts a receive of exactly `bytes` bytes from `peer` into p.
  virtual handle irecv(void* p, std::size_t bytes, int peer, int tag) = 0;
  /// Waits for h[0..n) (every one of them is waited for and released, even after a
  /// failure), at most `limit_ms` milliseconds in all (<= 0: the group's timeout). Stops
  /// early, with peer_failed, when a peer's failure report arrives.
  virtual wait_result wait(const handle* h, std::size_t n, std::int64_t limit_ms) = 0;
  /// Element-wise maximum of v[0..n) over the ranks (collective). Throws std::runtime_error.
  virtual void max_all(std::int64_t* v, std::size_t n) = 0;
  /// Tells every peer that this rank failed: `origin` (the first failing rank), its code
  /// (cgx::errc as an int), the rank it waited for (-1: none) and why. Never throws.
  virtual void report(int origin, int code, int waited_for, const std::string& why) noexcept = 0;
  /// A peer's report heard so far, as {origin, code, waited_for, why}; origin < 0: none.
  struct heard_report {
    int origin = -1, code = 0, waited_for = -1;
    std::string why;
  };
  virtual heard_report heard() = 0;
  /// The group's timeout in milliseconds (the wait limit when a plan sets none).
  virtual std::int64_t timeout_ms() const = 0;
};

/// A key-value store the ranks share: implemented by the torch half (bindings.cpp) over
/// the group's c10d::Store, used by the cgx half as a cgx::comm::kv_store (the set-up of
/// the device transports with no MPI: comm::store_bootstrap). Throws std::runtime_error.
class kv {
 public:
  virtual ~kv() = default;
  virtual void set(const std::string& key, const std::vector<std::uint8_t>& value) = 0;
  /// True and the value in `out` when `key` is set; false (at once) when not.
  virtual bool try_get(const std::string& key, std::vector<std::uint8_t>& out) = 0;
  /// Atomically adds `delta` to the counter under `key` (0 when unset); the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
};

/// cgx::comm::store_bootstrap over a kv, type-erased (every call collective over the
/// group; each bounded by the limit it was made with; throws cgx::error).
class bootstrap {
 public:
  virtual ~bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Rank r's m bytes land at all[r * m, (r + 1) * m) on every rank.
  virtual void allgather(const void* mine, std::size_t m, void* all) = 0;
  virtual void barrier() = 0;
  virtual bool same_node() = 0;
};

/// Collective: a store_bootstrap of rank `rank` of `size` over `store`, its keys under
/// `prefix`, every step bounded by `timeout_ms` (0: none).
std::unique_ptr<bootstrap> make_store_bootstrap(std::shared_ptr<kv> store, int rank, int size,
                                                const std::string& prefix, std::int64_t timeout_ms);

/// A host plan (cgx::layerwise_plan) over a torch.distributed process group (through
/// `ch`). Collective over the group.
std::unique_ptr<plan> make_pg_host_plan(std::shared_ptr<channel> ch, dtype t, std::size_t n,
                                        std::vector<layer_desc> layers, const plan_config& c);

/// Whether this build has the MPI half (comm::mpi plans over mpi4py communicators).
bool mpi_compiled();

/// A host plan (cgx::layerwise_plan) over the communicator with Fortran handle `comm_f`
/// (mpi4py's comm.py2f()). Collective over that communicator.
std::unique_ptr<plan> make_host_plan(int comm_f, dtype t, std::size_t n, std::vector<layer_desc> layers,
                                     const plan_config& c);

/// Whether device plans were compiled into this extension (the CUDA toolkit was found
/// when it was built).
bool device_plans_compiled();

/// A device plan (cgx::layerwise_device_plan): defined in device_plans.cu where CUDA is
/// compiled; otherwise throws. Collective.
std::unique_ptr<plan> make_device_plan(int comm_f, dtype t, std::size_t n, std::vector<layer_desc> layers,
                                       const plan_config& c);

/// The device transports a device plan over a torch.distributed group's Store may use.
enum class device_transport { cuda_ipc, nccl };

/// What device transports this build has, for build_info ("" without CUDA).
std::string device_transports_compiled();

/// A device plan (cgx::layerwise_device_plan) over the ranks of a torch.distributed group,
/// its transport (comm::cuda_ipc: one node) set up through the group's Store (a
/// comm::store_bootstrap of rank `rank` of `size`, keys under `prefix`, unique per plan
/// and the same on every rank). Every wait bounded by `timeout_ms`. Collective; throws
/// cgx::error (errc::communicator when cuda_ipc's ranks are not on one node,
/// errc::invalid_argument for a transport this build lacks, errc::timeout for a missing rank).
std::unique_ptr<plan> make_store_device_plan(std::shared_ptr<kv> store, const std::string& prefix, int rank, int size,
                                             std::int64_t timeout_ms, device_transport x, dtype t, std::size_t n,
                                             std::vector<layer_desc> layers, const plan_config& c);

/// The size of the communicator with Fortran handle `comm_f`; throws when MPI is not
/// initialized or the handle is not a usable intra-communicator.
int comm_size(int comm_f);
/// The rank of this process in that communicator.
int comm_rank(int comm_f);

/// What a collective check found: `same` when every rank passed the same hash, `bad`
/// when some rank flagged its own arguments as invalid.
struct check_result {
  bool same = true;
  bool bad = false;
};
/// Collective over `comm_f`: one MPI_Allreduce (MAX) of {hash, -hash, bad}.
check_result collective_check(int comm_f, std::int64_t hash, bool bad);

/// The library's version and build facts, for diagnostics.
std::string build_info();

}  // namespace cgx_torch
