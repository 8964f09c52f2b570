/* bench/oscar_demo.c -- the main job: JIT-compile oscar's kernels for the GPU
   it finds, check them against the CPU reference and time them. With no GPU
   it says why, runs the same pipeline on the CPU backend, and JIT-compiles the
   kernels for sm_90 in a compile-only context to show the toolchain works. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "bench_util.h"

#include <math.h>

/* A small INT2 pool filled with random codes and scales, dequantized. */
static int run_dequant(oscar_ctx *ctx, int on_gpu) {
    enum { D = 128, H = 8, PAGES = 64, PS = 16 };
    const int64_t T = PAGES * PS;
    oscar_int2_pool_desc pool = {0};
    oscar_dequant_desc dq = {0};
    size_t code_bytes, scale_bytes, out_bytes = (size_t)T * H * D * 2;
    uint8_t *codes, *scales;
    int32_t *slots = malloc(sizeof(int32_t) * (size_t)T);
    uint16_t *out = malloc(out_bytes), *ref = malloc(out_bytes);
    void *dcodes = NULL, *dscales = NULL, *dslots = NULL, *dout = NULL;
    oscar_ctx *cpu = NULL;
    oscar_desc cdesc = {0};
    int64_t i, mismatches = 0;
    double t0;
    pool.head_dim = D, pool.num_kv_heads = H, pool.num_pages = PAGES, pool.page_size = PS;
    BU_OK(ctx, oscar_int2_pool_bytes(ctx, &pool, &code_bytes, &scale_bytes));
    codes = malloc(code_bytes), scales = malloc(scale_bytes);
    for (i = 0; i < (int64_t)code_bytes; i++) codes[i] = (uint8_t)(i * 2654435761u >> 13);
    for (i = 0; i < (int64_t)scale_bytes / 4; i++) {
        uint16_t s = oscar__f32_to_f16(0.01f + 0.001f * (float)(i % 97));
        uint16_t m = oscar__f32_to_f16(-0.5f - 0.01f * (float)(i % 31));
        memcpy(scales + 4 * i, &s, 2);
        memcpy(scales + 4 * i + 2, &m, 2);
    }
    for (i = 0; i < T; i++) slots[i] = (int32_t)((i * 7919) % T);
    cdesc.backend = OSCAR_BACKEND_CPU;
    BU_OK(NULL, oscar_setup(&cdesc, &cpu));
    pool.k_codes = pool.v_codes = codes, pool.k_scales = pool.v_scales = scales;
    dq.slots = slots, dq.num_tokens = T, dq.k_out = ref;
    BU_OK(cpu, oscar_dequantize_kv(cpu, &pool, &dq, NULL));
    if (on_gpu) {
        BU_CUDA(cudaMalloc(&dcodes, code_bytes));
        BU_CUDA(cudaMalloc(&dscales, scale_bytes));
        BU_CUDA(cudaMalloc(&dslots, sizeof(int32_t) * (size_t)T));
        BU_CUDA(cudaMalloc(&dout, out_bytes));
        BU_CUDA(cudaMemcpy(dcodes, codes, code_bytes, cudaMemcpyHostToDevice));
        BU_CUDA(cudaMemcpy(dscales, scales, scale_bytes, cudaMemcpyHostToDevice));
        BU_CUDA(cudaMemcpy(dslots, slots, sizeof(int32_t) * (size_t)T, cudaMemcpyHostToDevice));
        BU_CUDA(cudaMemset(dout, 0xff, out_bytes));
        pool.k_codes = pool.v_codes = dcodes, pool.k_scales = pool.v_scales = dscales;
        dq.slots = dslots, dq.k_out = dout;
        t0 = oscar__now_ms();
        BU_OK(ctx, oscar_dequantize_kv(ctx, &pool, &dq, NULL));
        BU_CUDA(cudaDeviceSynchronize());
        printf("  dequantize %lld tokens x %d heads (D=%d), first call incl. JIT: %.1f ms\n", (long long)T, H, D,
               oscar__now_ms() - t0);
        BU_CUDA(cudaMemcpy(out, dout, out_bytes, cudaMemcpyDeviceToHost));
        for (i = 0; i < (int64_t)(out_bytes / 2); i++) mismatches += out[i] != ref[i];
        printf("  GPU vs CPU reference: %lld of %lld values differ (expected 0)\n", (long long)mismatches,
               (long long)(out_bytes / 2));
        cudaFree(dcodes), cudaFree(dscales), cudaFree(dslots), cudaFree(dout);
    } else {
        printf("  CPU backend: dequantized %lld tokens x %d heads (D=%d); first value %g\n", (long long)T, H, D,
               oscar__bf16_to_f32(ref[0]));
    }
    oscar_shutdown(cpu);
    free(codes), free(scales), free(slots), free(out), free(ref);
    return mismatches == 0 ? 0 : 1;
}

