/* cpu/oscar_cpu.h -- part of the oscar.h implementation: the C reference of
   every kernel. It is the CPU backend (OSCAR_BACKEND_CPU runs these on host
   memory through the same descriptors) and the oracle of the GPU tests.
   Arithmetic follows the device code operation for operation where the spec
   makes bit-exact results possible (conversions, codes, dequantized values);
   fmaf() is used where the device uses __fmaf_rn. */
#ifndef OSCAR_CPU_H_INCLUDED
#define OSCAR_CPU_H_INCLUDED

/* ---- conversions (identical to oscar_kernels/common.cuh) ------------------ */
OSCAR__PRIVATE uint32_t oscar__f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
OSCAR__PRIVATE float oscar__bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
OSCAR__PRIVATE float oscar__bf16_to_f32(uint16_t h) { return oscar__bits_f32(OSCAR__CAST(uint32_t, h) << 16); }
OSCAR__PRIVATE uint16_t oscar__f32_to_bf16(float f) {
    uint32_t u = oscar__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return OSCAR__CAST(uint16_t, u >> 16);
}
OSCAR__PRIVATE float oscar__f16_to_f32(uint16_t h) {
    uint32_t sign = OSCAR__CAST(uint32_t, h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    float f;
    if (e == 0) {
        f = ldexpf(OSCAR__CAST(float, m), -24);
        return (h & 0x8000u) ? -f : f;
    }
    if (e == 31) return oscar__bits_f32(sign | 0x7f800000u | (m << 13));
    return oscar__bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
/* Round to nearest even, overflow to infinity, subnormals kept (cvt.rn.f16.f32). */
OSCAR__PRIVATE uint16_t oscar__f32_to_f16(float f) {
    uint32_t x = oscar__f32_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu, e, h;
    if (ax > 0x7f800000u) return OSCAR__CAST(uint16_t, 0x7fffu);
    if (ax >= 0x477ff000u) return OSCAR__CAST(uint16_t, sign | 0x7c00u);
    if (ax <= 0x33000000u) return OSCAR__CAST(uint16_t, sign);
    e = ax >> 23;
    if (e < 113) {
        uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e, rem, half;
        h = m >> shift;
        rem = m & ((1u << shift) - 1u);
        half = 1u << (shift - 1);
        if (rem > half || (rem == half && (h & 1u))) h++;
        return OSCAR__CAST(uint16_t, sign | h);
    }
    h = ((e - 112u) << 10) | ((ax >> 13) & 0x3ffu);
    {
        uint32_t rem = ax & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    }
    return OSCAR__CAST(uint16_t, sign | h);
}
OSCAR__PRIVATE float oscar__to_f32(uint16_t h, int dtype) {
    return dtype == OSCAR_K_DTYPE_F16 ? oscar__f16_to_f32(h) : oscar__bf16_to_f32(h);
}
OSCAR__PRIVATE uint16_t oscar__from_f32(float f, int dtype) {
    return dtype == OSCAR_K_DTYPE_F16 ? oscar__f32_to_f16(f) : oscar__f32_to_bf16(f);
}

/* ---- pool addressing ------------------------------------------------------ */
OSCAR__PRIVATE int64_t oscar__cpu_row_offset(int64_t slot, int head, int64_t page_stride, int64_t token_stride,
                                     int64_t head_stride, int page_size) {
    int64_t page = slot / page_size, off = slot - page * page_size;
    return page * page_stride + off * token_stride + OSCAR__CAST(int64_t, head) * head_stride;
}
OSCAR__PRIVATE int64_t oscar__cpu_slot(uint64_t slots, int64_t i, int dtype) {
    if (dtype == OSCAR_K_DTYPE_I64) return OSCAR__RCAST(const int64_t *, slots)[i];
    return OSCAR__RCAST(const int32_t *, slots)[i];
}

typedef struct oscar__affine {
    float scale, offset;
} oscar__affine;

OSCAR__PRIVATE oscar__affine oscar__cpu_group_affine(const uint8_t *scale_row, int g, int layout) {
    oscar__affine a;
    if (layout == OSCAR_K_SCALE_F32_SCALE_ZERO) {
        memcpy(&a.scale, scale_row + 8 * g, 4);
        memcpy(&a.offset, scale_row + 8 * g + 4, 4);
    } else {
        uint16_t s, m;
        memcpy(&s, scale_row + 4 * g, 2);
        memcpy(&m, scale_row + 4 * g + 2, 2);
        a.scale = oscar__f16_to_f32(s);
        a.offset = oscar__f16_to_f32(m);
    }
    return a;
}
OSCAR__PRIVATE float oscar__cpu_dequant_value(uint32_t code, oscar__affine a, int layout) {
    float c = OSCAR__CAST(float, code);
    if (layout == OSCAR_K_SCALE_F32_SCALE_ZERO) {
        float t = c - a.offset;
        return t * a.scale;
    }
    return fmaf(c, a.scale, a.offset);
}
/* Code of natural dim d in a packed row of head_dim/4 bytes. */
OSCAR__PRIVATE uint32_t oscar__cpu_code(const uint8_t *row, int d, int head_dim) {
    int q4 = head_dim / 4;
    return (row[d % q4] >> (2 * (d / q4))) & 3u;
}

/* ---- dequantize ------------------------------------------------------------ */
OSCAR__PRIVATE void oscar__cpu_dequant(const oscar_dequant_params *p, int head_dim, int group_size) {
    const oscar_pool_params *pool = &p->pool;
    int64_t t;
    int h, kv, d;
    for (t = 0; t < p->num_tokens; t++) {
        int64_t slot = oscar__cpu_slot(p->slots, t, p->slot_dtype);
        int valid = slot >= 0 && slot < OSCAR__CAST(int64_t, pool->num_pages) * pool->page_size;
        for (h = 0; h < pool->num_kv_heads; h++) {
            int64_t co = valid ? oscar__cpu_row_offset(slot, h, pool->codes_page_stride, pool->codes_token_stride,
                                                       pool->codes_head_stride, pool->page_size)
                               : 0;
            int64_t so = valid ? oscar__cpu_row_offset(slot, h, pool->scales_page_stride, pool->scales_token_stride,
                                                       pool->scales_head_stride, pool->page_size)
                               : 0;
            for (kv = 0; kv < 2; kv++) {
                uint64_t out_base = kv ? p->v_out : p->k_out;
                const uint8_t *codes = OSCAR__RCAST(const uint8_t *, kv ? pool->v_codes : pool->k_codes) + co;
                const uint8_t *scales = OSCAR__RCAST(const uint8_t *, kv ? pool->v_scales : pool->k_scales) + so;
                uint16_t *out;
                if (!out_base) continue;
                out = OSCAR__RCAST(uint16_t *, out_base) + t * p->out_token_stride + h * p->out_head_stride;
                for (d = 0; d < head_dim; d++) {
                    float x = oscar__bits_f32(0x7fc00000u);
                    if (valid)
                        x = oscar__cpu_dequant_value(oscar__cpu_code(codes, d, head_dim),
                                                     oscar__cpu_group_affine(scales, d / group_size, pool->scale_layout),
                                                     pool->scale_layout);
                    out[d] = oscar__from_f32(x, p->out_dtype);
                }
            }
        }
    }
}

/* ---- quantize ------------------------------------------------------------ */
#define OSCAR__LM_THRESHOLD 0.9810652732849121f
#define OSCAR__LM_SCALE 1.1673919518788656f

/* A product that must not be fused into a following add (the device rounds
   it separately): the volatile store forces the rounding on any host. */
OSCAR__PRIVATE float oscar__mul_rn(float a, float b) {
    volatile float t = a * b;
    return t;
}

OSCAR__PRIVATE int oscar__cmp_float(const void *a, const void *b) {
    float x = *OSCAR__CAST(const float *, a), y = *OSCAR__CAST(const float *, b);
    return x < y ? -1 : x > y;
}

/* Quantizes one row y[D] (values representable in the source dtype) exactly
   as quantize.cuh does. Writes code[D], and per group scale, zero (f32
   layout) and min (f16 layout). clip_index < 0: no clipping. */
OSCAR__PRIVATE void oscar__cpu_quantize_row(float *y, int D, int GS, int clip_index, int lloyd_max, uint8_t *code,
                                            float *g_scale, float *g_zero, float *g_min) {
    int d, gi, G = D / GS;
    if (clip_index >= 0) {
        float sorted[256], tau;
        for (d = 0; d < D; d++) sorted[d] = fabsf(y[d]);
        qsort(sorted, OSCAR__CAST(size_t, D), sizeof(float), oscar__cmp_float);
        tau = sorted[clip_index];
        for (d = 0; d < D; d++) y[d] = fminf(fmaxf(y[d], -tau), tau);
    }
    if (lloyd_max) {
        /* the device's summation order: lane c sums dims nt*8 + 2c + e in
           order, then the quad butterfly (s0 + s1) + (s2 + s3) */
        float s[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0}, mean, var, sd;
        int c, nt, e;
        for (c = 0; c < 4; c++)
            for (nt = 0; nt < D / 8; nt++)
                for (e = 0; e < 2; e++) s[c] = s[c] + y[nt * 8 + 2 * c + e];
        mean = ((s[0] + s[1]) + (s[2] + s[3])) / OSCAR__CAST(float, D);
        for (c = 0; c < 4; c++)
            for (nt = 0; nt < D / 8; nt++)
                for (e = 0; e < 2; e++) {
                    float t = y[nt * 8 + 2 * c + e] - mean;
                    q[c] = q[c] + oscar__mul_rn(t, t);
                }
        var = ((q[0] + q[1]) + (q[2] + q[3])) / OSCAR__CAST(float, D);
        sd = sqrtf(var + 1e-8f);
        for (d = 0; d < D; d++) {
            float z = (y[d] - mean) / sd;
            code[d] = OSCAR__CAST(uint8_t, (z >= -OSCAR__LM_THRESHOLD) + (z >= 0.f) + (z >= OSCAR__LM_THRESHOLD));
        }
        for (gi = 0; gi < G; gi++) {
            g_scale[gi] = oscar__mul_rn(OSCAR__LM_SCALE, sd);
            g_zero[gi] = 1.5f - mean / g_scale[gi];
            g_min[gi] = mean - oscar__mul_rn(1.5f, g_scale[gi]);
        }
        return;
    }
    for (gi = 0; gi < G; gi++) {
        float mn = y[gi * GS], mx = mn, scale, zero;
        for (d = gi * GS; d < (gi + 1) * GS; d++) {
            mn = fminf(mn, y[d]);
            mx = fmaxf(mx, y[d]);
        }
        scale = fmaxf(mx - mn, 1e-8f) / 3.0f;
        zero = -mn / scale;
        g_scale[gi] = scale, g_zero[gi] = zero, g_min[gi] = mn;
        for (d = gi * GS; d < (gi + 1) * GS; d++) {
            float qv = y[d] / scale + zero + 0.5f;
            int ci = OSCAR__CAST(int, truncf(qv));
            code[d] = OSCAR__CAST(uint8_t, ci < 0 ? 0 : ci > 3 ? 3 : ci);
        }
    }
}

/* Packs D codes in the quartered layout: byte j = c[j] | c[j+Q4]<<2 | ... */
OSCAR__PRIVATE void oscar__cpu_pack_row(const uint8_t *code, int D, uint8_t *out) {
    int j, q4 = D / 4;
    for (j = 0; j < q4; j++)
        out[j] = OSCAR__CAST(uint8_t, code[j] | code[j + q4] << 2 | code[j + 2 * q4] << 4 | code[j + 3 * q4] << 6);
}

/* ---- the clipped-group threshold table of quantize.cuh ------------------
   A bf16 group clipped at both ends (min -tau, max tau: nearly every group of
   a clipped row when the group is the row) has code thresholds that depend
   only on tau's mantissa: with mn = -tau, mx = tau the formula above scales
   with tau by powers of two while every value stays normal (quantize.cuh, v8).
   Entry 3 m + (k - 1), for tau = 1.m (bf16 exponent 127, 7-bit mantissa m)
   and level k = 1..3: bits 0-15 the threshold word, the smallest bf16 value t
   in [-tau, tau] whose code is >= k, or a marker -- neg_inf when t = -tau
   (every value of the group reaches k), pos_inf when no value does; bit 16
   set when the entry is usable: t is a marker or |t| >= 2^-70, and the same
   computation at exponents 127 - 25 and 127 + 60 gives t shifted by that
   many binades (oscar__cpu_clip_shift). pos_inf is the compare domain's
   +infinity: 0x7F80 where the device compares bf16 natively (sm_90), 0x7C00
   where it compares bf16 patterns as f16 (sm_80, sm_89); neg_inf = pos_inf |
   0x8000. The device reads this table (oscar_kernels/quantize_table.cuh,
   written by tools/gen_quantize_table.c from this function); session 8-17
   kernels built it per CTA with the same definition (q_tab_entry). */
#define OSCAR__CLIP_TAB_EMIN (127 - 25)
#define OSCAR__CLIP_TAB_EMAX (127 + 60)
OSCAR__PRIVATE uint32_t oscar__cpu_ord16(uint32_t pat) { return pat ^ ((pat & 0x8000u) ? 0xffffu : 0x8000u); }
OSCAR__PRIVATE uint32_t oscar__cpu_unord16(uint32_t o) { return o ^ ((o & 0x8000u) ? 0x8000u : 0xffffu); }
/* the uniform code of bf16 value v in a group clipped to [-tau, tau], before
   the clamp to [0, 3]: (v / scale + zero) + 0.5 as the device evaluates it */
OSCAR__PRIVATE float oscar__cpu_clipped_eval(float tau, float v) {
    const float scale = fmaxf(tau - -tau, 1e-8f) / 3.0f, zero = tau / scale;
    return v / scale + zero + 0.5f;
}
/* the threshold word of level k for tau (bf16 pattern tau_pat > 0), by
   bisection over the ordered bf16 indices of [-tau, tau] (the code is
   monotone in the value) */
OSCAR__PRIVATE uint32_t oscar__cpu_clipped_threshold(uint32_t tau_pat, int k, uint32_t pos_inf) {
    const float tau = oscar__bf16_to_f32(OSCAR__CAST(uint16_t, tau_pat));
    const uint32_t olo = oscar__cpu_ord16(tau_pat | 0x8000u), ohi = oscar__cpu_ord16(tau_pat);
    uint32_t lo = olo, hi = ohi + 1u; /* the smallest index in [olo, ohi + 1] that reaches k (ohi + 1: none) */
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2u;
        if (oscar__cpu_clipped_eval(tau, oscar__bf16_to_f32(OSCAR__CAST(uint16_t, oscar__cpu_unord16(mid)))) >=
            OSCAR__CAST(float, k))
            hi = mid;
        else
            lo = mid + 1u;
    }
    return lo == olo ? (pos_inf | 0x8000u) : lo > ohi ? pos_inf : oscar__cpu_unord16(lo);
}
/* t moved by de binades (markers and zeros stay) */
OSCAR__PRIVATE uint32_t oscar__cpu_clip_shift(uint32_t t, int de) {
    const uint32_t mag = t & 0x7fffu;
    if (mag >= 0x7f80u || mag == 0u) return t;
    return (t & 0x8000u) | (mag + OSCAR__CAST(uint32_t, de * 128));
}
OSCAR__PRIVATE void oscar__cpu_clip_table(int native_bf16, uint32_t out[384]) {
    const uint32_t pos_inf = native_bf16 ? 0x7F80u : 0x7C00u;
    int m, k, i;
    for (m = 0; m < 128; m++)
        for (k = 1; k <= 3; k++) {
            uint32_t t = 0u;
            int ok = 1;
            for (i = 0; i < 3; i++) {
                const int e = i == 0 ? 127 : i == 1 ? OSCAR__CLIP_TAB_EMIN : OSCAR__CLIP_TAB_EMAX;
                const uint32_t x = oscar__cpu_clipped_threshold(OSCAR__CAST(uint32_t, (e << 7) | m), k, pos_inf);
                if (i == 0) {
                    const uint32_t mag = x & 0x7fffu;
                    t = x;
                    ok = mag >= 0x7f80u || mag >= ((127u - 70u) << 7);
                } else {
                    ok = ok && x == oscar__cpu_clip_shift(t, e - 127);
                }
            }
            out[3 * m + k - 1] = t | (ok ? 0x10000u : 0u);
        }
}

/* The prepared rotation image (oscar_prepare_rotation; quantize.cuh's
   rotation_prepare_kernel writes the same bytes): header, then R rounded to
   the source dtype in the wgmma path's layout and in the mma.sync path's. */
OSCAR__PRIVATE uint32_t oscar__cpu_rowswz(int D, int row) {
    if (D == 64) return OSCAR__CAST(uint32_t, ((row & 3) << 1) | ((row >> 2) & 1));
    if (D == 128) return OSCAR__CAST(uint32_t, (row & 1) | ((row & 2) << 1) | ((row & 4) >> 1));
    return OSCAR__CAST(uint32_t, row & 7);
}
OSCAR__PRIVATE void oscar__cpu_rotation_image(const float *R, int D, int src_dtype, uint8_t *out) {
    const int chunks = D / 8;
    const size_t bytes = OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, D) * 2;
    uint8_t *wg = out + OSCAR_K_ROT_PREP_HEADER, *ms = wg + bytes;
    uint32_t hdr[OSCAR_K_ROT_PREP_HEADER / 4] = {0};
    int c, n, e;
    hdr[0] = OSCAR_K_ROT_PREP_MAGIC, hdr[1] = OSCAR_K_ROT_PREP_VERSION, hdr[2] = OSCAR__CAST(uint32_t, D);
    hdr[3] = OSCAR__CAST(uint32_t, src_dtype);
    memcpy(out, hdr, sizeof hdr);
    for (c = 0; c < chunks; c++)
        for (n = 0; n < D; n++) {
            /* wgmma: chunk c of R^T row n, at (c / 8) D 128 + n 128 + ((c % 8) ^ (n % 8)) 16 */
            uint8_t *dst = wg + OSCAR__CAST(size_t, (c >> 3) * (D * 128) + n * 128 + (((c & 7) ^ (n & 7)) << 4));
            for (e = 0; e < 8; e++) {
                const uint16_t h = oscar__from_f32(R[OSCAR__CAST(int64_t, c * 8 + e) * D + n], src_dtype);
                memcpy(dst + 2 * e, &h, 2);
            }
        }
    for (n = 0; n < D; n++) /* mma.sync: chunk c of R row n at n 2D + (c ^ rowswz(n)) 16 */
        for (c = 0; c < chunks; c++) {
            uint8_t *dst = ms + OSCAR__CAST(size_t, n) * OSCAR__CAST(size_t, D) * 2 +
                           ((OSCAR__CAST(uint32_t, c) ^ oscar__cpu_rowswz(D, n)) << 4);
            for (e = 0; e < 8; e++) {
                const uint16_t h = oscar__from_f32(R[OSCAR__CAST(int64_t, n) * D + c * 8 + e], src_dtype);
                memcpy(dst + 2 * e, &h, 2);
            }
        }
}

