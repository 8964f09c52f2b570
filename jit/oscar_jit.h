/* jit/oscar_jit.h -- part of the oscar.h implementation.
   Loads libcuda and libnvrtc at run time, compiles the embedded kernel sources
   with NVRTC (templates instantiated through name expressions), and keeps the
   cubins in a per-context table and in a disk cache.

   Disk cache entry: <dir>/<key>.sm<XY>.nvrtc<maj>-<min>.v<format>.cubin, where
   key = SHA-256(oscar version, digests of all embedded sources, program name,
   name expression, options, arch, NVRTC version). File layout:
       "OSCARJIT" | u32 format | u32 lowered-name bytes | u64 cubin bytes |
       32-byte SHA-256 of (lowered name, cubin) | lowered name | cubin
   Reads take no lock and verify sizes and checksum; a bad entry counts as a
   miss. A miss takes an exclusive flock on <entry>.lock, looks again, compiles,
   writes <entry>.tmp.<pid>.<n>, fsyncs and renames it into place. */
#ifndef OSCAR_JIT_H_INCLUDED
#define OSCAR_JIT_H_INCLUDED

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define OSCAR__JIT_FORMAT 1

/* ---- loading the libraries ------------------------------------------------ */
OSCAR__PRIVATE void *oscar__dlopen_first(const char *const *names, int n, char *tried, size_t tried_cap) {
    int i;
    size_t len = 0;
    tried[0] = 0;
    for (i = 0; i < n; i++) {
        void *h;
        if (!names[i] || !names[i][0]) continue;
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) return h;
        if (len + 4 < tried_cap) {
            const char *why = dlerror();
            int k = snprintf(tried + len, tried_cap - len, "%s%s (%s)", len ? ", " : "", names[i],
                             why ? why : "not found");
            if (k > 0) len = OSCAR__MIN(len + OSCAR__CAST(size_t, k), tried_cap - 1);
        }
    }
    return NULL;
}

#define OSCAR__SYM(api, name, sym, required)                                                                           \
    do {                                                                                                               \
        *OSCAR__RCAST(void **, &(api)->name) = dlsym((api)->lib, sym);                                                 \
        if (!(api)->name && (required)) missing = sym;                                                                 \
    } while (0)

