/* tests/test_dequant.c -- INT2 -> bf16/f16 dequantization: the CPU reference
   against hand-computed cases (packing order, both scale layouts, groups,
   paged addressing, conversions), and the GPU kernel against the CPU
   reference bit for bit on random packed data with outlier-sized scales. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

static oscar_ctx *cpu_ctx(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    return ctx;
}

static void put_f32(uint8_t *p, float v) { memcpy(p, &v, 4); }
static void put_f16(uint8_t *p, float v) {
    uint16_t h = oscar__f32_to_f16(v);
    memcpy(p, &h, 2);
}

Test(dequant_cpu, conversions) {
    uint32_t h;
    cr_assert_eq(oscar__f32_to_f16(1.0f), 0x3C00);
    cr_assert_eq(oscar__f32_to_f16(65504.0f), 0x7BFF);
    cr_assert_eq(oscar__f32_to_f16(65520.0f), 0x7C00);
    cr_assert_eq(oscar__f32_to_f16(-65519.0f), 0xFBFF);
    cr_assert_eq(oscar__f32_to_f16(ldexpf(1.0f, -24)), 0x0001);
    cr_assert_eq(oscar__f32_to_f16(ldexpf(1.0f, -25)), 0x0000, "tie to even");
    cr_assert_eq(oscar__f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    cr_assert_eq(oscar__f32_to_f16(ldexpf(3.0f, -25)), 0x0002, "1.5 ulp rounds to even 2");
    cr_assert_eq(oscar__f32_to_f16(0.1f), 0x2E66);
    cr_assert_eq(oscar__f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3C00, "tie to even");
    cr_assert_eq(oscar__f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3C02, "tie to even (up)");
    for (h = 0; h < 65536; h++) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue; /* NaN */
        cr_assert_eq(oscar__f32_to_f16(oscar__f16_to_f32((uint16_t)h)), h, "f16 0x%04x round trip", h);
    }
    cr_assert_eq(oscar__f32_to_bf16(1.0f), 0x3F80);
    cr_assert_eq(oscar__f32_to_bf16(oscar__bits_f32(0x3F808000u)), 0x3F80, "tie to even (down)");
    cr_assert_eq(oscar__f32_to_bf16(oscar__bits_f32(0x3F818000u)), 0x3F82, "tie to even (up)");
    cr_assert_eq(oscar__f32_to_bf16(oscar__bits_f32(0x3F808001u)), 0x3F81);
}

/* D = 128, one row: byte 5 holds codes 0,1,2,3 for dims 5, 37, 69, 101. */
Test(dequant_cpu, packing_order_and_reference_layout) {
    oscar_ctx *ctx = cpu_ctx();
    uint8_t codes[32] = {0}, scales[8];
    uint16_t out[128];
    int32_t slot = 0;
    oscar_int2_pool_desc pool = {0};
    oscar_dequant_desc d = {0};
    int i;
    codes[5] = 0 | 1 << 2 | 2 << 4 | 3 << 6;
    put_f32(scales, 2.0f);      /* scale */
    put_f32(scales + 4, 1.0f);  /* zero: x = (code - 1) * 2 */
    pool.head_dim = 128;
    pool.num_kv_heads = 1;
    pool.num_pages = 1;
    pool.scale_layout = OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO;
    pool.k_codes = pool.v_codes = codes;
    pool.k_scales = pool.v_scales = scales;
    d.slots = &slot;
    d.num_tokens = 1;
    d.k_out = out;
    TU_OK(ctx, oscar_dequantize_kv(ctx, &pool, &d, NULL));
    for (i = 0; i < 128; i++) {
        float want = (i == 37) ? 0.0f : (i == 69) ? 2.0f : (i == 101) ? 4.0f : -2.0f;
        cr_assert_eq(oscar__bf16_to_f32(out[i]), want, "dim %d: %g", i, oscar__bf16_to_f32(out[i]));
    }
    oscar_shutdown(ctx);
}

