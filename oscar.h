/* oscar.h -- OSCAR 2-bit KV-cache kernels for LLM engines, v0.1.0

    A header-only CUDA C kernel collection with a JIT dispatch layer: INT2
    quantize/pack into engine-owned paged pools, dequantize, and (in later
    sections) decode attention over INT2 history plus BF16 windows, merge of
    partial attention states and calibration of the OSCAR rotations.
    The algorithm and the data formats are those of OSCAR (arXiv 2605.17757),
    described in docs/ and in the OSCAR reference implementation.

    Do this:
        #define OSCAR_IMPLEMENTATION
        #include "oscar.h"
    in *one* C or C++ file, before any other #include of that file (the
    implementation needs POSIX declarations and defines _GNU_SOURCE), or build
    that file with -D_GNU_SOURCE. Every other file includes oscar.h plainly.
    Link with -ldl (and -lpthread on old glibc). Nothing else: libcuda and
    libnvrtc are opened at run time, and the CUDA headers are not needed.

    CONFIGURATION MACROS (define before including)
        OSCAR_IMPLEMENTATION    compile the implementation into this file
        OSCAR_STATIC            make every function static (default: extern)
        OSCAR_API               override the linkage of public functions
        OSCAR_ASSERT(c)         internal invariants only (default: assert(c))
        OSCAR_MALLOC(n) / OSCAR_FREE(p)
                                host allocator, both or neither (default:
                                malloc/free); oscar_desc.allocator wins at run time
        OSCAR_NO_MESSAGES       keep status codes, drop the message sentences

    ENVIRONMENT
        OSCAR_CUDA_PATH         libcuda to load (before libcuda.so.1, libcuda.so)
        OSCAR_NVRTC_PATH        libnvrtc to load (before libnvrtc.so, libnvrtc.so.13,
                                libnvrtc.so.12, $CUDA_HOME/lib64, /usr/local/cuda/lib64)
        OSCAR_CACHE_DIR         JIT disk cache folder (default $XDG_CACHE_HOME/oscar/<version>,
                                else ~/.cache/oscar/<version>)
        OSCAR_JIT_DISABLE=1     a JIT cache miss is an error (same as
                                OSCAR_JIT_CACHE_CACHED_ONLY), for production start-up checks
        OSCAR_JIT_NO_DISK=1     keep compiled kernels in memory only
        OSCAR_JIT_VERBOSE=1     log every compile and disk hit to the logger
        OSCAR_TUNE_TABLE        tuning table file when desc.tune_table_path is NULL
                                (default <cache dir>/tune_table.txt)

    oscar DOES NOT
        - allocate the KV pools: the engine owns them and describes them;
        - own streams: every launch takes the engine's stream;
        - keep global state: everything hangs off an oscar_ctx;
        - abort, exit or print: every call returns an oscar_status, and
          oscar_last_error() gives a sentence naming the field, the value and
          the rule that failed.

    STEP BY STEP
        1. oscar_setup(&desc, &ctx): on a device (its compute capability picks
           sm_XY), compile-only for a named arch (desc.compile_only_sm = 90, no
           driver needed), or the CPU backend (desc.backend = OSCAR_BACKEND_CPU).
        2. Describe the INT2 pool the engine allocated: oscar_int2_pool_desc.
        3. Call the kernels (oscar_dequantize_kv, ...), each with a stream.
        4. oscar_shutdown(ctx).

    PAGED-POOL DESCRIPTORS
        An INT2 pool holds, per (slot, kv head), head_dim/4 bytes of packed
        2-bit codes and head_dim/group_size (scale, offset) pairs. A slot is
        page * page_size + offset_in_page. Addresses are computed from byte
        strides (page, token-in-page, head), so NHD, HND and any padding work;
        zero strides mean the contiguous layout named by .layout.
        Packing ("quartered", as the OSCAR reference): byte j of a row holds
        the codes of dims j, j+D/4, j+D/2, j+3D/4 in bits 1:0, 3:2, 5:4, 7:6.

    JIT CACHE
        Kernels are CUDA C++ sources embedded in oscar_kernels/oscar_kernels.inc,
        instantiated through NVRTC name expressions (template arguments: head
        dim, group size, page size, tile shape) and compiled for the device's
        sm_XY. Compiled cubins are kept per context in memory and on disk; the
        key covers the source digests, the name expression, the options, the
        target arch, the NVRTC version and the oscar version. Disk writes are
        atomic (temporary file + rename) and entries carry a SHA-256 checksum:
        a torn or corrupted entry is recompiled, never loaded.
        oscar_query_jit_stats() reports hits, misses and cold/warm times.

    AUTOTUNER
        Plans take tile parameters and split counts from a tuning table (text,
        `key=value` per line, keyed by GPU name, SM count, compute capability,
        NVRTC and oscar versions and a shape bucket), else from the shipped
        table of the arch, else from heuristics. Tables come from
        oscar_tune_decode / oscar_tune_merge / oscar_tune_quantize or the
        `oscar_tune` tool; a table
        made elsewhere is ignored with a log line. See tune/oscar_tune_api.h
        and docs/tuning.md.

    ERRORS AND LOGGING
        Every fallible call returns oscar_status (OSCAR_OK == 0). The sentence
        of the calling thread's last failure is oscar_last_error(ctx) (also for
        a failed oscar_setup, with ctx == NULL). A failed NVRTC compile keeps
        the whole log, readable with oscar_jit_log(ctx). A failed call leaves
        the engine's pools untouched: validation runs before any launch.
        An optional logger callback (oscar_desc.logger) receives the same text.

    THREADING
        A context may be used from several threads at once: its JIT tables are
        guarded by a mutex, error sentences are per thread. One context per
        device; several contexts share the disk cache safely.

    MEMORY OWNERSHIP
        Pointers in descriptors are borrowed for the duration of the call
        (device pointers: until the work on the stream has finished).

    REVISION HISTORY
        0.1.0  foundation: setup, JIT with memory and disk cache, dequantize.

    LICENSE: MIT, see the end of this file.
*/
#if defined(OSCAR_IMPLEMENTATION) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#ifndef OSCAR_H_INCLUDED
#define OSCAR_H_INCLUDED

