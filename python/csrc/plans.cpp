// The cgx half of the extension: layer-wise host plans over an MPI communicator handed
// over from mpi4py as a Fortran handle, and the build's facts. In a build without MPI
// (CGX_TORCH_WITH_MPI undefined: no mpi4py at build time) the MPI entry points throw and
// the plans run over torch.distributed process groups only (pg_plans.cpp). No torch
// header here (see plans.hpp).
#include "plans.hpp"

#include "host_plan.inl"

#include <array>
#include <optional>
#include <string>
#include <utility>

namespace cgx_torch {

#ifdef CGX_TORCH_WITH_MPI
bool mpi_compiled() { return true; }

namespace {

MPI_Comm to_comm(int comm_f) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized)
    throw cgx::error(cgx::errc::communicator,
                     "MPI is not initialized (import mpi4py.MPI first) or already finalized");
  MPI_Comm c = MPI_Comm_f2c(static_cast<MPI_Fint>(comm_f));
  if (c == MPI_COMM_NULL) throw cgx::error(cgx::errc::communicator, "the communicator is MPI_COMM_NULL");
  return c;
}

}  // namespace

namespace {
template <class T>
std::unique_ptr<plan> make_host_t(MPI_Comm comm, std::size_t n, std::vector<cgx::layer> layers, const plan_config& c) {
  if (c.stochastic) return detail::make_host<T, cgx::quant::stochastic>(comm, n, std::move(layers), c);
  return detail::make_host<T, cgx::quant::nearest>(comm, n, std::move(layers), c);
}

}  // namespace

std::unique_ptr<plan> make_host_plan(int comm_f, dtype t, std::size_t n, std::vector<layer_desc> layers,
                                     const plan_config& c) {
  MPI_Comm comm = to_comm(comm_f);
  if (t == dtype::f32) return make_host_t<float>(comm, n, detail::to_layers(layers), c);
  return make_host_t<double>(comm, n, detail::to_layers(layers), c);
}

int comm_size(int comm_f) {
  int s = 0;
  cgx::comm::detail::check_mpi(MPI_Comm_size(to_comm(comm_f), &s), "MPI_Comm_size");
  return s;
}

int comm_rank(int comm_f) {
  int r = 0;
  cgx::comm::detail::check_mpi(MPI_Comm_rank(to_comm(comm_f), &r), "MPI_Comm_rank");
  return r;
}

check_result collective_check(int comm_f, std::int64_t hash, bool bad) {
  std::array<std::int64_t, 3> v{hash, -hash, bad ? 1 : 0};
  cgx::comm::detail::check_mpi(
      MPI_Allreduce(MPI_IN_PLACE, v.data(), 3, MPI_INT64_T, MPI_MAX, to_comm(comm_f)), "MPI_Allreduce");
  return check_result{v[0] == -v[1], v[2] != 0};
}

std::string mpi_library() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string l(lib, static_cast<std::size_t>(len));
  if (auto nl = l.find('\n'); nl != std::string::npos) l.resize(nl);
  if (auto comma = l.find(','); comma != std::string::npos) l.resize(comma);
  return l;
}
#else
bool mpi_compiled() { return false; }

namespace {
[[noreturn]] void no_mpi() {
  throw cgx::error(cgx::errc::communicator,
                   "this cgx_torch was built without MPI (mpi4py was not importable at build time): pass a "
                   "torch.distributed process group (the default: the job's own group), or install mpi4py and "
                   "rebuild cgx_torch for mpi4py communicators");
}
}  // namespace

std::unique_ptr<plan> make_host_plan(int, dtype, std::size_t, std::vector<layer_desc>, const plan_config&) { no_mpi(); }
int comm_size(int) { no_mpi(); }
int comm_rank(int) { no_mpi(); }
check_result collective_check(int, std::int64_t, bool) { no_mpi(); }
std::string mpi_library() { return "none (built without MPI)"; }
#endif

std::string build_info() {
  return "cgx " + std::to_string(CGX_VERSION_MAJOR) + "." + std::to_string(CGX_VERSION_MINOR) +
         "; host plans: float32, float64; host kernels: " +
         std::string(cgx::quant::to_string(cgx::quant::active_host_isa())) + "; MPI: " + mpi_library() +
         "; torch.distributed process groups: yes; device plans: " +
         (device_plans_compiled() ? "compiled (transports: " + device_transports_compiled() + ")" : "not compiled");
}

}  // namespace cgx_torch
