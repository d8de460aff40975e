// Compile-fail cases: built once per case with -DCGX_CF_<CASE>; each invalid policy
// must stop the compiler with cgx's own static_assert message (see CMakeLists.txt for
// the message each case expects). CGX_CF_VALID is the positive control: valid policies,
// including the boundary values, must compile with the same command line.
#include <cgx/cgx.hpp>

#include <cstddef>

namespace q = cgx::quant;
using sra = cgx::comm::scatter_reduce_allgather;
using Q = q::maxmin<4, 1024, q::nearest>;

/// Not a rounding policy: only nearest and stochastic are.
struct my_rounding {};

// sizeof instantiates the class, which runs its static_asserts, and nothing else.
#if defined(CGX_CF_VALID)
static_assert(sizeof(q::maxmin<1, 8>) > 0);
static_assert(sizeof(q::maxmin<3, 1000>) > 0);  // 1000 = 125 * 8
static_assert(sizeof(q::maxmin<8, std::size_t{1} << 20, q::stochastic>) > 0);
static_assert(sizeof(cgx::allreduce_plan<float, Q, sra, cgx::comm::mpi>) > 0);
static_assert(sizeof(cgx::allreduce_plan<double, q::maxmin<2, 512>, sra, cgx::comm::mpi>) > 0);
static_assert(sizeof(cgx::allreduce_plan<float, q::none, sra, cgx::comm::mpi>) > 0);
static_assert(sizeof(cgx::error_bounded_plan<float, q::error_bounded<>, sra, cgx::comm::mpi>) > 0);
static_assert(sizeof(cgx::error_bounded_plan<double, q::error_bounded<64>, cgx::comm::ring, cgx::comm::shm>) > 0);
static_assert(sizeof(cgx::reduce_scatter_plan<float, Q, cgx::comm::shm>) > 0);
static_assert(sizeof(cgx::allgather_plan<double, q::none, cgx::comm::mpi>) > 0);
static_assert(sizeof(cgx::broadcast_plan<float, Q, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_EB_PLAN_TREE)
static_assert(sizeof(cgx::error_bounded_plan<float, q::error_bounded<>, cgx::comm::tree, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_EB_PLAN_MAXMIN)
static_assert(sizeof(cgx::error_bounded_plan<float, Q, sra, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_ALLGATHER_EB)
static_assert(sizeof(cgx::allgather_plan<float, q::error_bounded<>, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_MAXMIN_BITS_0)
static_assert(sizeof(q::maxmin<0, 1024>) > 0);
#elif defined(CGX_CF_MAXMIN_BITS_9)
static_assert(sizeof(q::maxmin<9, 1024>) > 0);
#elif defined(CGX_CF_MAXMIN_BUCKET_0)
static_assert(sizeof(q::maxmin<4, 0>) > 0);
#elif defined(CGX_CF_MAXMIN_BUCKET_1020)
static_assert(sizeof(q::maxmin<4, 1020>) > 0);  // 1020 = 127 * 8 + 4
#elif defined(CGX_CF_MAXMIN_BUCKET_TOO_LARGE)
static_assert(sizeof(q::maxmin<4, (std::size_t{1} << 20) + 8>) > 0);
#elif defined(CGX_CF_MAXMIN_ROUNDING)
static_assert(sizeof(q::maxmin<4, 1024, my_rounding>) > 0);
#elif defined(CGX_CF_PLAN_VALUE_INT)
static_assert(sizeof(cgx::allreduce_plan<int, Q, sra, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_PLAN_VALUE_LONG_DOUBLE)
static_assert(sizeof(cgx::allreduce_plan<long double, Q, sra, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_PLAN_QUANTIZER_INT)
static_assert(sizeof(cgx::allreduce_plan<float, int, sra, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_PLAN_REDUCER_INT)
static_assert(sizeof(cgx::allreduce_plan<float, Q, int, cgx::comm::mpi>) > 0);
#elif defined(CGX_CF_PLAN_TRANSPORT_INT)
static_assert(sizeof(cgx::allreduce_plan<float, Q, sra, int>) > 0);
#else
#error "define one CGX_CF_<CASE>"
#endif
