#pragma once
/// \file cgx.hpp
/// The host umbrella header of cgx: everything that compiles with a plain C++20
/// compiler and MPI. CUDA code includes <cgx/cgx.cuh> instead. The cost model
/// (<cgx/model.hpp>), a tool of the benchmarks and tests, is not part of it: include it
/// by name.

#include "config.hpp"
#include "error.hpp"
#include "concepts.hpp"
#include "dispatch.hpp"
#include "quant/rounding.hpp"
#include "quant/philox.hpp"
#include "quant/wire_format.hpp"
#include "quant/host_exec.hpp"
#include "quant/none.hpp"
#include "quant/maxmin.hpp"
#include "quant/rotated.hpp"
#include "quant/error_bounded.hpp"
#include "comm/mpi.hpp"
#include "comm/shm.hpp"
#include "comm/chunking.hpp"
#include "comm/scatter_reduce_allgather.hpp"
#include "comm/ring.hpp"
#include "comm/tree.hpp"
#include "comm/uncompressed.hpp"
#include "comm/hierarchical.hpp"
#include "comm/varsize.hpp"
#include "comm/error_bounded_schedules.hpp"
#include "plan_common.hpp"
#include "allreduce_plan.hpp"
#include "reduce_scatter_plan.hpp"
#include "allgather_plan.hpp"
#include "broadcast_plan.hpp"
#include "error_bounded_plan.hpp"
#include "layerwise.hpp"
#include "error_feedback.hpp"
#include "layerwise_plan.hpp"
#include "adaptive.hpp"