OSCAR__PRIVATE oscar_status oscar__load_cuda(oscar_ctx *ctx) {
    char tried[2048];
    const char *env = getenv("OSCAR_CUDA_PATH");
    const char *names[4];
    const char *missing = NULL;
    oscar__cuda_api *cu = &ctx->cu;
    names[0] = ctx->desc.cuda_library_path;
    names[1] = env;
    names[2] = "libcuda.so.1";
    names[3] = "libcuda.so";
    cu->lib = oscar__dlopen_first(names, 4, tried, sizeof tried);
    if (!cu->lib)
        return oscar__fail(NULL, OSCAR_STATUS_NO_DRIVER,
                           "oscar_setup: the CUDA driver library could not be loaded (tried %s); install the NVIDIA "
                           "driver, set OSCAR_CUDA_PATH, or use desc.compile_only_sm or OSCAR_BACKEND_CPU",
                           tried);
    OSCAR__SYM(cu, cuInit, "cuInit", 1);
    OSCAR__SYM(cu, cuDriverGetVersion, "cuDriverGetVersion", 1);
    OSCAR__SYM(cu, cuDeviceGetCount, "cuDeviceGetCount", 1);
    OSCAR__SYM(cu, cuDeviceGet, "cuDeviceGet", 1);
    OSCAR__SYM(cu, cuDeviceGetAttribute, "cuDeviceGetAttribute", 1);
    OSCAR__SYM(cu, cuDeviceGetName, "cuDeviceGetName", 1);
    OSCAR__SYM(cu, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1);
    OSCAR__SYM(cu, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", 1);
    OSCAR__SYM(cu, cuCtxPushCurrent, "cuCtxPushCurrent_v2", 1);
    OSCAR__SYM(cu, cuCtxPopCurrent, "cuCtxPopCurrent_v2", 1);
    OSCAR__SYM(cu, cuCtxGetCurrent, "cuCtxGetCurrent", 1);
    OSCAR__SYM(cu, cuCtxSynchronize, "cuCtxSynchronize", 1);
    OSCAR__SYM(cu, cuModuleLoadData, "cuModuleLoadData", 1);
    OSCAR__SYM(cu, cuModuleUnload, "cuModuleUnload", 1);
    OSCAR__SYM(cu, cuModuleGetFunction, "cuModuleGetFunction", 1);
    OSCAR__SYM(cu, cuModuleGetGlobal, "cuModuleGetGlobal_v2", 1);
    OSCAR__SYM(cu, cuFuncSetAttribute, "cuFuncSetAttribute", 1);
    OSCAR__SYM(cu, cuOccupancyMaxActiveBlocksPerMultiprocessor, "cuOccupancyMaxActiveBlocksPerMultiprocessor", 0);
    OSCAR__SYM(cu, cuLaunchKernel, "cuLaunchKernel", 1);
    OSCAR__SYM(cu, cuLaunchKernelEx, "cuLaunchKernelEx", 0);
    OSCAR__SYM(cu, cuGetErrorName, "cuGetErrorName", 1);
    OSCAR__SYM(cu, cuGetErrorString, "cuGetErrorString", 1);
    OSCAR__SYM(cu, cuMemAlloc, "cuMemAlloc_v2", 1);
    OSCAR__SYM(cu, cuMemFree, "cuMemFree_v2", 1);
    OSCAR__SYM(cu, cuMemcpyHtoD, "cuMemcpyHtoD_v2", 1);
    OSCAR__SYM(cu, cuMemcpyDtoH, "cuMemcpyDtoH_v2", 1);
    OSCAR__SYM(cu, cuMemsetD8Async, "cuMemsetD8Async", 1);
    OSCAR__SYM(cu, cuStreamSynchronize, "cuStreamSynchronize", 1);
    OSCAR__SYM(cu, cuEventCreate, "cuEventCreate", 1);
    OSCAR__SYM(cu, cuEventDestroy, "cuEventDestroy_v2", 1);
    OSCAR__SYM(cu, cuEventRecord, "cuEventRecord", 1);
    OSCAR__SYM(cu, cuEventSynchronize, "cuEventSynchronize", 1);
    OSCAR__SYM(cu, cuEventElapsedTime, "cuEventElapsedTime_v2", 0);
    if (!cu->cuEventElapsedTime) OSCAR__SYM(cu, cuEventElapsedTime, "cuEventElapsedTime", 1);
    OSCAR__SYM(cu, cuStreamCreate, "cuStreamCreate", 0);
    OSCAR__SYM(cu, cuStreamDestroy, "cuStreamDestroy_v2", 0);
    OSCAR__SYM(cu, cuStreamBeginCapture, "cuStreamBeginCapture_v2", 0);
    OSCAR__SYM(cu, cuStreamEndCapture, "cuStreamEndCapture", 0);
    OSCAR__SYM(cu, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 0);
    OSCAR__SYM(cu, cuGraphLaunch, "cuGraphLaunch", 0);
    OSCAR__SYM(cu, cuGraphExecDestroy, "cuGraphExecDestroy", 0);
    OSCAR__SYM(cu, cuGraphDestroy, "cuGraphDestroy", 0);
    if (missing)
        return oscar__fail(NULL, OSCAR_STATUS_NO_DRIVER,
                           "oscar_setup: the CUDA driver library lacks %s (driver too old?); oscar needs CUDA 12 or later",
                           missing);
    return OSCAR_OK;
}

OSCAR__PRIVATE oscar_status oscar__load_nvrtc(oscar_ctx *ctx) {
    char tried[4096];
    char home_path[1024];
    const char *env = getenv("OSCAR_NVRTC_PATH");
    const char *cuda_home = getenv("CUDA_HOME");
    const char *names[8];
    const char *missing = NULL;
    oscar__nvrtc_api *nv = &ctx->nvrtc;
    home_path[0] = 0;
    if (cuda_home && cuda_home[0]) snprintf(home_path, sizeof home_path, "%s/lib64/libnvrtc.so", cuda_home);
    names[0] = ctx->desc.nvrtc_library_path;
    names[1] = env;
    names[2] = "libnvrtc.so";
    names[3] = "libnvrtc.so.13";
    names[4] = "libnvrtc.so.12";
    names[5] = home_path;
    names[6] = "/usr/local/cuda/lib64/libnvrtc.so";
    names[7] = "/usr/local/cuda/lib64/libnvrtc.so.13";
    nv->lib = oscar__dlopen_first(names, 8, tried, sizeof tried);
    if (!nv->lib)
        return oscar__fail(NULL, OSCAR_STATUS_NO_NVRTC,
                           "oscar_setup: NVRTC could not be loaded (tried %s); install the CUDA toolkit's NVRTC or set "
                           "OSCAR_NVRTC_PATH",
                           tried);
    OSCAR__SYM(nv, nvrtcVersion, "nvrtcVersion", 1);
    OSCAR__SYM(nv, nvrtcGetErrorString, "nvrtcGetErrorString", 1);
    OSCAR__SYM(nv, nvrtcCreateProgram, "nvrtcCreateProgram", 1);
    OSCAR__SYM(nv, nvrtcDestroyProgram, "nvrtcDestroyProgram", 1);
    OSCAR__SYM(nv, nvrtcAddNameExpression, "nvrtcAddNameExpression", 1);
    OSCAR__SYM(nv, nvrtcCompileProgram, "nvrtcCompileProgram", 1);
    OSCAR__SYM(nv, nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize", 1);
    OSCAR__SYM(nv, nvrtcGetProgramLog, "nvrtcGetProgramLog", 1);
    OSCAR__SYM(nv, nvrtcGetCUBINSize, "nvrtcGetCUBINSize", 1);
    OSCAR__SYM(nv, nvrtcGetCUBIN, "nvrtcGetCUBIN", 1);
    OSCAR__SYM(nv, nvrtcGetLoweredName, "nvrtcGetLoweredName", 1);
    if (missing)
        return oscar__fail(NULL, OSCAR_STATUS_NO_NVRTC, "oscar_setup: the NVRTC library lacks %s (need CUDA 11.2+)",
                           missing);
    nv->nvrtcVersion(&ctx->nvrtc_major, &ctx->nvrtc_minor);
    return OSCAR_OK;
}
#undef OSCAR__SYM

/* Formats a failed driver call. */
OSCAR__PRIVATE oscar_status oscar__cu_fail_as(const oscar__cuda_api *cu, const oscar_ctx *report, oscar__CUresult r,
                                      const char *what) {
    const char *name = NULL, *text = NULL;
    if (cu->cuGetErrorName) cu->cuGetErrorName(r, &name);
    if (cu->cuGetErrorString) cu->cuGetErrorString(r, &text);
    return oscar__fail(report, OSCAR_STATUS_CUDA_ERROR, "%s failed: %s (%d): %s", what, name ? name : "?", r,
                       text ? text : "");
}
OSCAR__PRIVATE oscar_status oscar__cu_fail(const oscar_ctx *ctx, oscar__CUresult r, const char *what) {
    return oscar__cu_fail_as(&ctx->cu, ctx, r, what);
}
#define OSCAR__CU(ctx, call, what)                                                                                     \
    do {                                                                                                               \
        oscar__CUresult oscar__r = (call);                                                                             \
        if (oscar__r != 0) return oscar__cu_fail((ctx), oscar__r, (what));                                            \
    } while (0)

/* The context's CUDA context is made current around every driver call and
   the caller's is restored afterwards; when it already is current (the
   usual case: engines run on the primary context) nothing is pushed.
   Returns 1 when a push happened, 0 when not, -1 on failure. */
OSCAR__PRIVATE int oscar__push_if_needed(const oscar_ctx *ctx) {
    oscar__CUcontext cur = NULL;
    if (ctx->cu.cuCtxGetCurrent(&cur) == 0 && cur == ctx->cuctx) return 0;
    return ctx->cu.cuCtxPushCurrent(ctx->cuctx) == 0 ? 1 : -1;
}
OSCAR__PRIVATE oscar_status oscar__push(const oscar_ctx *ctx) {
    OSCAR__CU(ctx, ctx->cu.cuCtxPushCurrent(ctx->cuctx), "cuCtxPushCurrent");
    return OSCAR_OK;
}
OSCAR__PRIVATE void oscar__pop(const oscar_ctx *ctx) {
    oscar__CUcontext dummy;
    ctx->cu.cuCtxPopCurrent(&dummy);
}
OSCAR__PRIVATE uint64_t oscar__fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ OSCAR__CAST(uint8_t, *s)) * 0x100000001b3ULL;
    return (h ^ 0xff) * 0x100000001b3ULL;
}