/* D = 64, group 32, compact layout, HND pages of 4: slot 9 = page 2, offset 1. */
Test(dequant_cpu, groups_and_paged_addressing) {
    oscar_ctx *ctx = cpu_ctx();
    enum { PAGES = 3, PS = 4, H = 2, D = 64 };
    uint8_t codes[PAGES * H * PS * D / 4];
    uint8_t scales[PAGES * H * PS * 2 * 4];
    uint16_t out[H * D];
    int32_t slot = 9;
    oscar_int2_pool_desc pool = {0};
    oscar_dequant_desc d = {0};
    int h, i;
    memset(codes, 0, sizeof codes);
    memset(scales, 0, sizeof scales);
    for (h = 0; h < H; h++) {
        /* HND: row = ((page * H + head) * PS + offset) */
        size_t row = (size_t)((2 * H + h) * PS + 1);
        codes[row * (D / 4) + 3] = (uint8_t)(3 | 2 << 2 | 1 << 4); /* dims 3, 19, 35 -> 3, 2, 1 */
        put_f16(scales + row * 8 + 0, 0.5f);                       /* group 0: scale 0.5, min -1 */
        put_f16(scales + row * 8 + 2, -1.0f);
        put_f16(scales + row * 8 + 4, 4.0f + (float)h); /* group 1: scale 4+h, min 10 */
        put_f16(scales + row * 8 + 6, 10.0f);
    }
    pool.head_dim = D;
    pool.num_kv_heads = H;
    pool.num_pages = PAGES;
    pool.page_size = PS;
    pool.group_size = 32;
    pool.layout = OSCAR_KV_LAYOUT_HND;
    pool.k_codes = pool.v_codes = codes;
    pool.k_scales = pool.v_scales = scales;
    d.slots = &slot;
    d.num_tokens = 1;
    d.v_out = out;
    d.out_dtype = OSCAR_DTYPE_F16;
    TU_OK(ctx, oscar_dequantize_kv(ctx, &pool, &d, NULL));
    for (h = 0; h < H; h++)
        for (i = 0; i < D; i++) {
            float want = i < 32 ? -1.0f : 10.0f;
            if (i == 3) want = -1.0f + 3 * 0.5f;
            if (i == 19) want = -1.0f + 2 * 0.5f;
            if (i == 35) want = 10.0f + 1 * (4.0f + (float)h);
            cr_assert_eq(oscar__f16_to_f32(out[h * D + i]), want, "head %d dim %d", h, i);
        }
    oscar_shutdown(ctx);
}

Test(dequant_cpu, validation_touches_nothing) {
    oscar_ctx *ctx = cpu_ctx();
    uint8_t codes[64] __attribute__((aligned(16))) = {0}, scales[16] = {0};
    uint16_t out[256];
    int32_t slot = 0;
    oscar_int2_pool_desc pool = {0};
    oscar_dequant_desc d = {0};
    oscar_status st;
    int i;
    for (i = 0; i < 256; i++) out[i] = 0xBEEF;
    pool.head_dim = 128;
    pool.num_kv_heads = 1;
    pool.num_pages = 1;
    pool.group_size = 48;
    pool.k_codes = pool.v_codes = codes + 1; /* misaligned */
    pool.k_scales = pool.v_scales = scales;
    d.slots = &slot;
    d.num_tokens = 1;
    d.k_out = out;
    d.out_dtype = OSCAR_DTYPE_I32;
    st = oscar_dequantize_kv(ctx, &pool, &d, NULL);
    cr_assert_eq(st, OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "pool.group_size = 48") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "16-byte aligned") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "desc.out_dtype = i32") != NULL, "%s", oscar_last_error(ctx));
    for (i = 0; i < 256; i++) cr_assert_eq(out[i], 0xBEEF);
    oscar_shutdown(ctx);
}

/* ---- GPU: bit for bit against the CPU reference ---------------------------- */

/* Random pool contents: codes uniform, scales spanning 1e-6 .. 1e4 with
   negative and positive offsets (outlier-sized), for both layouts. */
static void fill_random_pool(tu_rng *r, uint8_t *codes, size_t code_bytes, uint8_t *scales, size_t pairs,
                             oscar_scale_layout layout) {
    size_t i;
    for (i = 0; i < code_bytes; i++) codes[i] = (uint8_t)tu_next(r);
    for (i = 0; i < pairs; i++) {
        float mag = (float)pow(10.0, -6.0 + 10.0 * tu_uniform(r));
        float off = (float)(tu_normal(r) * pow(10.0, -3.0 + 6.0 * tu_uniform(r)));
        if (layout == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO) {
            put_f32(scales + 8 * i, mag);
            put_f32(scales + 8 * i + 4, (float)(tu_normal(r) * 100.0));
        } else {
            put_f16(scales + 4 * i, fminf(mag, 60000.0f));
            put_f16(scales + 4 * i + 2, fmaxf(fminf(off, 60000.0f), -60000.0f));
        }
    }
}

