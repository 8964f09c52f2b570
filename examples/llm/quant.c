/* quant.c — see quant.h. */
#include "quant.h"

#include <string.h>

#include "gguf.h"

float fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while ((man & 0x400) == 0) { man <<= 1; exp--; }
            man &= 0x3FF;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int dequant_supported(uint32_t type) {
    return type == GGML_T_F32 || type == GGML_T_Q4_1 || type == GGML_T_Q8_0;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

int dequantize_row(uint32_t type, const void *src, float *dst, size_t n) {
    const uint8_t *p = (const uint8_t *)src;
    switch (type) {
    case GGML_T_F32:
        memcpy(dst, src, n * sizeof(float));
        return 0;
    case GGML_T_Q4_1:
        if (n % 32) return -1;
        for (size_t b = 0; b < n / 32; b++, p += 20, dst += 32) {
            float d = fp16_to_f32(rd16(p)), m = fp16_to_f32(rd16(p + 2));
            for (int j = 0; j < 16; j++) {
                dst[j] = d * (float)(p[4 + j] & 15) + m;
                dst[j + 16] = d * (float)(p[4 + j] >> 4) + m;
            }
        }
        return 0;
    case GGML_T_Q8_0:
        if (n % 32) return -1;
        for (size_t b = 0; b < n / 32; b++, p += 34, dst += 32) {
            float d = fp16_to_f32(rd16(p));
            for (int j = 0; j < 32; j++) dst[j] = d * (float)(int8_t)p[2 + j];
        }
        return 0;
    default:
        return -1;
    }
}
