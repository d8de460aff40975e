// The nvcc half of tests/mixed_tu (see host_isa_mixed.cpp).
#include <cgx/cgx.cuh>

#include "host_isa_mixed.hpp"

CGX_MIXED_HALF(cu)
