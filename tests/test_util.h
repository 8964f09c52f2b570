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
/* A fresh seed per test from the clock, or OSCAR_TEST_SEED's (decimal or
   0x hex) to replay a run; the seed is logged (shown with --verbose). */
static inline tu_rng tu_seed(void) {
    tu_rng r;
    const char *env = getenv("OSCAR_TEST_SEED");
    if (env && *env) {
        r.s = strtoull(env, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r.s = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ULL ^ (uint64_t)ts.tv_sec ^ 0xD1B54A32D192ED03ULL;
    }
    if (!r.s) r.s = 1;
    cr_log_info("seed %llu (OSCAR_TEST_SEED=%llu replays it)", (unsigned long long)r.s, (unsigned long long)r.s);
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

/* A context on device 0 (with a kernel trace of trace_records records when
   > 0), or the test skipped without one. */
static inline oscar_ctx *tu_gpu_ctx_traced_or_skip(int32_t trace_records) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_status st;
    desc.trace_records = trace_records;
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_STATUS_NO_DRIVER || st == OSCAR_STATUS_NO_DEVICE) {
        cr_skip_test("no CUDA device: %s: %s", oscar_status_string(st), oscar_last_error(NULL));
    }
    cr_assert(st == OSCAR_OK, "oscar_setup: %s: %s", oscar_status_string(st), oscar_last_error(NULL));
    return ctx;
}
static inline oscar_ctx *tu_gpu_ctx_or_skip(void) { return tu_gpu_ctx_traced_or_skip(0); }

/* The kernel trace's records of one kernel (one launch since the reset):
   every CTA that entered also reached DONE, each mark at most once, in time
   order (ENTRY <= WAITED <= LOOP_END <= DONE where present), and no CTA has
   marks without ENTRY. Returns the number of CTAs that entered; *t_min /
   *t_max are widened to the kernel's first and last mark. */
static inline int tu_trace_ctas(const oscar_trace_record *rec, int n, int kernel, uint64_t *t_min, uint64_t *t_max) {
    uint32_t max_cta = 0, c;
    uint64_t(*t)[OSCAR__TRACE_MARK_COUNT];
    int i, m, ctas = 0;
    for (i = 0; i < n; i++)
        if (rec[i].kernel == kernel && rec[i].cta > max_cta) max_cta = rec[i].cta;
    t = (uint64_t(*)[OSCAR__TRACE_MARK_COUNT])calloc((size_t)max_cta + 1, sizeof *t);
    cr_assert(t != NULL);
    for (i = 0; i < n; i++) {
        const oscar_trace_record *r = &rec[i];
        cr_assert(r->kernel > 0 && r->kernel < OSCAR__TRACE_KERNEL_COUNT, "record %d: kernel id %d", i, r->kernel);
        cr_assert(r->mark < OSCAR__TRACE_MARK_COUNT, "record %d: mark id %d", i, r->mark);
        cr_assert(r->time_ns != 0, "record %d: time 0", i);
        if (r->kernel != kernel) continue;
        cr_assert(t[r->cta][r->mark] == 0, "%s CTA %u: mark %s twice", oscar_trace_kernel_name(kernel), r->cta,
                  oscar_trace_mark_name(r->mark));
        t[r->cta][r->mark] = r->time_ns;
        if (r->time_ns < *t_min) *t_min = r->time_ns;
        if (r->time_ns > *t_max) *t_max = r->time_ns;
    }
    for (c = 0; c <= max_cta; c++) {
        uint64_t prev = t[c][0];
        if (!t[c][0]) {
            for (m = 1; m < OSCAR__TRACE_MARK_COUNT; m++)
                cr_assert(t[c][m] == 0, "%s CTA %u: mark %s without entry", oscar_trace_kernel_name(kernel), c,
                          oscar_trace_mark_name(m));
            continue;
        }
        ctas++;
        cr_assert(t[c][OSCAR_TRACE_DONE] != 0, "%s CTA %u entered but has no done mark", oscar_trace_kernel_name(kernel), c);
        for (m = 1; m < OSCAR__TRACE_MARK_COUNT; m++) {
            if (!t[c][m]) continue;
            cr_assert(t[c][m] >= prev, "%s CTA %u: mark %s before the one before it", oscar_trace_kernel_name(kernel), c,
                      oscar_trace_mark_name(m));
            prev = t[c][m];
        }
    }
    free(t);
    return ctas;
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
