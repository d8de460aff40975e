#pragma once
/// \file config.hpp
/// Version and portability macros. Every `CGX_` macro of the library lives here.

#define CGX_VERSION_MAJOR 0
#define CGX_VERSION_MINOR 1
#define CGX_VERSION_PATCH 0

#if defined(__CUDACC__)
/// Marks a function usable from host and device code (both when compiled by nvcc).
#define CGX_HOST_DEVICE __host__ __device__
#define CGX_DEVICE __device__
#else
#define CGX_HOST_DEVICE
#define CGX_DEVICE
#endif

#if defined(__CUDA_ARCH__)
#define CGX_FORCEINLINE __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define CGX_FORCEINLINE inline __attribute__((always_inline))
#else
#define CGX_FORCEINLINE inline
#endif

#if defined(__GNUC__) || defined(__clang__) || defined(__CUDACC__)
#define CGX_RESTRICT __restrict__
#else
#define CGX_RESTRICT
#endif

/// Unrolls the following loop fully (the trip counts it is used on are compile-time constants).
/// nvcc's device pass takes `unroll`; its host pass hands the code to the host compiler.
#if defined(__CUDA_ARCH__)
#define CGX_UNROLL _Pragma("unroll")
#elif defined(__clang__)
#define CGX_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define CGX_UNROLL _Pragma("GCC unroll 16")
#else
#define CGX_UNROLL
#endif

/// Asks the host compiler to vectorize the following loop (ignored where unsupported).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#define CGX_VECTORIZE _Pragma("GCC ivdep")
#elif defined(__clang__) && !defined(__CUDA_ARCH__)
#define CGX_VECTORIZE _Pragma("clang loop vectorize(enable)")
#else
#define CGX_VECTORIZE
#endif
