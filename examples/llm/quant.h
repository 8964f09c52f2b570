/* quant.h — the ggml weight formats this model file uses, and bf16 rounding.

   SmolLM2-135M-Instruct.Q4_1.gguf holds three ggml types (checked with the gguf reader):
     F32  — norms (61 tensors)
     Q4_1 — every linear layer (210 tensors): blocks of 32 = {f16 d, f16 m, u8 qs[16]},
            x[j] = d*(qs[j] & 15) + m, x[j+16] = d*(qs[j] >> 4) + m
     Q8_0 — token_embd (1 tensor, tied output): blocks of 32 = {f16 d, i8 qs[32]}, x = d*q
   Only these are implemented; anything else is refused with the type's name. */
#ifndef LLM_QUANT_H
#define LLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

float fp16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x); /* round to nearest even; NaN stays NaN */
float bf16_to_f32(uint16_t b);
static inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* 1 if dequantize_row supports ggml type `type`. */
int dequant_supported(uint32_t type);

/* Dequantize n elements (n a multiple of the type's block size) from src to dst.
   Returns 0, or -1 for an unsupported type or a bad n. */
int dequantize_row(uint32_t type, const void *src, float *dst, size_t n);

#endif
