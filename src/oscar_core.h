/* src/oscar_core.h -- part of the oscar.h implementation (included under
   OSCAR_IMPLEMENTATION): host allocation, error sentences, logging, timers,
   SHA-256, the driver/NVRTC ABI types and the context struct. */
#ifndef OSCAR_CORE_H_INCLUDED
#define OSCAR_CORE_H_INCLUDED

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef OSCAR_ASSERT
#include <assert.h>
#define OSCAR_ASSERT(c) assert(c)
#endif

#if defined(OSCAR_MALLOC) && !defined(OSCAR_FREE) || !defined(OSCAR_MALLOC) && defined(OSCAR_FREE)
#error "oscar.h: define both OSCAR_MALLOC and OSCAR_FREE, or neither"
#endif
#ifndef OSCAR_MALLOC
#define OSCAR_MALLOC(n) malloc(n)
#define OSCAR_FREE(p) free(p)
#endif

#ifdef __cplusplus
#define OSCAR__THREAD_LOCAL thread_local
#define OSCAR__UNCONST(T, x) const_cast<T>(x)
#define OSCAR__CAST(T, x) static_cast<T>(x)
#define OSCAR__RCAST(T, x) reinterpret_cast<T>(x)
#else
#define OSCAR__THREAD_LOCAL _Thread_local
#define OSCAR__UNCONST(T, x) ((T)(x))
#define OSCAR__CAST(T, x) ((T)(x))
#define OSCAR__RCAST(T, x) ((T)(x))
#endif

/* Internal functions: file-local, and no warning when a program uses only
   part of the library. */
#if defined(__GNUC__)
#define OSCAR__PRIVATE static __attribute__((unused))
#else
#define OSCAR__PRIVATE static
#endif

#define oscar__def(v, d) ((v) == 0 ? (d) : (v))
#define OSCAR__MIN(a, b) ((a) < (b) ? (a) : (b))
#define OSCAR__MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define OSCAR__PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define OSCAR__PRINTF(f, a)
#endif

/* ---- driver and NVRTC ABI (our own names, so cuda.h may be included too) */
typedef int oscar__CUresult;
typedef int oscar__CUdevice;
typedef struct oscar__CUctx_st *oscar__CUcontext;
typedef struct oscar__CUmod_st *oscar__CUmodule;
typedef struct oscar__CUfunc_st *oscar__CUfunction;
typedef struct oscar__CUevent_st *oscar__CUevent;
typedef struct oscar__CUgraph_st *oscar__CUgraph;
typedef struct oscar__CUgraphExec_st *oscar__CUgraphExec;
typedef unsigned long long oscar__CUdeviceptr;
typedef int oscar__nvrtcResult;
typedef struct oscar__nvrtcProgram_st *oscar__nvrtcProgram;

enum {
    OSCAR__CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    OSCAR__CU_ATTR_L2_CACHE_SIZE = 38,
    OSCAR__CU_ATTR_CC_MAJOR = 75,
    OSCAR__CU_ATTR_CC_MINOR = 76,
    OSCAR__CU_ATTR_MAX_SMEM_OPTIN = 97,
    OSCAR__CU_FUNC_ATTR_MAX_DYNAMIC_SMEM = 8,
    OSCAR__CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
    OSCAR__CUDA_ERROR_NO_DEVICE = 100,
    OSCAR__CUDA_ERROR_STUB_LIBRARY = 34,
    OSCAR__CUDA_ERROR_NOT_FOUND = 500
};

/* Layouts of CUlaunchAttribute / CUlaunchConfig (cuda.h, CUDA 12+). */
typedef struct oscar__CUlaunchAttribute {
    int id;
    char pad[4];
    union {
        char pad[64];
        int value;
    } value;
} oscar__CUlaunchAttribute;
typedef struct oscar__CUlaunchConfig {
    unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, smem_bytes;
    oscar_stream stream;
    oscar__CUlaunchAttribute *attrs;
    unsigned int num_attrs;
} oscar__CUlaunchConfig;

