#ifndef CGX_C_H
#define CGX_C_H
/** \file c.h
 * The C API of cgx (C99; also usable from C++): a compressed allreduce and an
 * error-bounded allreduce over an MPI communicator, for codes that cannot instantiate
 * C++ templates. It is a compiled library, `cgx_c` (CMake target `cgx::c`,
 * `find_package(cgx COMPONENTS c)`), built from the C++ headers; the Fortran module
 * `cgx` (`use cgx`) is written over it.
 *
 * Conventions:
 * - Every function returns a cgx_errc: CGX_OK (0) on success, else the category of
 *   the failure; cgx_last_error() then gives its message (per thread, beginning
 *   "cgx: " once). The exceptions: the four queries (cgx_last_error,
 *   cgx_errc_name, cgx_version, cgx_bucket_supported) return their value, and the three
 *   init functions return nothing (see below).
 * - No C++ exception ever crosses this interface, by construction: every function is
 *   defined noexcept (and declared so to C++ callers) and runs its body inside one
 *   catch-all that turns cgx::error into its code, std::bad_alloc into
 *   CGX_ERR_NO_MEMORY and anything else into CGX_ERR_INTERNAL, with the message kept
 *   for cgx_last_error(). tests/c_api/test_c_boundary calls every function of this
 *   header with a malformed CGX_TIMEOUT_MS in the environment.
 * - The init functions cannot return a code, so what they find wrong reaches the next
 *   create: they never read the environment into the struct (timeout_ms stays
 *   CGX_DEFAULT_TIMEOUT, resolved by the create), so a malformed CGX_TIMEOUT_MS makes
 *   the create return CGX_ERR_INVALID_ARGUMENT naming the variable and its value, on
 *   every rank (the create's agreement tells ranks whose environment was valid), before
 *   any plan is built; the init also leaves that message in cgx_last_error() at once. An
 *   init that failed for any other reason sets options.timeout_ms to CGX_INIT_FAILED,
 *   which every create refuses the same way. A configuration filled by hand, without an
 *   init, is checked by the create just the same.
 * - Handles: cgx_allreduce_free(&plan) and cgx_error_bounded_free(&plan) free a plan
 *   and set the handle to NULL, as MPI_Comm_free(&comm) sets MPI_COMM_NULL, so a later
 *   call with it returns CGX_ERR_INVALID_ARGUMENT ("the plan is NULL") and a second
 *   free does nothing. The older cgx_allreduce_destroy(plan) and
 *   cgx_error_bounded_destroy(plan) (by value) stay for source compatibility; they
 *   cannot reset the caller's copy, which must not be used again. Every function that
 *   takes a plan returns CGX_ERR_INVALID_ARGUMENT for a NULL plan (destroy and free:
 *   CGX_OK, nothing to do); none of them crashes on one.
 * - An allreduce that refuses to run (a bad argument, a count above the plan's
 *   capacity, a datatype other than the plan's, a mismatch found before data moves)
 *   leaves the caller's buffer untouched. After a failure *inside* a call (a peer
 *   failed, a timeout, a mismatch found in-band) the buffer may hold partial results
 *   and the plan refuses every later call: free it and create a new one. Under local
 *   checking (CGX_CHECK_LOCAL, and CGX_CHECK_AUTOMATIC in a release build) a refusal by
 *   the plan itself (a NULL buffer, a count above capacity) is told to the peers at once
 *   (they return CGX_ERR_PEER_FAILED naming the rank; a peer's buffer may hold partial
 *   results, as after any failure inside a call) and fails the plan on every rank; the
 *   refusing rank's buffer is untouched. Under collective checking every rank refuses
 *   together, every buffer untouched, and the plan goes on working. The C layer's own refusals (the datatype, a
 *   NULL plan) are local to the rank and leave the plan working.
 * - "Collective" functions must be called by every rank of the plan's communicator, in
 *   the same order, with the same arguments (count, bound, configuration).
 * - A plan duplicates the communicator it is given; free every plan before
 *   MPI_Finalize.
 *
 * The compiled set (the C++ templates instantiated in the library):
 * - bits 1..8 (cgx::quant::maxmin), value types float and double, rounding stochastic
 *   or nearest, schedules SRA (scatter-reduce-allgather) and ring;
 * - bucket sizes (values per max-min bucket): **128 and 1024 only**
 *   (CGX_BUCKET_SMALL, CGX_BUCKET_DEFAULT). Any other bucket is refused by
 *   cgx_allreduce_create with CGX_ERR_INVALID_ARGUMENT; cgx_bucket_supported() asks;
 * - the error-bounded allreduce: cgx::quant::error_bounded<1024> with SRA or ring.
 */

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

