/* kv_backend.h — where the model keeps its KV cache and computes attention.

   The model hands every layer's post-RoPE q, k, v of each token to a kv_backend and gets
   the attention output back; it never touches the cache itself. That is the seam where
   oscar.h plugs in (quantize on demotion + INT2 decode attention, CPU or GPU): write a
   constructor that fills a kv_backend with your functions, nothing else changes.

   Calling contract (the model keeps it; a backend may rely on it):
     - reset() starts a new sequence: positions restart at 0.
     - For each token, in increasing pos (0, 1, 2, ...), and for each layer in order
       0..num_layers-1: append(layer, pos, k, v) and then attend(layer, pos, q, out).
       The token's own k/v is appended before its attention, so attend covers 0..pos.
       Within a layer, token pos+1 is appended only after attend(pos) returned, so a
       backend may demote (quantize) older rows inside append: the query at pos sees
       exactly the cache a one-token decode step at pos would see.
     - q is [num_heads][head_dim], k and v are [num_kv_heads][head_dim], all f32, post-RoPE,
       heads contiguous. Query head h reads KV head h / (num_heads / num_kv_heads) (GQA).
       Attention is softmax(q·k / sqrt(head_dim)) · v with a causal mask.
     - Return 0 on success, nonzero on failure (the model stops and reports it).

   Rows are stored in RoPE "NORM" order (llama.cpp: rotation pairs are dims (2i, 2i+1)),
   which is a fixed per-head permutation of the Hugging Face order (pairs (i, i+D/2)).
   Anything calibrated on these rows (rotations, clip ratios) is calibrated in this order. */
#ifndef LLM_KV_BACKEND_H
#define LLM_KV_BACKEND_H

#include <stdint.h>

typedef struct kv_shape {
    int32_t num_layers;
    int32_t num_heads;     /* query heads */
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t max_tokens;    /* capacity of one sequence */
} kv_shape;

typedef struct kv_backend kv_backend;
struct kv_backend {
    kv_shape shape;
    const char *name;
    void (*reset)(kv_backend *b);
    int (*append)(kv_backend *b, int32_t layer, int64_t pos, const float *k, const float *v);
    int (*attend)(kv_backend *b, int32_t layer, int64_t pos, const float *q, float *out);
    void (*destroy)(kv_backend *b);
    void *impl;
};

/* Quantize -> dequantize, in place, the K rows (is_v = 0) or V rows (is_v = 1) of
   n_tokens consecutive tokens pos0..pos0+n_tokens-1 of one layer, as they leave the recent
   window. rows is [n_tokens][num_kv_heads][head_dim] f32 holding bf16-rounded values.
   This is the hook for OSCAR's quantizer (rotate, clip, INT2, dequantize, rotate back). */
typedef void (*kv_qdq_fn)(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens,
                          float *rows, int32_t num_kv_heads, int32_t head_dim);

/* Simulated mixed cache: [bf16 sink | qdq history | bf16 recent].
   Defaults (zero fields): sink 64, recent 256, demote 8 tokens at a time (the reference's
   N_Q), as in OSCAR-SPEC.md §7. A row at position p is demoted once the recent window holds
   at least recent_tokens + demote_interval tokens after it, i.e. the recent part always
   holds between recent_tokens and recent_tokens + demote_interval - 1 tokens. */
typedef struct kv_sim_desc {
    int32_t sink_tokens;      /* default 64; -1 for none */
    int32_t recent_tokens;    /* default 256; -1 for none */
    int32_t demote_interval;  /* default 8; 1 demotes each token as soon as it leaves */
    kv_qdq_fn qdq;            /* *must* be set */
    void *qdq_user;
} kv_sim_desc;

/* The "BF16" baseline: a dense cache that stores K and V rounded to bf16 (round to
   nearest even), attention in f32. With round_bf16 = 0 it keeps f32 rows. */
kv_backend *kv_backend_dense_create(kv_shape shape, int round_bf16);

/* The simulated quantized cache (bf16 storage plus demotion through desc->qdq). */
kv_backend *kv_backend_sim_create(kv_shape shape, const kv_sim_desc *desc);

/* Built-in quantize -> dequantize functions for experiments (use as kv_sim_desc.qdq with a
   qdq_int2_desc* as qdq_user): OSCAR-SPEC.md §3.2 min-max asymmetric INT2 per group,
   optionally after a normalised Hadamard rotation (head_dim must be a power of two) and a
   symmetric sort-threshold clip (§4). This is plain INT2 / "Hadamard INT2", not OSCAR: it
   has no calibrated rotation. */
typedef struct qdq_int2_desc {
    int32_t group_size;   /* default head_dim (one scale/zero per row and head) */
    int hadamard;         /* 1: quantize x·H and return dequant·H */
    float k_clip_ratio;   /* 0: no clipping; else CLIP_INDEX = int(ratio·D) */
    float v_clip_ratio;
} qdq_int2_desc;
void qdq_int2(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens, float *rows,
              int32_t num_kv_heads, int32_t head_dim);

#endif