#include <stddef.h>
#include <stdint.h>

#define OSCAR_VERSION_MAJOR 0
#define OSCAR_VERSION_MINOR 1
#define OSCAR_VERSION_PATCH 0
#define OSCAR_VERSION_STRING "0.1.0"

#if !defined(OSCAR_API)
#if defined(OSCAR_STATIC)
#define OSCAR_API static
#else
#define OSCAR_API extern
#endif
#endif

#ifdef __cplusplus
#define OSCAR__STRUCT(T, name) T name = {}
extern "C" {
#else
#define OSCAR__STRUCT(T, name) T name = {0}
#endif

/* A CUDA stream; the same type as CUstream and cudaStream_t. NULL is the
   legacy default stream. Ignored by the CPU backend. */
struct CUstream_st;
typedef struct CUstream_st *oscar_stream;

/* oscar_status: the result of every fallible call. */
#define OSCAR__STATUS_LIST(X)                                                                                  \
    X(OSCAR_OK, "ok")                                                                                          \
    X(OSCAR_STATUS_INVALID_ARGUMENT, "invalid argument")                                                       \
    X(OSCAR_STATUS_INVALID_DESC, "descriptor not zero-initialised (canary set)")                               \
    X(OSCAR_STATUS_UNSUPPORTED, "unsupported configuration")                                                   \
    X(OSCAR_STATUS_NO_DRIVER, "CUDA driver not available")                                                     \
    X(OSCAR_STATUS_NO_DEVICE, "no CUDA device")                                                                \
    X(OSCAR_STATUS_NO_NVRTC, "NVRTC not available")                                                            \
    X(OSCAR_STATUS_CUDA_ERROR, "CUDA driver call failed")                                                      \
    X(OSCAR_STATUS_JIT_COMPILE_FAILED, "NVRTC compilation failed")                                             \
    X(OSCAR_STATUS_JIT_CACHE_MISS, "kernel not in the JIT cache and compilation is disabled")                  \
    X(OSCAR_STATUS_NEEDS_DEVICE, "operation needs a device; the context is compile-only")                      \
    X(OSCAR_STATUS_IO_ERROR, "file input/output failed")                                                       \
    X(OSCAR_STATUS_FORMAT_ERROR, "malformed file")                                                             \
    X(OSCAR_STATUS_OUT_OF_MEMORY, "out of host memory")                                                        \
    X(OSCAR_STATUS_INTERNAL, "internal error")

typedef enum oscar_status {
#define OSCAR__X(id, text) id,
    OSCAR__STATUS_LIST(OSCAR__X)
#undef OSCAR__X
    OSCAR__STATUS_COUNT,
    OSCAR__STATUS_FORCE_U32 = 0x7FFFFFFF
} oscar_status;

typedef enum oscar_backend {
    OSCAR_BACKEND_DEFAULT = 0, /* = OSCAR_BACKEND_CUDA */
    OSCAR_BACKEND_CUDA,        /* kernels JIT-compiled with NVRTC, run on a device */
    OSCAR_BACKEND_CPU,         /* the C reference of every kernel on host memory */
    OSCAR__BACKEND_COUNT,
    OSCAR__BACKEND_FORCE_U32 = 0x7FFFFFFF
} oscar_backend;

typedef enum oscar_dtype {
    OSCAR_DTYPE_DEFAULT = 0,
    OSCAR_DTYPE_BF16,
    OSCAR_DTYPE_F16,
    OSCAR_DTYPE_F32,
    OSCAR_DTYPE_I32,
    OSCAR_DTYPE_I64,
    OSCAR__DTYPE_COUNT,
    OSCAR__DTYPE_FORCE_U32 = 0x7FFFFFFF
} oscar_dtype;

typedef enum oscar_jit_cache_mode {
    OSCAR_JIT_CACHE_DEFAULT = 0, /* memory + disk; compile on a miss */
    OSCAR_JIT_CACHE_MEMORY_ONLY, /* never touch the disk */
    OSCAR_JIT_CACHE_CACHED_ONLY, /* memory + disk; a miss is OSCAR_STATUS_JIT_CACHE_MISS */
    OSCAR__JIT_CACHE_COUNT,
    OSCAR__JIT_CACHE_FORCE_U32 = 0x7FFFFFFF
} oscar_jit_cache_mode;

/* Logger, sokol's signature. level: 0 panic, 1 error, 2 warning, 3 info.
   item_id is the oscar_status of an error (0 for information). Must be
   reentrant: it can be called from several threads. */
typedef struct oscar_logger {
    void (*func)(const char *tag, uint32_t level, uint32_t item_id, const char *message_or_null, uint32_t line,
                 const char *filename_or_null, void *user_data);
    void *user_data;
} oscar_logger;

/* Host allocator: both functions or neither. */
typedef struct oscar_allocator {
    void *(*alloc_fn)(size_t size, void *user_data);
    void (*free_fn)(void *ptr, void *user_data);
    void *user_data;
} oscar_allocator;

/* oscar_desc: how to set up a context. Zero means default:
       backend              OSCAR_BACKEND_CUDA
       device_ordinal       0
       compile_only_sm      0: use the device; e.g. 90: no device, compile for sm_90 only
       cuda_library_path    $OSCAR_CUDA_PATH, then "libcuda.so.1", "libcuda.so"
       nvrtc_library_path   $OSCAR_NVRTC_PATH, then the NVRTC sonames (see top of file)
       cache_dir            $OSCAR_CACHE_DIR, $XDG_CACHE_HOME/oscar/<version>, ~/.cache/oscar/<version>
       cache_mode           OSCAR_JIT_CACHE_DEFAULT (env OSCAR_JIT_DISABLE=1 forces CACHED_ONLY)
       tune_table_path      $OSCAR_TUNE_TABLE, then <cache dir>/tune_table.txt (see AUTOTUNER)
       trace_records        0: no kernel trace; N (24 .. 2^24): trace builds of every kernel
                            and a device buffer of N records (see "Kernel trace" below)
   Strings are copied; nothing is borrowed past oscar_setup. */
typedef struct oscar_desc {
    uint32_t _start_canary;
    oscar_backend backend;
    int32_t device_ordinal;
    int32_t compile_only_sm;
    const char *cuda_library_path;
    const char *nvrtc_library_path;
    const char *cache_dir;
    oscar_jit_cache_mode cache_mode;
    const char *tune_table_path;
    oscar_logger logger;
    oscar_allocator allocator;
    int32_t trace_records;
    uint32_t _end_canary;
} oscar_desc;

typedef struct oscar_ctx oscar_ctx;

/* What a context is running on, after defaults were filled in. */
typedef struct oscar_ctx_info {
    oscar_backend backend;
    int32_t device_ordinal;     /* -1 when compile-only or CPU */
    int32_t sm;                 /* target arch, e.g. 90 for sm_90; 0 for CPU */
    int32_t num_sms;            /* multiprocessors of the device; 0 without one */
    int32_t compile_only;       /* 1: no device, kernels are compiled but never run */
    int32_t nvrtc_version;      /* major*1000 + minor*10, 0 if not loaded */
    int32_t driver_version;     /* as cuDriverGetVersion, 0 if not loaded */
    char device_name[128];
    char cache_dir[1024];       /* empty when the disk cache is off */
} oscar_ctx_info;

OSCAR_API oscar_status oscar_setup(const oscar_desc *desc, oscar_ctx **out_ctx);
OSCAR_API void oscar_shutdown(oscar_ctx *ctx);
OSCAR_API oscar_status oscar_query_ctx_info(const oscar_ctx *ctx, oscar_ctx_info *out_info);
/* The calling thread's last error sentence for this ctx (ctx may be NULL: the
   last failure of oscar_setup or of a call given a NULL ctx). "" if none. */
OSCAR_API const char *oscar_last_error(const oscar_ctx *ctx);
OSCAR_API const char *oscar_status_string(oscar_status status);
/* The full NVRTC log of the last failed compile on this ctx ("" if none). The
   pointer stays valid until the next failing compile or oscar_shutdown. */
OSCAR_API const char *oscar_jit_log(const oscar_ctx *ctx);
/* The stderr logger: clickable "file:line:0: [oscar][error] message" lines. */
OSCAR_API void oscar_log_stderr(const char *tag, uint32_t level, uint32_t item_id, const char *message_or_null,
                                uint32_t line, const char *filename_or_null, void *user_data);

/* ------------------------------------------------------------------------ */
/* JIT statistics and timing                                                 */

typedef struct oscar_jit_stats {
    int64_t memory_hits;   /* lookups served by the context's table */
    int64_t disk_hits;     /* cubins loaded from the disk cache */
    int64_t compiles;      /* NVRTC compilations */
    int64_t disk_rejects;  /* corrupted or torn disk entries found (then recompiled) */
    double compile_ms;     /* total NVRTC time */
    double disk_load_ms;   /* total time of disk hits (read + checksum) */
} oscar_jit_stats;

/* One compiled kernel of this context and how it got there. */
typedef struct oscar_jit_kernel_info {
    char program[64];          /* the .cuh file, e.g. "dequant.cuh" */
    char name_expression[192]; /* e.g. "oscar::dequant_kernel<128,128,16>" */
    int32_t origin;            /* 1 compiled, 2 disk hit */
    double ms;                 /* NVRTC time (origin 1) or disk load time (origin 2) */
    double module_load_ms;     /* cuModuleLoadData (0 when compile-only) */
} oscar_jit_kernel_info;

OSCAR_API oscar_status oscar_query_jit_stats(const oscar_ctx *ctx, oscar_jit_stats *out);
/* Copies up to cap records; *out_count is the number available. */
OSCAR_API oscar_status oscar_query_jit_kernels(const oscar_ctx *ctx, oscar_jit_kernel_info *out, int32_t cap,
                                               int32_t *out_count);

/* ------------------------------------------------------------------------ */
/* Kernel trace: per-CTA timestamps, for benchmarking (off by default)       */
/* With desc.trace_records = N (0, or OSCAR_TRACE_MIN_RECORDS to
   OSCAR_TRACE_MAX_RECORDS) every kernel the context compiles is a trace
   build (-DOSCAR_TRACE=1, its own JIT cache entries: the kernels of a
   context without a trace carry none of it), and the context owns a device
   buffer of N 16-byte records, shared equally by the kinds of kernel: the
   first N / OSCAR_TRACE_MIN_RECORDS CTAs of each kernel have a record slot
   per mark, later CTAs' marks are counted as dropped. Thread 0 of each CTA
   stores the device's %globaltimer (ns) at each of its kernel's marks (two
   plain stores; no atomic, no round trip); the same plans, launches and
   results as without the trace. One launch of each kernel between a reset
   and a read: a second launch's marks overwrite the first's. Decode kernels
   mark:
       ENTRY     first instruction
       WAITED    prep: the previous grid done (griddepcontrol.wait);
                 INT2: q' from prep visible; merge: every split of its
                 groups signalled (merge_head: its first group's)
       LOOP_END  INT2 / window: warp 0 left its token loop
       DONE      partial state written and signalled (INT2, window), output
                 written (prep, merge)
   quantize: ENTRY, WAITED (R and the threshold table staged in shared
   memory), DONE (thread 0's warp stored its last codes). */
#define OSCAR_TRACE_MIN_RECORDS 24 /* kernel kinds x marks: one CTA each */
#define OSCAR_TRACE_MAX_RECORDS (1 << 24)
typedef enum oscar_trace_kernel {
    OSCAR_TRACE_DECODE_PREP = 1,
    OSCAR_TRACE_DECODE_INT2 = 2,
    OSCAR_TRACE_DECODE_WINDOW = 3,
    OSCAR_TRACE_DECODE_MERGE = 4,
    OSCAR_TRACE_DECODE_MERGE_HEAD = 5,
    OSCAR_TRACE_QUANTIZE = 6,
    OSCAR__TRACE_KERNEL_COUNT
} oscar_trace_kernel;
typedef enum oscar_trace_mark {
    OSCAR_TRACE_ENTRY = 0,
    OSCAR_TRACE_WAITED = 1,
    OSCAR_TRACE_LOOP_END = 2,
    OSCAR_TRACE_DONE = 3,
    OSCAR__TRACE_MARK_COUNT
} oscar_trace_mark;
/* One mark of one CTA, as the device wrote it (16 bytes). */
typedef struct oscar_trace_record {
    uint64_t time_ns; /* %globaltimer */
    uint32_t cta;     /* blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z) */
    uint16_t sm;      /* %smid */
    uint8_t kernel;   /* oscar_trace_kernel */
    uint8_t mark;     /* oscar_trace_mark */
} oscar_trace_record;
/* Empties the buffer, in stream order (a cuMemsetD8Async of all of it). */
OSCAR_API oscar_status oscar_trace_reset(oscar_ctx *ctx, oscar_stream stream);
/* Copies up to cap of the records made since the last reset, in (kernel,
   CTA, mark) order; *out_count is the number made (all were copied when it
   is <= cap), *out_dropped (may be NULL) the marks of CTAs beyond the slots.
   Synchronous: call it once the traced work has finished (e.g. after
   cuStreamSynchronize). */
OSCAR_API oscar_status oscar_trace_read(oscar_ctx *ctx, oscar_trace_record *out, int32_t cap, int32_t *out_count,
                                        int32_t *out_dropped);
/* "decode_int2", "entry", ...; "?" for a value outside the enums. */
OSCAR_API const char *oscar_trace_kernel_name(int32_t kernel);
OSCAR_API const char *oscar_trace_mark_name(int32_t mark);

/* Every kernel instantiation the dispatcher can produce, as (program, name
   expression) pairs; index runs over [0, oscar_jit_instantiation_count()). */
OSCAR_API int32_t oscar_jit_instantiation_count(void);
OSCAR_API oscar_status oscar_jit_instantiation(int32_t index, const char **out_program,
                                               const char **out_name_expression);
/* Compiles (or loads from the caches) one instantiation by index. In a
   compile-only context this is all that can be done with a kernel. */
OSCAR_API oscar_status oscar_jit_prepare(oscar_ctx *ctx, int32_t index);
/* Compiles every instantiation of one program in one NVRTC call (each name
   expression added to the same program) without caching: a check that the
   whole family builds for the context's arch; *out_num_checked is how many
   name expressions it held. */
OSCAR_API oscar_status oscar_jit_check_program(oscar_ctx *ctx, const char *program, int32_t *out_num_checked);

/* ------------------------------------------------------------------------ */
/* INT2 pool                                                                 */

typedef enum oscar_scale_layout {
    OSCAR_SCALE_LAYOUT_DEFAULT = 0,    /* = OSCAR_SCALE_LAYOUT_F16_SCALE_MIN */
    OSCAR_SCALE_LAYOUT_F16_SCALE_MIN,  /* per group [f16 scale, f16 min]: x = min + code*scale; 2.25 bits at G=1, D=128 */
    OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO, /* the reference's [f32 scale, f32 zero]: x = (code - zero)*scale; 2.5 bits */
    OSCAR__SCALE_LAYOUT_COUNT,
    OSCAR__SCALE_LAYOUT_FORCE_U32 = 0x7FFFFFFF
} oscar_scale_layout;

typedef enum oscar_kv_layout {
    OSCAR_KV_LAYOUT_DEFAULT = 0, /* = NHD */
    OSCAR_KV_LAYOUT_NHD,         /* [page][token in page][head][row] */
    OSCAR_KV_LAYOUT_HND,         /* [page][head][token in page][row] */
    OSCAR__KV_LAYOUT_COUNT,
    OSCAR__KV_LAYOUT_FORCE_U32 = 0x7FFFFFFF
} oscar_kv_layout;

/* oscar_int2_pool_desc: one layer's INT2 K and V pool, allocated by the engine.
   Row = one (slot, kv head): head_dim/4 bytes of codes, and
   head_dim/group_size (scale, offset) pairs of the scale layout's element type.
   K and V have the same geometry (same strides, relative to their own bases).
       head_dim                 *must* be set: 64, 128 or 256
       num_kv_heads             *must* be set
       num_pages                *must* be set (validates page ids)
       page_size                1 (tokens per page)
       group_size               head_dim; 32, 64, 128 or 256 dividing head_dim
       scale_layout             OSCAR_SCALE_LAYOUT_F16_SCALE_MIN
       layout                   NHD (only used to fill zero strides)
       k_codes, v_codes         *must* be set: device pointers (host for the CPU backend), 16-byte aligned
       k_scales, v_scales       *must* be set, 4-byte aligned
       codes_*_stride_bytes     contiguous in .layout: token stride H*D/4 (NHD), head stride D/4 ...
       scales_*_stride_bytes    likewise with the scale row size 2*G*sizeof(element)
   All strides are in bytes and must keep rows 16-byte (codes) / 4-byte
   (scales) aligned. */
typedef struct oscar_int2_pool_desc {
    uint32_t _start_canary;
    int32_t head_dim;
    int32_t num_kv_heads;
    int32_t num_pages;
    int32_t page_size;
    int32_t group_size;
    oscar_scale_layout scale_layout;
    oscar_kv_layout layout;
    void *k_codes;
    void *v_codes;
    void *k_scales;
    void *v_scales;
    int64_t codes_page_stride_bytes;
    int64_t codes_token_stride_bytes;
    int64_t codes_head_stride_bytes;
    int64_t scales_page_stride_bytes;
    int64_t scales_token_stride_bytes;
    int64_t scales_head_stride_bytes;
    uint32_t _end_canary;
} oscar_int2_pool_desc;

/* The pool descriptor with every default filled in, as the kernels see it. */
OSCAR_API oscar_status oscar_query_int2_pool_defaults(oscar_ctx *ctx, const oscar_int2_pool_desc *desc,
                                                      oscar_int2_pool_desc *out);
/* Bytes the engine must allocate for each of the four arrays of a pool with
   contiguous default strides (num_pages * page_size * num_kv_heads rows). */
OSCAR_API oscar_status oscar_int2_pool_bytes(oscar_ctx *ctx, const oscar_int2_pool_desc *desc, size_t *out_code_bytes,
                                             size_t *out_scale_bytes);

/* ------------------------------------------------------------------------ */
/* Dequantize: INT2 rows back to dense BF16/F16 (debugging, fallback paths)   */

/* oscar_dequant_desc: which slots to expand and where to.
       slots             *must* be set: device array of num_tokens slot ids
       slot_dtype        OSCAR_DTYPE_I32 (or I64)
       num_tokens        0 is a no-op
       k_out, v_out      device [num_tokens][num_kv_heads][head_dim], either may be NULL
       out_dtype         OSCAR_DTYPE_BF16 (or F16)
       out_token_stride  num_kv_heads*head_dim (elements)
       out_head_stride   head_dim (elements)
   The values are in the pool's (rotated) space: x = min + code*scale computed
   in float32 and rounded to out_dtype. */
typedef struct oscar_dequant_desc {
    uint32_t _start_canary;
    const void *slots;
    oscar_dtype slot_dtype;
    int64_t num_tokens;
    void *k_out;
    void *v_out;
    oscar_dtype out_dtype;
    int64_t out_token_stride;
    int64_t out_head_stride;
    uint32_t _end_canary;
} oscar_dequant_desc;

OSCAR_API oscar_status oscar_dequantize_kv(oscar_ctx *ctx, const oscar_int2_pool_desc *pool,
                                           const oscar_dequant_desc *desc, oscar_stream stream);

/* ------------------------------------------------------------------------ */
/* Quantize: rotate -> clip -> INT2 -> pack into the engine's pool           */

typedef enum oscar_quant_mode {
    OSCAR_QUANT_MODE_DEFAULT = 0, /* = UNIFORM */
    OSCAR_QUANT_MODE_UNIFORM,     /* per group min-max: scale = (max-min)/3, zero = -min/scale (the reference) */
    OSCAR_QUANT_MODE_LLOYD_MAX,   /* per row Gaussian Lloyd-Max decision levels, stored as (scale, zero); G = 1 only */
    OSCAR__QUANT_MODE_COUNT,
    OSCAR__QUANT_MODE_FORCE_U32 = 0x7FFFFFFF
} oscar_quant_mode;

/* One layer's pointers for a multi-layer quantize (demotion of every layer
   in one launch). All device pointers (host for the CPU backend). */
typedef struct oscar_quantize_layer_desc {
    const void *src_k, *src_v;             /* source rows (dense chunk, or the engine's bf16 pool base) */
    const float *k_rotation, *v_rotation;  /* [head_dim][head_dim] f32 row-major (as stored); NULL = none
                                              (v_rotation NULL = V rotation absorbed into the weights) */
    void *k_codes, *v_codes;               /* this layer's INT2 pool */
    void *k_scales, *v_scales;
} oscar_quantize_layer_desc;

/* oscar_quantize_desc: quantize num_tokens rows of K and V (every KV head)
   into the INT2 pool, for one layer or many.
       pool              *must* be set: the pool geometry, shared by all layers;
                         with layers == NULL also layer 0's arrays
       num_layers        1
       layers            NULL: one layer made of pool's arrays and the src_k,
                         src_v, k_rotation, v_rotation fields below
       src_dtype         OSCAR_DTYPE_BF16 (or F16)
       num_tokens        0 is a no-op
       src_slots         NULL: dense rows (token t is source row t); else
                         device [num_tokens] slot ids into the engine's
                         paged bf16 cache (demotion), slot = page*src_page_size + offset
       src_page_size     1
       src_*_stride      elements; token num_kv_heads*head_dim, head head_dim,
                         page src_page_size*token stride; multiples of 8
       dst_slots         *must* be set: device [num_tokens] INT2 pool slots
       slot_dtype        OSCAR_DTYPE_I32 (or I64) for both slot arrays
       k_clip_ratio, v_clip_ratio
                         0 (off); in (0, 1]: tau = sorted|x|[int(ratio*D)] per row
       mode              OSCAR_QUANT_MODE_UNIFORM
   Codes are those of OSCAR-SPEC §3.2 computed in IEEE f32 from the rotated
   row rounded to src_dtype (see oscar_kernels/quantize.cuh). Out-of-range
   destination slots are skipped on the device. */
typedef struct oscar_quantize_desc {
    uint32_t _start_canary;
    const oscar_int2_pool_desc *pool;
    int32_t num_layers;
    const oscar_quantize_layer_desc *layers;
    const void *src_k, *src_v;
    const float *k_rotation, *v_rotation;
    oscar_dtype src_dtype;
    int64_t num_tokens;
    const void *src_slots;
    int32_t src_page_size;
    int64_t src_page_stride, src_token_stride, src_head_stride;
    const void *dst_slots;
    oscar_dtype slot_dtype;
    float k_clip_ratio, v_clip_ratio;
    oscar_quant_mode mode;
    /* optional, [num_layers] each: oscar_prepare_rotation's images of the layers'
       k_rotation / v_rotation (NULL array or entry = none; see below). Arrays beside
       the layer descs, not fields in them, so that layer descs filled field by field
       stay valid. */
    const void *const *k_rotation_prepared;
    const void *const *v_rotation_prepared;
    uint32_t _end_canary;
} oscar_quantize_desc;

OSCAR_API oscar_status oscar_quantize_kv(oscar_ctx *ctx, const oscar_quantize_desc *desc, oscar_stream stream);

/* Prepared rotations (optional, for the quantize path only). A quantize launch
   stages each layer's R from f32 into its shared memory as the source dtype
   (64 KB of loads and a conversion per CTA at head dim 128: most of a small
   demotion's latency). An engine can do that once per matrix at load time:
   oscar_prepare_rotation writes an image of R -- rounded to the source dtype,
   in the kernel's own shared-memory layouts, behind a header -- into memory the
   engine owns (oscar_rotation_prepared_bytes of it, 16-byte aligned), and the
   quantize desc's k/v_rotation_prepared arrays hand it to oscar_quantize_kv, whose CTAs
   then copy it in one round trip. Codes are bit-identical either way. The f32
   rotation stays required: a CTA that finds a header for another head dim,
   dtype or layout version stages from it instead (slower, never wrong).
   Prepare again if the f32 matrix changes. Capturable; no allocation.
       head_dim     *must* be set: 64, 128 or 256
       src_dtype    BF16 (default) or F16: the dtype of the rows it will rotate
       rotation     *must* be set: device [head_dim][head_dim] f32, row-major
       out          *must* be set: device, 16-byte aligned
       out_bytes    *must* be >= oscar_rotation_prepared_bytes(head_dim) */
typedef struct oscar_rotation_prepare_desc {
    uint32_t _start_canary;
    int32_t head_dim;
    oscar_dtype src_dtype;
    const float *rotation;
    void *out;
    size_t out_bytes;
    uint32_t _end_canary;
} oscar_rotation_prepare_desc;
/* the image's size: 64 + 4 head_dim^2 bytes (0 for an unsupported head dim) */
OSCAR_API size_t oscar_rotation_prepared_bytes(int32_t head_dim);
OSCAR_API oscar_status oscar_prepare_rotation(oscar_ctx *ctx, const oscar_rotation_prepare_desc *desc, oscar_stream stream);

/* ------------------------------------------------------------------------ */
/* Decode attention: INT2 history + the engine's bf16 windows, plan / run    */

typedef enum oscar_lse_base {
    OSCAR_LSE_BASE_DEFAULT = 0, /* = E */
    OSCAR_LSE_BASE_E,           /* natural log (FlashAttention, SGLang, PyTorch) */
    OSCAR_LSE_BASE_2,           /* log2 of the sum of exp2(s * log2 e) (FlashInfer) */
    OSCAR__LSE_BASE_COUNT,
    OSCAR__LSE_BASE_FORCE_U32 = 0x7FFFFFFF
} oscar_lse_base;

/* oscar_window_pool_desc: the engine's own paged bf16 K/V cache of one
   layer, where the sink and recent tokens live, unrotated.
       k, v          *must* be set (device), 16-byte aligned
       dtype         OSCAR_DTYPE_BF16 (or F16)
       num_pages     *must* be set
       page_size     1
       layout        NHD ([page][token][head][dim]) or HND
       *_stride      elements; defaults from layout; multiples of 8 */
typedef struct oscar_window_pool_desc {
    uint32_t _start_canary;
    void *k, *v;
    oscar_dtype dtype;
    int32_t num_pages;
    int32_t page_size;
    oscar_kv_layout layout;
    int64_t page_stride, token_stride, head_stride;
    uint32_t _end_canary;
} oscar_window_pool_desc;

/* Per-request pages in FlashInfer's CSR form (device int32 arrays):
   request b owns pages indices[indptr[b] .. indptr[b+1]); its last page holds
   last_page_len[b] tokens (1..page_size) when it owns any page. */
typedef struct oscar_page_table {
    const int32_t *indptr;
    const int32_t *indices;
    const int32_t *last_page_len;
} oscar_page_table;

/* oscar_decode_plan_desc: the shape a plan serves.
       num_q_heads          *must* be set: a multiple of int2_pool->num_kv_heads, ratio 1..16
       int2_pool            *must* be set: the INT2 pool geometry (its arrays are not read)
       window_pool          geometry of the window cache; NULL: INT2 only
       batch_size           *must* be set: requests per run (the grid is fixed by it)
       max_int2_tokens      *must* be set (>= 0): the most INT2 tokens one request may have;
                            0 plans no INT2 tier at all (a plain bf16 decode over the windows)
       max_window_tokens    512: the most window tokens one request may have
       int2_splits, window_splits
                            0: chosen to fill the GPU (or the tuning table); else forced. The
                            plan raises the INT2 count (up to 128) until no INT2 warp walks
                            more than 8192 tokens of max_int2_tokens: longer walks lose
                            precision in the f32 accumulators (docs/decode.md "Session 41");
                            plan_info.int2_splits is the count used
       requests_per_cta     0: chosen for the GPU (or the tuning table); else forced: the
                            requests of one KV head that each prep and per-KV-head merge CTA
                            serves, 1 .. 16 / (num_q_heads / num_kv_heads)
       int2_warps           0: chosen (or the tuning table); else forced: warps per INT2
                            CTA, 4, 12 or 16 (one CTA per SM -- 16: ratio <= 4, head_dim <=
                            128; 12: ratio 5-8, head_dim 64, or 128 with group_size >= 64; and
                            the shared memory must fit; else OSCAR_STATUS_UNSUPPORTED). The
                            plan takes 16 or 12 for batches of long contexts that one wave
                            of them fills (docs/decode.md)
   Every kernel the runs need is compiled (or loaded from the cache) here. */
typedef struct oscar_decode_plan_desc {
    uint32_t _start_canary;
    int32_t num_q_heads;
    const oscar_int2_pool_desc *int2_pool;
    const oscar_window_pool_desc *window_pool;
    int32_t batch_size;
    int64_t max_int2_tokens;
    int32_t max_window_tokens;
    int32_t int2_splits;
    int32_t window_splits;
    int32_t requests_per_cta;
    int32_t int2_warps;
    uint32_t _end_canary;
} oscar_decode_plan_desc;

/* oscar_decode_plan_info: caller-owned plain data, valid while the context
   lives. Copy it, keep it in graph state; oscar_decode_run reads it. */
typedef struct oscar_decode_plan_info {
    uint32_t magic;
    int32_t batch_size, num_q_heads, num_kv_heads, head_dim, group_size, page_size;
    int32_t window_page_size, window_dtype, has_window;
    int32_t int2_splits, window_splits, min_chunk;
    int32_t requests_per_cta; /* of one KV head, per prep and per-KV-head merge CTA */
    oscar_scale_layout scale_layout;
    size_t workspace_bytes; /* what oscar_decode_run needs */
    size_t ws_q_offset, ws_o_offset, ws_lse_offset;
    uint32_t smem_int2, smem_window;
    int32_t int2_warps;     /* warps per INT2 CTA: 4, or 16 / 12 (one CTA per SM) */
    void *kernels[4];       /* prep, window, int2, merge (owned by the context) */
} oscar_decode_plan_info;

/* oscar_decode_run_desc: one layer's decode step.
       int2_pool, window_pool   this layer's arrays (geometry as planned)
       int2_pages, window_pages device CSR tables (window_pages ignored without a window pool)
       q, o                     *must* be set: [batch][num_q_heads][head_dim] bf16|f16
       q_dtype, o_dtype         bf16
       q_/o_ batch/head stride  elements; num_q_heads*head_dim, head_dim
       lse                      optional f32 [batch][num_q_heads], base lse_base
       k_rotation, v_rotation   device [D][D] f32 (as stored): q is rotated by R_k for the
                                INT2 tier, and the INT2 part of o is brought back with R_v^T;
                                NULL = none (v_rotation NULL: V rotation absorbed)
       sm_scale                 *must* be set (e.g. 1/sqrt(head_dim))
       logit_cap                0 = none; else cap * tanh(s / cap) (s = sm_scale q.k)
       workspace                *must* be set: plan.workspace_bytes of device memory
   No allocation, host synchronisation or compilation: capturable in a CUDA
   graph and replayable with new lengths up to the planned maximum. */
typedef struct oscar_decode_run_desc {
    uint32_t _start_canary;
    const oscar_int2_pool_desc *int2_pool;
    const oscar_window_pool_desc *window_pool;
    oscar_page_table int2_pages;
    oscar_page_table window_pages;
    const void *q;
    oscar_dtype q_dtype;
    int64_t q_batch_stride, q_head_stride;
    void *o;
    oscar_dtype o_dtype;
    int64_t o_batch_stride, o_head_stride;
    float *lse;
    oscar_lse_base lse_base;
    const float *k_rotation, *v_rotation;
    float sm_scale;
    float logit_cap;
    void *workspace;
    size_t workspace_bytes;
    uint32_t _end_canary;
} oscar_decode_run_desc;

/* Chooses splits and kernels for a shape, compiles them, sizes the workspace. */
OSCAR_API oscar_status oscar_decode_plan(oscar_ctx *ctx, const oscar_decode_plan_desc *desc,
                                         oscar_decode_plan_info *out_plan);
OSCAR_API oscar_status oscar_decode_run(oscar_ctx *ctx, const oscar_decode_plan_info *plan,
                                        const oscar_decode_run_desc *desc, oscar_stream stream);

/* ------------------------------------------------------------------------ */
/* Merge of partial attention states (o, lse)                                */

/* oscar_merge_desc: out = the exact softmax merge of num_states partial
   states over disjoint token sets, for num_rows rows of head_dim values.
   An empty state (lse = -inf) contributes nothing; all empty gives o = 0,
   lse = -inf. NaN-safe.
       num_states        *must* be 1..8
       num_rows          rows (e.g. batch * heads)
       head_dim          *must* be set: 64, 128 or 256
       o[i], lse[i]      *must* be set: state i: o [num_rows][head_dim] (row stride in
                         elements, default head_dim), lse f32 [num_rows]
       dtype             bf16 (also f16, f32) of every o
       lse_base          base of the input lse values
       out_o, out_lse    out_o *must* be set; out_lse optional; same dtype and base */
typedef struct oscar_merge_desc {
    uint32_t _start_canary;
    int32_t num_states;
    int64_t num_rows;
    int32_t head_dim;
    const void *o[8];
    const float *lse[8];
    int64_t row_stride;
    oscar_dtype dtype;
    oscar_lse_base lse_base;
    void *out_o;
    float *out_lse;
    int64_t out_row_stride;
    uint32_t _end_canary;
} oscar_merge_desc;

OSCAR_API oscar_status oscar_merge_states(oscar_ctx *ctx, const oscar_merge_desc *desc, oscar_stream stream);

/* ------------------------------------------------------------------------ */
/* Calibration and rotation files                                            */
#include "calib/oscar_calib_api.h"

/* ------------------------------------------------------------------------ */
/* Autotuner: tuning tables, lookups, tuning runs                            */
#include "tune/oscar_tune_api.h"

#ifdef __cplusplus
} /* extern "C" */
#endif
#endif /* OSCAR_H_INCLUDED */