typedef struct oscar__cuda_api {
    void *lib;
    oscar__CUresult (*cuInit)(unsigned int);
    oscar__CUresult (*cuDriverGetVersion)(int *);
    oscar__CUresult (*cuDeviceGetCount)(int *);
    oscar__CUresult (*cuDeviceGet)(oscar__CUdevice *, int);
    oscar__CUresult (*cuDeviceGetAttribute)(int *, int, oscar__CUdevice);
    oscar__CUresult (*cuDeviceGetName)(char *, int, oscar__CUdevice);
    oscar__CUresult (*cuDevicePrimaryCtxRetain)(oscar__CUcontext *, oscar__CUdevice);
    oscar__CUresult (*cuDevicePrimaryCtxRelease)(oscar__CUdevice);
    oscar__CUresult (*cuCtxPushCurrent)(oscar__CUcontext);
    oscar__CUresult (*cuCtxPopCurrent)(oscar__CUcontext *);
    oscar__CUresult (*cuCtxGetCurrent)(oscar__CUcontext *);
    oscar__CUresult (*cuCtxSynchronize)(void);
    oscar__CUresult (*cuModuleLoadData)(oscar__CUmodule *, const void *);
    oscar__CUresult (*cuModuleUnload)(oscar__CUmodule);
    oscar__CUresult (*cuModuleGetFunction)(oscar__CUfunction *, oscar__CUmodule, const char *);
    oscar__CUresult (*cuModuleGetGlobal)(oscar__CUdeviceptr *, size_t *, oscar__CUmodule, const char *);
    oscar__CUresult (*cuFuncSetAttribute)(oscar__CUfunction, int, int);
    oscar__CUresult (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int *, oscar__CUfunction, int, size_t);
    oscar__CUresult (*cuLaunchKernel)(oscar__CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, oscar_stream, void **, void **);
    oscar__CUresult (*cuLaunchKernelEx)(const oscar__CUlaunchConfig *, oscar__CUfunction, void **, void **);
    oscar__CUresult (*cuGetErrorName)(oscar__CUresult, const char **);
    oscar__CUresult (*cuGetErrorString)(oscar__CUresult, const char **);
    oscar__CUresult (*cuMemAlloc)(oscar__CUdeviceptr *, size_t);
    oscar__CUresult (*cuMemFree)(oscar__CUdeviceptr);
    oscar__CUresult (*cuMemcpyHtoD)(oscar__CUdeviceptr, const void *, size_t);
    oscar__CUresult (*cuMemcpyDtoH)(void *, oscar__CUdeviceptr, size_t);
    oscar__CUresult (*cuMemsetD8Async)(oscar__CUdeviceptr, unsigned char, size_t, oscar_stream);
    oscar__CUresult (*cuStreamSynchronize)(oscar_stream);
    oscar__CUresult (*cuEventCreate)(oscar__CUevent *, unsigned int);
    oscar__CUresult (*cuEventDestroy)(oscar__CUevent);
    oscar__CUresult (*cuEventRecord)(oscar__CUevent, oscar_stream);
    oscar__CUresult (*cuEventSynchronize)(oscar__CUevent);
    oscar__CUresult (*cuEventElapsedTime)(float *, oscar__CUevent, oscar__CUevent);
    /* optional (0 where missing): the tuner times CUDA-graph replays with them */
    oscar__CUresult (*cuStreamCreate)(oscar_stream *, unsigned int);
    oscar__CUresult (*cuStreamDestroy)(oscar_stream);
    oscar__CUresult (*cuStreamBeginCapture)(oscar_stream, int);
    oscar__CUresult (*cuStreamEndCapture)(oscar_stream, oscar__CUgraph *);
    oscar__CUresult (*cuGraphInstantiateWithFlags)(oscar__CUgraphExec *, oscar__CUgraph, unsigned long long);
    oscar__CUresult (*cuGraphLaunch)(oscar__CUgraphExec, oscar_stream);
    oscar__CUresult (*cuGraphExecDestroy)(oscar__CUgraphExec);
    oscar__CUresult (*cuGraphDestroy)(oscar__CUgraph);
} oscar__cuda_api;

