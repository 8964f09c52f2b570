/* tests/test_calib_gpu.c -- the CUDA backend of calibration (calib.cuh)
   against the CPU backend (itself checked against the reference math in
   test_calib_cpu.c): 32K tokens x 32 query heads at D = 128, every head dim
   and input dtype, strided (fused QKV) inputs, host-memory staging, sparse
   layer ids, warm-up skipping, statistics views and export/import, bitwise
   determinism, and cuSOLVER against LAPACK.
   Tolerance: both backends sum float64 products exactly rounded; only the
   summation order differs, so statistics agree to max|Δ|/max|S| <= 1e-12
   (measured values are logged). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"
#include "calib_ref.h"

#define STATS_TOL 1e-12

static oscar_ctx *cpu_ctx(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    return ctx;
}

/* Fused QKV activations, as engines hold them: [n][Hq + 2 Hkv][D]. */
typedef struct fused {
    int64_t n;
    int Hq, Hkv, D;
    oscar_dtype dtype;
    act_buf buf;
    void *dev;
} fused;

static fused make_fused(tu_rng *r, int64_t n, int Hq, int Hkv, int D, oscar_dtype dtype) {
    fused f;
    int64_t H = Hq + 2 * Hkv, t;
    int h, d;
    double *M = cr_dalloc((size_t)D * D);
    f.n = n, f.Hq = Hq, f.Hkv = Hkv, f.D = D, f.dtype = dtype;
    f.buf = act_alloc((size_t)(n * H * D), dtype);
    random_orthogonal(r, D, M);
    for (t = 0; t < n; t++)
        for (h = 0; h < H; h++) {
            double tok = 0.5 + tu_uniform(r), x[256];
            int e;
            for (d = 0; d < D; d++) {
                double sc = pow(10.0, -1.0 + 2.0 * ((d * 37 + h) % D) / D) * ((d + h) % 41 == 3 ? 20.0 : 1.0);
                x[d] = tu_normal(r) * sc * tok + (d % 17 == 1 ? 4.0 : 0.0);
            }
            if (h < Hq) /* queries through a fixed mixing: a covariance unlike K's */
                for (d = 0; d < D; d++) {
                    double s = 0;
                    for (e = 0; e < D; e++) s += x[e] * M[e * D + d];
                    act_set(&f.buf, (size_t)((t * H + h) * D + d), s);
                }
            else
                for (d = 0; d < D; d++) act_set(&f.buf, (size_t)((t * H + h) * D + d), x[d]);
        }
    f.dev = tu_dev_upload(f.buf.data, f.buf.count * (dtype == OSCAR_DTYPE_F32 ? 4 : 2));
    free(M);
    return f;
}
static void free_fused(fused *f) {
    act_free(&f->buf);
    cudaFree(f->dev);
}

/* Feeds tokens [t0, t1) of one layer, in the given chunk sizes (cycled), from
   device memory (host = 0), host memory (host = 1, CUDA staging) or for the
   CPU backend (host = 2). */
static void feed(oscar_calib *c, const fused *f, int32_t layer, int64_t t0, int64_t t1, const int64_t *chunks, int nch,
                 int host, oscar_stream stream) {
    size_t es = f->dtype == OSCAR_DTYPE_F32 ? 4 : 2;
    int64_t H = f->Hq + 2 * f->Hkv, ts = H * f->D, t = t0;
    const char *base = host ? (const char *)f->buf.data : (const char *)f->dev;
    int i = 0;
    while (t < t1) {
        oscar_calib_batch_desc b = {0};
        int64_t n = chunks[i++ % nch];
        if (n > t1 - t) n = t1 - t;
        b.layer_id = layer;
        b.num_tokens = n;
        b.dtype = f->dtype;
        b.q = base + (size_t)(t * ts) * es;
        b.k = base + (size_t)(t * ts + f->Hq * f->D) * es;
        b.v = base + (size_t)(t * ts + (f->Hq + f->Hkv) * f->D) * es;
        b.q_token_stride = b.k_token_stride = b.v_token_stride = ts;
        b.host_memory = host == 1;
        TU_OK(NULL, oscar_calib_accumulate(c, &b, stream));
        t += n;
    }
}

static oscar_calib *make_calib(oscar_ctx *ctx, const fused *f, int L, const int32_t *ids, int skip, int tensor) {
    oscar_calib_desc d = {0};
    oscar_calib *c = NULL;
    d.num_layers = L, d.layer_ids = ids, d.head_dim = f->D, d.num_q_heads = f->Hq, d.num_kv_heads = f->Hkv;
    d.skip_first_chunks = skip, d.tensor_targets = tensor;
    TU_OK(ctx, oscar_calib_create(ctx, &d, &c));
    return c;
}