/* Exported from the shared library, which hides every other symbol. */
#if defined(CGX_C_BUILDING) && defined(__GNUC__)
#define CGX_C_API __attribute__((visibility("default")))
#else
#define CGX_C_API
#endif

/* Every function is noexcept to C++ callers (the library's definitions must match). */
#ifdef __cplusplus
#define CGX_C_NOEXCEPT noexcept
#else
#define CGX_C_NOEXCEPT
#endif

/** The revision of this interface: 2 added cgx_allreduce_free, cgx_error_bounded_free,
 * CGX_INIT_FAILED and the noexcept declarations (undefined before); 3 the measured
 * choice's cgx_path, cgx_allreduce_path, cgx_error_bounded_path, CGX_STATIC_THRESHOLD
 * and CGX_ALWAYS_NATIVE (CGX_AUTO_THRESHOLD now measures). */
#define CGX_C_API_VERSION 3

#ifdef __cplusplus
extern "C" {
#endif

/** What went wrong. CGX_ERR_INVALID_ARGUMENT .. CGX_ERR_TIMEOUT mirror cgx::errc (in
 * its order, plus one); the last two have no C++ counterpart. */
typedef enum cgx_errc {
  CGX_OK = 0,                   /**< success */
  CGX_ERR_INVALID_ARGUMENT = 1, /**< a null pointer or buffer, a count above capacity, a bad configuration (bits, bucket, ...), the wrong datatype */
  CGX_ERR_MISMATCH = 2,         /**< ranks disagree on a collective's arguments (count, bound, plan) */
  CGX_ERR_WORKSPACE = 3,        /**< the plan's workspace cannot be allocated */
  CGX_ERR_COMMUNICATOR = 4,     /**< a null or unusable communicator (MPI_COMM_NULL, an inter-communicator, MPI not initialized) */
  CGX_ERR_TRANSPORT = 5,        /**< MPI reported a failure */
  CGX_ERR_CUDA = 6,             /**< a CUDA runtime call failed (not raised by this host-only API) */
  CGX_ERR_CORRUPT = 7,          /**< a received message is malformed or fails its integrity check */
  CGX_ERR_PEER_FAILED = 8,      /**< another rank failed inside this call (it told this rank so) */
  CGX_ERR_TIMEOUT = 9,          /**< a wait exceeded the plan's timeout_ms */
  CGX_ERR_NO_MEMORY = 10,       /**< an allocation other than the workspace failed (std::bad_alloc) */
  CGX_ERR_INTERNAL = 11         /**< any other failure inside the library (a bug: please report it) */
} cgx_errc;

/** The value type of a plan's buffers. */
typedef enum cgx_datatype { CGX_FLOAT = 0, CGX_DOUBLE = 1 } cgx_datatype;
/** Rounding of cgx::quant::maxmin: stochastic (unbiased; CGX's) or to nearest. */
typedef enum cgx_rounding { CGX_STOCHASTIC = 0, CGX_NEAREST = 1 } cgx_rounding;
/** The schedule: scatter-reduce-allgather (CGX's) or ring. */
typedef enum cgx_schedule { CGX_SRA = 0, CGX_RING = 1 } cgx_schedule;
/** How much a call checks before data moves (cgx::checking). AUTOMATIC: collective
 * in a library built without NDEBUG, local in a release build (the default build). */
typedef enum cgx_checking { CGX_CHECK_AUTOMATIC = 0, CGX_CHECK_LOCAL = 1, CGX_CHECK_COLLECTIVE = 2 } cgx_checking;

/** The bucket of CGX's default configuration. */
#define CGX_BUCKET_DEFAULT ((size_t)1024)
/** The other compiled bucket (finer scales, more metadata). */
#define CGX_BUCKET_SMALL ((size_t)128)
/** native_below_bytes: choose per size class of call between the compressed schedule and
 * MPI_Allreduce by timing both on the plan's own calls, agreed across ranks and re-checked
 * now and then (cgx::auto_threshold; the default; see cgx_allreduce_path). */
#define CGX_AUTO_THRESHOLD ((size_t)-1)
/** native_below_bytes: a fixed threshold picked at create from where the ranks are (16 MiB
 * on one node, 64 KiB across nodes; error-bounded: every call on one node)
 * (cgx::static_threshold). */
#define CGX_STATIC_THRESHOLD ((size_t)-3)
/** native_below_bytes: every call through MPI_Allreduce, exact (cgx::always_native). */
#define CGX_ALWAYS_NATIVE ((size_t)-4)
/** timeout_ms: the library's default wait limit (10 minutes, or CGX_TIMEOUT_MS, read by
 * the create; a malformed value makes it return CGX_ERR_INVALID_ARGUMENT). */
#define CGX_DEFAULT_TIMEOUT ((int64_t)-1)
/** timeout_ms as an init function leaves it when it failed (it cannot return a code):
 * every create refuses the configuration with CGX_ERR_INVALID_ARGUMENT. */
#define CGX_INIT_FAILED INT64_MIN

/** The options every plan takes (cgx::plan_options). Fill with cgx_options_init. */
typedef struct cgx_options {
  cgx_checking check;        /**< argument checking; CGX_CHECK_AUTOMATIC */
  uint64_t seed;             /**< seed of stochastic rounding (ranks may differ) */
  int threads;               /**< host threads for (de)compression, per rank; 1 */
  size_t native_below_bytes; /**< calls of fewer bytes go through MPI_Allreduce, exact; CGX_AUTO_THRESHOLD (default): measured per size class; CGX_STATIC_THRESHOLD: 16 MiB on one node, 64 KiB across nodes (error-bounded: every call on one node); CGX_ALWAYS_NATIVE; 0: always compress */
  int64_t timeout_ms;        /**< the longest one wait may last, ms; 0: no limit; CGX_DEFAULT_TIMEOUT (CGX_INIT_FAILED: see the init functions) */
  int verify;                /**< nonzero: checksum every message (CRC-32C); every rank the same; 0 */
} cgx_options;

/** The configuration of a compressed (max-min) allreduce. Fill with cgx_allreduce_config_init. */
typedef struct cgx_allreduce_config {
  cgx_datatype type;     /**< CGX_FLOAT (default) or CGX_DOUBLE */
  int bits;              /**< 1..8; 4 */
  size_t bucket;         /**< CGX_BUCKET_DEFAULT (1024) or CGX_BUCKET_SMALL (128) */
  cgx_rounding rounding; /**< CGX_STOCHASTIC (default) or CGX_NEAREST */
  cgx_schedule schedule; /**< CGX_SRA (default) or CGX_RING */
  size_t max_count;      /**< the largest count a call may pass (sizes the workspace); 0 */
  cgx_options options;   /**< as cgx_options_init */
} cgx_allreduce_config;

/** The configuration of an error-bounded allreduce. Fill with cgx_error_bounded_config_init. */
typedef struct cgx_error_bounded_config {
  cgx_datatype type;     /**< CGX_DOUBLE (default) or CGX_FLOAT */
  cgx_schedule schedule; /**< CGX_SRA (default) or CGX_RING */
  size_t max_count;      /**< the largest count a call may pass; 0 */
  cgx_options options;   /**< as cgx_options_init */
} cgx_error_bounded_config;

/** What the last call of a plan did, on this rank. */
typedef struct cgx_stats {
  size_t count;            /**< values of the last call */
  int native;              /**< 1: it went through MPI_Allreduce, uncompressed and exact (below native_below_bytes, or the measured choice's pick) */
  uint32_t calls;          /**< compressed calls of the plan so far (native ones are not counted) */
  double seconds;          /**< wall time of the last call on this rank (run, or start to the end of wait) */
  size_t raw_bytes;        /**< count * sizeof(value) */
  size_t compressed_bytes; /**< max-min: the compressed size of count values (buckets' scales and codes); error-bounded: the bytes this rank sent (payloads and 8-byte length headers); 0 when native */
  size_t schedule_raw_bytes; /**< error-bounded: the bytes the same schedule sends uncompressed, this rank; max-min: 0 */
  double bound;            /**< error-bounded: the bound asked for (absolute); max-min: 0 */
  double step_bound;       /**< error-bounded: the bound each quantization got; max-min: 0 */
} cgx_stats;

/** What a plan's measured choice (CGX_AUTO_THRESHOLD) knows of one size class of call
 * (cgx::path_pick). With a fixed threshold: measured 1, and the threshold's pick. */
typedef struct cgx_path {
  int measured;              /**< 0 while the class is still probed (or never called) */
  int compressed;            /**< the pick: 1 compressed schedule, 0 MPI_Allreduce */
  double native_seconds;     /**< agreed (slowest rank's) time of MPI_Allreduce at the last decision */
  double compressed_seconds; /**< the same for the compressed schedule */
  uint32_t calls;            /**< calls made in the class */
  uint32_t decisions;        /**< decisions taken (1 after probing, +1 per re-check); 0 with measured 1:
                                  the pick was inferred from a measured neighbouring class (both times 0) */
  uint32_t flips;            /**< decisions that changed the pick */
} cgx_path;

/** A compressed allreduce plan (cgx::allreduce_plan behind it). */
typedef struct cgx_allreduce_plan cgx_allreduce_plan;
/** An error-bounded allreduce plan (cgx::error_bounded_plan behind it). */
typedef struct cgx_error_bounded_plan cgx_error_bounded_plan;

/** The message of the last failed call on this thread ("" when the last call of this
 * thread succeeded). Valid until this thread's next call of the API. */
CGX_C_API const char* cgx_last_error(void) CGX_C_NOEXCEPT;
/** A short name of a code ("CGX_ERR_MISMATCH", ...); "unknown" for other values. */
CGX_C_API const char* cgx_errc_name(int code) CGX_C_NOEXCEPT;
/** The library's version, "major.minor.patch". */
CGX_C_API const char* cgx_version(void) CGX_C_NOEXCEPT;
/** 1 if `bucket` is compiled in (128 or 1024), else 0. */
CGX_C_API int cgx_bucket_supported(size_t bucket) CGX_C_NOEXCEPT;

/** The defaults of cgx_options (cgx::plan_options{}), timeout_ms CGX_DEFAULT_TIMEOUT.
 * Returns nothing: a malformed CGX_TIMEOUT_MS is reported by the next create (and in
 * cgx_last_error() now); any other failure leaves timeout_ms CGX_INIT_FAILED, which the
 * next create refuses; a NULL `o` is ignored (the message says so). */
CGX_C_API void cgx_options_init(cgx_options* o) CGX_C_NOEXCEPT;
/** The defaults: float, 4 bits, bucket 1024, stochastic, SRA, max_count 0, default
 * options. Reports problems as cgx_options_init does. */
CGX_C_API void cgx_allreduce_config_init(cgx_allreduce_config* c) CGX_C_NOEXCEPT;
/** The defaults: double, SRA, max_count 0, default options. Reports problems as
 * cgx_options_init does. */
CGX_C_API void cgx_error_bounded_config_init(cgx_error_bounded_config* c) CGX_C_NOEXCEPT;

/** Collective over `comm`: a plan for up to c->max_count values; *plan is NULL on
 * failure. CGX_ERR_INVALID_ARGUMENT for bits outside 1..8, a bucket not compiled in, an
 * unknown type, rounding, schedule or checking level, threads < 1, a timeout above
 * 2^32 - 1 ms, timeout_ms CGX_DEFAULT_TIMEOUT with a malformed CGX_TIMEOUT_MS in the
 * environment (the message names it and its value), CGX_INIT_FAILED; any of these on
 * one rank fails the create on every rank. CGX_ERR_COMMUNICATOR for MPI_COMM_NULL;
 * CGX_ERR_WORKSPACE when the workspace cannot be allocated. Bounded: every collective
 * step (the agreement on the configurations, an MPI_Iallreduce; the plan's duplication
 * of `comm`, MPI_Comm_idup; its barriers) waits at most options.timeout_ms (0: no
 * limit), so a rank that skips the create, or comes later than that, makes the others
 * return CGX_ERR_TIMEOUT, and fails too when it comes (it never succeeds alone). What
 * stays MPI's own: MPI cannot say which rank is missing, nor cancel a timed-out step
 * (it is left with MPI for the life of the process); docs/errors.md lists the rest. */
CGX_C_API cgx_errc cgx_allreduce_create(MPI_Comm comm, const cgx_allreduce_config* c, cgx_allreduce_plan** plan) CGX_C_NOEXCEPT;
/** As cgx_allreduce_create, with a Fortran communicator handle (MPI_Comm_f2c). */
CGX_C_API cgx_errc cgx_allreduce_create_f(MPI_Fint comm, const cgx_allreduce_config* c, cgx_allreduce_plan** plan) CGX_C_NOEXCEPT;
/** Collective: sums buf[0..count) over the ranks, in place, blocking; `type` must be the
 * plan's. Every rank ends with the same bits; the error bound is that of the schedule
 * (include/cgx/comm/scatter_reduce_allgather.hpp, ring.hpp). */
CGX_C_API cgx_errc cgx_allreduce(cgx_allreduce_plan* plan, void* buf, size_t count, cgx_datatype type) CGX_C_NOEXCEPT;
/** Collective: starts the same sum on a background thread and returns; buf must not be
 * touched until cgx_allreduce_wait. MPI must provide MPI_THREAD_SERIALIZED (then make no
 * MPI call until the wait) or MPI_THREAD_MULTIPLE; else CGX_ERR_TRANSPORT. Bad
 * arguments are refused here, buf untouched. */
CGX_C_API cgx_errc cgx_allreduce_start(cgx_allreduce_plan* plan, void* buf, size_t count, cgx_datatype type) CGX_C_NOEXCEPT;
/** Completes the sum begun by cgx_allreduce_start and returns its outcome (CGX_OK
 * when none is in flight). */
CGX_C_API cgx_errc cgx_allreduce_wait(cgx_allreduce_plan* plan) CGX_C_NOEXCEPT;
/** What the plan's last successful call did, on this rank (zeros before the first). */
CGX_C_API cgx_errc cgx_allreduce_stats(const cgx_allreduce_plan* plan, cgx_stats* stats) CGX_C_NOEXCEPT;
/** The threshold in use (see cgx_options::native_below_bytes). */
CGX_C_API cgx_errc cgx_allreduce_native_below_bytes(const cgx_allreduce_plan* plan, size_t* bytes) CGX_C_NOEXCEPT;
/** What the plan's choice knows of calls of `bytes` bytes (see cgx_path). */
CGX_C_API cgx_errc cgx_allreduce_path(const cgx_allreduce_plan* plan, size_t bytes, cgx_path* path) CGX_C_NOEXCEPT;
/** Frees *plan and sets *plan to NULL (MPI_Comm_free's convention); *plan NULL:
 * nothing to do, CGX_OK; `plan` itself NULL: CGX_ERR_INVALID_ARGUMENT. A reduction still
 * in flight is waited for first (its outcome is returned; the plan is freed either way).
 * Not collective, but a plan in flight needs its peers. */
CGX_C_API cgx_errc cgx_allreduce_free(cgx_allreduce_plan** plan) CGX_C_NOEXCEPT;
/** As cgx_allreduce_free, by value (kept for source compatibility): the caller's handle
 * is left dangling; prefer cgx_allreduce_free. NULL: nothing, CGX_OK. */
CGX_C_API cgx_errc cgx_allreduce_destroy(cgx_allreduce_plan* plan) CGX_C_NOEXCEPT;

/** Collective over `comm`: an error-bounded plan for up to c->max_count values; refusals
 * and the bounded construction as cgx_allreduce_create. */
CGX_C_API cgx_errc cgx_error_bounded_create(MPI_Comm comm, const cgx_error_bounded_config* c, cgx_error_bounded_plan** plan) CGX_C_NOEXCEPT;
/** As cgx_error_bounded_create, with a Fortran communicator handle (MPI_Comm_f2c). */
CGX_C_API cgx_errc cgx_error_bounded_create_f(MPI_Fint comm, const cgx_error_bounded_config* c, cgx_error_bounded_plan** plan) CGX_C_NOEXCEPT;
/** Collective: sums buf[0..count) over the ranks, in place, blocking, so that every
 * element of the result is within `bound` (absolute, finite, > 0) of the exact sum, up
 * to the rounding of the sum itself (include/cgx/error_bounded_plan.hpp). Every rank
 * passes the same count and bound. Blocking only: there is no start/wait form. */
CGX_C_API cgx_errc cgx_error_bounded_allreduce(cgx_error_bounded_plan* plan, void* buf, size_t count, cgx_datatype type,
                                     double bound) CGX_C_NOEXCEPT;
/** What the plan's last successful call did, on this rank (zeros before the first). */
CGX_C_API cgx_errc cgx_error_bounded_stats(const cgx_error_bounded_plan* plan, cgx_stats* stats) CGX_C_NOEXCEPT;
/** What the plan's choice knows of calls of `bytes` bytes (see cgx_path). */
CGX_C_API cgx_errc cgx_error_bounded_path(const cgx_error_bounded_plan* plan, size_t bytes, cgx_path* path) CGX_C_NOEXCEPT;
/** Frees *plan and sets *plan to NULL (as cgx_allreduce_free). */
CGX_C_API cgx_errc cgx_error_bounded_free(cgx_error_bounded_plan** plan) CGX_C_NOEXCEPT;
/** As cgx_error_bounded_free, by value (kept for source compatibility): the caller's
 * handle is left dangling; prefer cgx_error_bounded_free. NULL: nothing, CGX_OK. */
CGX_C_API cgx_errc cgx_error_bounded_destroy(cgx_error_bounded_plan* plan) CGX_C_NOEXCEPT;

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CGX_C_H */