/* ---- embedded sources --------------------------------------------------- */
OSCAR__PRIVATE const oscar__embedded_source *oscar__find_source(const char *name) {
    int i;
    for (i = 0; i < OSCAR__NUM_EMBEDDED_SOURCES; i++)
        if (strcmp(oscar__embedded_sources[i].name, name) == 0) return &oscar__embedded_sources[i];
    return NULL;
}

/* One more NVRTC option for this thread's compiles, or NULL: `oscar kernels
   resources` (tools/oscar_cli.c) sets --ptxas-options=-v to read each
   kernel's registers and spills from the log, which a compile then keeps in
   the context's JIT log. It is part of the options, so of the cache key. */
static OSCAR__THREAD_LOCAL const char *oscar__nvrtc_extra_option;

/* The compile options of a program. quantize.cuh on sm_90 compiles for
   sm_90a (its rotation uses wgmma, which has no sm_90 form; the cubin runs
   on every sm_90 device, and the kernel keeps its mma.sync path for the
   other architectures). */
OSCAR__PRIVATE int oscar__nvrtc_options(const oscar_ctx *ctx, const char *program, char arch[32], const char *opts[8]) {
    int n = 0;
    int arch_specific = ctx->sm == 90 && strcmp(program, "quantize.cuh") == 0;
    snprintf(arch, 32, "--gpu-architecture=sm_%d%s", ctx->sm, arch_specific ? "a" : "");
    opts[n++] = arch;
    opts[n++] = "-std=c++17";
    opts[n++] = "-DOSCAR_NVRTC=1";
    opts[n++] = "--fmad=true";
    if (ctx->desc.trace_records > 0) opts[n++] = "-DOSCAR_TRACE=1"; /* see src/oscar_trace.h */
    if (oscar__nvrtc_extra_option) opts[n++] = oscar__nvrtc_extra_option;
    return n;
}

