#pragma once
/// \file config.hpp
/// Version and portability macros. Every `CGX_` macro of the library lives here.

#define CGX_VERSION_MAJOR 0  ///< major version: changes break the API
#define CGX_VERSION_MINOR 1  ///< minor version: additions
#define CGX_VERSION_PATCH 0  ///< patch version: fixes

/// \cond CGX_INTERNAL
// The portability macros below are the library's own plumbing, not API.

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

/// The phases of the CUDA kernels' bodies (quant/kernel_bodies.hpp): inlined by force on
/// the device, as the kernels always were; left to the compiler's judgement on the host,
/// where only tests run them (forced there, their many instantiations compiled slowly).
#if defined(__CUDA_ARCH__)
#define CGX_BODY_INLINE __forceinline__
#else
#define CGX_BODY_INLINE inline
#endif

/// An inline function (or template) that the compiler must call rather than inline.
#if defined(__CUDA_ARCH__)
#define CGX_NOINLINE __noinline__ inline
#elif defined(__GNUC__) || defined(__clang__)
#define CGX_NOINLINE __attribute__((noinline)) inline
#else
#define CGX_NOINLINE inline
#endif

#if defined(__GNUC__) || defined(__clang__) || defined(__CUDACC__)
#define CGX_RESTRICT __restrict__
#else
#define CGX_RESTRICT
#endif

/// `CGX_PRAGMA(text)`: `#pragma text` from inside a macro.
#define CGX_PRAGMA(x) _Pragma(#x)

/// Unrolls the following loop fully (the trip counts it is used on are compile-time constants).
/// nvcc's device pass takes `unroll`. Its host pass gets nothing: nvcc's front end parses
/// the host code too and warns about every GCC or Clang loop pragma ("unrecognized GCC
/// pragma"). So the host kernels of a .cu file are compiled unhinted: the same code as
/// a .cpp file's (see CGX_HAS_HOST_SIMD), less unrolled where GCC would have been told to.
#if defined(__CUDA_ARCH__)
#define CGX_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define CGX_UNROLL
#elif defined(__clang__)
#define CGX_UNROLL _Pragma("clang loop unroll(full)")
#elif defined(__GNUC__)
#define CGX_UNROLL _Pragma("GCC unroll 16")
#else
#define CGX_UNROLL
#endif

/// Unrolls the following device loop fully when its trip count N (a constant expression,
/// e.g. from a template argument) is at most 8, and 4 iterations at a time above: for the
/// per-thread loops of the CUDA kernels, whose trip count grows with the bucket size
/// (maxmin<4, 1 << 20>: 512 positions per thread). Fully unrolled there, one compress
/// instantiation took minutes to compile into a cubin of about a megabyte; the common
/// buckets (up to 16384 values: at most 8 positions per thread) keep the full unroll and
/// the code they had. nvcc's device pass only (see CGX_UNROLL for the host passes).
#if defined(__CUDA_ARCH__)
#define CGX_UNROLL_BOUNDED(N) CGX_PRAGMA(unroll((N) <= 8 ? (N) : 4))
#else
#define CGX_UNROLL_BOUNDED(N)
#endif

/// Asks the host compiler to vectorize the following loop (ignored where unsupported).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDA_ARCH__)
#define CGX_VECTORIZE _Pragma("GCC ivdep")
#elif defined(__clang__) && !defined(__CUDA_ARCH__)
#define CGX_VECTORIZE _Pragma("clang loop vectorize(enable)")
#else
#define CGX_VECTORIZE
#endif

/// Host SIMD kernels (quant/host_simd.hpp): compiled with GCC or Clang, and by nvcc's
/// host pass (its host compiler is GCC or Clang), unless CGX_NO_HOST_SIMD is defined
/// (then in every translation unit of the program). The same in .cu and .cpp files: the
/// host functions and templates a program's .cu and .cpp files both instantiate must be
/// the same code (the one-definition rule), or the linker keeps one of them for both.
/// When .cu files got the scalar reference alone, a program with both (every CUDA
/// training code; cgx_torch's CUDA build) could run its host kernels scalar everywhere,
/// whichever definitions the linker kept. CGX_HOST_SIMD_X86 / CGX_HOST_SIMD_NEON say
/// which family of kernels is compiled; quant/host_isa.hpp picks one at run time.
///
/// Never in nvcc's device pass (__CUDA_ARCH__): device code calls no host kernel, and
/// under --expt-relaxed-constexpr the kernels' lambdas would become __host__ __device__
/// and reach the device code generator with GCC vector builtins it cannot lower (an
/// internal compiler error in cicc, seen building cgx_torch's CUDA extension). The
/// device pass emits no host function, so the host pass's definitions are the only ones.
#if (defined(__GNUC__) || defined(__clang__)) && !defined(CGX_NO_HOST_SIMD) && !defined(__CUDA_ARCH__) && \
    (defined(__x86_64__) || defined(__aarch64__))
#define CGX_HAS_HOST_SIMD 1
#if defined(__x86_64__)
#define CGX_HOST_SIMD_X86 1
#else
#define CGX_HOST_SIMD_NEON 1
#endif
#else
#define CGX_HAS_HOST_SIMD 0
#endif

/// CGX_TARGET_BEGIN("avx2,fma") ... CGX_TARGET_END: every function defined in between
/// (templates and lambdas included) is compiled for that instruction set, whatever the
/// translation unit's flags (GCC's target pragma, Clang's attribute pragma). Used by
/// quant/host_simd.hpp to compile its kernels once per instruction set.
#if defined(__clang__)
#define CGX_TARGET_BEGIN(T) CGX_PRAGMA(clang attribute push(__attribute__((target(T))), apply_to = function))
#define CGX_TARGET_END CGX_PRAGMA(clang attribute pop)
#elif defined(__GNUC__)
#define CGX_TARGET_BEGIN(T) CGX_PRAGMA(GCC push_options) CGX_PRAGMA(GCC target(T))
#define CGX_TARGET_END CGX_PRAGMA(GCC pop_options)
#else
#define CGX_TARGET_BEGIN(T)
#define CGX_TARGET_END
#endif
/// \endcond