/* Rotates x[D] by R (f32 [D][D] row-major, rounded to the source dtype as
   the device does) in float64 and rounds the result to the source dtype. */
OSCAR__PRIVATE void oscar__cpu_rotate_row(const float *x, const float *R, int D, int src_dtype, float *y) {
    int i, j;
    for (j = 0; j < D; j++) {
        double acc = 0;
        for (i = 0; i < D; i++)
            acc += OSCAR__CAST(double, x[i]) *
                   OSCAR__CAST(double, oscar__to_f32(oscar__from_f32(R[OSCAR__CAST(int64_t, i) * D + j], src_dtype), src_dtype));
        y[j] = oscar__to_f32(oscar__from_f32(OSCAR__CAST(float, acc), src_dtype), src_dtype);
    }
}

OSCAR__PRIVATE void oscar__cpu_quantize(const oscar_quantize_params *p, int D, int GS, int src_dtype) {
    const oscar_pool_params *pool = &p->pool;
    int layer, side, h, d, gi, G = D / GS, H = pool->num_kv_heads;
    int64_t t;
    float x[256], y[256], g_scale[8], g_zero[8], g_min[8];
    uint8_t code[256], packed[64];
    for (layer = 0; layer < p->num_layers; layer++)
        for (side = 0; side < 2; side++) {
            const oscar_quantize_layer *L = &p->layers[layer];
            const uint16_t *src = OSCAR__RCAST(const uint16_t *, side ? L->src_v : L->src_k);
            const float *R = OSCAR__RCAST(const float *, side ? L->rot_v : L->rot_k);
            uint8_t *cbase = OSCAR__RCAST(uint8_t *, side ? L->v_codes : L->k_codes);
            uint8_t *sbase = OSCAR__RCAST(uint8_t *, side ? L->v_scales : L->k_scales);
            int clip_index = side ? p->v_clip_index : p->k_clip_index;
            for (t = 0; t < p->num_tokens; t++) {
                int64_t sslot = p->src_slots ? oscar__cpu_slot(p->src_slots, t, p->slot_dtype) : t;
                int64_t dslot = oscar__cpu_slot(p->dst_slots, t, p->slot_dtype);
                if (sslot < 0 || dslot < 0 || dslot >= OSCAR__CAST(int64_t, pool->num_pages) * pool->page_size) continue;
                for (h = 0; h < H; h++) {
                    int64_t spage = sslot / p->src_page_size, soff = sslot - spage * p->src_page_size;
                    const uint16_t *row = src + spage * p->src_page_stride + soff * p->src_token_stride +
                                          OSCAR__CAST(int64_t, h) * p->src_head_stride;
                    uint8_t *crow, *srow;
                    for (d = 0; d < D; d++) x[d] = oscar__to_f32(row[d], src_dtype);
                    if (R)
                        oscar__cpu_rotate_row(x, R, D, src_dtype, y);
                    else
                        memcpy(y, x, sizeof(float) * OSCAR__CAST(size_t, D));
                    oscar__cpu_quantize_row(y, D, GS, clip_index, p->lloyd_max, code, g_scale, g_zero, g_min);
                    oscar__cpu_pack_row(code, D, packed);
                    crow = cbase + oscar__cpu_row_offset(dslot, h, pool->codes_page_stride, pool->codes_token_stride,
                                                         pool->codes_head_stride, pool->page_size);
                    srow = sbase + oscar__cpu_row_offset(dslot, h, pool->scales_page_stride, pool->scales_token_stride,
                                                         pool->scales_head_stride, pool->page_size);
                    memcpy(crow, packed, OSCAR__CAST(size_t, D / 4));
                    for (gi = 0; gi < G; gi++) {
                        if (pool->scale_layout == OSCAR_K_SCALE_F32_SCALE_ZERO) {
                            memcpy(srow + 8 * gi, &g_scale[gi], 4);
                            memcpy(srow + 8 * gi + 4, &g_zero[gi], 4);
                        } else {
                            uint16_t s16 = oscar__f32_to_f16(g_scale[gi]), m16 = oscar__f32_to_f16(g_min[gi]);
                            memcpy(srow + 4 * gi, &s16, 2);
                            memcpy(srow + 4 * gi + 2, &m16, 2);
                        }
                    }
                }
            }
        }
}