OSCAR__PRIVATE void oscar__jit_key(const oscar_ctx *ctx, const char *program, const char *name_expr, uint8_t key[32]) {
    oscar__sha256 s;
    char arch[32], buf[64];
    const char *opts[8];
    int i, n = oscar__nvrtc_options(ctx, program, arch, opts);
    oscar__sha256_init(&s);
    oscar__sha256_str(&s, "oscar " OSCAR_VERSION_STRING);
    snprintf(buf, sizeof buf, "format %d nvrtc %d.%d", OSCAR__JIT_FORMAT, ctx->nvrtc_major, ctx->nvrtc_minor);
    oscar__sha256_str(&s, buf);
    for (i = 0; i < OSCAR__NUM_EMBEDDED_SOURCES; i++) {
        oscar__sha256_str(&s, oscar__embedded_sources[i].name);
        oscar__sha256_str(&s, oscar__embedded_sources[i].sha256);
    }
    oscar__sha256_str(&s, program);
    oscar__sha256_str(&s, name_expr);
    for (i = 0; i < n; i++) oscar__sha256_str(&s, opts[i]);
    oscar__sha256_final(&s, key);
}

OSCAR__PRIVATE void oscar__set_jit_log(oscar_ctx *ctx, const char *log) {
    char *copy = oscar__strdup(ctx, log ? log : "");
    oscar__free(ctx, ctx->jit_log);
    ctx->jit_log = copy;
}

/* Compiles `program` with the given name expressions in one NVRTC call.
   On success *out_cubin (oscar__alloc'ed) and lowered[i] (oscar__alloc'ed)
   are set. Caller holds ctx->lock. */
OSCAR__PRIVATE oscar_status oscar__nvrtc_compile(oscar_ctx *ctx, const char *program, const char *const *name_exprs, int n,
                                         char **out_cubin, size_t *out_size, char **lowered) {
    const oscar__embedded_source *src = oscar__find_source(program);
    const char *header_text[OSCAR__NUM_EMBEDDED_SOURCES];
    const char *header_name[OSCAR__NUM_EMBEDDED_SOURCES];
    const char *opts[8];
    char arch[32];
    int nopts = oscar__nvrtc_options(ctx, program, arch, opts), nh = 0, i;
    oscar__nvrtcProgram prog = NULL;
    oscar__nvrtcResult r;
    size_t log_size = 0, cubin_size = 0;
    char *log = NULL, *cubin = NULL;
    oscar_status st = OSCAR_OK;

    *out_cubin = NULL;
    *out_size = 0;
    for (i = 0; i < n; i++) lowered[i] = NULL;
    if (!src) return oscar__fail(ctx, OSCAR_STATUS_INTERNAL, "oscar jit: no embedded program named %s", program);
    for (i = 0; i < OSCAR__NUM_EMBEDDED_SOURCES; i++) {
        header_text[nh] = oscar__embedded_sources[i].text;
        header_name[nh] = oscar__embedded_sources[i].name;
        nh++;
    }
    r = ctx->nvrtc.nvrtcCreateProgram(&prog, src->text, program, nh, header_text, header_name);
    if (r != 0)
        return oscar__fail(ctx, OSCAR_STATUS_JIT_COMPILE_FAILED, "nvrtcCreateProgram(%s) failed: %s", program,
                           ctx->nvrtc.nvrtcGetErrorString(r));
    for (i = 0; i < n; i++) {
        r = ctx->nvrtc.nvrtcAddNameExpression(prog, name_exprs[i]);
        if (r != 0) {
            st = oscar__fail(ctx, OSCAR_STATUS_JIT_COMPILE_FAILED, "nvrtcAddNameExpression(%s, %s) failed: %s",
                             program, name_exprs[i], ctx->nvrtc.nvrtcGetErrorString(r));
            goto done;
        }
    }
    r = ctx->nvrtc.nvrtcCompileProgram(prog, nopts, opts);
    /* the log first, whatever the result */
    ctx->nvrtc.nvrtcGetProgramLogSize(prog, &log_size);
    log = OSCAR__CAST(char *, oscar__calloc(ctx, log_size + 1));
    if (log && log_size) ctx->nvrtc.nvrtcGetProgramLog(prog, log);
    if (r != 0) {
        char optline[256];
        size_t len = 0;
        optline[0] = 0;
        for (i = 0; i < nopts; i++) {
            int k = snprintf(optline + len, sizeof optline - len, "%s%s", i ? " " : "", opts[i]);
            if (k > 0) len = OSCAR__MIN(len + OSCAR__CAST(size_t, k), sizeof optline - 1);
        }
        oscar__set_jit_log(ctx, log);
        st = oscar__fail(ctx, OSCAR_STATUS_JIT_COMPILE_FAILED,
                         "NVRTC failed to compile program %s, name expression %s%s, options [%s]: %s\n%.2500s", program,
                         name_exprs[0], n > 1 ? " (and others)" : "", optline, ctx->nvrtc.nvrtcGetErrorString(r),
                         log ? log : "");
        goto done;
    }
    if (oscar__nvrtc_extra_option) oscar__set_jit_log(ctx, log);
    ctx->nvrtc.nvrtcGetCUBINSize(prog, &cubin_size);
    cubin = OSCAR__CAST(char *, oscar__alloc(ctx, cubin_size));
    if (!cubin) {
        st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar jit: out of memory for a %zu-byte cubin", cubin_size);
        goto done;
    }
    ctx->nvrtc.nvrtcGetCUBIN(prog, cubin);
    for (i = 0; i < n; i++) {
        const char *low = NULL;
        r = ctx->nvrtc.nvrtcGetLoweredName(prog, name_exprs[i], &low);
        if (r != 0 || !low) {
            st = oscar__fail(ctx, OSCAR_STATUS_JIT_COMPILE_FAILED,
                             "program %s: no lowered name for name expression %s (%s)", program, name_exprs[i],
                             ctx->nvrtc.nvrtcGetErrorString(r));
            goto done;
        }
        lowered[i] = oscar__strdup(ctx, low);
    }
    *out_cubin = cubin;
    *out_size = cubin_size;
    cubin = NULL;
done:
    if (st != OSCAR_OK)
        for (i = 0; i < n; i++) {
            oscar__free(ctx, lowered[i]);
            lowered[i] = NULL;
        }
    oscar__free(ctx, cubin);
    oscar__free(ctx, log);
    ctx->nvrtc.nvrtcDestroyProgram(&prog);
    return st;
}