/* quantize on the GPU, decode on the GPU, both against the CPU backend */
static int run_pipeline(oscar_ctx *gpu) {
    enum { B = 4, HQ = 32, HKV = 8, D = 128, L = 4096, W = 320, PS = 16 };
    const int64_t np = L / PS, wnp = W / PS;
    oscar_ctx *cpu = NULL;
    oscar_desc cd = {0};
    oscar_int2_pool_desc pool = {0};
    oscar_window_pool_desc win = {0};
    size_t code_bytes, scale_bytes, n_src = (size_t)B * L * HKV * D, n_win = (size_t)B * W * HKV * D, i;
    uint16_t *k = malloc(n_src * 2), *v = malloc(n_src * 2), *wk = malloc(n_win * 2), *wv = malloc(n_win * 2);
    uint16_t *q = malloc((size_t)B * HQ * D * 2), *o_cpu = malloc((size_t)B * HQ * D * 2), *o_gpu = malloc((size_t)B * HQ * D * 2);
    float *R = malloc(sizeof(float) * D * D);
    int32_t *slots = malloc(sizeof(int32_t) * B * L), ip[B + 1], idx[B * L / PS], last[B], wip[B + 1], widx[B * W / PS], wlast[B];
    uint8_t *kc, *vc, *ks, *vs, *gk;
    void *d_k, *d_v, *d_wk, *d_wv, *d_q, *d_o, *d_R, *d_slots, *d_kc, *d_vc, *d_ks, *d_vs, *d_ip, *d_idx, *d_last, *d_wip,
        *d_widx, *d_wlast, *d_ws;
    oscar_quantize_desc qd = {0};
    oscar_decode_plan_desc pd = {0};
    oscar_decode_plan_info plan_c, plan_g;
    oscar_decode_run_desc rd = {0};
    double num = 0, den = 0, t0, t_run;
    size_t diff = 0;
    int b, x, y;
    uint64_t s = 12345;
    for (i = 0; i < n_src; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        k[i] = oscar__f32_to_bf16((float)((int64_t)(s >> 40) - (1 << 23)) / (1 << 22) * ((i % D) % 17 == 3 ? 8.f : 1.f));
        v[i] = oscar__f32_to_bf16((float)((int64_t)(s >> 20 & 0xFFFFFF) - (1 << 23)) / (1 << 22));
    }
    for (i = 0; i < n_win; i++) wk[i] = k[i], wv[i] = v[i];
    for (i = 0; i < (size_t)B * HQ * D; i++) q[i] = k[i * 7 % n_src];
    for (x = 0; x < D; x++)
        for (y = 0; y < D; y++) R[x * D + y] = (__builtin_popcount((unsigned)(x & y)) & 1 ? -1.f : 1.f) / sqrtf((float)D);
    for (i = 0; i < (size_t)B * L; i++) slots[i] = (int32_t)i;
    for (b = 0; b <= B; b++) ip[b] = (int32_t)(b * np), wip[b] = (int32_t)(b * wnp);
    for (i = 0; i < (size_t)B * np; i++) idx[i] = (int32_t)i;
    for (i = 0; i < (size_t)B * wnp; i++) widx[i] = (int32_t)i;
    for (b = 0; b < B; b++) last[b] = PS, wlast[b] = PS;
    pool.head_dim = D, pool.num_kv_heads = HKV, pool.num_pages = (int32_t)(B * np), pool.page_size = PS;
    pool.layout = OSCAR_KV_LAYOUT_HND;
    BU_OK(gpu, oscar_int2_pool_bytes(gpu, &pool, &code_bytes, &scale_bytes));
    kc = calloc(1, code_bytes), vc = calloc(1, code_bytes), ks = calloc(1, scale_bytes), vs = calloc(1, scale_bytes);
    gk = malloc(code_bytes);
    cd.backend = OSCAR_BACKEND_CPU;
    BU_OK(NULL, oscar_setup(&cd, &cpu));
    /* quantize (rotation of K and V, clip .96/.92) on the CPU backend ... */
    pool.k_codes = kc, pool.v_codes = vc, pool.k_scales = ks, pool.v_scales = vs;
    qd.pool = &pool, qd.src_k = k, qd.src_v = v, qd.k_rotation = R, qd.v_rotation = R, qd.num_tokens = B * L;
    qd.dst_slots = slots, qd.k_clip_ratio = 0.96f, qd.v_clip_ratio = 0.92f;
    BU_OK(cpu, oscar_quantize_kv(cpu, &qd, NULL));
    /* ... and on the GPU */
#define UP(dst, src, n)                                                                                            \
    do {                                                                                                           \
        BU_CUDA(cudaMalloc(&dst, n));                                                                             \
        BU_CUDA(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));                                                  \
    } while (0)
    UP(d_k, k, n_src * 2); UP(d_v, v, n_src * 2); UP(d_R, R, sizeof(float) * D * D); UP(d_slots, slots, sizeof(int32_t) * B * L);
    BU_CUDA(cudaMalloc(&d_kc, code_bytes)); BU_CUDA(cudaMalloc(&d_vc, code_bytes));
    BU_CUDA(cudaMalloc(&d_ks, scale_bytes)); BU_CUDA(cudaMalloc(&d_vs, scale_bytes));
    pool.k_codes = d_kc, pool.v_codes = d_vc, pool.k_scales = d_ks, pool.v_scales = d_vs;
    qd.src_k = d_k, qd.src_v = d_v, qd.k_rotation = d_R, qd.v_rotation = d_R, qd.dst_slots = d_slots;
    t0 = oscar__now_ms();
    BU_OK(gpu, oscar_quantize_kv(gpu, &qd, NULL));
    BU_CUDA(cudaDeviceSynchronize());
    printf("  quantize %d tokens x %d heads (rotate K and V, clip .96/.92), first call incl. JIT: %.0f ms\n", B * L, HKV,
           oscar__now_ms() - t0);
    BU_CUDA(cudaMemcpy(gk, d_kc, code_bytes, cudaMemcpyDeviceToHost));
    for (i = 0; i < code_bytes; i++) diff += gk[i] != kc[i];
    printf("  GPU vs CPU reference: %zu of %zu K code bytes differ (rotation rounding; 0 expected without rotation)\n",
           diff, code_bytes);
    /* decode: 4 requests, 4096 INT2 + 320 window tokens each */
    win.num_pages = (int32_t)(B * wnp), win.page_size = PS;
    pd.num_q_heads = HQ, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = B, pd.max_int2_tokens = L;
    pd.max_window_tokens = W;
    BU_OK(cpu, oscar_decode_plan(cpu, &pd, &plan_c));
    BU_OK(gpu, oscar_decode_plan(gpu, &pd, &plan_g));
    pool.k_codes = kc, pool.v_codes = vc, pool.k_scales = ks, pool.v_scales = vs;
    win.k = wk, win.v = wv;
    rd.int2_pool = &pool, rd.window_pool = &win;
    rd.int2_pages = (oscar_page_table){ip, idx, last};
    rd.window_pages = (oscar_page_table){wip, widx, wlast};
    rd.q = q, rd.o = o_cpu, rd.k_rotation = R, rd.v_rotation = R, rd.sm_scale = 1.0f / sqrtf((float)D);
    /* the CPU backend's plan needs no workspace (plan_c.workspace_bytes == 0) */
    BU_OK(cpu, oscar_decode_run(cpu, &plan_c, &rd, NULL));
    UP(d_wk, wk, n_win * 2); UP(d_wv, wv, n_win * 2); UP(d_q, q, (size_t)B * HQ * D * 2);
    UP(d_ip, ip, sizeof ip); UP(d_idx, idx, sizeof idx); UP(d_last, last, sizeof last);
    UP(d_wip, wip, sizeof wip); UP(d_widx, widx, sizeof widx); UP(d_wlast, wlast, sizeof wlast);