/* ---- decode attention (float64) ------------------------------------------ */
/* Attention of one query row over a token set, in float64: logits s_t =
   sm_scale * q.k_t (capped), returns lse (natural) and o = softmax(s) V; an
   empty set gives lse = -inf and o = 0. get_kv fills k and v of token t. */
typedef void (*oscar__cpu_kv_fn)(const void *ctx, int64_t t, double *k, double *v);
OSCAR__PRIVATE double oscar__cpu_attend(const double *q, int D, int64_t n, oscar__cpu_kv_fn get_kv, const void *kv_ctx,
                                        double sm_scale, double cap, double *o, double *scratch_s) {
    double k[256], v[256], m = -HUGE_VAL, l = 0;
    int64_t t;
    int d;
    for (d = 0; d < D; d++) o[d] = 0;
    for (t = 0; t < n; t++) {
        double s = 0;
        get_kv(kv_ctx, t, k, v);
        for (d = 0; d < D; d++) s += q[d] * k[d];
        s *= sm_scale;
        if (cap > 0) s = cap * tanh(s / cap);
        scratch_s[t] = s;
        if (s > m) m = s;
    }
    if (n == 0) return -HUGE_VAL;
    for (t = 0; t < n; t++) {
        double w = exp(scratch_s[t] - m);
        get_kv(kv_ctx, t, k, v);
        l += w;
        for (d = 0; d < D; d++) o[d] += w * v[d];
    }
    for (d = 0; d < D; d++) o[d] /= l;
    return m + log(l);
}