/* ---- disk cache ------------------------------------------------------------ */
OSCAR__PRIVATE void oscar__cache_path(const oscar_ctx *ctx, const uint8_t key[32], char *out, size_t cap) {
    char hex[65];
    oscar__hex(key, 32, hex);
    snprintf(out, cap, "%s/%s.sm%d.nvrtc%d-%d.v%d.cubin", ctx->cache_dir, hex, ctx->sm, ctx->nvrtc_major,
             ctx->nvrtc_minor, OSCAR__JIT_FORMAT);
}

OSCAR__PRIVATE void oscar__put_u32(uint8_t *p, uint32_t v) {
    int i;
    for (i = 0; i < 4; i++) p[i] = OSCAR__CAST(uint8_t, v >> (8 * i));
}
OSCAR__PRIVATE void oscar__put_u64(uint8_t *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; i++) p[i] = OSCAR__CAST(uint8_t, v >> (8 * i));
}
OSCAR__PRIVATE uint32_t oscar__get_u32(const uint8_t *p) {
    return OSCAR__CAST(uint32_t, p[0]) | OSCAR__CAST(uint32_t, p[1]) << 8 | OSCAR__CAST(uint32_t, p[2]) << 16 |
           OSCAR__CAST(uint32_t, p[3]) << 24;
}
OSCAR__PRIVATE uint64_t oscar__get_u64(const uint8_t *p) {
    return OSCAR__CAST(uint64_t, oscar__get_u32(p)) | OSCAR__CAST(uint64_t, oscar__get_u32(p + 4)) << 32;
}

#define OSCAR__ENTRY_HEADER 56 /* 8 magic + 4 format + 4 name + 8 size + 32 sha */

OSCAR__PRIVATE void oscar__entry_digest(const char *lowered, uint32_t name_len, const char *cubin, uint64_t size,
                                uint8_t out[32]) {
    oscar__sha256 s;
    oscar__sha256_init(&s);
    oscar__sha256_update(&s, lowered, name_len);
    oscar__sha256_update(&s, cubin, OSCAR__CAST(size_t, size));
    oscar__sha256_final(&s, out);
}

/* Reads an entry: 1 = hit (outputs set), 0 = no file, -1 = present but bad. */
OSCAR__PRIVATE int oscar__disk_read(oscar_ctx *ctx, const char *path, char **out_lowered, char **out_cubin,
                            size_t *out_size) {
    FILE *f = fopen(path, "rb");
    uint8_t head[OSCAR__ENTRY_HEADER], digest[32];
    long file_size;
    uint32_t name_len;
    uint64_t cubin_size;
    char *lowered = NULL, *cubin = NULL;
    int result = -1;
    if (!f) return 0;
    if (fseek(f, 0, SEEK_END) != 0 || (file_size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) goto out;
    if (fread(head, 1, sizeof head, f) != sizeof head) goto out;
    if (memcmp(head, "OSCARJIT", 8) != 0 || oscar__get_u32(head + 8) != OSCAR__JIT_FORMAT) goto out;
    name_len = oscar__get_u32(head + 12);
    cubin_size = oscar__get_u64(head + 16);
    if (name_len == 0 || name_len > 4096 || cubin_size == 0 ||
        cubin_size != OSCAR__CAST(uint64_t, file_size) - OSCAR__ENTRY_HEADER - name_len)
        goto out;
    lowered = OSCAR__CAST(char *, oscar__alloc(ctx, name_len + 1));
    cubin = OSCAR__CAST(char *, oscar__alloc(ctx, OSCAR__CAST(size_t, cubin_size)));
    if (!lowered || !cubin) goto out;
    if (fread(lowered, 1, name_len, f) != name_len) goto out;
    lowered[name_len] = 0;
    if (fread(cubin, 1, OSCAR__CAST(size_t, cubin_size), f) != cubin_size) goto out;
    oscar__entry_digest(lowered, name_len, cubin, cubin_size, digest);
    if (memcmp(digest, head + 24, 32) != 0) goto out;
    *out_lowered = lowered;
    *out_cubin = cubin;
    *out_size = OSCAR__CAST(size_t, cubin_size);
    lowered = cubin = NULL;
    result = 1;
out:
    fclose(f);
    oscar__free(ctx, lowered);
    oscar__free(ctx, cubin);
    return result;
}

OSCAR__PRIVATE int oscar__write_all(int fd, const void *data, size_t n) {
    const char *p = OSCAR__CAST(const char *, data);
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += k;
        n -= OSCAR__CAST(size_t, k);
    }
    return 0;
}