typedef struct oscar__nvrtc_api {
    void *lib;
    oscar__nvrtcResult (*nvrtcVersion)(int *, int *);
    const char *(*nvrtcGetErrorString)(oscar__nvrtcResult);
    oscar__nvrtcResult (*nvrtcCreateProgram)(oscar__nvrtcProgram *, const char *, const char *, int,
                                             const char *const *, const char *const *);
    oscar__nvrtcResult (*nvrtcDestroyProgram)(oscar__nvrtcProgram *);
    oscar__nvrtcResult (*nvrtcAddNameExpression)(oscar__nvrtcProgram, const char *);
    oscar__nvrtcResult (*nvrtcCompileProgram)(oscar__nvrtcProgram, int, const char *const *);
    oscar__nvrtcResult (*nvrtcGetProgramLogSize)(oscar__nvrtcProgram, size_t *);
    oscar__nvrtcResult (*nvrtcGetProgramLog)(oscar__nvrtcProgram, char *);
    oscar__nvrtcResult (*nvrtcGetCUBINSize)(oscar__nvrtcProgram, size_t *);
    oscar__nvrtcResult (*nvrtcGetCUBIN)(oscar__nvrtcProgram, char *);
    oscar__nvrtcResult (*nvrtcGetLoweredName)(oscar__nvrtcProgram, const char *, const char **);
} oscar__nvrtc_api;

/* One compiled kernel, owned by the context's table. */
typedef struct oscar__kernel {
    uint8_t key[32];
    uint64_t name_hash; /* FNV-1a of program and name expression: the fast lookup */
    char *program;
    char *name_expression;
    char *lowered_name;
    oscar__CUmodule module;
    oscar__CUfunction function;
    oscar_jit_kernel_info info;
    int32_t max_dynamic_smem_set; /* largest dynamic smem limit set on the function */
} oscar__kernel;

struct oscar_ctx {
    oscar_desc desc; /* with defaults filled in; strings point into the copies below */
    oscar_backend backend;
    int32_t compile_only;
    int32_t sm;
    int32_t num_sms;
    int32_t l2_bytes;
    int32_t max_smem_optin;
    int32_t device_ordinal;
    int32_t driver_version;
    int32_t nvrtc_major, nvrtc_minor;
    char device_name[128];
    char cache_dir[1024];
    oscar__cuda_api cu;
    oscar__nvrtc_api nvrtc;
    oscar__CUdevice device;
    oscar__CUcontext cuctx;
    pthread_mutex_t lock; /* guards everything below */
    oscar__kernel **kernels;
    int32_t num_kernels, cap_kernels;
    oscar_jit_stats stats;
    char *jit_log;
    struct oscar__tune_state *tune; /* tuning tables (tune/oscar_tune.h); NULL for the CPU backend */
    /* kernel trace (desc.trace_records > 0): every compile adds -DOSCAR_TRACE=1;
       on a device, a buffer of OSCAR_K_TRACE_HEADER_BYTES + record slots
       (oscar__trace_cta_slots CTAs of each kernel kind x marks) that each
       loaded module's oscar_trace constant names (src/oscar_trace.h) */
    oscar__CUdeviceptr trace_buffer;
};

/* The kernel trace's record slots per kind of kernel: desc.trace_records
   shared by the kinds and their marks (src/oscar_trace.h). */
OSCAR__PRIVATE int64_t oscar__trace_cta_slots(const oscar_ctx *ctx) {
    return ctx->desc.trace_records / (OSCAR_K_TRACE_KERNELS * OSCAR_K_TRACE_MARKS);
}