static double *stats(oscar_calib *c, int64_t *count) {
    oscar_calib_stats v = {0};
    double *s;
    TU_OK(NULL, oscar_calib_stats_view(c, &v));
    s = cr_dalloc((size_t)v.count);
    TU_OK(NULL, oscar_calib_export_stats(c, s, v.count, NULL));
    *count = v.count;
    return s;
}

/* Both passes on GPU and CPU; returns the worse relative difference. */
static double compare_backends(oscar_ctx *gpu, oscar_ctx *cpu, const fused *f, int L, const int32_t *ids, int skip,
                               int host, const int64_t *gch, int ngch, const int64_t *cch, int ncch, const char *what) {
    oscar_calib *g = make_calib(gpu, f, L, ids, skip, 1), *c = make_calib(cpu, f, L, ids, skip, 1);
    double worst = 0, d;
    double *sg, *sc;
    int64_t ng, nc;
    int pass, l;
    for (pass = 0; pass < 2; pass++) {
        for (l = 0; l < L; l++) {
            feed(g, f, ids ? ids[l] : l, 0, f->n, gch, ngch, host, NULL);
            feed(c, f, ids ? ids[l] : l, 0, f->n, cch, ncch, 2, NULL);
        }
        TU_CUDA(cudaDeviceSynchronize());
        sg = stats(g, &ng), sc = stats(c, &nc);
        cr_assert_eq(ng, nc);
        d = rel_maxdiff(sg, sc, (size_t)ng);
        cr_log_info("%s pass %d: GPU vs CPU statistics max|Δ|/max|S| = %.2e (%lld doubles)", what, pass + 1, d,
                    (long long)ng);
        cr_assert(d <= STATS_TOL, "%s pass %d: GPU vs CPU %g", what, pass + 1, d);
        for (l = 0; l < L; l++) /* token counts are exact */
            cr_assert_eq(sg[(size_t)l * (size_t)(ng / L)], sc[(size_t)l * (size_t)(nc / L)]);
        worst = fmax(worst, d);
        free(sg), free(sc);
        if (pass == 0) {
            TU_OK(gpu, oscar_calib_begin_score_pass(g, NULL));
            TU_OK(cpu, oscar_calib_begin_score_pass(c, NULL));
        }
    }
    oscar_calib_destroy(g);
    oscar_calib_destroy(c);
    return worst;
}

Test(calib_gpu, matches_cpu_at_32k_tokens_32_query_heads, .timeout = 900) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    fused f = make_fused(&r, 32768, 32, 8, 128, OSCAR_DTYPE_BF16);
    static const int64_t gch[3] = {4096, 8191, 3}, cch[1] = {32768};
    compare_backends(gpu, cpu, &f, 1, NULL, 0, 0, gch, 3, cch, 1, "D=128 32K tokens 32q/8kv bf16");
    free_fused(&f);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* Throughput of one layer of 32K tokens (32 query / 8 KV heads, D = 128, bf16),
   kernels already compiled: logged for bench/results, no threshold. */
Test(calib_gpu, throughput_one_layer_32k_tokens, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip();
    tu_rng r = tu_seed();
    fused f = make_fused(&r, 32768, 32, 8, 128, OSCAR_DTYPE_BF16);
    static const int64_t all[1] = {32768};
    oscar_calib *c = make_calib(gpu, &f, 2, NULL, 0, 0);
    cudaEvent_t e0, e1, e2, e3;
    float ms1 = 0, ms2 = 0;
    double fma1 = 32768.0 * 32 * 128 * 128 / 2, fma2 = 32768.0 * 8 * (128.0 * 128 + 128.0 * 128 / 2);
    TU_CUDA(cudaEventCreate(&e0));
    TU_CUDA(cudaEventCreate(&e1));
    TU_CUDA(cudaEventCreate(&e2));
    TU_CUDA(cudaEventCreate(&e3));
    feed(c, &f, 1, 0, f.n, all, 1, 0, NULL); /* layer 1: compiles the kernels, sizes the workspaces */
    TU_CUDA(cudaEventRecord(e0, NULL));
    feed(c, &f, 0, 0, f.n, all, 1, 0, NULL);
    TU_CUDA(cudaEventRecord(e1, NULL));
    TU_OK(gpu, oscar_calib_begin_score_pass(c, NULL));
    feed(c, &f, 1, 0, f.n, all, 1, 0, NULL);
    TU_CUDA(cudaEventRecord(e2, NULL));
    feed(c, &f, 0, 0, f.n, all, 1, 0, NULL);
    TU_CUDA(cudaEventRecord(e3, NULL));
    TU_CUDA(cudaEventSynchronize(e3));
    TU_CUDA(cudaEventElapsedTime(&ms1, e0, e1));
    TU_CUDA(cudaEventElapsedTime(&ms2, e2, e3));
    cr_log_info("one layer, 32768 tokens, 32q/8kv, D=128, bf16: query pass %.2f ms (%.0f GFMA/s fp64), score pass %.2f ms "
                "(%.0f GFMA/s fp64)",
                ms1, fma1 / (ms1 * 1e6), ms2, fma2 / (ms2 * 1e6));
    cudaEventDestroy(e0), cudaEventDestroy(e1), cudaEventDestroy(e2), cudaEventDestroy(e3);
    oscar_calib_destroy(c);
    free_fused(&f);
    oscar_shutdown(gpu);
}