/* Publishes an entry atomically: temp file, fsync, rename. Failure to write
   the cache is not an error of the call (the kernel is compiled): logged. */
OSCAR__PRIVATE void oscar__disk_write(oscar_ctx *ctx, const char *path, const char *lowered, const char *cubin, size_t size) {
    static int counter = 0;
    char tmp[1300];
    uint8_t head[OSCAR__ENTRY_HEADER];
    uint32_t name_len = OSCAR__CAST(uint32_t, strlen(lowered));
    int fd, n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", path, OSCAR__CAST(long, getpid()), n);
    memcpy(head, "OSCARJIT", 8);
    oscar__put_u32(head + 8, OSCAR__JIT_FORMAT);
    oscar__put_u32(head + 12, name_len);
    oscar__put_u64(head + 16, size);
    oscar__entry_digest(lowered, name_len, cubin, size, head + 24);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        oscar__info(ctx, "jit cache: cannot create %s: %s", tmp, strerror(errno));
        return;
    }
    if (oscar__write_all(fd, head, sizeof head) || oscar__write_all(fd, lowered, name_len) ||
        oscar__write_all(fd, cubin, size) || fsync(fd) != 0) {
        oscar__info(ctx, "jit cache: cannot write %s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return;
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        oscar__info(ctx, "jit cache: cannot rename %s: %s", tmp, strerror(errno));
        unlink(tmp);
    }
}

/* mkdir -p */
OSCAR__PRIVATE int oscar__mkdirs(const char *dir) {
    char buf[1024];
    size_t i, n = strlen(dir);
    if (n == 0 || n >= sizeof buf) return -1;
    memcpy(buf, dir, n + 1);
    for (i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == 0) {
            char c = buf[i];
            buf[i] = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
            buf[i] = c;
        }
    }
    return 0;
}

OSCAR__PRIVATE int oscar__disk_enabled(const oscar_ctx *ctx) { return ctx->cache_dir[0] != 0; }

/* ---- the kernel table ------------------------------------------------------ */
OSCAR__PRIVATE oscar__kernel *oscar__find_kernel(oscar_ctx *ctx, const uint8_t key[32]) {
    int i;
    for (i = 0; i < ctx->num_kernels; i++)
        if (memcmp(ctx->kernels[i]->key, key, 32) == 0) return ctx->kernels[i];
    return NULL;
}

OSCAR__PRIVATE oscar_status oscar__load_module(oscar_ctx *ctx, oscar__kernel *k, const char *cubin) {
    oscar__CUresult r;
    double t0;
    oscar_status st;
    if (ctx->compile_only) return OSCAR_OK;
    st = oscar__push(ctx);
    if (st != OSCAR_OK) return st;
    t0 = oscar__now_ms();
    r = ctx->cu.cuModuleLoadData(&k->module, cubin);
    if (r == 0) r = ctx->cu.cuModuleGetFunction(&k->function, k->module, k->lowered_name);
    k->info.module_load_ms = oscar__now_ms() - t0;
    if (r == 0 && ctx->trace_buffer) { /* a trace build: {buffer, CTA slots} into its constant */
        oscar__CUdeviceptr var = 0;
        size_t bytes = 0;
        unsigned long long v[2];
        v[0] = ctx->trace_buffer, v[1] = OSCAR__CAST(unsigned long long, oscar__trace_cta_slots(ctx));
        r = ctx->cu.cuModuleGetGlobal(&var, &bytes, k->module, "oscar_trace");
        if (r == 0 && bytes == sizeof v)
            r = ctx->cu.cuMemcpyHtoD(var, v, sizeof v);
        else if (r == OSCAR__CUDA_ERROR_NOT_FOUND)
            r = 0; /* a kernel without marks (ptxas kept no unused constant) */
    }
    oscar__pop(ctx);
    if (r != 0) return oscar__cu_fail(ctx, r, "cuModuleLoadData/cuModuleGetFunction (or the trace buffer's address)");
    return OSCAR_OK;
}

/* Finds or builds the kernel (program, name_expr): memory table, then disk,
   then NVRTC. Thread-safe. */