#undef UP
    BU_CUDA(cudaMalloc(&d_o, (size_t)B * HQ * D * 2));
    BU_CUDA(cudaMalloc(&d_ws, plan_g.workspace_bytes));
    pool.k_codes = d_kc, pool.v_codes = d_vc, pool.k_scales = d_ks, pool.v_scales = d_vs;
    win.k = d_wk, win.v = d_wv;
    rd.int2_pages = (oscar_page_table){d_ip, d_idx, d_last};
    rd.window_pages = (oscar_page_table){d_wip, d_widx, d_wlast};
    rd.q = d_q, rd.o = d_o, rd.k_rotation = d_R, rd.v_rotation = d_R, rd.workspace = d_ws;
    rd.workspace_bytes = plan_g.workspace_bytes;
    BU_OK(gpu, oscar_decode_run(gpu, &plan_g, &rd, NULL));
    BU_CUDA(cudaDeviceSynchronize());
    t0 = oscar__now_ms();
    for (x = 0; x < 20; x++) BU_OK(gpu, oscar_decode_run(gpu, &plan_g, &rd, NULL));
    BU_CUDA(cudaDeviceSynchronize());
    t_run = (oscar__now_ms() - t0) / 20;
    BU_CUDA(cudaMemcpy(o_gpu, d_o, (size_t)B * HQ * D * 2, cudaMemcpyDeviceToHost));
    for (i = 0; i < (size_t)B * HQ * D; i++) {
        double a = oscar__bf16_to_f32(o_gpu[i]), c = oscar__bf16_to_f32(o_cpu[i]);
        num += (a - c) * (a - c), den += c * c;
    }
    printf("  decode %d requests x (%d INT2 + %d bf16 window tokens), %d/%d heads: %.3f ms per step (wall clock),\n"
           "  relative difference to the CPU backend %.2e (bf16 outputs)\n",
           B, L, W, HQ, HKV, t_run, sqrt(num / den));
    oscar_shutdown(cpu);
    cudaFree(d_k), cudaFree(d_v), cudaFree(d_wk), cudaFree(d_wv), cudaFree(d_q), cudaFree(d_o), cudaFree(d_R);
    cudaFree(d_slots), cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_ks), cudaFree(d_vs), cudaFree(d_ip), cudaFree(d_idx);
    cudaFree(d_last), cudaFree(d_wip), cudaFree(d_widx), cudaFree(d_wlast), cudaFree(d_ws);
    free(k), free(v), free(wk), free(wv), free(q), free(o_cpu), free(o_gpu), free(R), free(slots);
    free(kc), free(vc), free(ks), free(vs), free(gk);
    return sqrt(num / den) < 1e-2 ? 0 : 1;
}