/* ---- allocation ---------------------------------------------------------- */
OSCAR__PRIVATE void *oscar__alloc(const oscar_ctx *ctx, size_t n) {
    if (n == 0) n = 1;
    if (ctx && ctx->desc.allocator.alloc_fn) return ctx->desc.allocator.alloc_fn(n, ctx->desc.allocator.user_data);
    return OSCAR_MALLOC(n);
}
OSCAR__PRIVATE void oscar__free(const oscar_ctx *ctx, void *p) {
    if (!p) return;
    if (ctx && ctx->desc.allocator.free_fn) {
        ctx->desc.allocator.free_fn(p, ctx->desc.allocator.user_data);
        return;
    }
    OSCAR_FREE(p);
}
OSCAR__PRIVATE void *oscar__calloc(const oscar_ctx *ctx, size_t n) {
    void *p = oscar__alloc(ctx, n);
    if (p) memset(p, 0, n);
    return p;
}
OSCAR__PRIVATE char *oscar__strdup(const oscar_ctx *ctx, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = OSCAR__CAST(char *, oscar__alloc(ctx, n));
    if (p) memcpy(p, s, n);
    return p;
}

/* ---- error sentences (per thread) and logging ----------------------------- */
#define OSCAR__ERROR_CAP 4096
typedef struct oscar__error_slot {
    const oscar_ctx *ctx;
    oscar_status status;
    char text[OSCAR__ERROR_CAP];
} oscar__error_slot;
static OSCAR__THREAD_LOCAL oscar__error_slot oscar__tls_error;

OSCAR_API const char *oscar_status_string(oscar_status status) {
    switch (status) {
#define OSCAR__X(id, text)                                                                                             \
    case id: return text;
        OSCAR__STATUS_LIST(OSCAR__X)
#undef OSCAR__X
    default: return "unknown status";
    }
}

OSCAR__PRIVATE void oscar__log(const oscar_ctx *ctx, uint32_t level, uint32_t item, const char *msg, int line,
                       const char *file) {
    if (ctx && ctx->desc.logger.func)
        ctx->desc.logger.func("oscar", level, item, msg, OSCAR__CAST(uint32_t, line), file, ctx->desc.logger.user_data);
}

/* Records the sentence of a failure and returns its status. */
OSCAR__PRIVATE oscar_status oscar__vfail(const oscar_ctx *ctx, oscar_status st, int line, const char *fmt, va_list ap) {
    oscar__error_slot *slot = &oscar__tls_error;
    slot->ctx = ctx;
    slot->status = st;
#ifdef OSCAR_NO_MESSAGES
    (void)fmt;
    (void)ap;
    snprintf(slot->text, sizeof slot->text, "%s", oscar_status_string(st));
#else
    vsnprintf(slot->text, sizeof slot->text, fmt, ap);
#endif
    oscar__log(ctx, 1, OSCAR__CAST(uint32_t, st), slot->text, line, __FILE__);
    return st;
}
OSCAR__PRIVATE oscar_status oscar__fail_at(const oscar_ctx *ctx, oscar_status st, int line, const char *fmt, ...)
    OSCAR__PRINTF(4, 5);
OSCAR__PRIVATE oscar_status oscar__fail_at(const oscar_ctx *ctx, oscar_status st, int line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    oscar__vfail(ctx, st, line, fmt, ap);
    va_end(ap);
    return st;
}
#define oscar__fail(ctx, st, ...) oscar__fail_at((ctx), (st), __LINE__, __VA_ARGS__)

OSCAR__PRIVATE void oscar__clear_error(const oscar_ctx *ctx) {
    oscar__tls_error.ctx = ctx;
    oscar__tls_error.status = OSCAR_OK;
    oscar__tls_error.text[0] = 0;
}

OSCAR_API const char *oscar_last_error(const oscar_ctx *ctx) {
    if (oscar__tls_error.ctx != ctx) return "";
    return oscar__tls_error.text;
}

OSCAR__PRIVATE void oscar__info(const oscar_ctx *ctx, const char *fmt, ...) OSCAR__PRINTF(2, 3);
OSCAR__PRIVATE void oscar__info(const oscar_ctx *ctx, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    if (!ctx || !ctx->desc.logger.func) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    oscar__log(ctx, 3, 0, buf, 0, NULL);
}

