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

#endif /* OSCAR_CPU_H_INCLUDED */