typedef struct oscar__cpu_int2_kv {
    const oscar_decode_params *p;
    int D, GS, b, kvh;
} oscar__cpu_int2_kv;
OSCAR__PRIVATE void oscar__cpu_int2_get(const void *c, int64_t t, double *k, double *v) {
    const oscar__cpu_int2_kv *x = OSCAR__CAST(const oscar__cpu_int2_kv *, c);
    const oscar_pool_params *pool = &x->p->pool;
    const int32_t *indptr = OSCAR__RCAST(const int32_t *, x->p->int2_indptr);
    const int32_t *indices = OSCAR__RCAST(const int32_t *, x->p->int2_indices);
    int32_t page = indices[indptr[x->b] + t / pool->page_size];
    int64_t slot = OSCAR__CAST(int64_t, page) * pool->page_size + t % pool->page_size;
    int d, kv;
    for (kv = 0; kv < 2; kv++) {
        const uint8_t *codes = OSCAR__RCAST(const uint8_t *, kv ? pool->v_codes : pool->k_codes) +
                               oscar__cpu_row_offset(slot, x->kvh, pool->codes_page_stride, pool->codes_token_stride,
                                                     pool->codes_head_stride, pool->page_size);
        const uint8_t *scales = OSCAR__RCAST(const uint8_t *, kv ? pool->v_scales : pool->k_scales) +
                                oscar__cpu_row_offset(slot, x->kvh, pool->scales_page_stride,
                                                      pool->scales_token_stride, pool->scales_head_stride,
                                                      pool->page_size);
        double *out = kv ? v : k;
        for (d = 0; d < x->D; d++) {
            oscar__affine a = oscar__cpu_group_affine(scales, d / x->GS, pool->scale_layout);
            double code = oscar__cpu_code(codes, d, x->D);
            out[d] = pool->scale_layout == OSCAR_K_SCALE_F32_SCALE_ZERO ? (code - a.offset) * a.scale
                                                                        : a.offset + code * a.scale;
        }
    }
}