OSCAR__PRIVATE oscar_status oscar__jit_get(oscar_ctx *ctx, const char *program, const char *name_expr, oscar__kernel **out) {
    uint8_t key[32];
    char path[1200];
    char *cubin = NULL, *lowered = NULL;
    size_t size = 0;
    int lock_fd = -1, disk = 0;
    double t0;
    oscar_status st = OSCAR_OK;
    oscar__kernel *k;

    *out = NULL;
    if (ctx->backend == OSCAR_BACKEND_CPU)
        return oscar__fail(ctx, OSCAR_STATUS_INTERNAL, "oscar jit: the CPU backend compiles nothing");
    /* hot path: a string hash, no SHA-256 (the key is only needed on a miss) */
    {
        uint64_t h = oscar__fnv(oscar__fnv(0xcbf29ce484222325ULL, program), name_expr);
        int i;
        pthread_mutex_lock(&ctx->lock);
        for (i = 0; i < ctx->num_kernels; i++) {
            k = ctx->kernels[i];
            if (k->name_hash == h && strcmp(k->name_expression, name_expr) == 0 && strcmp(k->program, program) == 0) {
                ctx->stats.memory_hits++;
                pthread_mutex_unlock(&ctx->lock);
                *out = k;
                return OSCAR_OK;
            }
        }
        pthread_mutex_unlock(&ctx->lock);
    }
    oscar__jit_key(ctx, program, name_expr, key);
    pthread_mutex_lock(&ctx->lock);
    k = oscar__find_kernel(ctx, key);
    if (k) {
        ctx->stats.memory_hits++;
        pthread_mutex_unlock(&ctx->lock);
        *out = k;
        return OSCAR_OK;
    }
    if (oscar__disk_enabled(ctx)) {
        oscar__cache_path(ctx, key, path, sizeof path);
        t0 = oscar__now_ms();
        disk = oscar__disk_read(ctx, path, &lowered, &cubin, &size);
        if (disk < 0) {
            /* torn or corrupted: take the lock, look again, else rebuild */
            char lock_path[1300];
            ctx->stats.disk_rejects++;
            oscar__info(ctx, "jit cache: %s is corrupted or torn; recompiling", path);
            snprintf(lock_path, sizeof lock_path, "%s.lock", path);
            lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (lock_fd >= 0) flock(lock_fd, LOCK_EX);
            disk = oscar__disk_read(ctx, path, &lowered, &cubin, &size);
            if (disk < 0) disk = 0;
        } else if (disk == 0) {
            char lock_path[1300];
            snprintf(lock_path, sizeof lock_path, "%s.lock", path);
            lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
            if (lock_fd >= 0) flock(lock_fd, LOCK_EX);
            /* another process may have published while we waited */
            disk = oscar__disk_read(ctx, path, &lowered, &cubin, &size);
            if (disk < 0) disk = 0;
        }
        if (disk == 1) {
            ctx->stats.disk_hits++;
            ctx->stats.disk_load_ms += oscar__now_ms() - t0;
        }
    }
    if (disk != 1) {
        const char *names[1];
        if (ctx->desc.cache_mode == OSCAR_JIT_CACHE_CACHED_ONLY) {
            st = oscar__fail(ctx, OSCAR_STATUS_JIT_CACHE_MISS,
                             "oscar jit: %s from %s is not in the cache (%s) and compilation is disabled "
                             "(OSCAR_JIT_DISABLE=1 or cache_mode CACHED_ONLY); run oscar_jit_prewarm once with "
                             "compilation enabled",
                             name_expr, program, oscar__disk_enabled(ctx) ? ctx->cache_dir : "memory only");
            goto out;
        }
        names[0] = name_expr;
        t0 = oscar__now_ms();
        st = oscar__nvrtc_compile(ctx, program, names, 1, &cubin, &size, &lowered);
        if (st != OSCAR_OK) goto out;
        ctx->stats.compiles++;
        ctx->stats.compile_ms += oscar__now_ms() - t0;
        if (oscar__disk_enabled(ctx)) oscar__disk_write(ctx, path, lowered, cubin, size);
    }
    if (ctx->num_kernels == ctx->cap_kernels) {
        int cap = ctx->cap_kernels ? 2 * ctx->cap_kernels : 32;
        oscar__kernel **grown =
            OSCAR__CAST(oscar__kernel **, oscar__calloc(ctx, sizeof(oscar__kernel *) * OSCAR__CAST(size_t, cap)));
        if (!grown) {
            st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar jit: out of memory for the kernel table");
            goto out;
        }
        if (ctx->kernels) memcpy(grown, ctx->kernels, sizeof(oscar__kernel *) * OSCAR__CAST(size_t, ctx->num_kernels));
        oscar__free(ctx, ctx->kernels);
        ctx->kernels = grown;
        ctx->cap_kernels = cap;
    }
    /* kernels are allocated one by one, so a pointer handed out stays valid */
    k = OSCAR__CAST(oscar__kernel *, oscar__calloc(ctx, sizeof *k));
    if (!k) {
        st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar jit: out of memory for a kernel record");
        goto out;
    }
    memcpy(k->key, key, 32);
    k->name_hash = oscar__fnv(oscar__fnv(0xcbf29ce484222325ULL, program), name_expr);
    k->program = oscar__strdup(ctx, program);
    k->name_expression = oscar__strdup(ctx, name_expr);
    k->lowered_name = lowered;
    lowered = NULL;
    snprintf(k->info.program, sizeof k->info.program, "%s", program);
    snprintf(k->info.name_expression, sizeof k->info.name_expression, "%s", name_expr);
    k->info.origin = disk == 1 ? 2 : 1;
    k->info.ms = oscar__now_ms() - t0;
    st = oscar__load_module(ctx, k, cubin);
    if (st != OSCAR_OK) {
        oscar__free(ctx, k->name_expression);
        oscar__free(ctx, k->program);
        oscar__free(ctx, k->lowered_name);
        oscar__free(ctx, k);
        goto out;
    }
    ctx->kernels[ctx->num_kernels++] = k;
    if (getenv("OSCAR_JIT_VERBOSE"))
        oscar__info(ctx, "jit: %s %s in %.1f ms", k->info.origin == 1 ? "compiled" : "loaded from disk", name_expr,
                    k->info.ms);
    *out = k;
out:
    if (lock_fd >= 0) {
        flock(lock_fd, LOCK_UN);
        close(lock_fd);
    }
    pthread_mutex_unlock(&ctx->lock);
    oscar__free(ctx, cubin);
    oscar__free(ctx, lowered);
    return st;
}

