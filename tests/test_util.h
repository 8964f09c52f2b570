/* tests/test_util.h -- helpers shared by the Criterion suites: random
   numbers, CUDA runtime checks, the GPU-or-skip context, host/device buffers.
   Each suite is one translation unit that defines OSCAR_IMPLEMENTATION. */
#ifndef OSCAR_TEST_UTIL_H
#define OSCAR_TEST_UTIL_H

#include <criterion/criterion.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- random numbers: xorshift64*, seeded per test from the clock ---------- */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;
static inline uint64_t tu_next(tu_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}
static inline tu_rng tu_seed(void) {
    tu_rng r;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r.s = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ (uint64_t)ts.tv_sec ^ 0xD1B54A32D192ED03ULL;
    if (!r.s) r.s = 1;
    return r;
}
static inline double tu_uniform(tu_rng *r) { return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0); }
static inline double tu_normal(tu_rng *r) {
    double u = tu_uniform(r), v = tu_uniform(r);
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static inline int64_t tu_int(tu_rng *r, int64_t n) { return (int64_t)(tu_next(r) % (uint64_t)n); }
/* Random permutation of [0, n). */
static inline void tu_permutation(tu_rng *r, int64_t *out, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) out[i] = i;
    for (i = n - 1; i > 0; i--) {
        int64_t j = tu_int(r, i + 1), t = out[i];
        out[i] = out[j];
        out[j] = t;
    }
}

/* ---- CUDA runtime --------------------------------------------------------- */
#define TU_CUDA(call)                                                                                                \
    do {                                                                                                             \
        cudaError_t tu_e = (call);                                                                                   \
        cr_assert(tu_e == cudaSuccess, "%s failed: %s", #call, cudaGetErrorString(tu_e));                          \
    } while (0)
#define TU_OK(ctx, call)                                                                                             \
    do {                                                                                                             \
        oscar_status tu_st = (call);                                                                                 \
        cr_assert(tu_st == OSCAR_OK, "%s -> %s: %s", #call, oscar_status_string(tu_st), oscar_last_error(ctx));     \
    } while (0)

/* Sets up a device context, or skips the test with the reason. */
static inline oscar_ctx *tu_gpu_ctx_or_skip(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_STATUS_NO_DRIVER || st == OSCAR_STATUS_NO_DEVICE) {
        cr_skip_test("no CUDA device: %s: %s", oscar_status_string(st), oscar_last_error(NULL));
    }
    cr_assert(st == OSCAR_OK, "oscar_setup: %s: %s", oscar_status_string(st), oscar_last_error(NULL));
    return ctx;
}

static inline void *tu_dev_alloc(size_t n) {
    void *p = NULL;
    TU_CUDA(cudaMalloc(&p, n ? n : 1));
    return p;
}
static inline void *tu_dev_upload(const void *host, size_t n) {
    void *p = tu_dev_alloc(n);
    TU_CUDA(cudaMemcpy(p, host, n, cudaMemcpyHostToDevice));
    return p;
}
static inline void tu_dev_download(void *host, const void *dev, size_t n) {
    TU_CUDA(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost));
}
static inline void *tu_xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    cr_assert(p != NULL, "out of host memory (%zu bytes)", n);
    return p;
}

/* A temporary folder for a disk cache; removed by tu_rmtree. */
static inline void tu_tempdir(char *out, size_t cap, const char *tag) {
    snprintf(out, cap, "/tmp/oscar-test-%s-XXXXXX", tag);
    cr_assert(mkdtemp(out) != NULL, "mkdtemp failed");
}
static inline void tu_rmtree(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", dir);
}

#endif