typedef struct oscar__cpu_win_kv {
    const oscar_decode_params *p;
    int D, b, kvh;
} oscar__cpu_win_kv;
OSCAR__PRIVATE void oscar__cpu_win_get(const void *c, int64_t t, double *k, double *v) {
    const oscar__cpu_win_kv *x = OSCAR__CAST(const oscar__cpu_win_kv *, c);
    const oscar_decode_params *p = x->p;
    const int32_t *indptr = OSCAR__RCAST(const int32_t *, p->win_indptr);
    const int32_t *indices = OSCAR__RCAST(const int32_t *, p->win_indices);
    int32_t page = indices[indptr[x->b] + t / p->win_page_size];
    int64_t e = OSCAR__CAST(int64_t, page) * p->win_page_stride + (t % p->win_page_size) * p->win_token_stride +
                OSCAR__CAST(int64_t, x->kvh) * p->win_head_stride;
    int d;
    for (d = 0; d < x->D; d++) {
        k[d] = oscar__to_f32(OSCAR__RCAST(const uint16_t *, p->win_k)[e + d], p->kv_dtype);
        v[d] = oscar__to_f32(OSCAR__RCAST(const uint16_t *, p->win_v)[e + d], p->kv_dtype);
    }
}

OSCAR__PRIVATE int64_t oscar__cpu_csr_tokens(uint64_t indptr, uint64_t last, int b, int page_size) {
    const int32_t *ip = OSCAR__RCAST(const int32_t *, indptr), *lp = OSCAR__RCAST(const int32_t *, last);
    int64_t n;
    if (!ip) return 0;
    n = ip[b + 1] - ip[b];
    return n > 0 ? (n - 1) * page_size + lp[b] : 0;
}

