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
        oscar_shutdown(ctx);
        return rc;
    }
    printf("No usable CUDA GPU: %s -- %s\n", oscar_status_string(st), oscar_last_error(NULL));
    printf("Running the CPU backend (the C reference of every kernel) instead:\n");
    desc.backend = OSCAR_BACKEND_CPU;
    BU_OK(NULL, oscar_setup(&desc, &ctx));
    rc |= run_dequant(ctx, 0);
    oscar_shutdown(ctx);
    printf("And a compile-only context for sm_90 (no GPU needed), JIT-compiling every kernel instantiation:\n");
    memset(&desc, 0, sizeof desc);
    desc.compile_only_sm = 90;
    st = oscar_setup(&desc, &ctx);
    if (st != OSCAR_OK) {
        printf("  NVRTC unavailable: %s\n", oscar_last_error(NULL));
        return rc;
    }
    {
        int32_t i, n = oscar_jit_instantiation_count();
        oscar_jit_stats s;
        double t0 = oscar__now_ms();
        for (i = 0; i < n; i++) BU_OK(ctx, oscar_jit_prepare(ctx, i));
        oscar_query_jit_stats(ctx, &s);
        printf("  %d kernels ready in %.0f ms: %lld compiled by NVRTC (%.0f ms), %lld from the disk cache (%.1f ms)\n",
               n, oscar__now_ms() - t0, (long long)s.compiles, s.compile_ms, (long long)s.disk_hits, s.disk_load_ms);
    }
    oscar_shutdown(ctx);
    return rc;
}