OSCAR_API void oscar_log_stderr(const char *tag, uint32_t level, uint32_t item_id, const char *message_or_null,
                                uint32_t line, const char *filename_or_null, void *user_data) {
    static const char *const names[] = {"panic", "error", "warning", "info"};
    (void)user_data;
    (void)item_id;
    fprintf(stderr, "%s:%u:0: [%s][%s] %s\n", filename_or_null ? filename_or_null : "oscar", line, tag ? tag : "oscar",
            names[level < 4 ? level : 3], message_or_null ? message_or_null : "");
}

/* ---- validation: collects every problem of one call into one sentence ---- */
typedef struct oscar__validator {
    const oscar_ctx *ctx;
    const char *func;
    oscar_status status;
    char text[OSCAR__ERROR_CAP];
    size_t len;
} oscar__validator;

OSCAR__PRIVATE void oscar__validate_begin(oscar__validator *v, const oscar_ctx *ctx, const char *func) {
    v->ctx = ctx;
    v->func = func;
    v->status = OSCAR_OK;
    v->len = 0;
    v->text[0] = 0;
}
OSCAR__PRIVATE void oscar__verr(oscar__validator *v, oscar_status st, const char *fmt, ...) OSCAR__PRINTF(3, 4);
OSCAR__PRIVATE void oscar__verr(oscar__validator *v, oscar_status st, const char *fmt, ...) {
    va_list ap;
    int n;
    if (v->status == OSCAR_OK || v->status == OSCAR_STATUS_INVALID_ARGUMENT) v->status = st;
    if (v->len + 8 >= sizeof v->text) return;
    n = snprintf(v->text + v->len, sizeof v->text - v->len, "%s%s: ", v->len ? "; " : "", v->func);
    if (n > 0) v->len = OSCAR__MIN(v->len + OSCAR__CAST(size_t, n), sizeof v->text - 1);
    va_start(ap, fmt);
    n = vsnprintf(v->text + v->len, sizeof v->text - v->len, fmt, ap);
    va_end(ap);
    if (n > 0) v->len = OSCAR__MIN(v->len + OSCAR__CAST(size_t, n), sizeof v->text - 1);
}
OSCAR__PRIVATE oscar_status oscar__validate_end(oscar__validator *v) {
    if (v->status == OSCAR_OK) return OSCAR_OK;
    return oscar__fail(v->ctx, v->status, "%s", v->text);
}
#define OSCAR__VALIDATE(v, cond, ...)                                                                                  \
    do {                                                                                                               \
        if (!(cond)) oscar__verr((v), OSCAR_STATUS_INVALID_ARGUMENT, __VA_ARGS__);                                     \
    } while (0)

/* ---- time ------------------------------------------------------------------ */
OSCAR__PRIVATE double oscar__now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return OSCAR__CAST(double, ts.tv_sec) * 1e3 + OSCAR__CAST(double, ts.tv_nsec) * 1e-6;
}

/* ---- SHA-256 (FIPS 180-4) --------------------------------------------------- */
typedef struct oscar__sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    uint32_t fill;
} oscar__sha256;