/* One query head of a decode step in float64: the INT2 tier with q @ R_k,
   its output brought back with R_v^T, the window tier with q, merged.
   o[D] and the natural-log lse out; scratch holds max_tokens doubles. */
OSCAR__PRIVATE void oscar__cpu_decode_head(const oscar_decode_params *p, int D, int GS, int b, int h, double *o,
                                           double *lse_out, double *scratch) {
    int d, n, r = p->group_ratio, kvh = h / r;
    const uint16_t *qp = OSCAR__RCAST(const uint16_t *, p->q) + b * p->q_batch_stride + h * p->q_head_stride;
    double q[256] = {0}, qr[256] = {0}, o1r[256] = {0}, o1[256] = {0}, o2[256] = {0}, lse1, lse2, m, w1, w2;
    oscar__cpu_int2_kv ik;
    oscar__cpu_win_kv wk;
    for (d = 0; d < D; d++) q[d] = oscar__to_f32(qp[d], p->q_dtype);
    for (n = 0; n < D; n++) {
        double s = 0;
        if (!p->rot_k) {
            qr[n] = q[n];
            continue;
        }
        for (d = 0; d < D; d++) s += q[d] * OSCAR__RCAST(const float *, p->rot_k)[d * D + n];
        qr[n] = s;
    }
    ik.p = p, ik.D = D, ik.GS = GS, ik.b = b, ik.kvh = kvh;
    lse1 = oscar__cpu_attend(qr, D, oscar__cpu_csr_tokens(p->int2_indptr, p->int2_last_page_len, b, p->pool.page_size),
                             oscar__cpu_int2_get, &ik, p->sm_scale, p->logit_cap, o1r, scratch);
    for (n = 0; n < D; n++) {
        double s = 0;
        if (!p->rot_v) {
            o1[n] = o1r[n];
            continue;
        }
        for (d = 0; d < D; d++) s += o1r[d] * OSCAR__RCAST(const float *, p->rot_v)[n * D + d];
        o1[n] = s;
    }
    wk.p = p, wk.D = D, wk.b = b, wk.kvh = kvh;
    lse2 = oscar__cpu_attend(q, D, oscar__cpu_csr_tokens(p->win_indptr, p->win_last_page_len, b, p->win_page_size),
                             oscar__cpu_win_get, &wk, p->sm_scale, p->logit_cap, o2, scratch);
    m = lse1 > lse2 ? lse1 : lse2;
    w1 = m == -HUGE_VAL ? 0 : exp(lse1 - m);
    w2 = m == -HUGE_VAL ? 0 : exp(lse2 - m);
    for (d = 0; d < D; d++) o[d] = w1 + w2 > 0 ? (w1 * o1[d] + w2 * o2[d]) / (w1 + w2) : 0.0;
    *lse_out = w1 + w2 > 0 ? m + log(w1 + w2) : -HUGE_VAL;
}