Test(calib_gpu, every_head_dim_and_dtype_strided, .timeout = 900) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[3] = {64, 128, 256};
    static const oscar_dtype dtypes[3] = {OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32};
    static const int64_t gch[4] = {1, 700, 33, 17}, cch[2] = {500, 1};
    int32_t ids[2] = {3, 11};
    int di, ti;
    for (di = 0; di < 3; di++)
        for (ti = 0; ti < 3; ti++) {
            char what[96];
            fused f = make_fused(&r, 1001, 12, 4, dims[di], dtypes[ti]);
            snprintf(what, sizeof what, "D=%d dtype %d fused QKV, layers 3 and 11", dims[di], ti);
            compare_backends(gpu, cpu, &f, 2, ids, 0, 0, gch, 4, cch, 2, what);
            free_fused(&f);
        }
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

Test(calib_gpu, host_memory_staging_and_warmup_skip, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    fused f = make_fused(&r, 2000, 8, 1, 128, OSCAR_DTYPE_BF16); /* MQA: one KV head */
    static const int64_t gch[3] = {6, 1000, 994}, cch[3] = {6, 1, 1993};
    compare_backends(gpu, cpu, &f, 1, NULL, 1, 1, gch, 3, cch, 3, "host memory, MQA, warm-up chunk skipped");
    free_fused(&f);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

Test(calib_gpu, deterministic_and_stats_views_on_device, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip();
    tu_rng r = tu_seed();
    fused f = make_fused(&r, 3000, 16, 4, 128, OSCAR_DTYPE_BF16);
    static const int64_t ch[2] = {1500, 1500};
    oscar_calib *a = make_calib(gpu, &f, 1, NULL, 0, 0), *b = make_calib(gpu, &f, 1, NULL, 0, 0);
    oscar_calib_stats view = {0};
    cudaStream_t s;
    double *sa, *sb, *sv;
    int64_t n;
    TU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    feed(a, &f, 0, 0, f.n, ch, 2, 0, (oscar_stream)s);
    feed(b, &f, 0, 0, f.n, ch, 2, 0, NULL);
    TU_CUDA(cudaStreamSynchronize(s));
    TU_CUDA(cudaDeviceSynchronize());
    sa = stats(a, &n), sb = stats(b, &n);
    cr_assert(memcmp(sa, sb, sizeof(double) * (size_t)n) == 0, "same inputs and chunks: the same bits");
    TU_OK(gpu, oscar_calib_stats_view(a, &view));
    cr_assert(view.on_device && view.pass == OSCAR_CALIB_PASS_QUERY && view.count == n);
    sv = cr_dalloc((size_t)n);
    TU_CUDA(cudaMemcpy(sv, view.data, sizeof(double) * (size_t)n, cudaMemcpyDeviceToHost));
    cr_assert(memcmp(sv, sa, sizeof(double) * (size_t)n) == 0, "the view is the statistics");
    /* in-place all-reduce of two ranks, simulated: b's statistics added on the device through the view */
    {
        int64_t i;
        for (i = 0; i < n; i++) sv[i] = sa[i] + sb[i];
        TU_OK(gpu, oscar_calib_import_stats(b, sv, n, (oscar_stream)s));
        free(sb);
        sb = stats(b, &n);
        cr_assert(memcmp(sb, sv, sizeof(double) * (size_t)n) == 0);
        cr_assert_eq(sb[0], 6000.0, "token count doubled");
    }
    TU_CUDA(cudaStreamDestroy(s));
    oscar_calib_destroy(a), oscar_calib_destroy(b);
    free(sa), free(sb), free(sv);
    free_fused(&f);
    oscar_shutdown(gpu);
}

/* Planted covariance (distinct eigenvalues): cuSOLVER and LAPACK agree on the
   eigenvalues and, after the sign convention, on the eigenvectors. */
Test(calib_gpu, cusolver_matches_lapack_and_rotations_are_orthogonal, .timeout = 600) {
    enum { D = 128 };
    oscar_ctx *gpu = tu_gpu_ctx_or_skip();
    tu_rng r = tu_seed();
    double *U0 = cr_dalloc(D * D), lam[D], z[D];
    const int64_t n = 4096;
    act_buf q = act_alloc((size_t)n * 4 * D, OSCAR_DTYPE_F32);
    void *dq;
    oscar_calib_desc cd = {0};
    oscar_calib_batch_desc b = {0};
    oscar_calib_finish_desc fd = {0};
    oscar_calib *c;
    oscar_rotation_set *ks, *kl = NULL, *kh;
    oscar_rotation_set_info is = {0}, il = {0}, ih = {0};
    oscar_status st;
    int64_t t;
    int i, j;
    random_orthogonal(&r, D, U0);
    for (i = 0; i < D; i++) lam[i] = pow(1.1, i) * 0.01;
    for (t = 0; t < n * 4; t++) {
        for (i = 0; i < D; i++) z[i] = tu_normal(&r) * sqrt(lam[i]);
        for (j = 0; j < D; j++) {
            double x = 0;
            for (i = 0; i < D; i++) x += U0[j * D + i] * z[i];
            act_set(&q, (size_t)(t * D + j), x);
        }
    }
    dq = tu_dev_upload(q.data, q.count * 4);
    cd.num_layers = 1, cd.head_dim = D, cd.num_q_heads = 4, cd.num_kv_heads = 2;
    TU_OK(gpu, oscar_calib_create(gpu, &cd, &c));
    b.num_tokens = n, b.q = dq, b.dtype = OSCAR_DTYPE_F32;
    TU_OK(gpu, oscar_calib_accumulate(c, &b, NULL));
    fd.composition = OSCAR_ROTATION_U;
    fd.eigensolver = OSCAR_EIGENSOLVER_CUSOLVER;
    TU_OK(gpu, oscar_calib_finish(c, &fd, &ks, NULL, NULL));
    fd.composition = OSCAR_ROTATION_U_H_PBR;
    TU_OK(gpu, oscar_calib_finish(c, &fd, &kh, NULL, NULL));
    oscar_rotation_set_query(ks, &is);
    oscar_rotation_set_query(kh, &ih);
    cr_assert(oscar__orthogonality_error(ih.rotations, D) <= 1e-5, "cuSOLVER U·H·P_br max|RRᵀ-I| = %g",
              oscar__orthogonality_error(ih.rotations, D));
    cr_assert_str_eq(ih.objective, "qqt_r_h_pbr");
    for (i = 0; i < D; i++) cr_assert(fabs(is.eigenvalues[i] / lam[i] - 1) < 0.2, "λ_%d %g vs planted %g", i, is.eigenvalues[i], lam[i]);
    fd.composition = OSCAR_ROTATION_U;
    fd.eigensolver = OSCAR_EIGENSOLVER_LAPACK;
    st = oscar_calib_finish(c, &fd, &kl, NULL, NULL);
    if (st == OSCAR_STATUS_UNSUPPORTED) {
        cr_log_warn("no LAPACK on this machine, cuSOLVER checked alone: %s", oscar_last_error(gpu));
    } else {
        double de = 0, dv = 0;
        TU_OK(gpu, st);
        oscar_rotation_set_query(kl, &il);
        for (i = 0; i < D; i++) de = fmax(de, fabs(is.eigenvalues[i] - il.eigenvalues[i]) / il.eigenvalues[D - 1]);
        for (i = 0; i < D * D; i++) dv = fmax(dv, fabs(is.rotations[i] - il.rotations[i]));
        cr_log_info("cuSOLVER vs LAPACK: eigenvalues %.2e (relative to the largest), eigenvectors %.2e", de, dv);
        cr_assert(de < 1e-6 && dv < 1e-4, "cuSOLVER vs LAPACK: %g %g", de, dv);
        oscar_rotation_set_destroy(kl);
    }
    oscar_rotation_set_destroy(ks), oscar_rotation_set_destroy(kh);
    oscar_calib_destroy(c);
    cudaFree(dq);
    act_free(&q);
    free(U0);
    oscar_shutdown(gpu);
}

/* No device needed: a compile-only context refuses to calibrate, clearly. */
Test(calib_gpu, compile_only_context_refuses) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_calib_desc cd = {0};
    oscar_calib *c = NULL;
    oscar_status st;
    desc.compile_only_sm = 90;
    desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY;
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_STATUS_NO_NVRTC) cr_skip_test("no NVRTC: %s", oscar_last_error(NULL));
    TU_OK(NULL, st);
    cd.num_layers = 1, cd.head_dim = 128, cd.num_q_heads = 8, cd.num_kv_heads = 8;
    cr_assert_eq(oscar_calib_create(ctx, &cd, &c), OSCAR_STATUS_NEEDS_DEVICE);
    cr_assert(strstr(oscar_last_error(ctx), "compile-only") != NULL, "%s", oscar_last_error(ctx));
    cd.head_dim = 32;
    cr_assert_eq(oscar_calib_create(ctx, &cd, &c), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "64, 128 or 256 on the CUDA backend") != NULL, "%s", oscar_last_error(ctx));
    oscar_shutdown(ctx);
}