int main(int argc, char **argv) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_ctx_info info;
    oscar_status st;
    int rc = 0;
    (void)argc, (void)argv;
    printf("oscar.h %s demo\n", OSCAR_VERSION_STRING);
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_OK) {
        oscar_query_ctx_info(ctx, &info);
        printf("GPU: %s (sm_%d, %d SMs), driver %d, NVRTC %d; JIT cache: %s\n", info.device_name, info.sm, info.num_sms,
               info.driver_version, info.nvrtc_version, info.cache_dir[0] ? info.cache_dir : "memory only");
        rc |= run_dequant(ctx, 1);
        rc |= run_pipeline(ctx);
        oscar_shutdown(ctx);
        return rc;
    }
    printf("No usable CUDA GPU: %s -- %s\n", oscar_status_string(st), oscar_last_error(NULL));
    printf("Running the CPU backend (the C reference of every kernel) instead:\n");
    desc.backend = OSCAR_BACKEND_CPU;
    BU_OK(NULL, oscar_setup(&desc, &ctx));
    rc |= run_dequant(ctx, 0);
    oscar_shutdown(ctx);
    printf("And a compile-only context for sm_90 (no GPU needed): the kernels a model with head dim 128 and\n"
           "32 query / 8 KV heads needs, compiled by NVRTC, then loaded again from the disk cache:\n");
    {
        /* name prefixes: every quantize tile candidate (the tuner may pick any) */
        static const char *wanted[] = {"oscar::quantize_kernel<128, 128, 1, ", "oscar::decode_prep_kernel<128, 128, 4>",
                                       "oscar::decode_window_kernel<128, 1, 1, 4>",
                                       "oscar::decode_int2_kernel<128, 128, 16, 4, 1>", "oscar::decode_merge_kernel<128, 4, 1>",
                                       "oscar::dequant_kernel<128, 128, 16>"};
        char cache_dir[64] = "/tmp/oscar-demo-XXXXXX";
        int pass;
        if (!mkdtemp(cache_dir)) snprintf(cache_dir, sizeof cache_dir, "/tmp");
        for (pass = 0; pass < 2; pass++) {
            int32_t i, n = oscar_jit_instantiation_count(), w, prepared;
            oscar_jit_stats s;
            double t0;
            memset(&desc, 0, sizeof desc);
            desc.compile_only_sm = 90;
            desc.cache_dir = cache_dir; /* a fresh folder: the first pass is a true cold start */
            st = oscar_setup(&desc, &ctx);
            if (st != OSCAR_OK) {
                printf("  NVRTC unavailable: %s\n", oscar_last_error(NULL));
                return rc;
            }
            t0 = oscar__now_ms();
            prepared = 0;
            for (w = 0; w < (int)(sizeof wanted / sizeof wanted[0]); w++) {
                int matched = 0;
                for (i = 0; i < n; i++) {
                    const char *prog = NULL, *name = NULL;
                    oscar_jit_instantiation(i, &prog, &name);
                    if (strncmp(name, wanted[w], strlen(wanted[w])) == 0) {
                        BU_OK(ctx, oscar_jit_prepare(ctx, i));
                        prepared++, matched++;
                    }
                }
                /* a kernel's template parameters changed and this list did not
                   (session 14's merge DSPLIT left one prefix matching nothing) */
                if (!matched && !pass) {
                    printf("  oscar_demo: no registered instantiation is named %s...: this list is stale\n", wanted[w]);
                    rc = 1;
                }
            }
            oscar_query_jit_stats(ctx, &s);
            printf("  %s: %d kernels in %.0f ms (%lld compiled by NVRTC in %.0f ms, %lld disk hits in %.1f ms)\n",
                   pass ? "warm" : "cold", prepared, oscar__now_ms() - t0,
                   (long long)s.compiles, s.compile_ms, (long long)s.disk_hits, s.disk_load_ms);
            oscar_shutdown(ctx);
        }
        printf("  (all %d instantiations for sm_80/89/90 are compiled by the test suite)\n", oscar_jit_instantiation_count());
    }
    return rc;
}