OSCAR__PRIVATE int64_t oscar__cpu_decode_max_tokens(const oscar_decode_params *p) {
    int64_t max_tokens = 1;
    int b;
    for (b = 0; b < p->batch_size; b++) {
        max_tokens = OSCAR__MAX(max_tokens, oscar__cpu_csr_tokens(p->int2_indptr, p->int2_last_page_len, b, p->pool.page_size));
        max_tokens = OSCAR__MAX(max_tokens, oscar__cpu_csr_tokens(p->win_indptr, p->win_last_page_len, b, p->win_page_size));
    }
    return max_tokens;
}

/* The whole decode step (the CPU backend). Returns 0, or -1 when out of memory. */
OSCAR__PRIVATE int oscar__cpu_decode(const oscar_decode_params *p, int D, int GS) {
    int b, h, d;
    double *scratch = OSCAR__CAST(double *, malloc(sizeof(double) * OSCAR__CAST(size_t, oscar__cpu_decode_max_tokens(p))));
    if (!scratch) return -1;
    for (b = 0; b < p->batch_size; b++)
        for (h = 0; h < p->num_q_heads; h++) {
            double o[256], lse;
            uint16_t *op = OSCAR__RCAST(uint16_t *, p->o) + b * p->o_batch_stride + h * p->o_head_stride;
            oscar__cpu_decode_head(p, D, GS, b, h, o, &lse, scratch);
            for (d = 0; d < D; d++) op[d] = oscar__from_f32(OSCAR__CAST(float, o[d]), p->o_dtype);
            if (p->lse)
                OSCAR__RCAST(float *, p->lse)[b * p->num_q_heads + h] =
                    OSCAR__CAST(float, p->lse_base == 2 ? lse * 1.4426950408889634 : lse);
        }
    free(scratch);
    return 0;
}