/* Launches a kernel whose only parameter is a params struct passed by value.
   pdl: allow programmatic dependent launch (sm_90+; the kernel must call
   griddepcontrol.wait before reading what the previous kernel wrote). */
OSCAR__PRIVATE oscar_status oscar__launch_ex(const oscar_ctx *ctx, oscar__kernel *k, unsigned gx, unsigned gy,
                                             unsigned gz, unsigned block, unsigned smem, oscar_stream stream,
                                             void *params, int pdl) {
    void *args[1];
    oscar__CUresult r;
    int pushed;
    if (ctx->compile_only)
        return oscar__fail(ctx, OSCAR_STATUS_NEEDS_DEVICE, "%s: the context is compile-only (sm_%d); nothing can run",
                           k->info.name_expression, ctx->sm);
    args[0] = params;
    pushed = oscar__push_if_needed(ctx);
    if (pushed < 0) return oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "cuCtxPushCurrent failed");
    if (smem > 48 * 1024) {
        /* under the context's lock: threads sharing a context may launch the
           same kernel with different sizes (the field is read and raised) */
        pthread_mutex_t *lock = &OSCAR__UNCONST(oscar_ctx *, ctx)->lock;
        r = 0;
        pthread_mutex_lock(lock);
        if (OSCAR__CAST(int32_t, smem) > k->max_dynamic_smem_set) {
            r = ctx->cu.cuFuncSetAttribute(k->function, OSCAR__CU_FUNC_ATTR_MAX_DYNAMIC_SMEM, OSCAR__CAST(int, smem));
            if (r == 0) k->max_dynamic_smem_set = OSCAR__CAST(int32_t, smem);
        }
        pthread_mutex_unlock(lock);
        if (r != 0) {
            if (pushed) oscar__pop(ctx);
            return oscar__cu_fail(ctx, r, "cuFuncSetAttribute(max dynamic shared memory)");
        }
    }
    if (pdl && ctx->sm >= 90 && ctx->cu.cuLaunchKernelEx) {
        oscar__CUlaunchAttribute attr;
        oscar__CUlaunchConfig cfg;
        memset(&attr, 0, sizeof attr);
        memset(&cfg, 0, sizeof cfg);
        attr.id = OSCAR__CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.value = 1;
        cfg.grid_x = gx, cfg.grid_y = gy, cfg.grid_z = gz, cfg.block_x = block, cfg.block_y = 1, cfg.block_z = 1;
        cfg.smem_bytes = smem, cfg.stream = stream, cfg.attrs = &attr, cfg.num_attrs = 1;
        r = ctx->cu.cuLaunchKernelEx(&cfg, k->function, args, NULL);
    } else {
        r = ctx->cu.cuLaunchKernel(k->function, gx, gy, gz, block, 1, 1, smem, stream, args, NULL);
    }
    if (pushed) oscar__pop(ctx);
    if (r != 0) return oscar__cu_fail(ctx, r, k->info.name_expression);
    return OSCAR_OK;
}

OSCAR__PRIVATE oscar_status oscar__launch3(const oscar_ctx *ctx, oscar__kernel *k, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned block, unsigned smem, oscar_stream stream, void *params) {
    return oscar__launch_ex(ctx, k, gx, gy, gz, block, smem, stream, params, 0);
}
OSCAR__PRIVATE oscar_status oscar__launch(const oscar_ctx *ctx, oscar__kernel *k, unsigned gx, unsigned block,
                                         unsigned smem, oscar_stream stream, void *params) {
    return oscar__launch_ex(ctx, k, gx, 1, 1, block, smem, stream, params, 0);
}

#endif /* OSCAR_JIT_H_INCLUDED */