static void gpu_case(oscar_ctx *gpu, oscar_ctx *cpu, tu_rng *r, int head_dim, int group, int page_size,
                     oscar_scale_layout layout, oscar_kv_layout kv_layout, oscar_dtype out_dtype) {
    const int H = 3, pages = 7;
    const int64_t T = pages * page_size + 5; /* more tokens than slots: repeats + one invalid */
    oscar_int2_pool_desc pool = {0}, filled;
    oscar_dequant_desc d = {0};
    size_t code_bytes, scale_bytes, out_elems = (size_t)T * H * head_dim;
    uint8_t *codes_k, *codes_v, *sc_k, *sc_v;
    void *dk, *dv, *dsk, *dsv, *dslots, *dout_k, *dout_v;
    int64_t *slots = tu_xmalloc(sizeof(int64_t) * (size_t)T), *perm;
    uint16_t *ref_k = tu_xmalloc(out_elems * 2), *ref_v = tu_xmalloc(out_elems * 2);
    uint16_t *got_k = tu_xmalloc(out_elems * 2), *got_v = tu_xmalloc(out_elems * 2);
    int64_t nslots = (int64_t)pages * page_size, t;
    size_t i;

    pool.head_dim = head_dim;
    pool.num_kv_heads = H;
    pool.num_pages = pages;
    pool.page_size = page_size;
    pool.group_size = group;
    pool.scale_layout = layout;
    pool.layout = kv_layout;
    TU_OK(cpu, oscar_int2_pool_bytes(cpu, &pool, &code_bytes, &scale_bytes));
    codes_k = tu_xmalloc(code_bytes), codes_v = tu_xmalloc(code_bytes);
    sc_k = tu_xmalloc(scale_bytes), sc_v = tu_xmalloc(scale_bytes);
    fill_random_pool(r, codes_k, code_bytes, sc_k, scale_bytes / (layout == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO ? 8 : 4),
                     layout);
    fill_random_pool(r, codes_v, code_bytes, sc_v, scale_bytes / (layout == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO ? 8 : 4),
                     layout);
    perm = tu_xmalloc(sizeof(int64_t) * (size_t)nslots);
    tu_permutation(r, perm, nslots);
    for (t = 0; t < T; t++) slots[t] = t < nslots ? perm[t] : tu_int(r, nslots);
    slots[T - 1] = nslots + 3; /* out of range: NaN rows, no out-of-bounds read */

    /* CPU reference on host copies */
    pool.k_codes = codes_k, pool.v_codes = codes_v, pool.k_scales = sc_k, pool.v_scales = sc_v;
    d.slots = slots;
    d.slot_dtype = OSCAR_DTYPE_I64;
    d.num_tokens = T;
    d.k_out = ref_k;
    d.v_out = ref_v;
    d.out_dtype = out_dtype;
    TU_OK(cpu, oscar_dequantize_kv(cpu, &pool, &d, NULL));

    /* GPU on device copies, outputs poisoned */
    dk = tu_dev_upload(codes_k, code_bytes), dv = tu_dev_upload(codes_v, code_bytes);
    dsk = tu_dev_upload(sc_k, scale_bytes), dsv = tu_dev_upload(sc_v, scale_bytes);
    dslots = tu_dev_upload(slots, sizeof(int64_t) * (size_t)T);
    dout_k = tu_dev_alloc(out_elems * 2), dout_v = tu_dev_alloc(out_elems * 2);
    TU_CUDA(cudaMemset(dout_k, 0xA5, out_elems * 2));
    TU_CUDA(cudaMemset(dout_v, 0xA5, out_elems * 2));
    pool.k_codes = dk, pool.v_codes = dv, pool.k_scales = dsk, pool.v_scales = dsv;
    d.slots = dslots;
    d.k_out = dout_k;
    d.v_out = dout_v;
    TU_OK(gpu, oscar_dequantize_kv(gpu, &pool, &d, NULL));
    TU_CUDA(cudaDeviceSynchronize());
    tu_dev_download(got_k, dout_k, out_elems * 2);
    tu_dev_download(got_v, dout_v, out_elems * 2);
    for (i = 0; i < out_elems; i++) {
        cr_assert_eq(got_k[i], ref_k[i], "K D=%d G=%d P=%d layout %d/%d out %d: element %zu: gpu 0x%04x cpu 0x%04x",
                     head_dim, group, page_size, layout, kv_layout, out_dtype, i, got_k[i], ref_k[i]);
        cr_assert_eq(got_v[i], ref_v[i], "V D=%d G=%d P=%d element %zu", head_dim, group, page_size, i);
    }
    TU_OK(gpu, oscar_query_int2_pool_defaults(gpu, &pool, &filled));
    cudaFree(dk), cudaFree(dv), cudaFree(dsk), cudaFree(dsv), cudaFree(dslots), cudaFree(dout_k), cudaFree(dout_v);
    free(codes_k), free(codes_v), free(sc_k), free(sc_v), free(perm), free(slots);
    free(ref_k), free(ref_v), free(got_k), free(got_v);
}

Test(dequant_gpu, bit_exact_against_cpu_reference, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip();
    oscar_ctx *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256}, groups[] = {32, 64, 128, 256}, pages[] = {1, 16, 5, 64};
    int di, gi, pi, cases = 0;
    for (di = 0; di < 3; di++)
        for (gi = 0; gi < 4; gi++) {
            if (groups[gi] > dims[di]) continue;
            for (pi = 0; pi < 4; pi++) {
                gpu_case(gpu, cpu, &r, dims[di], groups[gi], pages[pi], OSCAR_SCALE_LAYOUT_F16_SCALE_MIN,
                         pi % 2 ? OSCAR_KV_LAYOUT_HND : OSCAR_KV_LAYOUT_NHD, OSCAR_DTYPE_BF16);
                gpu_case(gpu, cpu, &r, dims[di], groups[gi], pages[pi], OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO,
                         pi % 2 ? OSCAR_KV_LAYOUT_NHD : OSCAR_KV_LAYOUT_HND,
                         pi % 2 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16);
                cases += 2;
            }
        }
    cr_log_info("dequant: %d GPU cases bit-identical to the CPU reference", cases);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}