/* ---- merge of states -------------------------------------------------------- */
OSCAR__PRIVATE void oscar__cpu_merge(const oscar_merge_params *p, int D) {
    int64_t row;
    int i, d;
    double to_e = p->lse_base == 2 ? 0.6931471805599453 : 1.0;
    for (row = 0; row < p->num_rows; row++) {
        double m = -HUGE_VAL, W = 0, acc[256];
        for (d = 0; d < D; d++) acc[d] = 0;
        for (i = 0; i < p->num_states; i++) {
            double x = OSCAR__RCAST(const float *, p->lse[i])[row] * to_e;
            if (x == x && x > m) m = x;
        }
        if (m != -HUGE_VAL)
            for (i = 0; i < p->num_states; i++) {
                double x = OSCAR__RCAST(const float *, p->lse[i])[row] * to_e, w;
                if (!(x == x) || x == -HUGE_VAL) continue;
                w = exp(x - m);
                W += w;
                for (d = 0; d < D; d++) {
                    int64_t e = row * p->row_stride + d;
                    double v = p->dtype == OSCAR_K_DTYPE_F32 ? OSCAR__RCAST(const float *, p->o[i])[e]
                                                             : oscar__to_f32(OSCAR__RCAST(const uint16_t *, p->o[i])[e], p->dtype);
                    acc[d] += w * v;
                }
            }
        for (d = 0; d < D; d++) {
            int64_t e = row * p->out_row_stride + d;
            float v = W > 0 ? OSCAR__CAST(float, acc[d] / W) : 0.0f;
            if (p->dtype == OSCAR_K_DTYPE_F32)
                OSCAR__RCAST(float *, p->out_o)[e] = v;
            else
                OSCAR__RCAST(uint16_t *, p->out_o)[e] = oscar__from_f32(v, p->dtype);
        }
        if (p->out_lse)
            OSCAR__RCAST(float *, p->out_lse)[row] = W > 0 ? OSCAR__CAST(float, (m + log(W)) / to_e) : -HUGE_VALF;
    }
}

#endif /* OSCAR_CPU_H_INCLUDED */
