#pragma once
// The interface between the two halves of the extension: plans.cpp (and device_plans.cu
// where CUDA is compiled) include cgx and MPI but no torch header; bindings.cpp includes
// torch but no cgx header. Only plain types cross it, so each half compiles with its
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

/// A layer-wise plan over one communicator, type-erased over the element type and the
/// rounding. run() sums in place over the ranks (collective).
class plan {
 public:
  virtual ~plan() = default;
  /// Sums data[0..n) over the ranks, in place. `stream` is a cudaStream_t for device
  /// plans and ignored by host plans. Throws cgx::error (a std::runtime_error).
  virtual void run(void* data, std::size_t n, void* stream) = 0;
  /// The current (bits, bucket) of every layer, in the order given.
  virtual std::vector<std::pair<int, std::size_t>> settings() const = 0;
  virtual double average_bits() const = 0;
  virtual std::size_t bytes_sent() const = 0;
  virtual std::size_t size() const = 0;
  virtual std::uint32_t calls() const = 0;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual bool on_device() const = 0;
};

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