static const uint32_t oscar__sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define OSCAR__ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
OSCAR__PRIVATE void oscar__sha256_block(oscar__sha256 *s, const uint8_t *p) {
    uint32_t w[64], a, b, c, d, e, f, g, h;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = OSCAR__CAST(uint32_t, p[4 * i]) << 24 | OSCAR__CAST(uint32_t, p[4 * i + 1]) << 16 |
               OSCAR__CAST(uint32_t, p[4 * i + 2]) << 8 | p[4 * i + 3];
    for (i = 16; i < 64; i++) {
        uint32_t s0 = OSCAR__ROTR(w[i - 15], 7) ^ OSCAR__ROTR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = OSCAR__ROTR(w[i - 2], 17) ^ OSCAR__ROTR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (i = 0; i < 64; i++) {
        uint32_t t1 = h + (OSCAR__ROTR(e, 6) ^ OSCAR__ROTR(e, 11) ^ OSCAR__ROTR(e, 25)) + ((e & f) ^ (~e & g)) +
                      oscar__sha256_k[i] + w[i];
        uint32_t t2 = (OSCAR__ROTR(a, 2) ^ OSCAR__ROTR(a, 13) ^ OSCAR__ROTR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    s->h[0] += a, s->h[1] += b, s->h[2] += c, s->h[3] += d, s->h[4] += e, s->h[5] += f, s->h[6] += g, s->h[7] += h;
}
#undef OSCAR__ROTR

OSCAR__PRIVATE void oscar__sha256_init(oscar__sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->bytes = 0;
    s->fill = 0;
}
OSCAR__PRIVATE void oscar__sha256_update(oscar__sha256 *s, const void *data, size_t n) {
    const uint8_t *p = OSCAR__CAST(const uint8_t *, data);
    s->bytes += n;
    while (n > 0) {
        size_t take = OSCAR__MIN(OSCAR__CAST(size_t, 64 - s->fill), n);
        memcpy(s->buf + s->fill, p, take);
        s->fill += OSCAR__CAST(uint32_t, take);
        p += take;
        n -= take;
        if (s->fill == 64) {
            oscar__sha256_block(s, s->buf);
            s->fill = 0;
        }
    }
}
OSCAR__PRIVATE void oscar__sha256_final(oscar__sha256 *s, uint8_t out[32]) {
    uint64_t bits = s->bytes * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    int i;
    oscar__sha256_update(s, &pad, 1);
    while (s->fill != 56) oscar__sha256_update(s, &zero, 1);
    for (i = 0; i < 8; i++) len[i] = OSCAR__CAST(uint8_t, bits >> (56 - 8 * i));
    oscar__sha256_update(s, len, 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = OSCAR__CAST(uint8_t, s->h[i] >> 24);
        out[4 * i + 1] = OSCAR__CAST(uint8_t, s->h[i] >> 16);
        out[4 * i + 2] = OSCAR__CAST(uint8_t, s->h[i] >> 8);
        out[4 * i + 3] = OSCAR__CAST(uint8_t, s->h[i]);
    }
}
OSCAR__PRIVATE void oscar__sha256_str(oscar__sha256 *s, const char *str) {
    /* strings are hashed with their terminating zero, so ("ab","c") != ("a","bc") */
    oscar__sha256_update(s, str, strlen(str) + 1);
}
OSCAR__PRIVATE void oscar__hex(const uint8_t *bytes, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    size_t i;
    for (i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = 0;
}

/* ---- small helpers ------------------------------------------------------- */
OSCAR__PRIVATE const char *oscar__dtype_name(oscar_dtype t) {
    switch (t) {
    case OSCAR_DTYPE_BF16: return "bf16";
    case OSCAR_DTYPE_F16: return "f16";
    case OSCAR_DTYPE_F32: return "f32";
    case OSCAR_DTYPE_I32: return "i32";
    case OSCAR_DTYPE_I64: return "i64";
    default: return "default";
    }
}
/* a 16-bit API dtype as the kernels' OSCAR_K_DTYPE_* (f16, else bf16) */
OSCAR__PRIVATE int oscar__k_dtype16(oscar_dtype t) { return t == OSCAR_DTYPE_F16 ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16; }
OSCAR__PRIVATE int oscar__is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

/* Canary check shared by every descriptor. */
#define OSCAR__CHECK_CANARIES(v, d, name)                                                                              \
    do {                                                                                                               \
        if ((d)->_start_canary != 0 || (d)->_end_canary != 0)                                                          \
            oscar__verr((v), OSCAR_STATUS_INVALID_DESC,                                                                \
                        name "._start_canary/_end_canary = %u/%u; expected 0 (zero-initialise the desc: "              \
                             "= {0} in C, = {} in C++)",                                                               \
                        (d)->_start_canary, (d)->_end_canary);                                                         \
    } while (0)

#endif /* OSCAR_CORE_H_INCLUDED */