/* ======================================================================== */
/* IMPLEMENTATION                                                            */
/* ======================================================================== */
#if defined(OSCAR_IMPLEMENTATION) && !defined(OSCAR_IMPLEMENTATION_INCLUDED)
#define OSCAR_IMPLEMENTATION_INCLUDED
/* the parameter structs shared with the kernels */
#include "oscar_kernels/oscar_params.h"
/* >>core: errors, allocation, hashing, the context struct */
#include "src/oscar_core.h"
/* >>jit: libcuda/libnvrtc at run time, compile, memory + disk cache, launch */
#include "oscar_kernels/oscar_kernels.inc"
#include "jit/oscar_jit.h"
#include "jit/oscar_registry.h"
/* >>cpu: the C reference of every kernel (the CPU backend and the tests' oracle) */
#include "cpu/oscar_cpu.h"
/* >>tune: tunable families, tuning tables, the plans' lookups, tuning runs */
#include "tune/oscar_tune.h"
/* >>validation and dispatch, one file per operation */
#include "src/oscar_trace.h"
#include "src/oscar_setup.h"
#include "src/oscar_pool.h"
#include "src/oscar_dequant.h"
#include "src/oscar_quantize.h"
#include "src/oscar_decode.h"
#include "src/oscar_merge.h"
/* >>calib: covariance accumulation, rotation fitting, rotation files */
#include "calib/oscar_calib.h"
#endif /* OSCAR_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the oscar.h authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
*/
